"""Regression (`Trainer(loss="mse")`) on the GPU engine matrix against the NumPy engine: a few epochs' weights and
losses, evaluate's MSE and R^2, predict's values, the short last batch, uint8 and float inputs with normalize, the
checkpoint round trip, and the engines built directly. Run on a GPU machine:
`PYTHONPATH=$PWD python3 -m pytest -m gpu -q tests/test_regression_gpu.py`.

Parameter tolerances are those of tests/test_gpu_engines.py's classification comparisons: fp32 tight, "mixed" and
"fp16" looser."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_gpu_engines import _assert_close, _engine_class, _refused, _rel

from fastnn import MLP, SGD, AdamW, ConfigError, Trainer
from fastnn._model import init_parameters
from fastnn.engine import Tuning
from fastnn.engine.base import EngineConfig
from fastnn.engine.numpy_engine import NumpyEngine

pytestmark = pytest.mark.gpu

#: Per precision: parameters' relative error (per tensor norm) after the epochs; losses and MSE (relative) and R^2
#: (absolute); predictions (absolute, times their largest magnitude).
TOLERANCES = {"fp32": (2e-4, 1e-4, 1e-4), "mixed": (2e-2, 5e-2, 2e-2), "fp16": (5e-2, 1e-1, 5e-2)}


def _data(n: int, d: int, k: int, seed: int = 0, dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """x (n, d) of `dtype` (uint8: pixel-like values) and float32 targets (n, k), a smooth function of x of unit
    scale (the same function for every seed of a shape) with a little noise; (n,) for k = 1."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    w = np.random.default_rng(100 * d + k).normal(size=(d, k)) / np.sqrt(d)
    y = np.tanh(x @ w) + 0.5 * (x @ w) + 0.25 + 0.05 * rng.normal(size=(n, k))
    if dtype == np.uint8:
        x = np.clip(x * 40 + 128, 0, 255).astype(np.uint8)
    y = y.astype(np.float32)
    return x.astype(dtype), (y[:, 0] if k == 1 else y)


def _pair(engine: dict, model: MLP, optimizer, batch: int, precision: str = "fp32", **kw) -> tuple[Trainer, Trainer]:
    """A CPU regression trainer and a GPU one built by `engine`, same seed, same settings (the CPU's in fp32)."""
    common = dict(optimizer=optimizer, batch_size=batch, seed=7, loss="mse", **kw)
    cpu = Trainer(model, precision="fp32", device="cpu", **common)
    gpu = Trainer(model, precision=precision, device="cuda", **engine, **common)
    assert gpu.engine == engine["engine"] and gpu.loss == "mse"
    return cpu, gpu


@pytest.mark.parametrize("precision", list(TOLERANCES))
@pytest.mark.parametrize("k", [1, 3])
def test_a_few_epochs_match_numpy(engine: dict, k: int, precision: str) -> None:
    """Weights, training and evaluation losses after 3 epochs of 11 steps, the last one short (7 of 32 rows)."""
    model, opt = MLP([12, 24, k]), SGD(lr=0.02, momentum=0.9)
    if _refused(engine, model, opt, 32, precision, loss="mse"):
        return
    x, y = _data(32 * 10 + 7, 12, k)
    xe, ye = _data(200, 12, k, seed=1)
    params, losses, outputs = TOLERANCES[precision]
    cpu, gpu = _pair(engine, model, opt, 32, precision)
    with gpu:
        hc = cpu.fit(x, y, epochs=3, eval_data=(xe, ye))
        hg = gpu.fit(x, y, epochs=3, eval_data=(xe, ye))
        assert hg["train_accuracy"] == hg["eval_accuracy"] == [None] * 3  # a regression has no accuracy
        assert hc["train_loss"][-1] < hc["train_loss"][0] / 2  # it learns: the comparison is not of noise
        _assert_close(cpu, gpu, params)
        np.testing.assert_allclose(hg["train_loss"], hc["train_loss"], rtol=losses)
        np.testing.assert_allclose(hg["eval_loss"], hc["eval_loss"], rtol=losses)
        ec, eg = cpu.evaluate(xe, ye), gpu.evaluate(xe, ye)
        assert set(eg) == {"loss", "mse", "r2"} and eg["loss"] == eg["mse"]
        assert eg["mse"] == pytest.approx(ec["mse"], rel=losses)
        assert eg["mse"] == pytest.approx(hg["eval_loss"][-1], rel=1e-6)  # the history's number is evaluate's
        assert eg["r2"] == pytest.approx(ec["r2"], abs=losses)
        pc, pg = cpu.predict(xe), gpu.predict(xe)
        assert pg.shape == ye.shape and pg.dtype == np.float32
        np.testing.assert_allclose(pg, pc, atol=outputs * float(np.abs(pc).max()))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32], ids=["uint8", "float32"])
