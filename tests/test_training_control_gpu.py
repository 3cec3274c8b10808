"""Training control on the GPU engines against the NumPy engine: early stopping ends at the same epoch with the
same weights, a callback stops with no epoch trained past it (the engine queues epochs ahead otherwise), the
validation split is the same rows. Run on a GPU machine: `PYTHONPATH=$PWD python3 -m pytest -m gpu -q`.

Every case runs on the GPU engine matrix (the `engine` fixture, tests/conftest.py) in fp32, with the tolerance
of tests/test_gpu_engines.py's fp32 comparisons; neighbouring epochs' weights differ by more than 1% here, so a
stop one epoch late fails.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_gpu_engines import _refused
from test_training_control import EPOCHS, EVAL, OPTIMIZERS, TRAIN, _expected_stop, _reference, _state

import fastnn
from fastnn import MLP, EarlyStopping, StopTraining, Trainer
from fastnn import _progress as progress_module
from fastnn._control import split_indices

pytestmark = pytest.mark.gpu

PARAM_RTOL = 2e-4  # fp32 parameters, relative norm (README: GPU engines vs NumPy after a few epochs)
STATE_RTOL = 1e-3  # optimizer state (momentum, Adam moments): rounding accumulates in them a little more


def _gpu(engine: dict, opt=OPTIMIZERS[0], **kw) -> Trainer:
    model = MLP([8, 64, 3])
    if _refused(engine, model, opt, 16, "fp32"):
        pytest.skip("the fused engine refuses this case (checked to be allowed)")
    return Trainer(model, opt, batch_size=16, precision="fp32", device="cuda", seed=3, **engine, **kw)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _assert_close(gpu: dict[str, np.ndarray], cpu: dict[str, np.ndarray]) -> None:
    assert sorted(gpu) == sorted(cpu)
    for k in cpu:
        tol = STATE_RTOL if k.startswith("opt.") else PARAM_RTOL
        assert _rel(gpu[k], cpu[k]) < tol, (k, _rel(gpu[k], cpu[k]))


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=["sgd-momentum", "adamw"])
def test_early_stopping_ends_at_the_cpu_engines_best_epoch(engine: dict, opt) -> None:
    reference = _reference(EPOCHS, opt)
    best_epoch, stop = _expected_stop(reference.history["eval_loss"], 3, 0.0, lower=True)
    assert stop is not None and 1 < best_epoch < stop < EPOCHS
    with _gpu(engine, opt) as t:
        es = EarlyStopping(patience=3)
        h = t.fit(*TRAIN, epochs=EPOCHS, eval_data=EVAL, early_stopping=es)
        assert (es.best_epoch, es.stopped_epoch) == (best_epoch, stop)
        assert (t.epoch, t.step) == (best_epoch, best_epoch * 4)
        assert h["epoch"] == t.history["epoch"] == list(range(1, best_epoch + 1))
        np.testing.assert_allclose(h["eval_loss"], reference.history["eval_loss"][:best_epoch], rtol=1e-4)
        assert [r["epoch"] for r in es.discarded] == list(range(best_epoch + 1, stop + 1))
        _assert_close(_state(t), _state(_reference(best_epoch, opt)))  # weights and optimizer state restored
        t.fit(*TRAIN, epochs=2)  # continuing: the GPU's epoch counter and shuffle key follow the rewind
        _assert_close(_state(t), _state(_reference(best_epoch + 2, opt)))


@pytest.mark.parametrize("how", ["return True", "raise StopTraining"])
def test_a_callback_stops_the_gpu_with_no_epoch_trained_past_it(engine: dict, how: str) -> None:
    seen: list[int] = []

    def stop_at_3(record: dict):
        seen.append(record["epoch"])
        if record["epoch"] == 3:
            if how == "raise StopTraining":
                raise StopTraining
            return True
        return None

    with _gpu(engine) as t:
        h = t.fit(*TRAIN, epochs=12, callbacks=[stop_at_3])  # without a stop the engine queues 3 epochs ahead
        assert seen == [1, 2, 3] and h["epoch"] == [1, 2, 3] and (t.epoch, t.step) == (3, 12)
        _assert_close(_state(t), _state(_reference(3)))
        t.fit(*TRAIN, epochs=2)
        _assert_close(_state(t), _state(_reference(5)))


def test_an_error_in_a_callback_keeps_the_gpu_at_its_epoch(engine: dict) -> None:
    def fail_at_2(record: dict) -> None:
        if record["epoch"] == 2:
            raise RuntimeError("callback failed")

    with _gpu(engine) as t:
        with pytest.raises(RuntimeError, match="callback failed"):
            t.fit(*TRAIN, epochs=8, callbacks=[fail_at_2])
        assert (t.epoch, t.step, t.history["epoch"]) == (2, 8, [1, 2])
        _assert_close(_state(t), _state(_reference(2)))


def test_validation_split_is_the_same_on_the_gpu(engine: dict) -> None:
    cpu = Trainer(MLP([8, 64, 3]), OPTIMIZERS[0], batch_size=16, precision="fp32", device="cpu", seed=3)
    hc = cpu.fit(*TRAIN, epochs=3, validation_split=0.25)
    with _gpu(engine) as t:
        hg = t.fit(*TRAIN, epochs=3, validation_split=0.25)
        assert hg["epoch"] == hc["epoch"] == [1, 2, 3] and (t.epoch, t.step) == (cpu.epoch, cpu.step) == (3, 9)
        np.testing.assert_allclose(hg["eval_loss"], hc["eval_loss"], rtol=1e-4)
        np.testing.assert_allclose(hg["train_loss"], hc["train_loss"], rtol=1e-4)
        _assert_close(_state(t), _state(cpu))


@pytest.mark.parametrize("tqdm_installed", [False, True])
def test_gpu_progress_is_one_line_per_epoch(engine: dict, tqdm_installed: bool, capsys, monkeypatch) -> None:
    if tqdm_installed:
        pytest.importorskip("tqdm")
    monkeypatch.setattr(progress_module, "_have_tqdm", lambda: tqdm_installed)
    with _gpu(engine) as t:
        t.fit(*TRAIN, epochs=3, eval_data=EVAL, progress=True)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"]
    assert all("eval acc" in line for line in lines)


def test_divergence_on_the_gpu_names_the_epoch_from_1(engine: dict) -> None:
    with _gpu(engine, fastnn.SGD(lr=0.05), schedule=lambda s: 0.05 if s < 8 else 1e30) as t:
        t.fit(*TRAIN, epochs=2)
        with pytest.raises(fastnn.TrainingDiverged, match="in epoch 3:") as info:
            t.fit(*TRAIN, epochs=2)
        assert info.value.epoch == 3 == t.epoch + 1 and t.history["epoch"] == [1, 2]


def test_validation_split_sees_x_changed_in_place_on_the_gpu(engine: str) -> None:
    # Issue 23 item 8 on the GPU engines: an x changed in place between two fits with validation_split is split
    # and uploaded again (the engines keep a resident copy keyed by the array's identity).
    x, y = TRAIN[0].copy(), TRAIN[1]
    cpu = Trainer(MLP([8, 64, 3]), OPTIMIZERS[0], batch_size=16, precision="fp32", device="cpu", seed=3)
    with _gpu(engine) as t:
        for trainer in (cpu, t):
            trainer.fit(x, y, epochs=1, validation_split=0.25)
        x[:] = EVAL[0][: len(x)]  # the same array, new rows
        train, val = split_indices(len(x), 0.25, seed=3)
        hc = cpu.fit(x[train], y[train], epochs=2, eval_data=(x[val], y[val]))  # the new rows, split by hand
        hg = t.fit(x, y, epochs=2, validation_split=0.25)
        np.testing.assert_allclose(hg["eval_loss"], hc["eval_loss"], rtol=1e-4)
        np.testing.assert_allclose(hg["train_loss"], hc["train_loss"], rtol=1e-4)
        _assert_close(_state(t), _state(cpu))
