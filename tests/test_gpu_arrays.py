"""Arrays already on the GPU (torch, CuPy, JAX) used in place by the GPU engines (the `engine` fixture): the same
results as host arrays."""

from __future__ import annotations

import os

import numpy as np
import pytest

from fastnn import MLP, SGD, DataError, Trainer

pytestmark = pytest.mark.gpu

D, C, N = 64, 5, 300


def _data(dtype):
    rng = np.random.default_rng(3)
    x = rng.integers(0, 256, size=(N, D)).astype(np.uint8)
    x = x if dtype == np.uint8 else (x / 255.0).astype(np.float32)
    return x, rng.integers(0, C, size=N)


def _trainer(engine):
    return Trainer(MLP([D, 32, C]), SGD(lr=0.1, momentum=0.9), batch_size=32, device="cuda", seed=1, **engine)


@pytest.mark.parametrize("dtype", [np.uint8, np.float32], ids=["uint8", "float32"])
def test_torch_cuda_tensor_fit_equals_host_fit(engine, dtype):
    torch = pytest.importorskip("torch")
    x, y = _data(dtype)
    with _trainer(engine) as host, _trainer(engine) as dev:
        host.fit(x, y, epochs=2, eval_data=(x, y), progress=False)
        xt, yt = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
        dev.fit(xt, yt, epochs=2, eval_data=(xt, yt), progress=False)
        for k, v in host.state_dict().items():
            np.testing.assert_array_equal(dev.state_dict()[k], v, err_msg=k)
        assert [r["train_loss"] for r in dev.history] == [r["train_loss"] for r in host.history]
        np.testing.assert_array_equal(dev.predict_proba(xt), host.predict_proba(x))
        with pytest.raises(DataError, match="requires grad: pass x.detach()"):
            dev.fit(xt.float().requires_grad_(), yt)


def test_cupy_predict_and_evaluate_equal_host(engine):
    cupy = pytest.importorskip("cupy")
    x, y = _data(np.float32)
    with _trainer(engine) as t:
        t.fit(x, y, epochs=1, progress=False)
        xc, yc = cupy.asarray(x), cupy.asarray(y)
        np.testing.assert_array_equal(t.predict(xc), t.predict(x))
        assert t.evaluate(xc, yc) == t.evaluate(x, y)
        with pytest.raises(DataError, match="uint8 or float32"):
            t.predict(cupy.asarray(x, dtype=cupy.float64))


def test_jax_array_predict_equals_host(engine):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX would take 75% of the GPU's memory
    jax = pytest.importorskip("jax")
    x, y = _data(np.float32)
    gpus = [d for d in jax.devices() if d.platform == "gpu"]
    if not gpus:
        pytest.skip("JAX sees no GPU")
    xj = jax.device_put(x, gpus[0])
    if not hasattr(xj, "__cuda_array_interface__"):
        pytest.skip("this JAX's arrays do not export __cuda_array_interface__ (DLPack only)")
    with _trainer(engine) as t:
        t.fit(x, y, epochs=1, progress=False)
        np.testing.assert_array_equal(t.predict(xj), t.predict(x))


class _Redescribed:
    """A real GPU array's memory exported under a changed __cuda_array_interface__ (what a buggy or hostile
    library could export); holds the array so its memory stays valid."""

    def __init__(self, base, **fields):
        self.base = base
        self.__cuda_array_interface__ = {**base.__cuda_array_interface__, **fields}


def _on_gpu(host: np.ndarray):
    """`host` copied into GPU memory by CuPy or torch, whichever is installed."""
    try:
        import cupy

        return cupy.asarray(host)
    except ImportError:
        pass
    try:
        import torch

        return torch.from_numpy(host).cuda()
    except ImportError:
        pytest.skip("neither CuPy nor torch is installed: no GPU array to re-describe")


def test_redescribed_gpu_arrays_are_refused_before_any_copy(engine):
    # Issue 23 item 17: CuPy int64 labels re-described as "|O8" crashed Python (SIGSEGV) in the label copy;
    # x's shape (-5, D) or (2.9, D), a mask and an unknown version were accepted.
    x, y = _data(np.float32)
    xd, yd = _on_gpu(x), _on_gpu(y.astype(np.int64))
    bad = [
        (xd, _Redescribed(yd, typestr="|O8"), r"y .*typestr '\|O8'"),
        (xd, _Redescribed(yd, typestr="<f8"), r"y .*float64.*integer dtype"),
        (xd, _Redescribed(yd, mask=yd), r"y is a masked GPU array"),
        (_Redescribed(xd, shape=(-5, D)), yd, rf"x .*shape \(-5, {D}\)"),
        (_Redescribed(xd, shape=(2.9, D)), yd, rf"x .*shape \(2.9, {D}\)"),
        (_Redescribed(xd, mask=xd), yd, r"x is a masked GPU array"),
        (_Redescribed(xd, version=99), yd, r"x .*version 99"),
        (_Redescribed(xd, typestr=">f4"), yd, r"x .*typestr '>f4'"),
    ]
    with _trainer(engine) as t:
        for bx, by, match in bad:
            with pytest.raises(DataError, match=match):
                t.fit(bx, by, epochs=1, progress=False)
        assert (t.epoch, t.step) == (0, 0)
        t.fit(xd, yd, epochs=1, progress=False)  # the process and the trainer are fine
        assert t.epoch == 1 and np.isfinite(t.predict_proba(xd)).all()
