"""The many-model engines against the NumPy engine (the definition of correct), model by model: folds (masks),
per-model optimizer hyperparameters, one model diverging alone, early stopping, regression, evaluation and
prediction. Each test runs on every entry of BACKENDS: "emulated" is the GPU engine's host side (buffers, layout
offsets, tables, packed arguments, the captured epoch) on the CPU with tests/_many_emulator.py's NumPy kernels
(bindings: no GPU); "device" is the GPU engine on a GPU (marked gpu:
`PYTHONPATH=$PWD python -m pytest -q -m gpu tests/test_many_engines.py`). A new many-model engine joins BACKENDS; a
new kernel variant of the GPU engine (a `Tuning` field) joins VARIANTS, so every test runs it too."""

from __future__ import annotations

import types

import numpy as np
import pytest

import fastnn
from fastnn import MLP, SGD, AdamW, EarlyStopping, MultiTrainer
from fastnn.engine import Tuning

#: (name, marks, tolerance of the weights (rtol, atol)): the emulation runs the NumPy engine's own functions (fp32,
#: the same shapes), the device's fp32 kernels sum in other orders.
BACKENDS = [
    pytest.param(("emulated", (1e-5, 1e-6)), marks=pytest.mark.bindings, id="emulated"),
    pytest.param(("device", (2e-4, 2e-5)), marks=pytest.mark.gpu, id="device"),
]
#: The GPU engine's kernel variants (fastnn/engine/tuning.py): the defaults, and the loss and update kernels written
#: against the measured phase profile (docs/design/many-models.md, "Next kernels"), which compute the same bits.
VARIANTS = [
    pytest.param(Tuning(), id="model-scalar"),
    pytest.param(Tuning(many_loss_kernel="tiled", many_update_kernel="vec4"), id="tiled-vec4"),
]


@pytest.fixture(params=VARIANTS)
def tuning(request) -> Tuning:
    """The GPU engine's kernel variant this test trains with."""
    return request.param


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """The tolerance (rtol, atol) of this backend, with MultiTrainer(engine="gpu") set up to train on it."""
    name, tol = request.param
    if name == "emulated":
        pytest.importorskip("fastnn.cuda.driver", reason="needs the CUDA wheels")
        from _many_emulator import Heap, make_cublaslt, make_driver

        from fastnn import _device
        from fastnn.engine.many.gpu import engine

        heap = Heap()
        monkeypatch.setattr(engine, "driver", make_driver(heap))
        monkeypatch.setattr(engine, "cublaslt", make_cublaslt(heap))
        monkeypatch.setattr(engine, "nvrtc", types.SimpleNamespace(compile_native=lambda *a, **k: b"emulated"))
        monkeypatch.setattr(_device, "cuda_status", lambda: (True, "emulated"))
    return tol


def _data(n=96, d=10, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, size=(n, d)).astype(np.uint8)
    y = (x[:, :classes].argmax(axis=1)).astype(np.int64)
    return x, y


def _pair(model, opt, tuning: Tuning, **kwargs):
    """The NumPy engine and the GPU engine (kernel variant `tuning`) on the same configuration (precision "fp32"
    unless given: "mixed" runs layer 0's GEMMs on TF32 tensor cores, compared in test_mixed_precision_is_close)."""
    kwargs.setdefault("precision", "fp32")
    cpu = MultiTrainer(model, opt, device="cpu", **kwargs)
    gpu = MultiTrainer(model, opt, device="cuda", engine="gpu", tuning=tuning, **kwargs)
    assert gpu.engine == "gpu" and cpu.engine == "numpy"
    return cpu, gpu


def _close(a: MultiTrainer, b: MultiTrainer, tol: tuple[float, float]) -> None:
    rtol, atol = tol
    for k, (sa, sb) in enumerate(zip(a.state_dicts(), b.state_dicts())):
        for n in sa:
            np.testing.assert_allclose(sb[n], sa[n], rtol=rtol, atol=atol, err_msg=f"model {k} {n}")
    for ha, hb in zip(a.histories, b.histories):
        assert len(ha) == len(hb)
        for field in ("train_loss", "train_accuracy", "eval_loss", "eval_accuracy"):
            va, vb = ha[field], hb[field]
            assert [v is None for v in va] == [v is None for v in vb], field
            np.testing.assert_allclose([v for v in vb if v is not None], [v for v in va if v is not None],
                                       rtol=10 * rtol, err_msg=field)  # fmt: skip


