"""Calls into a trainer while its own fit runs (from a callback): fit, close and load_state_dict are refused
with a FastnnError saying why, and the trainer ends as a fit stopped after that epoch ends."""

from __future__ import annotations

import numpy as np
import pytest
from test_training_control import EVAL, TRAIN, C, _reference, _trainer

from fastnn import FastnnError, Trainer


def _assert_like(t: Trainer, reference: Trainer) -> None:
    """The same weights, optimizer state, counters and history (but the seconds) as `reference`."""
    assert (t.epoch, t.step) == (reference.epoch, reference.step)
    assert [{**r, "seconds": 0} for r in t.history] == [{**r, "seconds": 0} for r in reference.history]
    for name, value in reference._engine.get_state().items():
        np.testing.assert_array_equal(t._engine.get_state()[name], value, err_msg=name)


CALLS = {
    "fit": (lambda t: t.fit(*TRAIN, epochs=1), "nested fit"),
    "close": (lambda t: t.close(), "StopTraining"),
    "load_state_dict": (lambda t: t.load_state_dict(_trainer().state_dict()), "weights it did not train"),
}


@pytest.mark.parametrize("method", list(CALLS))
def test_a_callback_cannot_refit_close_or_replace_the_weights(tmp_path, method) -> None:
    call, why = CALLS[method]
    t = _trainer()
    seen = []

    def callback(record: dict) -> None:
        seen.append(record["epoch"])
        if record["epoch"] == 2:
            call(t)

    with pytest.raises(FastnnError) as info:
        t.fit(*TRAIN, epochs=4, eval_data=EVAL, callbacks=[callback])
    message = str(info.value)
    assert f"Trainer.{method} was called while this trainer's fit is running" in message and why in message
    assert seen == [1, 2]
    _assert_like(t, _reference(2))  # ended as a fit stopped after epoch 2: nothing retrained, replaced or closed
    t.fit(*TRAIN, epochs=2, eval_data=EVAL)  # still open and usable, and goes on exactly
    _assert_like(t, _reference(4))
    t.save(tmp_path / "m.npz")
    _assert_like(Trainer.load(tmp_path / "m.npz", device="cpu"), t)
    t.close()  # and closes once fit has returned


def test_an_estimators_partial_fit_from_its_trainers_callback_is_refused() -> None:
    """scikit-learn's partial_fit goes through the same trainer: refused too, the estimator unchanged."""
    pytest.importorskip("sklearn")
    from fastnn.sklearn import MLPClassifier

    clf = MLPClassifier(hidden_layer_sizes=(16,), batch_size=16, device="cpu")
    clf.partial_fit(*TRAIN, classes=np.arange(C))
    n_iter, curve = clf.n_iter_, list(clf.loss_curve_)
    with pytest.raises(FastnnError, match="Trainer.fit was called while this trainer's fit is running"):
        clf.trainer_.fit(*TRAIN, epochs=3, callbacks=[lambda record: clf.partial_fit(*TRAIN)])
    assert clf.trainer_.epoch == 2 and (clf.n_iter_, clf.loss_curve_) == (n_iter, curve)


@pytest.mark.gpu
@pytest.mark.parametrize("method", list(CALLS))
def test_a_callback_cannot_refit_close_or_replace_the_weights_on_the_gpu(engine: str, method: str) -> None:
    """On the GPU a close() there failed later with a misleading ConfigError; the engine queues epochs ahead."""
    from test_training_control_gpu import _assert_close, _gpu, _state

    call = {
        "fit": lambda t: t.fit(*TRAIN, epochs=1),
        "close": lambda t: t.close(),
        "load_state_dict": lambda t: t.load_state_dict(t.state_dict()),
    }[method]
    with _gpu(engine) as t:

        def at_2(record: dict) -> None:
            if record["epoch"] == 2:
                call(t)

        with pytest.raises(FastnnError, match=f"Trainer.{method} was called while this trainer's fit is running"):
            t.fit(*TRAIN, epochs=8, callbacks=[at_2])
        assert (t.epoch, t.step, t.history["epoch"]) == (2, 8, [1, 2])
        _assert_close(_state(t), _state(_reference(2)))
        t.fit(*TRAIN, epochs=1)  # still usable
        assert t.epoch == 3


def test_a_second_threads_fit_is_refused_while_the_first_validates() -> None:
    """The "already fitting" check and its flag are one step: a thread whose fit starts while another thread's
    fit of the same trainer is still validating (here: building its learning-rate table) is refused by name,
    and the first fit trains as if alone."""
    import threading

    entered, release = threading.Event(), threading.Event()
    first = []

    def schedule(step: int) -> float:  # holds the first thread inside fit's validation until released
        if threading.current_thread() is not threading.main_thread() and not first:
            first.append(step)
            entered.set()
            release.wait(10)
        return 0.1

    t = _trainer(schedule=schedule)
    errors: list[BaseException] = []

    def fit_in_thread() -> None:
        try:
            t.fit(*TRAIN, epochs=2)
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    worker = threading.Thread(target=fit_in_thread)
    worker.start()
    try:
        assert entered.wait(10)
        with pytest.raises(FastnnError, match=r"Trainer\.fit was called while this trainer's fit is running"):
            t.fit(*TRAIN, epochs=1)
    finally:
        release.set()
        worker.join(30)
    assert not errors and (t.epoch, len(t.history)) == (2, 2)  # the first fit alone trained and recorded
    t.close()
