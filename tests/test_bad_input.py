"""Bad input: each case raises the right fastnn error naming the argument, before any work, losing nothing."""

from __future__ import annotations

import math
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from _checkpoints import rewrite

from fastnn import (
    MLP,
    SGD,
    AdamW,
    ConfigError,
    DataError,
    FastnnError,
    Trainer,
    TrainingDiverged,
)
from fastnn import _checkpoint as ckpt
from fastnn._model import init_parameters
from fastnn.schedules import Constant, Cosine, StepDecay, steps_per_epoch

D, C = 10, 3


def _data(n: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, D)).astype(np.uint8), rng.integers(0, C, size=n)


@pytest.fixture
def trained() -> Trainer:
    """A trainer one epoch in: every failing call below must leave it exactly as it is."""
    x, y = _data()
    t = Trainer(MLP([D, 8, C]), SGD(lr=0.1, momentum=0.9), batch_size=16, device="cpu")
    t.fit(x, y, epochs=1, eval_data=(x, y))
    return t


def _fails_cleanly(t: Trainer, call: Callable[[], object], error: type[Exception], *names: str) -> None:
    """`call` raises `error` whose message names each of `names`; t's parameters, optimizer state and counters
    are unchanged."""
    before = t._engine.get_state()  # parameters and optimizer state ("opt.<state>.<param>")
    assert any(k.startswith("opt.") for k in before) or not t.optimizer.state_names
    counters = (t.epoch, t.step, list(t.history))
    with pytest.raises(error) as info:
        call()
    for name in names:
        assert name in str(info.value), f"{name!r} not named in: {info.value}"
    assert isinstance(info.value, FastnnError)
    after = t._engine.get_state()
    assert sorted(after) == sorted(before)
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    assert (t.epoch, t.step, list(t.history)) == counters


X, Y = _data()
XF = X.astype(np.float32)

FIT_CASES = {
    "y shorter than x": (dict(x=X, y=Y[:-1]), DataError, ["y", "63 labels", "64 rows"]),
    "y longer than x": (dict(x=X[:10], y=Y), DataError, ["y", "64 labels", "10 rows"]),
    "x 1-D": (dict(x=X[0], y=Y[:1]), DataError, ["x", "(10,)"]),
    "x 3-D": (dict(x=X.reshape(64, 2, 5), y=Y), DataError, ["x", "(64, 2, 5)"]),
    "y 2-D": (dict(x=X, y=Y.reshape(64, 1)), DataError, ["y", "(64, 1)"]),
    "x wider than the model": (dict(x=np.zeros((64, D + 1), np.uint8), y=Y), DataError, ["x", f"{D + 1} features"]),
    "label == classes": (dict(x=X, y=np.where(Y == 0, C, Y)), DataError, ["y", f"label {C}"]),
    "negative label": (dict(x=X, y=np.where(Y == 0, -1, Y)), DataError, ["y", "label -1"]),
    "float labels": (dict(x=X, y=Y.astype(np.float64)), DataError, ["y", "integer", "float64"]),
    "fractional labels": (dict(x=X, y=Y + 0.5), DataError, ["y", "integer", "float64"]),
    "string labels": (dict(x=X, y=Y.astype(str)), DataError, ["y", "strings", "numpy.unique", "MLPClassifier"]),
    "ragged y": (dict(x=X[:2], y=[[0, 1], [2]]), DataError, ["y", "list", "ragged"]),
    "NaN in x": (
        dict(x=np.where(np.eye(64, D, k=3, dtype=bool), np.nan, XF), y=Y),
        DataError,
        ["x", "nan", "row 0, column 3"],
    ),
    "inf in x": (
        dict(x=np.where(np.eye(64, D, k=-5, dtype=bool), np.inf, XF), y=Y),
        DataError,
        ["x", "got inf", "row 5, column 0"],
    ),
    "-inf in x": (
        dict(x=np.where(np.eye(64, D, k=-7, dtype=bool), -np.inf, XF), y=Y),
        DataError,
        ["x", "-inf", "row 7"],
    ),
    "object x": (dict(x=np.array([["a"] * D] * 64), y=Y), DataError, ["x", "dtype", "<U1"]),
    "empty x": (dict(x=np.zeros((0, D), np.uint8), y=np.zeros(0, int)), DataError, ["x", "empty", f"(0, {D})"]),
    "empty y": (dict(x=X, y=np.zeros(0, int)), DataError, ["y", "0 labels"]),
    "epochs < 0": (dict(x=X, y=Y, epochs=-1), ConfigError, ["epochs", "got -1"]),
    "epochs float": (dict(x=X, y=Y, epochs=1.5), ConfigError, ["epochs", "got 1.5"]),
    "eval_every 0": (dict(x=X, y=Y, eval_data=(X, Y), eval_every=0), ConfigError, ["eval_every", "got 0"]),
    "eval_data not a pair": (dict(x=X, y=Y, eval_data=X), DataError, ["eval_data", "pair", "got array("]),
    "eval_data triple": (dict(x=X, y=Y, eval_data=(X, Y, Y)), DataError, ["eval_data", "pair", "tuple of 3 items"]),
    "eval_data wrong width": (dict(x=X, y=Y, eval_data=(X[:, :5], Y)), DataError, ["eval_data[0]", "5 features"]),
    "eval_data lengths": (dict(x=X, y=Y, eval_data=(X, Y[:9])), DataError, ["eval_data[1]", "9 labels", "64 rows"]),
    "eval_data bad label": (dict(x=X, y=Y, eval_data=(X, Y + C)), DataError, ["eval_data[1]", f"label {C + 2}"]),
    "eval_data empty": (
        dict(x=X, y=Y, eval_data=(np.zeros((0, D), np.uint8), np.zeros(0, int))),
        DataError,
        ["eval_data[0]", "empty", f"(0, {D})"],
    ),
    "eval_data NaN": (
        dict(x=X, y=Y, eval_data=(np.where(np.eye(64, D, k=-2, dtype=bool), np.nan, XF), Y)),
        DataError,
        ["eval_data[0]", "nan", "row 2, column 0"],
    ),
    "eval_data ragged y": (
        dict(x=X, y=Y, eval_data=(X[:2], [[0], [1, 2]])),
        DataError,
        ["eval_data[1]", "list", "ragged"],
    ),
    "progress not bool": (dict(x=X, y=Y, progress="yes"), ConfigError, ["progress", "'yes'"]),
}