@pytest.mark.parametrize("batch", [16, 40])
def test_gpu_engine_equals_numpy_with_folds(backend, tuning, batch):
    x, y = _data()
    folds = np.arange(96) % 3
    masks = np.stack([folds != f for f in range(3)] + [folds != 1])
    cpu, gpu = _pair(MLP([10, 8, 3]), SGD(lr=0.05), tuning, lr=[0.05, 0.1, 0.02, 0.05], momentum=[0.0, 0.9, 0.5, 0.9],
                     weight_decay=[0.0, 1e-3, 0.0, 1e-2], nesterov=[False, True, False, False], seeds=3,
                     batch_size=batch, shuffle_seed=7)  # fmt: skip
    for mt in (cpu, gpu):
        mt.fit(x, y, epochs=2, masks=masks, eval_data=(x, y), eval_masks=~masks)
    _close(cpu, gpu, backend)
    rtol, atol = 10 * backend[0], 10 * backend[1]
    np.testing.assert_allclose(gpu.forward(x), cpu.forward(x), rtol=rtol, atol=atol)
    assert (gpu.predict(x) == cpu.predict(x)).mean() > 0.99
    for a, b in zip(gpu.evaluate(x, y, masks=~masks), cpu.evaluate(x, y, masks=~masks)):
        assert a["loss"] == pytest.approx(b["loss"], rel=rtol)
        assert a["accuracy"] == pytest.approx(b["accuracy"], abs=0.02)  # a near tie may fall the other way
    t = gpu.trainer(1, device="cpu")  # model 1 with its momentum buffer, on the CPU, fit on
    t.fit(x[masks[1]], y[masks[1]], epochs=1, progress=False)
    c = cpu.trainer(1)
    c.fit(x[masks[1]], y[masks[1]], epochs=1, progress=False)
    np.testing.assert_allclose(t.state_dict()["0.weight"], c.state_dict()["0.weight"], rtol=rtol, atol=atol)


#: The optimizers' bias_decay: None (the biases decay as the weights) and 0 (fastnn.sklearn's: weights only).
BIAS_DECAY = pytest.mark.parametrize("bias_decay", [None, 0.0], ids=["bias-decayed", "bias_decay=0"])


