"""The progress display of fit: a stream that fails (a broken pipe, a closed stdout) turns the display off with
one warning and never stops the training."""

from __future__ import annotations

import contextlib
import io
import os
import warnings

import numpy as np
import pytest
from test_training_control import EVAL, TRAIN, _reference, _trainer

from fastnn import EarlyStopping, Trainer
from fastnn import _progress as progress_module

EPOCHS = 6


@contextlib.contextmanager
def _broken_pipe():
    """A text stream over a pipe whose reader has gone, as after `| head -1`: every flushed write raises
    BrokenPipeError (Python ignores SIGPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    stream = open(write_end, "w")  # noqa: SIM115 - closed below, whatever the test did
    try:
        yield stream
    finally:
        with contextlib.suppress(BrokenPipeError):
            stream.close()


def _closed() -> io.StringIO:
    stream = io.StringIO()
    stream.close()
    return stream


@pytest.mark.parametrize("tqdm", [True, False], ids=["tqdm", "plain"])
@pytest.mark.parametrize("failure", ["broken pipe", "closed stdout"])
def test_a_failing_display_never_stops_the_training(monkeypatch, tmp_path, failure, tqdm) -> None:
    if tqdm:
        pytest.importorskip("tqdm")
    monkeypatch.setattr(progress_module, "_have_tqdm", lambda: tqdm)
    reference = _reference(EPOCHS)
    with contextlib.ExitStack() as stack:
        stream = stack.enter_context(_broken_pipe()) if failure == "broken pipe" else _closed()
        monkeypatch.setattr("sys.stdout", stream)
        t = _trainer()
        with pytest.warns(RuntimeWarning, match="progress display turned off, training goes on") as caught:
            stop = EarlyStopping(100, restore_best=False)  # its closing note is shown too
            history = t.fit(*TRAIN, epochs=EPOCHS, eval_data=EVAL, progress=True, early_stopping=stop)
        assert len([w for w in caught if "progress display" in str(w.message)]) == 1  # one warning, not one a line
        monkeypatch.undo()
    assert len(history) == EPOCHS and (t.epoch, t.step) == (reference.epoch, reference.step)
    assert [{**r, "seconds": 0} for r in t.history] == [{**r, "seconds": 0} for r in reference.history]
    for name, value in reference._engine.get_state().items():
        np.testing.assert_array_equal(t._engine.get_state()[name], value, err_msg=name)
    path = tmp_path / "m.npz"
    t.save(path)
    assert Trainer.load(path, device="cpu").history == t.history
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the next fit shows progress again, on a working stream
        buffer = io.StringIO()
        monkeypatch.setattr("sys.stdout", buffer)
        t.fit(*TRAIN, epochs=1, progress=True)
    assert f"epoch {EPOCHS + 1}/{EPOCHS + 1}" in buffer.getvalue()


def test_a_verbose_estimator_fits_with_a_closed_stdout(monkeypatch) -> None:
    """scikit-learn's verbose=True takes the same path (a closed sys.stdout: a daemon, a notebook torn down)."""
    pytest.importorskip("sklearn")
    from sklearn.exceptions import ConvergenceWarning

    from fastnn.sklearn import MLPClassifier

    monkeypatch.setattr("sys.stdout", _closed())
    clf = MLPClassifier(hidden_layer_sizes=(16,), max_iter=3, batch_size=16, verbose=True, device="cpu")
    with pytest.warns(RuntimeWarning, match="progress display turned off"), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(*TRAIN)
    assert clf.n_iter_ == 3 and clf.trainer_.epoch == 3