@pytest.mark.parametrize("case", list(FIT_CASES))
def test_fit_rejects(trained: Trainer, case: str) -> None:
    kwargs, error, names = FIT_CASES[case]
    kwargs = {"epochs": 2, **kwargs}
    _fails_cleanly(trained, lambda: trained.fit(**kwargs), error, *names)


def test_eval_data_checked_even_when_x_is_good_and_epochs_zero(trained: Trainer) -> None:
    _fails_cleanly(trained, lambda: trained.fit(X, Y, epochs=0, eval_data=(X, Y[:3])), DataError, "eval_data[1]")


def test_drop_last_with_too_few_rows() -> None:
    t = Trainer(MLP([D, C]), batch_size=100, drop_last=True, device="cpu")
    _fails_cleanly(t, lambda: t.fit(X, Y), DataError, "batch_size=100", "drop_last", "64 rows")


@pytest.mark.parametrize(
    "schedule,names",
    [
        (lambda step: 0.1 if step < 5 else float("nan"), ["schedule(5)", "nan"]),
        (lambda step: -0.1, ["schedule(4)", "-0.1"]),  # step 4: the trained fixture has done 4 steps
        (lambda step: 0.1 if step != 7 else 1 / 0, ["schedule(7)", "ZeroDivisionError"]),
    ],
)
def test_bad_schedule_fails_before_any_step(trained: Trainer, schedule, names) -> None:
    t = Trainer(MLP([D, 8, C]), SGD(lr=0.1), batch_size=16, device="cpu", schedule=schedule)
    t.load_state_dict(trained.state_dict())
    t.epoch, t.step = trained.epoch, trained.step
    _fails_cleanly(t, lambda: t.fit(X, Y, epochs=2), ConfigError, *names)