@BIAS_DECAY
@pytest.mark.parametrize("fast", [True, False], ids=["layer0-gemm", "kernels"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_gpu_engine_equals_numpy_adamw(backend, tuning, activation, fast, bias_decay):
    x, y = _data(n=70)
    cpu, gpu = _pair(MLP([10, 6, 5, 3], activation=activation), AdamW(lr=1e-2, bias_decay=bias_decay), tuning,
                     lr=[1e-2, 3e-3],
                     betas=[(0.9, 0.999), (0.8, 0.99)], weight_decay=[0.0, 0.1], seeds=[1, 9], batch_size=16,
                     drop_last=True, precision="fp32")  # fmt: skip
    gpu._engine.fast_layer0 = fast  # one stream: layer 0 as one cuBLASLt GEMM, or the per-model kernels
    for mt in (cpu, gpu):
        mt.fit(x, y, epochs=2)
        mt.fit(x, y, epochs=1)  # the step counter goes on: AdamW's bias correction
    _close(cpu, gpu, (10 * backend[0], backend[1]))
    assert bool(gpu._engine._fast["forward"]) == fast


@pytest.mark.parametrize("fold", [False, True], ids=["update", "fold_sgd"])
def test_gpu_engine_one_model_diverging_alone(backend, tuning, fold):
    x, y = _data()
    x = x.astype(np.float32) * 100.0
    cpu, gpu = _pair(MLP([10, 8, 3]), SGD(lr=0.1), tuning, lr=[1e-6, 1e20, 2e-6], batch_size=16, precision="fp32")
    gpu._engine.fold_sgd = fold
    for mt in (cpu, gpu):
        with pytest.warns(RuntimeWarning, match="1 of 3 models diverged"):
            mt.fit(x, y, epochs=2)
    assert gpu.diverged.tolist() == cpu.diverged.tolist() == [False, True, False]
    assert isinstance(gpu.divergences[1], fastnn.TrainingDiverged)
    assert gpu.epochs.tolist() == cpu.epochs.tolist()
    _close(cpu, gpu, backend)  # the diverged model's weights are its last finite epoch's on both


def test_gpu_engine_early_stopping_and_regression(backend, tuning):
    x, y = _data(n=80)
    xe, ye = _data(n=40, seed=1)
    cpu, gpu = _pair(MLP([10, 3]), SGD(lr=0.1), tuning, lr=[0.5, 0.01, 2.0], batch_size=16,
                     normalize=(np.linspace(0, 1, 10), 2.0))  # fmt: skip
    for mt in (cpu, gpu):
        mt.fit(x, y, epochs=6, eval_data=(xe, ye), early_stopping=EarlyStopping(patience=1, min_delta=1e-3))
    _close(cpu, gpu, backend)
    assert gpu.epochs.tolist() == cpu.epochs.tolist()
    rng = np.random.default_rng(0)
    xr = rng.normal(size=(50, 4)).astype(np.float32)
    yr = rng.normal(size=(50, 2)).astype(np.float32)
    cpu, gpu = _pair(MLP([4, 5, 2]), SGD(lr=0.05), tuning, models=2, seeds=[0, 1], batch_size=8, loss="mse")
    for mt in (cpu, gpu):
        mt.fit(xr, yr, epochs=2, eval_data=(xr, yr))
    _close(cpu, gpu, backend)
    for a, b in zip(gpu.evaluate(xr, yr), cpu.evaluate(xr, yr)):
        assert a["r2"] == pytest.approx(b["r2"], rel=10 * backend[0]) and a["mse"] == pytest.approx(b["mse"],
                                                                                                 rel=10 * backend[0])
    np.testing.assert_allclose(gpu.predict(xr), cpu.predict(xr), rtol=10 * backend[0], atol=10 * backend[1])


@pytest.mark.parametrize("fold", [False, True], ids=["update", "fold_sgd"])
def test_phase_profile_names_every_node_and_leaves_the_state(backend, tuning, fold):
    x, y = _data()
    mt = MultiTrainer(MLP([10, 8, 3]), SGD(lr=0.1), models=3, batch_size=16, device="cuda", engine="gpu",
                     tuning=tuning)
    mt._engine.fold_sgd = fold
    mt.fit(x, y, epochs=1)
    before = mt.state_dicts()
    phases = mt._engine.profile_step(step=2, repeats=3)
    graphed = mt._engine.profile_step(step=2, repeats=3, graphed=True)  # each node in a graph of 3 copies
    assert list(graphed) == list(phases) and all(t > 0 for t in graphed.values())
    if fold:
        assert list(phases) == ["gather", "forward0", "scale_bias0", "forward1", "loss", "wgrad1", "dgrad1", "fold0",
                                "wgrad0", "update"]  # fmt: skip
    else:
        assert list(phases) == ["gather", "forward0", "forward1", "loss", "wgrad1", "dgrad1", "wgrad0", "update"]
    assert all(t > 0 for t in phases.values())
    for a, b in zip(before, mt.state_dicts()):
        for n in a:
            np.testing.assert_array_equal(a[n], b[n])


def test_mixed_precision_is_close(backend, tuning):
    """precision="mixed": layer 0's GEMMs of a one-stream epoch on TF32 tensor cores (10-bit mantissas), the rest
    fp32: close to the NumPy engine's fp32, at a TF32 tolerance."""
    x, y = _data(n=120)
    cpu, gpu = _pair(MLP([10, 16, 3]), SGD(lr=0.1, momentum=0.9), tuning, models=4, lr=[0.02, 0.05, 0.1, 0.2], seeds=5,
                     batch_size=32, precision="mixed")  # fmt: skip
    for mt in (cpu, gpu):
        mt.fit(x, y, epochs=2)
    for k, (sa, sb) in enumerate(zip(cpu.state_dicts(), gpu.state_dicts())):
        for n in sa:  # the one-model engines' "mixed" bound (test_gpu_engines.TOLERANCES): |gpu - cpu| / |cpu|
            rel = np.linalg.norm(sb[n] - sa[n]) / np.linalg.norm(sa[n])
            assert np.isfinite(sb[n]).all() and rel < 2e-2, (k, n, rel)


def test_too_many_models_for_one_gpu_are_refused_by_name(backend, tuning):
    with pytest.raises(fastnn.ConfigError, match="models=65,536: the GPU engine trains at most 65,535 models"):
        MultiTrainer(MLP([2, 2]), SGD(lr=0.1), models=65_536, device="cuda", engine="gpu", tuning=tuning)


@pytest.mark.parametrize("sizes, batch", [((784, 10), 128), ((784, 32, 10), 32)], ids=["logreg", "mlp"])
def test_fashion_mnist_shapes(backend, tuning, sizes, batch):
    """The benchmark's shapes (784 inputs, 10 classes, its batches) at K = 40, one stream and two folds."""
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, size=(300, 784), dtype=np.uint8)
    y = rng.integers(0, 10, size=300)
    lrs = np.geomspace(0.005, 0.1, 40)
    cpu, gpu = _pair(MLP(list(sizes)), SGD(lr=0.1), tuning, lr=lrs, weight_decay=np.geomspace(1e-5, 1e-3, 40), seeds=0,
                     batch_size=batch)  # fmt: skip
    for mt in (cpu, gpu):
        mt.fit(x, y, epochs=1)
        mt.fit(x, y, epochs=1, masks=np.stack([np.arange(300) % 2 == k % 2 for k in range(40)]))
    _close(cpu, gpu, (10 * backend[0], 10 * backend[1]))


@BIAS_DECAY
@pytest.mark.parametrize("sizes, batch", [((784, 10), 128), ((784, 32, 10), 32)], ids=["logreg", "mlp"])
def test_fold_sgd_equals_numpy(backend, tuning, sizes, batch, bias_decay):
    """fold_sgd: layer 0's SGD update (L2 included) folded into its weight-gradient GEMM through per-model weight
    scales; the same models as the NumPy engine's, to rounding; epochs of several streams use the plain path."""
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, size=(300, 784), dtype=np.uint8)
    y = rng.integers(0, 10, size=300)
    # (rates up to 0.05: at 0.5 on 784 raw inputs the run is chaotic enough that fp32 rounding differences between
    # any two engines grow by 10x an epoch)
    cpu, gpu = _pair(MLP(list(sizes)), SGD(lr=0.1, bias_decay=bias_decay), tuning, lr=np.geomspace(0.005, 0.05, 12),
                     weight_decay=np.geomspace(1e-4, 1e-1, 12), seeds=3, batch_size=batch)  # fmt: skip
    gpu._engine.fold_sgd = True
    for mt in (cpu, gpu):
        mt.fit(x, y, epochs=2, eval_data=(x[:50], y[:50]))
        mt.fit(x, y, epochs=1, masks=np.stack([np.arange(300) % 3 != k % 3 for k in range(12)]))
        mt.fit(x, y, epochs=1)
    _close(cpu, gpu, (10 * backend[0], 10 * backend[1]))
    assert gpu._engine._fast["wgrad_acc"]  # the folded path trained