def test_inputs_with_normalize_and_drop_last_match_numpy(engine: dict, dtype) -> None:
    model, opt = MLP([10, 16, 2]), AdamW(lr=1e-2)
    norm = (0.4, 0.3) if dtype == np.uint8 else (0.1, 2.0)
    if _refused(engine, model, opt, 16, "fp32", loss="mse", normalize=norm, drop_last=True):
        return
    x, y = _data(250, 10, 2, seed=2, dtype=dtype)
    cpu, gpu = _pair(engine, model, opt, 16, normalize=norm, drop_last=True)
    with gpu:
        hc, hg = cpu.fit(x, y, epochs=2), gpu.fit(x, y, epochs=2)
        _assert_close(cpu, gpu, 2e-4)
        np.testing.assert_allclose(hg["train_loss"], hc["train_loss"], rtol=1e-4)
        np.testing.assert_allclose(gpu.predict(x), cpu.predict(x), atol=1e-4)


@pytest.mark.parametrize("k", [1, 4])
def test_evaluate_and_predict_match_numpy_over_several_chunks(engine: dict, k: int) -> None:
    """Untrained weights (the same seed on both, given to each by load_state_dict: predict refuses weights nobody
    trained or gave), a set of 5000 rows: the GPU evaluates in chunks of 4096, so the sums of squared errors and
    the predictions span two chunks."""
    model = MLP([9, 20, 20, k])
    if _refused(engine, model, SGD(lr=0.1), 64, "fp32", loss="mse"):
        return
    x, y = _data(5000, 9, k, seed=3)
    cpu, gpu = _pair(engine, model, SGD(lr=0.1), 64)
    with gpu:
        initial = cpu.state_dict()
        cpu.load_state_dict(initial)
        gpu.load_state_dict(initial)
        ec, eg = cpu.evaluate(x, y), gpu.evaluate(x, y)
        assert eg["mse"] == pytest.approx(ec["mse"], rel=1e-5)
        assert eg["r2"] == pytest.approx(ec["r2"], abs=1e-5)
        pc, pg = cpu.predict(x), gpu.predict(x)
        assert pg.shape == ((5000,) if k == 1 else (5000, k))
        np.testing.assert_allclose(pg, pc, rtol=1e-5, atol=1e-5)
        assert float(((pg - y).astype(np.float64) ** 2).mean()) == pytest.approx(eg["mse"], rel=1e-4)
        np.testing.assert_allclose(gpu.predict(x[:3]), pg[:3], rtol=1e-5, atol=1e-5)  # another shape, same rows