def test_evaluate_and_predict_reject(trained: Trainer) -> None:
    _fails_cleanly(trained, lambda: trained.evaluate(X, Y[:5]), DataError, "y", "5 labels", "64 rows")
    _fails_cleanly(trained, lambda: trained.evaluate(X[:, :4], Y), DataError, "x", "4 features")
    _fails_cleanly(trained, lambda: trained.predict(np.zeros((0, D))), DataError, "x", "empty", f"(0, {D})")
    _fails_cleanly(trained, lambda: trained.predict_proba(XF * np.nan), DataError, "x", "nan", "row 0, column 0")


CONSTRUCTOR_CASES = {
    "batch_size 0": (dict(batch_size=0), ["batch_size", "got 0"]),
    "batch_size negative": (dict(batch_size=-4), ["batch_size", "got -4"]),
    "batch_size float": (dict(batch_size=16.0), ["batch_size", "got 16.0"]),
    "batch_size bool": (dict(batch_size=True), ["batch_size", "got True"]),
    "precision": (dict(precision="bf16"), ["precision", "'bf16'"]),
    "device": (dict(device="tpu"), ["device", "'tpu'"]),
    "seed negative": (dict(seed=-1), ["seed", "got -1"]),
    "seed too big": (dict(seed=2**64), ["seed", str(2**64)]),
    "normalize std 0": (dict(normalize=(0.5, 0.0)), ["normalize", "(0.5, 0.0)"]),
    "normalize not a pair": (dict(normalize=0.5), ["normalize", "got 0.5"]),
    "drop_last": (dict(drop_last="no"), ["drop_last", "'no'"]),
    "optimizer type": (dict(optimizer="sgd"), ["optimizer", "'sgd'"]),
    "model type": (dict(model=[D, C]), ["model", f"[{D}, {C}]"]),
    "schedule not callable": (dict(schedule=0.1), ["schedule", "got 0.1"]),
}


@pytest.mark.parametrize("case", list(CONSTRUCTOR_CASES))
def test_trainer_rejects(case: str) -> None:
    kwargs, names = CONSTRUCTOR_CASES[case]
    args = {"model": MLP([D, C]), "device": "cpu", **kwargs}
    with pytest.raises(ConfigError) as info:
        Trainer(**args)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize("lr", [0.0, -0.1, math.nan, math.inf, -math.inf, "fast", True, "0.1", None])
@pytest.mark.parametrize("opt", [SGD, AdamW])
def test_lr_must_be_finite_and_positive(opt, lr) -> None:
    with pytest.raises(ConfigError) as info:
        opt(lr=lr)
    assert "lr" in str(info.value) and f"got {lr!r}" in str(info.value), info.value


OPTIMIZER_CASES = {
    "nesterov str": (SGD, dict(momentum=0.9, nesterov="no"), "nesterov", "'no'"),
    "nesterov int": (SGD, dict(momentum=0.9, nesterov=1), "nesterov", "got 1"),
    "nesterov None": (SGD, dict(momentum=0.9, nesterov=None), "nesterov", "None"),
    "nesterov without momentum": (SGD, dict(nesterov=True), "nesterov", "momentum=0.0"),
    "momentum bool": (SGD, dict(momentum=True), "momentum", "True"),
    "momentum str": (SGD, dict(momentum="0.9"), "momentum", "'0.9'"),
    "momentum 1": (SGD, dict(momentum=1.0), "momentum", "got 1.0"),
    "sgd weight_decay bool": (SGD, dict(weight_decay=False), "weight_decay", "False"),
    "sgd weight_decay str": (SGD, dict(weight_decay="0"), "weight_decay", "'0'"),
    "adamw weight_decay negative": (AdamW, dict(weight_decay=-0.1), "weight_decay", "-0.1"),
    "betas bool": (AdamW, dict(betas=(True, 0.999)), "betas[0]", "True"),
    "betas str": (AdamW, dict(betas=(0.9, "0.999")), "betas[1]", "'0.999'"),
    "betas one number": (AdamW, dict(betas=0.9), "betas", "0.9"),
    "betas three": (AdamW, dict(betas=(0.9, 0.99, 0.999)), "betas", "(0.9, 0.99, 0.999)"),
    "eps bool": (AdamW, dict(eps=True), "eps", "True"),
    "eps str": (AdamW, dict(eps="1e-8"), "eps", "'1e-8'"),
    "eps 0": (AdamW, dict(eps=0.0), "eps", "0.0"),
}