def test_the_same_training_set_is_not_uploaded_again(backend, tuning):
    """A second fit on the same x (y checked into a new array, masks into new row lists) keeps the uploaded set and
    the captured epoch; a new x array is uploaded."""
    x, y = _data()
    masks = np.stack([np.arange(96) % 2 == k % 2 for k in range(2)])
    cpu, gpu = _pair(MLP([10, 3]), SGD(lr=0.1), tuning, models=2, batch_size=16)
    for mt in (cpu, gpu):
        mt.fit(x, y, epochs=1, masks=masks)
    data, graphs = gpu._engine._train, dict(gpu._engine._graphs)
    for mt in (cpu, gpu):
        mt.fit(x, list(y), epochs=1, masks=masks.copy())
    assert gpu._engine._train is data and all(gpu._engine._graphs[k] is g for k, g in graphs.items())
    x2 = x[::-1].copy()
    for mt in (cpu, gpu):
        mt.fit(x2, y, epochs=1, masks=masks)
    assert gpu._engine._train is not data
    _close(cpu, gpu, backend)


def test_a_failing_layer0_gemm_falls_back_to_the_kernels(backend, tuning):
    """cuBLASLt failing to run layer 0's GEMM (in the epoch's capture, in an evaluation): a warning, then the
    per-model kernels, the same results. (Only the emulation can make cuBLASLt fail.)"""
    from fastnn.engine.many.gpu import engine

    if not hasattr(engine.cublaslt, "fail"):
        pytest.skip("only the emulated cuBLASLt can be made to fail")
    x, y = _data()
    cpu, gpu = _pair(MLP([10, 8, 3]), SGD(lr=0.1), tuning, models=3, seeds=4, batch_size=16)
    cpu.fit(x, y, epochs=2, eval_data=(x, y))
    engine.cublaslt.fail = True
    with pytest.warns(RuntimeWarning, match="layer-0 GEMM failed .*CUBLAS_STATUS_NOT_SUPPORTED"):
        gpu.fit(x, y, epochs=2, eval_data=(x, y))
    assert not gpu._engine.fast_layer0
    _close(cpu, gpu, backend)
    engine.cublaslt.fail = False
    other = MultiTrainer(MLP([10, 8, 3]), SGD(lr=0.1), models=3, seeds=4, batch_size=16, device="cuda", engine="gpu",
                         precision="fp32", tuning=tuning)  # fmt: skip
    other.fit(x, y, epochs=2)
    assert other._engine.fast_layer0
    engine.cublaslt.fail = True
    with pytest.warns(RuntimeWarning, match="layer-0 GEMM failed"):
        scores = other.evaluate(x, y)
    assert [s["loss"] for s in scores] == pytest.approx([s["loss"] for s in gpu.evaluate(x, y)], rel=1e-5)
    np.testing.assert_allclose(other.forward(x), gpu.forward(x), rtol=1e-5, atol=1e-6)


