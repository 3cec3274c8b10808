"""Bad input: each case raises the right fastnn error naming the argument, before any work, losing nothing."""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

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
from fastnn import checkpoint as ckpt
from fastnn.model import init_parameters

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
    """`call` raises `error` whose message names each of `names`; t's weights and counters are unchanged."""
    before = t.state_dict()
    counters = (t.epoch, t.step, len(t.history))
    with pytest.raises(error) as info:
        call()
    for name in names:
        assert name in str(info.value), f"{name!r} not named in: {info.value}"
    assert isinstance(info.value, FastnnError)
    after = t.state_dict()
    for k in before:
        np.testing.assert_array_equal(after[k], before[k], err_msg=k)
    assert (t.epoch, t.step, len(t.history)) == counters


X, Y = _data()
XF = X.astype(np.float32)

FIT_CASES = {
    "y shorter than x": (dict(x=X, y=Y[:-1]), DataError, ["y"]),
    "y longer than x": (dict(x=X[:10], y=Y), DataError, ["y"]),
    "x 1-D": (dict(x=X[0], y=Y[:1]), DataError, ["x"]),
    "x 3-D": (dict(x=X.reshape(64, 2, 5), y=Y), DataError, ["x"]),
    "y 2-D": (dict(x=X, y=Y.reshape(64, 1)), DataError, ["y"]),
    "x wider than the model": (dict(x=np.zeros((64, D + 1), np.uint8), y=Y), DataError, ["x", str(D)]),
    "label == classes": (dict(x=X, y=np.where(Y == 0, C, Y)), DataError, ["y", str(C)]),
    "negative label": (dict(x=X, y=np.where(Y == 0, -1, Y)), DataError, ["y", "-1"]),
    "float labels": (dict(x=X, y=Y.astype(np.float64)), DataError, ["y", "integer"]),
    "fractional labels": (dict(x=X, y=Y + 0.5), DataError, ["y", "integer"]),
    "string labels": (dict(x=X, y=Y.astype(str)), DataError, ["y"]),
    "NaN in x": (dict(x=np.where(np.eye(64, D, dtype=bool), np.nan, XF), y=Y), DataError, ["x", "NaN"]),
    "inf in x": (dict(x=np.where(np.eye(64, D, k=3, dtype=bool), np.inf, XF), y=Y), DataError, ["x", "inf"]),
    "object x": (dict(x=np.array([["a"] * D] * 64), y=Y), DataError, ["x", "dtype"]),
    "empty x": (dict(x=np.zeros((0, D), np.uint8), y=np.zeros(0, int)), DataError, ["x", "empty"]),
    "empty y": (dict(x=X, y=np.zeros(0, int)), DataError, ["y"]),
    "epochs < 0": (dict(x=X, y=Y, epochs=-1), ConfigError, ["epochs", "-1"]),
    "epochs float": (dict(x=X, y=Y, epochs=1.5), ConfigError, ["epochs"]),
    "eval_every 0": (dict(x=X, y=Y, eval_data=(X, Y), eval_every=0), ConfigError, ["eval_every"]),
    "eval_data not a pair": (dict(x=X, y=Y, eval_data=X), DataError, ["eval_data", "pair"]),
    "eval_data triple": (dict(x=X, y=Y, eval_data=(X, Y, Y)), DataError, ["eval_data", "pair"]),
    "eval_data wrong width": (dict(x=X, y=Y, eval_data=(X[:, :5], Y)), DataError, ["eval_data[0]"]),
    "eval_data lengths": (dict(x=X, y=Y, eval_data=(X, Y[:9])), DataError, ["eval_data[1]"]),
    "eval_data bad label": (dict(x=X, y=Y, eval_data=(X, Y + C)), DataError, ["eval_data[1]"]),
    "progress not bool": (dict(x=X, y=Y, progress="yes"), ConfigError, ["progress"]),
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
    _fails_cleanly(t, lambda: t.fit(X, Y), DataError, "batch_size", "drop_last")


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
    _fails_cleanly(trained, lambda: trained.evaluate(X, Y[:5]), DataError, "y")
    _fails_cleanly(trained, lambda: trained.evaluate(X[:, :4], Y), DataError, "x")
    _fails_cleanly(trained, lambda: trained.predict(np.zeros((0, D))), DataError, "x")
    _fails_cleanly(trained, lambda: trained.predict_proba(XF * np.nan), DataError, "x")


CONSTRUCTOR_CASES = {
    "batch_size 0": (dict(batch_size=0), ["batch_size", "0"]),
    "batch_size negative": (dict(batch_size=-4), ["batch_size", "-4"]),
    "batch_size float": (dict(batch_size=16.0), ["batch_size"]),
    "batch_size bool": (dict(batch_size=True), ["batch_size"]),
    "precision": (dict(precision="bf16"), ["precision", "bf16"]),
    "device": (dict(device="tpu"), ["device", "tpu"]),
    "seed negative": (dict(seed=-1), ["seed"]),
    "seed too big": (dict(seed=2**64), ["seed"]),
    "normalize std 0": (dict(normalize=(0.5, 0.0)), ["normalize"]),
    "normalize not a pair": (dict(normalize=0.5), ["normalize"]),
    "drop_last": (dict(drop_last="no"), ["drop_last"]),
    "optimizer type": (dict(optimizer="sgd"), ["optimizer"]),
    "model type": (dict(model=[D, C]), ["model"]),
    "schedule not callable": (dict(schedule=0.1), ["schedule"]),
}


@pytest.mark.parametrize("case", list(CONSTRUCTOR_CASES))
def test_trainer_rejects(case: str) -> None:
    kwargs, names = CONSTRUCTOR_CASES[case]
    args = {"model": MLP([D, C]), "device": "cpu", **kwargs}
    with pytest.raises(ConfigError) as info:
        Trainer(**args)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize("lr", [0.0, -0.1, math.nan, math.inf, -math.inf, "fast"])
@pytest.mark.parametrize("opt", [SGD, AdamW])
def test_lr_must_be_finite_and_positive(opt, lr) -> None:
    with pytest.raises(ConfigError, match="lr"):
        opt(lr=lr)


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
    assert info.value.epoch == 0 and "epoch 0" in str(info.value) and not math.isfinite(info.value.loss)
    for k, v in init_parameters(model, 0).items():  # nothing finite was trained: the initial weights stay
        np.testing.assert_array_equal(t.state_dict()[k], v, err_msg=k)
    assert (t.epoch, t.step, len(t.history)) == (0, 0, 0)


def test_divergence_in_a_later_epoch() -> None:
    x, y = _data(256)
    # Epochs 0 and 1 at lr 0.05, then 1e6: epoch 2 diverges.
    t = Trainer(
        MLP([D, 64, 64, C]), SGD(lr=0.05), batch_size=32, device="cpu", schedule=lambda s: 0.05 if s < 16 else 1e6
    )
    t.fit(x, y, epochs=2)
    kept = t.state_dict()
    with pytest.raises(TrainingDiverged, match="epoch 2") as info:
        t.fit(x, y, epochs=3)
    assert info.value.epoch == 2
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
    with pytest.raises(OSError, match="disk full"):
        trained.save(path)
    monkeypatch.undo()

    def broken_replace(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(ckpt.os, "replace", broken_replace)
    with pytest.raises(OSError, match="rename failed"):
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


def _rewrite(src: Path, dst: Path, edit: Callable[[dict, dict], None]) -> Path:
    """Copy checkpoint src to dst with `edit(config, arrays)` applied, bypassing the format's own writer."""
    with np.load(src) as npz:
        files = dict(npz.items())
    config = json.loads(str(files["__fastnn_config__"]))
    arrays = {k: v for k, v in files.items() if not k.startswith("__fastnn_")}
    meta = {k: v for k, v in files.items() if k.startswith("__fastnn_")}
    edit(config, arrays)
    meta["__fastnn_config__"] = np.array(json.dumps(config))
    np.savez(dst, **meta, **arrays)
    return dst


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

    _assert_rejected(_rewrite(src, tmp_path / "shape.npz", wrong_shape), "0.weight", "shape")

    def no_momentum(config, arrays):
        del arrays["opt.momentum.2.bias"]

    _assert_rejected(_rewrite(src, tmp_path / "nomom.npz", no_momentum), "opt.momentum.2.bias", "missing")

    def bad_config(config, arrays):
        config["model"]["sizes"] = [D, 0, C]

    _assert_rejected(_rewrite(src, tmp_path / "config.npz", bad_config), "config")

    def nan_weight(config, arrays):
        arrays["2.bias"] = np.full_like(arrays["2.bias"], np.nan)

    _assert_rejected(_rewrite(src, tmp_path / "nan.npz", nan_weight), "2.bias", "finite")


def test_load_state_dict_rejects(trained: Trainer) -> None:
    sd = trained.state_dict()
    _fails_cleanly(
        trained, lambda: trained.load_state_dict({**sd, "0.weight": sd["0.weight"].T}), DataError, "0.weight"
    )
    missing = {k: v for k, v in sd.items() if k != "2.bias"}
    _fails_cleanly(trained, lambda: trained.load_state_dict(missing), DataError, "2.bias", "missing")
    _fails_cleanly(trained, lambda: trained.load_state_dict({**sd, "4.weight": sd["0.bias"]}), DataError, "4.weight")
    bad = {**sd, "0.bias": np.full_like(sd["0.bias"], np.inf)}
    _fails_cleanly(trained, lambda: trained.load_state_dict(bad), DataError, "0.bias")
    _fails_cleanly(trained, lambda: trained.load_state_dict([1, 2]), DataError, "state_dict")


def test_save_leaves_no_temp_file_and_keeps_the_name(trained: Trainer, tmp_path: Path) -> None:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        trained.save("plain-name")  # a bare file name in the current folder, no .npz suffix added
    finally:
        os.chdir(cwd)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain-name"]
    assert Trainer.load(tmp_path / "plain-name", device="cpu").step == trained.step