@pytest.mark.parametrize("case", list(OPTIMIZER_CASES))
def test_optimizer_rejects(case: str) -> None:
    cls, kwargs, name, value = OPTIMIZER_CASES[case]
    with pytest.raises(ConfigError) as info:
        cls(**kwargs)
    assert name in str(info.value) and value in str(info.value), info.value


def test_optimizer_accepts_numpy_numbers_and_bools() -> None:
    opt = SGD(lr=np.float32(0.5), momentum=np.float64(0.9), nesterov=np.bool_(True))
    assert opt.nesterov is True and isinstance(opt.lr, float) and opt.lr == 0.5
    assert SGD(momentum=0.9, nesterov=False).nesterov is False
    assert AdamW(lr=1, betas=[0.8, 0.9], eps=1e-6).betas == (0.8, 0.9)


SCHEDULE_CASES = {
    "total_steps str": (lambda: Cosine(total_steps="a"), "total_steps", "'a'"),
    "total_steps nan": (lambda: Cosine(total_steps=math.nan), "total_steps", "nan"),
    "total_steps inf": (lambda: Cosine(total_steps=math.inf), "total_steps", "inf"),
    "total_steps bool": (lambda: Cosine(total_steps=True), "total_steps", "True"),
    "total_steps 0": (lambda: Cosine(total_steps=0), "total_steps", "got 0"),
    "total_steps fraction": (lambda: Cosine(total_steps=2.5), "total_steps", "2.5"),
    "warmup_steps str": (lambda: Cosine(total_steps=10, warmup_steps="1"), "warmup_steps", "'1'"),
    "warmup_steps too many": (lambda: Cosine(total_steps=10, warmup_steps=10), "warmup_steps", "got 10"),
    "min_lr str": (lambda: Cosine(total_steps=10, min_lr="0"), "min_lr", "'0'"),
    "min_lr nan": (lambda: Cosine(total_steps=10, min_lr=math.nan), "min_lr", "nan"),
    "cosine lr str": (lambda: Cosine(total_steps=10, lr="0.1"), "lr", "'0.1'"),
    "gamma str": (lambda: StepDecay(5, gamma="a"), "gamma", "'a'"),
    "gamma bool": (lambda: StepDecay(5, gamma=True), "gamma", "True"),
    "gamma 0": (lambda: StepDecay(5, gamma=0.0), "gamma", "0.0"),
    "gamma inf": (lambda: StepDecay(5, gamma=math.inf), "gamma", "inf"),
    "step_size str": (lambda: StepDecay("5"), "step_size", "'5'"),
    "step_size nan": (lambda: StepDecay(math.nan), "step_size", "nan"),
    "constant lr negative": (lambda: Constant(-1.0), "lr", "-1.0"),
    "steps rows negative": (lambda: steps_per_epoch(-1, 8), "rows", "-1"),
    "steps batch 0": (lambda: steps_per_epoch(10, 0), "batch_size", "got 0"),
    "steps drop_last str": (lambda: steps_per_epoch(10, 3, "yes"), "drop_last", "'yes'"),
}


@pytest.mark.parametrize("case", list(SCHEDULE_CASES))
def test_schedule_rejects(case: str) -> None:
    make, name, value = SCHEDULE_CASES[case]
    with pytest.raises(ConfigError) as info:
        make()
    assert name in str(info.value) and value in str(info.value), info.value


def test_steps_per_epoch_counts_what_an_epoch_trains() -> None:
    """The public count a schedule's total_steps needs: the short last batch is a step unless drop_last."""
    assert [steps_per_epoch(n, 32) for n in (0, 1, 32, 33, 64)] == [0, 1, 1, 2, 2]
    assert [steps_per_epoch(n, 32, drop_last=True) for n in (31, 32, 65)] == [0, 1, 2]
    x, y = np.zeros((65, 3), np.float32), np.arange(65) % 2
    with Trainer(MLP([3, 2]), batch_size=32, device="cpu") as t:
        t.fit(x, y, epochs=2, progress=False)
        assert t.step == 2 * steps_per_epoch(65, 32) == 6