def test_kernel_variants_train_the_same_bits(backend):
    """Every kernel variant (VARIANTS) trains the defaults' bits: many_xent_tiled adds each model's sums in many_xent's
    order, many_update_vec runs optim_update element by element. K = 601 models in tiles of 4 (the last alone, on 132
    SMs), batches of 300 and 267 rows (the sums' slots reused past 256, chunks of 128 rows), a short last batch, folds
    (the models of a tile with different rows), SGD with and without momentum, AdamW, evaluation."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, size=(400, 20), dtype=np.uint8)
    y = rng.integers(0, 10, size=400)
    k = 601
    masks = np.stack([np.arange(400) % 3 != j % 3 for j in range(k)])  # folds of 267 rows: one batch
    for model, opt, hp in ((MLP([20, 10]), SGD(lr=0.01), {"momentum": np.linspace(0.0, 0.9, k)}),
                           (MLP([20, 12, 10]), AdamW(lr=1e-3), {})):  # fmt: skip
        runs = []
        for variant in VARIANTS:
            mt = MultiTrainer(model, opt, lr=np.geomspace(1e-3, 0.05, k), seeds=0, batch_size=300, device="cuda",
                              engine="gpu", precision="fp32", tuning=variant.values[0], **hp)  # fmt: skip
            net = mt._engine._net()
            assert (net.loss_tile > 0) == (variant.values[0].many_loss_kernel == "tiled")
            mt.fit(x, y, epochs=1)
            mt.fit(x, y, epochs=1, masks=masks, eval_data=(x, y), eval_masks=~masks)
            runs.append(mt)
        base = runs[0]
        for other in runs[1:]:
            for j, (sa, sb) in enumerate(zip(base.state_dicts(), other.state_dicts())):
                for n in sa:
                    np.testing.assert_array_equal(sb[n], sa[n], err_msg=f"model {j} {n}")
            for ha, hb in zip(base.histories, other.histories):
                for field in ("train_loss", "train_accuracy", "eval_loss", "eval_accuracy"):
                    assert ha[field] == hb[field], field


def test_autotuned_layer0_gemms_train_as_numpy(backend):
    """Tuning.many_autotune: layer 0's cuBLASLt plans (forward, weight gradient; with fold_sgd the raw forward and the
    accumulating GEMM) timed on the engine's buffers before the epoch's capture; the models still the NumPy
    engine's, the weights untouched by the timing."""
    x, y = _data(n=80)
    for fold in (False, True):
        cpu, gpu = _pair(MLP([10, 6, 3]), SGD(lr=0.05), Tuning(many_autotune=True), models=3, seeds=2, batch_size=16,
                         weight_decay=[0.0, 1e-3, 1e-2])  # fmt: skip
        eng = gpu._engine
        eng.fold_sgd = fold
        for buf in (eng.xb, eng.dz[0]):  # large operands: timing that wrote onto the weights would show
            buf.upload(np.full(buf.nbytes // 4, 1e3, dtype=np.float32))
        before = [eng.get_state(k) for k in range(3)]
        eng._fast_plans(16)
        for a, b in zip(before, [eng.get_state(k) for k in range(3)]):
            for n in a:
                np.testing.assert_array_equal(b[n], a[n], err_msg=n)
        for mt in (cpu, gpu):
            mt.fit(x, y, epochs=2, eval_data=(x, y))
        _close(cpu, gpu, backend)
        assert eng._fast["wgrad_acc" if fold else "wgrad"]
    from fastnn.engine.many.gpu import engine

    if hasattr(engine.cublaslt, "autotuned"):  # the emulation counts the plans timed, once each: every step and the
        assert engine.cublaslt.autotuned == 2 + 4  # evaluation have 16 rows; 2 plans, then 4 with fold_sgd
