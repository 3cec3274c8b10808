"""Trainer on the CPU: determinism, torch-style state_dict, split fits, checkpoints, History, progress, devices."""

from __future__ import annotations

import os
import stat
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import fastnn
from fastnn import MLP, SGD, AdamW, DeviceUnavailable, FastnnError, History, Trainer
from fastnn._model import init_parameters
from fastnn.engine import select
from fastnn.schedules import Cosine


def _data(n: int = 100, d: int = 12, classes: int = 4, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 60, size=(classes, d))
    y = rng.integers(0, classes, size=n)
    x = np.clip(128 + centers[y] + rng.normal(0, 30, size=(n, d)), 0, 255).astype(np.uint8)
    return x, y


def _trainer(**kw) -> Trainer:
    args = dict(model=MLP([12, 16, 8, 4]), optimizer=SGD(lr=0.1, momentum=0.9), batch_size=16, device="cpu", seed=3)
    args.update(kw)
    return Trainer(**args)


def _assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray], exact: bool = True) -> None:
    assert list(a) == list(b)
    for k in a:
        if exact:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        else:
            np.testing.assert_allclose(a[k], b[k], rtol=1e-6, atol=1e-7, err_msg=k)


def test_state_dict_is_torch_sequential_layout() -> None:
    model = MLP([12, 16, 8, 4])
    t = _trainer(model=model)
    sd = t.state_dict()
    assert list(sd) == ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"]
    assert [v.shape for v in sd.values()] == [(16, 12), (16,), (8, 16), (8,), (4, 8), (4,)]
    assert all(v.dtype == np.float32 for v in sd.values())
    _assert_same(sd, init_parameters(model, 3))
    assert t.device == "cpu" and t.model is model and t.epoch == 0 and t.step == 0


def test_same_seed_same_weights_other_seed_differs() -> None:
    x, y = _data()
    a, b, c = _trainer(), _trainer(), _trainer(seed=4)
    for t in (a, b, c):
        t.fit(x, y, epochs=2)
    _assert_same(a.state_dict(), b.state_dict())
    assert not np.array_equal(a.state_dict()["0.weight"], c.state_dict()["0.weight"])
    assert a.history["train_loss"] == b.history["train_loss"]


@pytest.mark.parametrize(
    "opt,schedule",
    [(SGD(lr=0.1, momentum=0.9, nesterov=True), None), (AdamW(lr=0.01), Cosine(total_steps=40, warmup_steps=5))],
)
def test_split_fits_equal_one_fit(opt, schedule) -> None:
    x, y = _data()
    whole = _trainer(optimizer=opt, schedule=schedule)
    whole.fit(x, y, epochs=4)
    split = _trainer(optimizer=opt, schedule=schedule)
    h1 = split.fit(x, y, epochs=1)
    h2 = split.fit(x, y, epochs=3)
    _assert_same(whole.state_dict(), split.state_dict())
    assert (split.epoch, split.step) == (4, 4 * 7) == (whole.epoch, whole.step)
    assert h1["epoch"] == [1] and h2["epoch"] == [2, 3, 4]  # numbered from 1, across calls
    assert split.history["train_loss"] == whole.history["train_loss"]
    assert len(split.history) == 4


def test_training_learns_and_inference_agrees() -> None:
    x, y = _data(n=400)
    t = _trainer()
    before = t.evaluate(x, y)
    h = t.fit(x, y, epochs=5, eval_data=(x, y))
    after = t.evaluate(x, y)
    assert set(after) == {"loss", "accuracy"} and all(isinstance(v, float) for v in after.values())
    assert after["loss"] < before["loss"] and after["accuracy"] > 0.9
    assert h[-1]["eval_loss"] == pytest.approx(after["loss"], rel=1e-6)
    assert h[-1]["eval_accuracy"] == after["accuracy"]
    proba = t.predict_proba(x)
    assert proba.shape == (400, 4) and proba.dtype == np.float32
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(t.predict(x), proba.argmax(axis=1))
    assert (t.predict(x) == y).mean() == pytest.approx(after["accuracy"])
    assert h[0]["train_loss"] > h[-1]["train_loss"]


def test_float_inputs_and_normalize_are_the_documented_affine() -> None:
    x, y = _data()
    a = _trainer(normalize=(0.5, 0.25))
    a.fit(x, y, epochs=1)
    b = _trainer()  # no normalize: feeding the same affine by hand as float32 must match
    b.fit(((x / 255.0 - 0.5) / 0.25).astype(np.float32), y, epochs=1)
    _assert_same(a.state_dict(), b.state_dict(), exact=False)