def test_schedules_accept_integral_floats_and_numpy_ints() -> None:
    c = Cosine(total_steps=10.0, warmup_steps=np.int64(2))
    assert (c.total_steps, c.warmup_steps) == (10, 2) and isinstance(c.total_steps, int)
    assert StepDecay(np.int32(3), gamma=np.float32(0.5)).step_size == 3


@pytest.mark.parametrize(
    "sizes,value",
    [([True, C], "True"), ([D, False, C], "False"), ([D, np.bool_(True), C], "True"), ([D, "8", C], "'8'")],
)
def test_mlp_rejects_bool_and_str_sizes(sizes, value) -> None:
    with pytest.raises(ConfigError) as info:
        MLP(sizes)
    assert "sizes" in str(info.value) and value in str(info.value), info.value


def test_mlp_sizes_from_a_generator() -> None:
    assert MLP(s for s in (D, 8, C)).sizes == (D, 8, C)


def test_unknown_activation() -> None:
    with pytest.raises(ConfigError, match="activation.*swish"):
        MLP([D, C], activation="swish")


# ---- divergence --------------------------------------------------------------------------------------------


def test_divergence_at_lr_1e6_keeps_the_last_finite_epoch() -> None:
    x, y = _data(256)
    model = MLP([D, 64, 64, C])
    t = Trainer(model, SGD(lr=1e6), batch_size=32, device="cpu")
    with pytest.raises(TrainingDiverged) as info:
        t.fit(x, y, epochs=3)
    assert info.value.epoch == 1 and "epoch 1" in str(info.value) and not math.isfinite(info.value.loss)
    for k, v in init_parameters(model, 0).items():  # nothing finite was trained: the initial weights stay
        np.testing.assert_array_equal(t.state_dict()[k], v, err_msg=k)
    assert (t.epoch, t.step, len(t.history)) == (0, 0, 0)


def test_divergence_in_a_later_epoch() -> None:
    x, y = _data(256)
    # Epochs 1 and 2 at lr 0.05, then 1e6: epoch 3 diverges (epochs are numbered from 1).
    t = Trainer(
        MLP([D, 64, 64, C]), SGD(lr=0.05), batch_size=32, device="cpu", schedule=lambda s: 0.05 if s < 16 else 1e6
    )
    t.fit(x, y, epochs=2)
    kept = t.state_dict()
    with pytest.raises(TrainingDiverged, match="epoch 3") as info:
        t.fit(x, y, epochs=3)
    assert info.value.epoch == 3
    for k, v in kept.items():
        np.testing.assert_array_equal(t.state_dict()[k], v, err_msg=k)
    assert (t.epoch, t.step, len(t.history)) == (2, 16, 2)


# ---- checkpoints -------------------------------------------------------------------------------------------