def test_the_checkpoint_round_trip(engine: dict, tmp_path: Path) -> None:
    model, opt = MLP([6, 12, 2]), AdamW(lr=1e-2)
    if _refused(engine, model, opt, 20, "fp32", loss="mse"):
        return
    x, y = _data(300, 6, 2, seed=4)
    path = tmp_path / "reg.npz"
    with Trainer(model, opt, batch_size=20, precision="fp32", device="cuda", seed=1, loss="mse", **engine) as t:
        t.fit(x, y, epochs=2)
        t.save(path)
        on_cpu = Trainer.load(path, device="cpu")
        assert on_cpu.loss == "mse" and on_cpu.history == t.history
        np.testing.assert_allclose(on_cpu.predict(x), t.predict(x), rtol=1e-5, atol=1e-5)
        with Trainer.load(path, device="cuda", **engine) as back:
            assert back.loss == "mse" and back.engine == engine["engine"]
            # The same weights on the same engine (rounding apart: each trainer autotunes its GEMMs for itself).
            np.testing.assert_allclose(back.predict(x), t.predict(x), rtol=1e-5, atol=1e-5)
            back.fit(x, y, epochs=1)  # continues as a regression, as the original does
            t.fit(x, y, epochs=1)
            _assert_close(t, back, 1e-4)
            on_cpu.fit(x, y, epochs=1)
            _assert_close(on_cpu, back, 2e-4)


def test_the_grid_engine_refuses_a_regression_naming_the_graph_engine() -> None:
    """Its two kernels compute softmax cross-entropy only (native/loss.cuh says why MSE is not taken there)."""
    cfg = EngineConfig(model=MLP([784, 256, 256, 256, 4]), optimizer=SGD(lr=0.05), batch_size=32, precision="mixed",
                       loss="mse")  # fmt: skip
    with pytest.raises(ConfigError, match="engine='grid' cannot train this model: grid_fast.cu: loss 'mse'"):
        _engine_class({"engine": "grid"})(cfg, init_parameters(cfg.model, 0))


@pytest.mark.parametrize("name", ["graph", "fused"])
def test_the_engine_itself_trains_evaluates_and_predicts_a_regression(name: str) -> None:
    """The graph and fused engines built directly (what the user layer builds on): evaluate's (MSE, R^2) and
    predict_outputs against the NumPy engine's from the same state; the history's accuracies None; predict_proba
    is a classifier's."""
    model = MLP([7, 16, 3])
    x, y = _data(130, 7, 3, seed=5)
    cfg = EngineConfig(model=model, optimizer=SGD(lr=0.05), batch_size=32, precision="fp32", loss="mse",
                       tuning=Tuning())  # fmt: skip
    state = init_parameters(model, 0)
    ref = NumpyEngine(cfg, state)
    eng = _engine_class({"engine": name})(cfg, state)
    try:
        seen = []
        for e in (ref, eng):
            e.set_train_data(x, y)
            e.fit_epochs(0, 0, np.full(5, 0.05, dtype=np.float32), (x, y), frozenset({0}), seen.append)
        (a, b) = seen
        assert a.accuracy is b.accuracy is a.eval_accuracy is b.eval_accuracy is None
        assert b.loss == pytest.approx(a.loss, rel=1e-5) and b.eval_loss == pytest.approx(a.eval_loss, rel=1e-5)
        for k, v in ref.get_state().items():
            assert _rel(eng.get_state()[k], v) < 1e-5, k
        (mse_ref, r2_ref), (mse, r2) = ref.evaluate(x, y), eng.evaluate(x, y)
        assert mse == pytest.approx(mse_ref, rel=1e-5) and r2 == pytest.approx(r2_ref, abs=1e-5)
        np.testing.assert_allclose(eng.predict_outputs(x), ref.predict_outputs(x), rtol=1e-5, atol=1e-5)
        with pytest.raises(RuntimeError, match="predict_proba is a classifier's"):
            eng.predict_proba(x)
    finally:
        eng.close()


def test_auto_trains_a_regression_on_the_gpu() -> None:
    """device="auto" takes the GPU for loss="mse" (no fallback to the CPU, no warning), and engine="auto" picks by
    the fused engine's rule as for a classifier."""
    import warnings

    x, y = _data(100, 5, 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Trainer(MLP([5, 8, 2]), loss="mse") as reg, Trainer(MLP([5, 8, 2])) as clf:
            assert reg.device == "cuda" and reg.engine == clf.engine
            reg.fit(x, y, epochs=2)
            assert np.isfinite(reg.evaluate(x, y)["mse"])
    assert not [str(w.message) for w in caught if "CPU" in str(w.message) or "mse" in str(w.message)]