def test_history_records_columns_table_and_eval_every() -> None:
    x, y = _data()
    t = _trainer()
    h = t.fit(x, y, epochs=5, eval_data=(x[:40], y[:40]), eval_every=2)
    assert isinstance(h, History) and len(h) == 5
    assert h["epoch"] == [1, 2, 3, 4, 5]
    evaluated = [e is not None for e in h["eval_loss"]]
    assert evaluated == [False, True, False, True, True]  # every 2nd, and always the last
    assert [e is not None for e in h["eval_accuracy"]] == evaluated
    rec = h[-1]
    assert set(rec) == {"epoch", "train_loss", "train_accuracy", "eval_loss", "eval_accuracy", "seconds"}
    assert rec["epoch"] == 5 == t.epoch and rec["seconds"] >= 0
    rec["epoch"] = 99  # records are copies
    assert h[-1]["epoch"] == 5
    assert len(h[1:3]) == 2 and h[1:3]["epoch"] == [2, 3]
    cols = h.to_dict()
    assert cols["train_loss"] == h["train_loss"] and len(cols["seconds"]) == 5
    table = str(h).splitlines()
    assert len(table) == 6 and "train loss" in table[0] and "eval acc" in table[0]
    assert table[1].split()[3] == "-"  # epoch 1 not evaluated
    with pytest.raises(KeyError, match="loss_typo"):
        h["loss_typo"]
    assert t.fit(x, y, epochs=0)["epoch"] == [] and t.epoch == 5


def test_history_plot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = _data()
    t = _trainer()
    h = t.fit(x, y, epochs=2, eval_data=(x, y))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ImportError, match="pip install matplotlib"):
        h.plot(tmp_path / "h.png")
    monkeypatch.undo()
    pytest.importorskip("matplotlib")
    h.plot(tmp_path / "h.png")
    assert (tmp_path / "h.png").stat().st_size > 1000


def test_progress_prints_one_line_per_epoch(capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.setattr(fastnn._progress, "_have_tqdm", lambda: False)  # plain lines; test_training_control: tqdm
    x, y = _data()
    t = _trainer()
    t.fit(x, y, epochs=2)
    assert capsys.readouterr().out == ""  # progress="auto": quiet, stdout is not a terminal here
    t.fit(x, y, epochs=3, eval_data=(x, y), progress=True)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("epoch 3/5") and lines[-1].startswith("epoch 5/5")
    assert all("loss" in line and "eval acc" in line for line in lines)


@pytest.mark.parametrize("opt", [SGD(lr=0.1, momentum=0.9), AdamW(lr=0.01)])
def test_save_load_continues_identically(tmp_path: Path, opt) -> None:
    x, y = _data()
    whole = _trainer(optimizer=opt, normalize=(0.4, 0.3), drop_last=True)
    whole.fit(x, y, epochs=3)
    first = _trainer(optimizer=opt, normalize=(0.4, 0.3), drop_last=True)
    first.fit(x, y, epochs=2, eval_data=(x, y))
    path = tmp_path / "model.npz"
    first.save(path)
    loaded = Trainer.load(path, device="cpu")
    assert (loaded.epoch, loaded.step) == (2, 2 * 6)
    assert loaded.model == first.model and loaded.optimizer == opt
    assert loaded.config == first.config
    assert loaded.history == first.history
    _assert_same(loaded.state_dict(), first.state_dict())
    loaded.fit(x, y, epochs=1)
    _assert_same(loaded.state_dict(), whole.state_dict(), exact=False)
    assert [p.name for p in tmp_path.iterdir()] == ["model.npz"]  # no temp files left


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_checkpoint_gets_the_umask_mode_and_replaces_atomically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask: int
) -> None:
    # mkstemp would make 0600; a checkpoint is an ordinary file the user may share, like a dataset file.
    from fastnn import _checkpoint as checkpoint
    renames = []
    real_replace = os.replace

    def spy_replace(src, dst):
        renames.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", spy_replace)
    t = _trainer()
    path = tmp_path / "model.npz"
    old = os.umask(umask)
    try:
        t.save(path)
        t.save(path)  # over an existing file too
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask
    assert len(renames) == 2 and all(src.parent == tmp_path and dst == path for src, dst in renames)
    assert [p.name for p in tmp_path.iterdir()] == ["model.npz"]
    assert Trainer.load(path, device="cpu").step == t.step


def test_load_without_optimizer_state_would_differ(tmp_path: Path) -> None:
    # Guards the test above: continuing from weights alone (fresh momentum) gives other weights.
    x, y = _data()
    whole = _trainer()
    whole.fit(x, y, epochs=3)
    first = _trainer()
    first.fit(x, y, epochs=2)
    fresh = _trainer()
    fresh.load_state_dict(first.state_dict())
    fresh.epoch, fresh.step = first.epoch, first.step
    fresh.fit(x, y, epochs=1)
    assert not np.allclose(fresh.state_dict()["0.weight"], whole.state_dict()["0.weight"], rtol=1e-6, atol=1e-7)