def test_save_is_atomic(trained: Trainer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "model.npz"
    trained.save(path)
    good = path.read_bytes()
    x, y = _data()
    trained.fit(x, y, epochs=1)

    def broken_savez(f, **arrays):
        f.write(b"PK\x03\x04 half a zip")  # a crash midway through writing
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.np, "savez", broken_savez)
    with pytest.raises(DataError, match="disk full") as info:
        trained.save(path)
    assert str(path) in str(info.value) and isinstance(info.value.__cause__, OSError)
    monkeypatch.undo()

    def broken_replace(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(ckpt.os, "replace", broken_replace)
    with pytest.raises(DataError, match="rename failed"):
        trained.save(path)
    monkeypatch.undo()
    assert path.read_bytes() == good  # the old checkpoint is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.npz"]  # and no temp file is left
    assert Trainer.load(path, device="cpu").epoch == 1


def _assert_rejected(path: Path, *words: str) -> None:
    with pytest.raises(DataError) as info:
        Trainer.load(path, device="cpu")
    assert str(path) in str(info.value)
    for w in words:
        assert w in str(info.value), f"{w!r} not in: {info.value}"


def test_load_rejects_non_checkpoints(trained: Trainer, tmp_path: Path) -> None:
    _assert_rejected(tmp_path / "missing.npz", "does not exist")
    (tmp_path / "text.npz").write_text("hello")
    _assert_rejected(tmp_path / "text.npz", "not a fastnn checkpoint")
    np.save(tmp_path / "array.npy", np.zeros(3))
    _assert_rejected(tmp_path / "array.npy", "not a fastnn checkpoint")
    np.savez(tmp_path / "plain.npz", w=np.zeros(3))
    _assert_rejected(tmp_path / "plain.npz", "not a fastnn checkpoint", "marker")
    np.savez(tmp_path / "pickled.npz", w=np.array([{"a": 1}], dtype=object))
    _assert_rejected(tmp_path / "pickled.npz", "not a fastnn checkpoint")
    with zipfile.ZipFile(tmp_path / "zip.npz", "w") as z:
        z.writestr("readme.txt", "not numpy")
    _assert_rejected(tmp_path / "zip.npz", "not a fastnn checkpoint")
    _assert_rejected(tmp_path, "does not exist or is not a file")


def test_load_rejects_newer_or_inconsistent_checkpoints(trained: Trainer, tmp_path: Path) -> None:
    src = tmp_path / "good.npz"
    trained.save(src)
    assert Trainer.load(src, device="cpu").epoch == 1
    with np.load(src) as npz:
        files = dict(npz.items())
    files["__fastnn_version__"] = np.array(ckpt.VERSION + 1)
    np.savez(tmp_path / "newer.npz", **files)
    _assert_rejected(tmp_path / "newer.npz", "version", str(ckpt.VERSION + 1))

    def wrong_shape(config, arrays):
        arrays["0.weight"] = arrays["0.weight"][:, :-1]

    _assert_rejected(rewrite(src, tmp_path / "shape.npz", wrong_shape), "0.weight", "shape")

    def no_momentum(config, arrays):
        del arrays["opt.momentum.2.bias"]

    _assert_rejected(rewrite(src, tmp_path / "nomom.npz", no_momentum), "opt.momentum.2.bias", "missing")

    def bad_config(config, arrays):
        config["model"]["sizes"] = [D, 0, C]

    _assert_rejected(rewrite(src, tmp_path / "config.npz", bad_config), "config", "sizes", f"[{D}, 0, {C}]")

    def nan_weight(config, arrays):
        arrays["2.bias"] = np.full_like(arrays["2.bias"], np.nan)

    _assert_rejected(rewrite(src, tmp_path / "nan.npz", nan_weight), "2.bias", "finite")


def _set(*keys: str | int, value: object) -> Callable[[dict, dict], None]:
    """An edit for `_rewrite` that sets config[keys[0]][keys[1]]... to `value`."""

    def edit(config: dict, arrays: dict) -> None:
        target = config
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value

    return edit


def _drop(key: str) -> Callable[[dict, dict], None]:
    def edit(config: dict, arrays: dict) -> None:
        del config[key]

    return edit


BAD_CONFIGS = {
    "precision": (_set("precision", value="bf16"), ["precision", "'bf16'"]),
    "batch_size 0": (_set("batch_size", value=0), ["batch_size", "got 0"]),
    "batch_size str": (_set("batch_size", value="16"), ["batch_size", "'16'"]),
    "seed negative": (_set("seed", value=-3), ["seed", "got -3"]),
    "normalize": (_set("normalize", value=[0.5, 0.0]), ["normalize", "[0.5, 0.0]"]),
    "drop_last": (_set("drop_last", value="no"), ["drop_last", "'no'"]),
    "lr": (_set("optimizer", "lr", value=-1.0), ["lr", "-1.0"]),
    "nesterov": (_set("optimizer", "nesterov", value="yes"), ["nesterov", "'yes'"]),
    "optimizer class": (_set("optimizer", "class", value="Adam"), ["'Adam'"]),
    "activation": (_set("model", "activation", value="swish"), ["activation", "'swish'"]),
    "epoch": (_set("epoch", value=-1), ["epoch", "got -1"]),
    "missing batch_size": (_drop("batch_size"), ["batch_size"]),
    "history not a list": (_set("history", value={"epoch": 0}), ["history", "dict"]),
    "history record keys": (_set("history", 0, value={"epoch": 0}), ["history[0]", "'epoch': 0"]),
    "history seconds str": (_set("history", 0, "seconds", value="s"), ["history[0]['seconds']", "'s'"]),
    "history epoch float": (_set("history", 0, "epoch", value=0.5), ["history[0]['epoch']", "0.5"]),
    "history loss None": (_set("history", 0, "train_loss", value=None), ["history[0]['train_loss']", "None"]),
    "history eval bool": (_set("history", 0, "eval_accuracy", value=True), ["history[0]['eval_accuracy']", "True"]),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_load_rejects_bad_config_values(trained: Trainer, tmp_path: Path, case: str) -> None:
    src = tmp_path / "good.npz"
    trained.save(src)
    str(Trainer.load(src, device="cpu").history)  # the unedited file loads and its history prints
    edit, words = BAD_CONFIGS[case]
    _assert_rejected(rewrite(src, tmp_path / "bad.npz", edit), "invalid config", *words)


def test_load_keeps_the_callers_argument_errors_as_config_errors(trained: Trainer, tmp_path: Path) -> None:
    src = tmp_path / "good.npz"
    trained.save(src)
    with pytest.raises(ConfigError, match="device.*'tpu'"):
        Trainer.load(src, device="tpu")
    with pytest.raises(ConfigError, match="schedule.*0.1"):
        Trainer.load(src, device="cpu", schedule=0.1)


def test_save_into_a_missing_folder_names_the_target(trained: Trainer, tmp_path: Path) -> None:
    target = tmp_path / "no-such-folder" / "model.npz"
    with pytest.raises(DataError) as info:
        trained.save(target)
    assert str(target) in str(info.value) and "does not exist" in str(info.value), info.value
    assert ".tmp" not in str(info.value) and ".part" not in str(info.value)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(DataError, match="is a folder"):
        trained.save(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_load_state_dict_rejects(trained: Trainer) -> None:
    sd = trained.state_dict()
    _fails_cleanly(
        trained,
        lambda: trained.load_state_dict({**sd, "0.weight": sd["0.weight"].T}),
        DataError,
        "0.weight",
        f"shape {sd['0.weight'].T.shape}",
    )
    missing = {k: v for k, v in sd.items() if k != "2.bias"}
    _fails_cleanly(trained, lambda: trained.load_state_dict(missing), DataError, "2.bias", "missing")
    _fails_cleanly(
        trained, lambda: trained.load_state_dict({**sd, "4.weight": sd["0.bias"]}), DataError, "4.weight", "unexpected"
    )
    bad = {**sd, "0.bias": np.full_like(sd["0.bias"], np.inf)}
    _fails_cleanly(trained, lambda: trained.load_state_dict(bad), DataError, "0.bias", "finite")
    _fails_cleanly(trained, lambda: trained.load_state_dict([1, 2]), DataError, "state_dict", "list")


def test_save_leaves_no_temp_file_and_keeps_the_name(trained: Trainer, tmp_path: Path) -> None:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        trained.save("plain-name")  # a bare file name in the current folder, no .npz suffix added
    finally:
        os.chdir(cwd)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain-name"]
    assert Trainer.load(tmp_path / "plain-name", device="cpu").step == trained.step


@pytest.mark.parametrize("dtype", [np.float64, object])
def test_a_finite_value_beyond_float32_is_reported_as_such(dtype):
    """1e40 is finite: not "got inf ... missing values?" but what it is, where, and the fix."""
    x = np.zeros((8, D), dtype=dtype)
    x[3, 2] = 1e40
    t = Trainer(MLP([D, C]), device="cpu")
    for call in (lambda: t.fit(x, np.zeros(8, dtype=np.int64)), lambda: t.predict(x)):
        with pytest.raises(DataError, match=r"x holds 1e\+40 in row 3, column 2: a finite number, but beyond "
                                            r"float32's range .* rescale it") as err:  # fmt: skip
            call()
        assert "missing values" not in str(err.value)
    x[3, 2] = np.nan
    with pytest.raises(DataError, match=r"got nan in row 3, column 2 \(missing values"):
        t.fit(x, np.zeros(8, dtype=np.int64))
    assert t.epoch == 0
