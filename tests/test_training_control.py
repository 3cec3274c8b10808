"""Training control on the CPU: validation_split, early stopping, callbacks, progress, and one numbering of epochs.

The oracle for early stopping and callbacks is a trainer run without them: stopping at epoch n must leave
exactly the state, counters and history of a trainer that trained n epochs, and continuing from there must
equal an uninterrupted run.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from test_state_integrity import _assert_state, _state

import fastnn
from fastnn import MLP, SGD, AdamW, ConfigError, DataError, EarlyStopping, StopTraining, Trainer, TrainingDiverged
from fastnn import _progress as progress_module
from fastnn._control import split_indices
from fastnn.engine.base import Engine
from fastnn.engine.numpy_engine import NumpyEngine

D, C = 8, 3
EPOCHS = 40
OPTIMIZERS = [SGD(lr=0.05, momentum=0.9), AdamW(lr=0.01)]


def _data(n: int, seed: int, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """Three overlapping clusters; a fraction `noise` of labels redrawn. A small noisy training set overfits:
    the loss on clean held-out data falls for a few epochs, then rises."""
    rng = np.random.default_rng(seed)
    centers = np.random.default_rng(99).normal(size=(C, D)) * 0.5
    y = rng.integers(0, C, n)
    x = (centers[y] + rng.normal(size=(n, D))).astype(np.float32)
    return x, np.where(rng.random(n) < noise, rng.integers(0, C, n), y)


TRAIN = _data(64, 0, 0.3)
EVAL = _data(300, 1, 0.0)


def _trainer(opt=OPTIMIZERS[0], **kw) -> Trainer:
    return Trainer(MLP([D, 64, C]), opt, batch_size=16, device="cpu", seed=3, **kw)


def _reference(epochs: int, opt=OPTIMIZERS[0], eval_every: int = 1) -> Trainer:
    t = _trainer(opt)
    if epochs:
        t.fit(*TRAIN, epochs=epochs, eval_data=EVAL, eval_every=eval_every)
    return t


def _expected_stop(values: list, patience: int, min_delta: float, lower: bool) -> tuple[int, int | None]:
    """(best epoch, epoch stopped after or None) by the documented rule, from a history column (1-based)."""
    best, best_epoch, waited = None, 0, 0
    for epoch, v in enumerate(values, start=1):
        if v is None:
            continue
        if best is None or (best - v if lower else v - best) > min_delta:
            best, best_epoch, waited = v, epoch, 0
            continue
        waited += 1
        if waited >= patience:
            return best_epoch, epoch
    return best_epoch, None


# ---- the validation split ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,fraction", [(10, 0.2), (64, 0.25), (1001, 0.1), (7, 0.8), (100, 0.07)])
def test_split_is_a_seeded_partition(n: int, fraction: float) -> None:
    train, val = split_indices(n, fraction, seed=5)
    assert len(val) == -(-round(n * fraction * 1000) // 1000) and len(train) == n - len(val)  # 7 of 100 at 0.07
    assert np.array_equal(np.sort(np.concatenate([train, val])), np.arange(n))
    assert np.all(np.diff(train) > 0) and np.all(np.diff(val) > 0)  # ascending: the shuffle does the mixing
    again = split_indices(n, fraction, seed=5)
    assert np.array_equal(again[0], train) and np.array_equal(again[1], val)
    if n > 100:
        assert not np.array_equal(split_indices(n, fraction, seed=6)[1], val)  # keyed by the seed
        assert not np.array_equal(val, np.arange(n - len(val), n))  # not simply the last rows


def test_validation_split_takes_the_fraction_as_written() -> None:
    x, y = TRAIN[0][:10], TRAIN[1][:10]
    t = _trainer()
    t.fit(x, y, epochs=1, validation_split=np.float32(0.2))  # 0.20000000298 as a float64: ceil would hold out 3
    assert len(t._engine._x) == 8


def test_split_refuses_an_empty_part() -> None:
    with pytest.raises(DataError, match=r"validation_split=0.5 of x's 1 rows leaves 0 for training"):
        split_indices(1, 0.5, seed=0)


def test_validation_split_equals_passing_the_split_as_eval_data() -> None:
    x, y = TRAIN
    t = _trainer()
    h = t.fit(x, y, epochs=3, validation_split=0.25)
    train, val = split_indices(len(x), 0.25, seed=3)  # the trainer's seed
    ref = _trainer()
    h_ref = ref.fit(x[train], y[train], epochs=3, eval_data=(x[val], y[val]))
    for field in ("epoch", "train_loss", "train_accuracy", "eval_loss", "eval_accuracy"):  # all but the time
        assert h[field] == h_ref[field], field
    _assert_state(_state(t), _state(ref))
    assert (t.epoch, t.step) == (3, 3 * 3)  # 48 training rows: 3 steps of 16


def test_validation_split_of_an_x_changed_in_place_uses_its_new_rows() -> None:
    # Issue 23 item 8: the split was cached by x's identity, so after `x[:] = ...` the next fit trained and
    # validated on the rows x held before.
    x, y = TRAIN[0].copy(), TRAIN[1]
    t, ref = _trainer(), _trainer()
    t.fit(x, y, epochs=1, validation_split=0.25)
    ref.fit(TRAIN[0].copy(), y, epochs=1, validation_split=0.25)
    x[:] = EVAL[0][: len(x)]  # the same array, new rows
    h = t.fit(x, y, epochs=2, validation_split=0.25)
    train, val = split_indices(len(x), 0.25, seed=3)
    h_ref = ref.fit(x[train], y[train], epochs=2, eval_data=(x[val], y[val]))
    for field in ("train_loss", "train_accuracy", "eval_loss", "eval_accuracy"):
        assert h[field] == h_ref[field], field
    _assert_state(_state(t), _state(ref))


# ---- early stopping ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=["sgd-momentum", "adamw"])
def test_early_stopping_ends_at_the_best_epoch_and_continues_like_a_run_that_stopped_there(opt) -> None:
    reference = _reference(EPOCHS, opt)
    best_epoch, stop = _expected_stop(reference.history["eval_loss"], 3, 0.0, lower=True)
    assert stop is not None and 1 < best_epoch < stop < EPOCHS  # the data overfits: the test is not vacuous
    es = EarlyStopping(patience=3)
    t = _trainer(opt)
    h = t.fit(*TRAIN, epochs=EPOCHS, eval_data=EVAL, early_stopping=es)
    assert (es.best_epoch, es.stopped_epoch) == (best_epoch, stop)
    assert es.best == reference.history[best_epoch - 1]["eval_loss"]
    # Weights, optimizer state, counters and history: all at the end of the best epoch.
    at_best = _reference(best_epoch, opt)
    _assert_state(_state(t), _state(at_best))
    assert (t.epoch, t.step) == (at_best.epoch, at_best.step) == (best_epoch, best_epoch * 4)
    assert h["epoch"] == t.history["epoch"] == list(range(1, best_epoch + 1))
    assert h["eval_loss"] == reference.history["eval_loss"][:best_epoch]
    assert [r["epoch"] for r in es.discarded] == list(range(best_epoch + 1, stop + 1))
    assert [r["eval_loss"] for r in es.discarded] == reference.history["eval_loss"][best_epoch:stop]
    # Continuing equals one run of the same length (same shuffles, schedule steps, AdamW step count).
    t.fit(*TRAIN, epochs=2)
    _assert_state(_state(t), _state(_reference(best_epoch + 2, opt)))


def test_early_stopping_without_restoring_stops_after_patience() -> None:
    reference = _reference(EPOCHS)
    _, stop = _expected_stop(reference.history["eval_loss"], 2, 0.0, lower=True)
    es = EarlyStopping(patience=2, restore_best=False)
    t = _trainer()
    h = t.fit(*TRAIN, epochs=EPOCHS, eval_data=EVAL, early_stopping=es)
    assert stop is not None and es.stopped_epoch == stop == t.epoch == len(h) and es.discarded == []
    _assert_state(_state(t), _state(_reference(stop)))


@pytest.mark.parametrize(
    "monitor,min_delta,eval_every", [("eval_accuracy", 0.0, 1), ("eval_loss", 0.01, 1), ("eval_loss", 0.0, 2)]
)
def test_early_stopping_monitor_min_delta_and_eval_every(monitor: str, min_delta: float, eval_every: int) -> None:
    reference = _reference(EPOCHS, eval_every=eval_every)
    best_epoch, stop = _expected_stop(reference.history[monitor], 2, min_delta, lower=monitor == "eval_loss")
    es = EarlyStopping(patience=2, min_delta=min_delta, monitor=monitor)
    t = _trainer()
    t.fit(*TRAIN, epochs=EPOCHS, eval_data=EVAL, eval_every=eval_every, early_stopping=es)
    assert (es.best_epoch, es.stopped_epoch) == (best_epoch, stop)
    assert t.epoch == best_epoch
    _assert_state(_state(t), _state(_reference(best_epoch)))


def test_early_stopping_that_never_triggers_still_ends_at_the_best_epoch(capsys, monkeypatch) -> None:
    reference = _reference(8)
    best_epoch = int(np.argmin(reference.history["eval_loss"])) + 1
    assert best_epoch < 8
    es = EarlyStopping(patience=100)
    t = _trainer()
    monkeypatch.setattr(progress_module, "_have_tqdm", lambda: False)
    t.fit(*TRAIN, epochs=8, eval_data=EVAL, early_stopping=es, progress=True)
    assert es.stopped_epoch is None and es.best_epoch == best_epoch == t.epoch
    _assert_state(_state(t), _state(_reference(best_epoch)))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 9 and lines[-1].startswith("early stopping: all epochs trained; best eval_loss")
    assert lines[-1].endswith(f"after epoch {best_epoch}, back at the end of epoch {best_epoch}")


def test_early_stopping_accepts_true_and_a_patience_and_judges_each_call_afresh() -> None:
    t = _trainer()
    t.fit(*TRAIN, epochs=EPOCHS, validation_split=0.25, early_stopping=True)
    assert 0 < t.epoch < EPOCHS
    done = t.epoch
    t.fit(*TRAIN, epochs=3, validation_split=0.25, early_stopping=1)
    assert done < t.epoch <= done + 3  # this call's first epoch is its own best so far: at least it stays
    es = EarlyStopping(patience=2)
    for _ in range(2):  # the same object, reused: each call starts from no best
        t.fit(*TRAIN, epochs=2, validation_split=0.25, early_stopping=es)
        assert es.best_epoch is not None and es.best_epoch > done


def _records(values: list, monitor: str = "eval_loss") -> list[dict]:
    other = "eval_accuracy" if monitor == "eval_loss" else "eval_loss"
    return [{"epoch": i, monitor: v, other: 0.5} for i, v in enumerate(values, start=1)]


@pytest.mark.parametrize(
    "values,best_epoch,stopped",
    [
        ([math.nan, 0.6, 0.5], 3, None),  # the case: a NaN first evaluation became the best
        ([0.6, math.nan, 0.5], 3, None),
        ([0.6, math.nan, math.nan], 1, 3),  # NaN counts against patience like a worse value
        ([math.inf, 0.9], 2, None),
        ([math.nan, math.nan], None, 2),
    ],
)
def test_a_nan_evaluation_is_never_an_improvement(values: list, best_epoch: int | None, stopped: int | None) -> None:
    # Issue 23 item 9: early stopping took a NaN evaluation loss as the best and rewound to it.
    es = EarlyStopping(patience=2)
    improved = [es.update(r)[0] for r in _records(values)]
    assert (es.best_epoch, es.stopped_epoch) == (best_epoch, stopped)
    assert es.best is None or math.isfinite(es.best)
    assert not any(imp for imp, v in zip(improved, values) if not math.isfinite(v))
    acc = EarlyStopping(patience=2, monitor="eval_accuracy")
    assert [acc.update(r)[0] for r in _records([math.nan, 0.8], "eval_accuracy")] == [False, True]


def test_a_fit_whose_evaluations_are_nan_is_not_rewound_to_one_of_them(capsys, monkeypatch) -> None:
    # Every evaluation scores NaN, as a GPU's does on inputs that overflow its operands (the NumPy engine
    # evaluates in float64, where finite float32 inputs cannot overflow).
    es = EarlyStopping(patience=2)
    t = _trainer(precision="fp32")
    monkeypatch.setattr(t._engine, "evaluate", lambda x, y: (math.nan, math.nan))
    h = t.fit(*TRAIN, epochs=6, eval_data=EVAL, early_stopping=es, progress=True)
    assert all(math.isnan(v) for v in h["eval_loss"])
    assert (es.best_epoch, es.best, es.stopped_epoch, es.discarded) == (None, None, 2, [])
    assert (t.epoch, t.step, h["epoch"]) == (2, 8, [1, 2])  # stopped after patience, nothing rewound
    reference = _trainer(precision="fp32")
    reference.fit(*TRAIN, epochs=2)
    _assert_state(_state(t), _state(reference))
    assert capsys.readouterr().out.splitlines()[-1] == (
        "early stopping: stopped after epoch 2; no finite eval_loss was seen"
    )


# ---- callbacks -----------------------------------------------------------------------------------------------


def test_callbacks_see_every_record_once_and_copies() -> None:
    seen: list[dict] = []

    def spoil(record: dict) -> None:
        record["train_loss"] = -1.0  # a copy: the history is not changed

    t = _trainer()
    h = t.fit(*TRAIN, epochs=4, eval_data=EVAL, eval_every=2, callbacks=[spoil, seen.append])
    assert seen == list(h) == list(t.history)
    assert [r["epoch"] for r in seen] == [1, 2, 3, 4]


@pytest.mark.parametrize("how", ["return True", "raise StopTraining", "numpy bool"])
def test_a_callback_stops_after_its_epoch(how: str) -> None:
    later: list[int] = []

    def stop_at_3(record: dict):
        if record["epoch"] < 3:
            return None if how != "numpy bool" else np.bool_(False)
        if how == "raise StopTraining":
            raise StopTraining
        return True if how == "return True" else np.float64(record["epoch"]) >= 3

    t = _trainer()
    h = t.fit(*TRAIN, epochs=10, callbacks=[stop_at_3, lambda r: later.append(r["epoch"])])
    assert later == [1, 2, 3]  # a later callback still sees the stopping epoch
    assert (t.epoch, t.step, h["epoch"]) == (3, 12, [1, 2, 3])
    _assert_state(_state(t), _state(_reference(3)))


def test_other_return_values_do_not_stop() -> None:
    t = _trainer()
    t.fit(*TRAIN, epochs=3, callbacks=[lambda r: 1, lambda r: "stop", lambda r: False])
    assert t.epoch == 3


def test_an_error_in_a_callback_propagates_and_keeps_its_epoch() -> None:
    def fail_at_2(record: dict) -> None:
        if record["epoch"] == 2:
            raise RuntimeError("callback failed")

    t = _trainer()
    with pytest.raises(RuntimeError, match="callback failed"):
        t.fit(*TRAIN, epochs=5, callbacks=[fail_at_2])
    assert (t.epoch, t.step, t.history["epoch"]) == (2, 8, [1, 2])  # epoch 2 trained: it counts
    _assert_state(_state(t), _state(_reference(2)))


def test_an_interrupt_before_commit_records_the_epoch_without_calling_back_twice(monkeypatch) -> None:
    real, calls, seen = Engine.report, [0], []

    def report(self, stats, on_epoch, quiet=False):
        calls[0] += 1
        if calls[0] == 2:  # epoch 2 counts as reported, and Ctrl-C lands before on_epoch runs
            self.last_reported = stats
            raise KeyboardInterrupt
        real(self, stats, on_epoch, quiet)

    monkeypatch.setattr(Engine, "report", report)
    t = _trainer()
    with pytest.raises(KeyboardInterrupt):
        t.fit(*TRAIN, epochs=4, callbacks=[lambda r: seen.append(r["epoch"])])
    assert t.epoch == 2 and t.history["epoch"] == [1, 2]
    assert sorted(set(seen)) == seen  # no epoch called back twice


def test_training_control_adds_no_work_per_step(monkeypatch) -> None:
    """Callbacks and early stopping run once per epoch: the engine gets no per-step hook without a bar."""
    hooks = []
    real = NumpyEngine.fit_epochs

    def fit_epochs(self, *args, **kw):
        hooks.append(kw.get("on_step"))
        return real(self, *args, **kw)

    monkeypatch.setattr(NumpyEngine, "fit_epochs", fit_epochs)
    t = _trainer()
    t.fit(*TRAIN, epochs=3, validation_split=0.2, early_stopping=2, callbacks=[print], progress=False)
    assert hooks == [None]


# ---- bad arguments: named, before any work -------------------------------------------------------------------

BAD = {
    "validation_split 0": (dict(validation_split=0), ["validation_split", "0"]),
    "validation_split 1.0": (dict(validation_split=1.0), ["validation_split", "1.0"]),
    "validation_split True": (dict(validation_split=True), ["validation_split", "True"]),
    "validation_split str": (dict(validation_split="0.2"), ["validation_split", "'0.2'"]),
    "validation_split nan": (dict(validation_split=math.nan), ["validation_split", "nan"]),
    "split and eval_data": (dict(validation_split=0.2, eval_data=EVAL), ["validation_split", "eval_data"]),
    "early_stopping alone": (dict(early_stopping=True), ["early_stopping=True", "eval_data", "validation_split"]),
    "early_stopping 0": (dict(early_stopping=0, eval_data=EVAL), ["early_stopping", "0"]),
    "early_stopping str": (dict(early_stopping="yes", eval_data=EVAL), ["early_stopping", "'yes'"]),
    "early_stopping float": (dict(early_stopping=2.5, eval_data=EVAL), ["early_stopping", "2.5"]),
    "callbacks not a list": (dict(callbacks=print), ["callbacks", "print"]),
    "callback not callable": (dict(callbacks=[print, 3]), ["callbacks[1]", "3"]),
    "callback EarlyStopping": (dict(callbacks=[EarlyStopping()], eval_data=EVAL), ["callbacks[0]", "early_stopping"]),
    "progress str": (dict(progress="always"), ["progress", "'always'"]),
    "progress int": (dict(progress=1), ["progress", "1"]),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_control_arguments_are_named_before_any_work(case: str) -> None:
    kwargs, words = BAD[case]
    t = _trainer()
    before = _state(t)
    with pytest.raises(ConfigError) as info:
        t.fit(*TRAIN, epochs=2, **kwargs)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    _assert_state(_state(t), before)
    assert (t.epoch, t.step, len(t.history)) == (0, 0, 0)


def test_a_split_leaving_too_few_rows_for_a_batch_is_a_data_error() -> None:
    t = Trainer(MLP([D, C]), batch_size=60, drop_last=True, device="cpu")
    with pytest.raises(DataError, match="48 rows for training, fewer than batch_size=60"):
        t.fit(*TRAIN, validation_split=0.25)


@pytest.mark.parametrize(
    "kwargs,words",
    [
        (dict(patience=0), ["patience", "0"]),
        (dict(patience=1.5), ["patience", "1.5"]),
        (dict(min_delta=-0.1), ["min_delta", "-0.1"]),
        (dict(min_delta=math.inf), ["min_delta", "inf"]),
        (dict(monitor="train_loss"), ["monitor", "'train_loss'", "eval_accuracy"]),
        (dict(restore_best="yes"), ["restore_best", "'yes'"]),
    ],
)
def test_early_stopping_arguments_are_checked(kwargs: dict, words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        EarlyStopping(**kwargs)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"


# ---- one numbering of epochs ---------------------------------------------------------------------------------


def test_epochs_are_numbered_from_1_in_history_table_progress_and_divergence(capsys, monkeypatch) -> None:
    monkeypatch.setattr(progress_module, "_have_tqdm", lambda: False)
    t = _trainer()
    t.fit(*TRAIN, epochs=2, progress=True)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines] == ["1/2", "2/2"]
    assert [r["epoch"] for r in t.history] == [1, 2] and t.epoch == 2
    table = str(t.history).splitlines()
    assert [row.split()[0] for row in table[1:]] == ["1", "2"]
    # The third epoch diverges: it is "epoch 3", and the trainer stays at the end of epoch 2.
    t2 = _trainer(SGD(lr=0.05), schedule=lambda s: 0.05 if s < 8 else 1e30)
    with pytest.raises(TrainingDiverged, match="in epoch 3:") as info:
        t2.fit(*TRAIN, epochs=5)
    assert info.value.epoch == 3 == t2.epoch + 1


def test_history_plot_uses_the_same_numbers(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    t = _trainer()
    h = t.fit(*TRAIN, epochs=3, eval_data=EVAL)
    fig = h.plot(tmp_path / "h.png")
    for ax in fig.axes:
        for line in ax.get_lines():
            assert list(line.get_xdata()) == [1, 2, 3]


def test_checkpoints_keep_the_numbers_and_older_files_load(tmp_path: Path) -> None:
    t = _trainer()
    t.fit(*TRAIN, epochs=2, eval_data=EVAL)
    t.save(tmp_path / "new.npz")
    loaded = Trainer.load(tmp_path / "new.npz", device="cpu")
    assert loaded.history == t.history and loaded.history["epoch"] == [1, 2]
    # A file written before records were numbered from 1: no history_epoch_base, epochs 0 and 1.
    with np.load(tmp_path / "new.npz") as npz:
        files = dict(npz.items())
    config = json.loads(str(files["__fastnn_config__"]))
    assert config.pop("history_epoch_base") == 1
    for r in config["history"]:
        r["epoch"] -= 1
    files["__fastnn_config__"] = np.array(json.dumps(config))
    np.savez(tmp_path / "old.npz", **files)
    old = Trainer.load(tmp_path / "old.npz", device="cpu")
    assert old.history == t.history
    config["history_epoch_base"] = 2
    files["__fastnn_config__"] = np.array(json.dumps(config))
    np.savez(tmp_path / "bad.npz", **files)
    with pytest.raises(DataError, match="history_epoch_base must be 0 or 1, got 2"):
        Trainer.load(tmp_path / "bad.npz", device="cpu")


# ---- progress ------------------------------------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_auto_follows_the_terminal(monkeypatch) -> None:
    monkeypatch.setattr(progress_module, "_have_tqdm", lambda: False)
    for stream, shown in ((io.StringIO(), False), (_Terminal(), True)):
        monkeypatch.setattr("sys.stdout", stream)
        t = _trainer()
        t.fit(*TRAIN, epochs=2)  # progress="auto" is the default
        assert (stream.getvalue().count("\n") == 2) is shown and ("epoch 2/2" in stream.getvalue()) is shown


def test_tqdm_bar_moves_within_a_cpu_epoch_and_leaves_the_epoch_lines(monkeypatch) -> None:
    tqdm = pytest.importorskip("tqdm")
    updates: list[tuple[str, int]] = []
    real = tqdm.tqdm.update

    def update(self, n=1):
        updates.append((self.desc, self.n + n))
        return real(self, n)

    monkeypatch.setattr(tqdm.tqdm, "update", update)
    term = _Terminal()
    monkeypatch.setattr("sys.stdout", term)
    t = _trainer()
    t.fit(*TRAIN, epochs=2, eval_data=EVAL, progress=True)
    assert [n for _, n in updates] == [1, 2, 3, 4, 1, 2, 3, 4]  # 4 steps an epoch, each moves the bar
    assert {d for d, _ in updates} == {"epoch 1/2", "epoch 2/2"}
    out = term.getvalue()
    assert "epoch 1/2  loss" in out and "epoch 2/2  loss" in out and "eval acc" in out


def test_gpu_engines_get_one_line_per_epoch_with_tqdm() -> None:
    pytest.importorskip("tqdm")
    stream = _Terminal()
    gpu = progress_module.reporter(1, 3, steps=100, per_step=False, stream=stream)
    assert not gpu.per_step  # the trainer passes no per-step hook: an epoch is one graph
    record = {"epoch": 1, "train_loss": 0.5, "train_accuracy": 0.75, "eval_loss": None, "eval_accuracy": None}
    gpu.epoch({**record, "seconds": 0.001})
    assert stream.getvalue() == "epoch 1/3  loss 0.5000  acc 0.7500  0.00s\n"
    cpu = progress_module.reporter(1, 3, steps=100, per_step=True, stream=stream)
    assert cpu.per_step


def test_fit_asks_the_engine_for_steps_only_with_a_bar(monkeypatch) -> None:
    hooks = []
    real = NumpyEngine.fit_epochs

    def fit_epochs(self, *args, **kw):
        hooks.append(kw.get("on_step") is not None)
        return real(self, *args, **kw)

    monkeypatch.setattr(NumpyEngine, "fit_epochs", fit_epochs)
    monkeypatch.setattr("sys.stdout", io.StringIO())
    monkeypatch.setattr(progress_module, "_have_tqdm", lambda: False)
    _trainer().fit(*TRAIN, epochs=1, progress=True)
    monkeypatch.setattr(progress_module, "_have_tqdm", lambda: True)
    pytest.importorskip("tqdm")
    _trainer().fit(*TRAIN, epochs=1, progress=True)
    assert hooks == [False, True]


def test_exports() -> None:
    assert fastnn.EarlyStopping is EarlyStopping and fastnn.StopTraining is StopTraining
    assert issubclass(StopTraining, fastnn.FastnnError)