def test_load_state_dict_round_trip() -> None:
    a, b = _trainer(seed=1), _trainer(seed=2)
    b.load_state_dict(a.state_dict())
    _assert_same(a.state_dict(), b.state_dict())
    sd = a.state_dict()
    sd["0.weight"][:] = 0.0  # state_dict returns copies
    assert np.abs(a.state_dict()["0.weight"]).max() > 0
    b.load_state_dict({k: v.astype(np.float64) for k, v in sd.items()})
    assert np.array_equal(b.state_dict()["0.weight"], np.zeros((16, 12), np.float32))


def test_context_manager_and_close() -> None:
    x, y = _data()
    with _trainer() as t:
        t.fit(x, y, epochs=1)
    with pytest.raises(FastnnError, match="closed"):
        t.fit(x, y, epochs=1)
    with pytest.raises(FastnnError, match="closed"):
        t.predict(x)
    t.close()  # idempotent


def test_default_optimizer_is_sgd_lr_0_1() -> None:
    t = Trainer(MLP([12, 4]), device="cpu")
    assert t.optimizer == SGD(lr=0.1) and t.config.batch_size == 128 and t.config.precision == "mixed"


# ---- device selection --------------------------------------------------------------------------------------


def _no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable():
        raise DeviceUnavailable("no usable GPU: test says so")

    monkeypatch.setattr(select, "graph_engine_class", unavailable)


def test_auto_falls_back_to_cpu_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_gpu(monkeypatch)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = Trainer(MLP([12, 4]), device="auto")
    assert t.device == "cpu"
    assert len(caught) == 1 and "test says so" in str(caught[0].message) and "CPU" in str(caught[0].message)
    assert caught[0].filename == __file__  # points at the user's line


def test_cuda_without_gpu_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_gpu(monkeypatch)
    with pytest.raises(DeviceUnavailable, match="device='cuda'.*test says so"):
        Trainer(MLP([12, 4]), device="cuda")


def test_cuda_when_fastnn_device_cannot_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fastnn._device", None)
    with pytest.raises(DeviceUnavailable, match="fastnn._device"):
        Trainer(MLP([12, 4]), device="cuda")


def test_cuda_on_a_machine_without_gpu_names_the_reason() -> None:
    device = pytest.importorskip("fastnn._device")
    usable, reason = device.cuda_status()
    if usable:
        pytest.skip("this machine has a usable GPU")
    with pytest.raises(DeviceUnavailable) as info:
        Trainer(MLP([12, 4]), device="cuda")
    assert reason in str(info.value)


def test_to_torch_gives_the_same_network() -> None:
    torch = pytest.importorskip("torch")
    for activation in ("relu", "gelu"):
        t = Trainer(MLP([6, 5, 4, 3], activation=activation), device="cpu", seed=3)
        t.load_state_dict(t.state_dict())  # its initial weights, given: predict answers
        x = np.random.default_rng(0).normal(size=(10, 6)).astype(np.float32)
        net = t.to_torch()
        assert isinstance(net, torch.nn.Sequential) and len(net) == 5
        with torch.no_grad():
            probs = torch.softmax(net(torch.from_numpy(x)), dim=1).numpy()
        np.testing.assert_allclose(probs, t.predict_proba(x), rtol=1e-5, atol=1e-6)


def test_to_torch_without_torch_says_how_to_install(monkeypatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch":
            raise ImportError("No module named 'torch'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(ImportError, match="pip install torch"):
        Trainer(MLP([4, 3]), device="cpu").to_torch()


def test_load_with_another_batch_size_continues_the_same_state(tmp_path: Path) -> None:
    x, y = _data()
    t = Trainer(MLP([12, 8, 4]), AdamW(lr=0.01), batch_size=10, device="cpu", seed=3)
    t.fit(x, y, epochs=2)
    t.save(tmp_path / "t.npz")
    back = Trainer.load(tmp_path / "t.npz", device="cpu", batch_size=25)
    assert back.config.batch_size == 25 and (back.epoch, back.step, back.history) == (t.epoch, t.step, t.history)
    state = t._engine.get_state()
    for name, value in back._engine.get_state().items():  # the optimizer state too
        np.testing.assert_array_equal(value, state[name])
    back.fit(x, y, epochs=1)
    assert back.step == t.step + 4  # 100 rows at 25 a step
    with pytest.raises(fastnn.ConfigError, match="batch_size must be an integer >= 1, got 0"):
        Trainer.load(tmp_path / "t.npz", device="cpu", batch_size=0)
