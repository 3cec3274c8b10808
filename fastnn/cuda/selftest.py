"""A one-line GPU self-test: one fused cuBLASLt GEMM and one cuDNN softmax, each checked against NumPy.

`python -m fastnn info` prints its line; a failure raises, so a broken library or driver combination is
caught before any training starts.
"""

from __future__ import annotations

import numpy as np

from .._errors import FastnnError

__all__ = ["SelfTestFailed", "run_selftest"]

# fp16 output: rounding alone gives ~5e-4 relative error; 1e-2 catches any wrong element or missing bias.
_GEMM_TOLERANCE = 1e-2
# fp32 softmax of O(1) logits: values in [0, 1], float32 rounding is ~1e-7.
_SOFTMAX_TOLERANCE = 1e-5


class SelfTestFailed(FastnnError, RuntimeError):
    """The GPU computed a result that disagrees with NumPy."""


def _gemm_check(device, stream, rng: np.random.Generator) -> str:
    from . import cublaslt as lt
    from .driver import DeviceBuffer

    m, n, k = 64, 48, 80
    # Column-major m x k A is the C-order (k, m) array A.T; likewise B (k x n) and D (m x n).
    a = rng.uniform(-1, 1, (m, k)).astype(np.float16)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float16)
    bias = rng.uniform(-1, 1, m).astype(np.float16)
    expected = a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64)[:, None]

    with lt.Handle(device) as handle, lt.Workspace(1 << 20, device) as workspace:
        bufs = [DeviceBuffer(x.nbytes, device) for x in (a, b, bias)] + [DeviceBuffer(m * n * 2, device)]
        try:
            da, db, dbias, dd = bufs
            da.upload(np.ascontiguousarray(a.T))
            db.upload(np.ascontiguousarray(b.T))
            dbias.upload(bias)
            dd.memset(0xFF)  # NaN in fp16: an element the GEMM does not write fails the check
            with lt.Matmul(
                handle,
                m,
                n,
                k,
                transa=False,
                transb=False,
                ab_type=lt.DataType.R_16F,
                cd_type=lt.DataType.R_16F,
                compute=lt.ComputeType.COMPUTE_32F,
                epilogue=lt.Epilogue.BIAS,
                workspace=workspace,
            ) as plan:
                plan(da.ptr, db.ptr, dd.ptr, dd.ptr, stream, bias=dbias.ptr)
                stream.synchronize()
            got = dd.download(np.empty((n, m), np.float16)).T.astype(np.float64)
        finally:
            for buf in bufs:
                buf.close()
    err = float(np.max(np.abs(got - expected)) / np.max(np.abs(expected))) if np.all(np.isfinite(got)) else np.inf
    if not err <= _GEMM_TOLERANCE:
        raise SelfTestFailed(
            f"self-test: cuBLASLt GEMM {m}x{n}x{k} fp16 + bias: max rel err {err:.1e} (> {_GEMM_TOLERANCE})"
        )
    return f"GEMM {m}x{n}x{k} fp16 max rel err {err:.1e} ok"


def _softmax_check(device, stream, rng: np.random.Generator) -> str:
    from . import cudnn
    from .driver import DeviceBuffer

    rows, classes = 32, 10
    x = rng.normal(0, 3, (rows, classes)).astype(np.float32)
    shifted = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    expected = shifted / shifted.sum(axis=1, keepdims=True)

    with cudnn.Handle(stream, device) as handle, cudnn.Softmax(handle, rows, classes, "fp32") as softmax:
        dx, dy = DeviceBuffer(x.nbytes, device), DeviceBuffer(x.nbytes, device)
        try:
            dx.upload(x)
            dy.memset(0xFF)  # NaN in fp32
            softmax.forward(dx.ptr, dy.ptr)
            stream.synchronize()
            got = dy.download(np.empty_like(x)).astype(np.float64)
        finally:
            dx.close()
            dy.close()
    err = float(np.max(np.abs(got - expected))) if np.all(np.isfinite(got)) else np.inf
    if not err <= _SOFTMAX_TOLERANCE:
        raise SelfTestFailed(
            f"self-test: cuDNN softmax {rows}x{classes} fp32: max err {err:.1e} (> {_SOFTMAX_TOLERANCE})"
        )
    return f"softmax {rows}x{classes} max err {err:.1e} ok"


def run_selftest(device_ordinal: int = 0) -> str:
    """Run a fused fp16 GEMM (BIAS epilogue) and an fp32 softmax on the GPU; return one line describing both.

    Raises:
        SelfTestFailed: a result disagrees with NumPy. DeviceUnavailable / CudaLibraryError: no usable GPU or
            a library call failed.
    """
    from .driver import Stream, get_device

    device = get_device(device_ordinal)
    rng = np.random.default_rng(0)
    with Stream(device) as stream:
        gemm = _gemm_check(device, stream, rng)
        softmax = _softmax_check(device, stream, rng)
    return f"self-test: {gemm}; {softmax}"
