"""The host's cost of recording one training step into the epoch graph (issue 26), on the CPU with the C calls stubbed.

Recording an epoch runs the step's Python once per step (1,875 steps for Fashion-MNIST at batch 32), so every
microsecond spent checking and packing arguments is ~2 ms of set-up per epoch graph. This times the Python that
prepares each call of a step with the library behind it replaced by a stub that returns success at once:

    matmul        cublaslt.Matmul.__call__ (a fused-epilogue GEMM; 11 per step of an MLP with 3 hidden layers)
    softmax       cudnn.Softmax.forward
    loss          graph/kernels.record_loss (arguments packed, Kernel.launch)
    update        graph/kernels.record_update with the next batch's gather (arguments packed, Kernel.launch)
    step          11 matmul + softmax + loss + update: what one step of MLP 784-8192x3-10 records

No GPU is needed: cublasLtMatmul and cudnnSoftmaxForward are bound to libc's `labs` (returns 0 for the NULL handle
the fake plans hold), cuLaunchKernel to a Python function returning CUDA_SUCCESS. The driver's own cost is not in
these numbers; on an H100 cuLaunchKernel and cublasLtMatmul each add a few microseconds under capture.

    python benchmarks/bench_record.py [--calls 20000]
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import sys
import time
import types
from pathlib import Path

if importlib.util.find_spec("fastnn") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import numpy as np

from fastnn import MLP, SGD
from fastnn.cuda import _loader, cublaslt, cudnn, driver
from fastnn.engine.base import EngineConfig
from fastnn.engine.graph import kernels
from fastnn.engine.plan import param_layout, precision_spec

__all__ = ["fake_engine", "fake_matmul", "fake_softmax", "main", "stub_libraries", "time_calls"]

_PTR = 1 << 32  # a plausible, 256-byte aligned device address


class _StubLibrary:
    """A ctypes.CDLL look-alike whose every function is libc's labs, returning an int (0, a success, for the NULL
    first argument the fakes pass): attributes declared as bind_library declares them (integer arguments checked,
    errcheck), `lib[name]` a fresh undeclared function object as CDLL gives."""

    def __init__(self, signatures: dict, status: object, errcheck) -> None:
        self._address = ctypes.cast(ctypes.CDLL(None).labs, ctypes.c_void_p).value
        for name, (restype, argtypes) in signatures.items():
            fn = self[name]
            fn.argtypes = [_loader.checked_argtype(t) for t in argtypes]
            if restype is status:
                fn.errcheck = errcheck
            setattr(self, name, fn)

    def __getitem__(self, name: str):
        fn = ctypes.CFUNCTYPE(ctypes.c_int)(self._address)
        fn.__name__ = name
        return fn


def stub_libraries() -> None:
    """cuBLASLt and cuDNN bound to a C function that does nothing; the driver's kernel launch to a Python one."""
    lt = _StubLibrary(cublaslt._SIGNATURES, cublaslt._STATUS, cublaslt._errcheck)
    dnn = _StubLibrary(cudnn._SIGNATURES, cudnn._STATUS, cudnn._errcheck)
    cublaslt._lib = lambda: lt
    cudnn._lib = lambda: dnn
    success = (driver.cu.CUresult.CUDA_SUCCESS,)
    driver.cu = types.SimpleNamespace(**{n: getattr(driver.cu, n) for n in dir(driver.cu) if not n.startswith("_")})
    driver.cu.cuLaunchKernel = lambda *args: success


def fake_matmul(epilogue: cublaslt.Epilogue) -> cublaslt.Matmul:
    """A Matmul as the graph engine builds one for a hidden layer, without the library (NULL descriptors)."""
    ws = object.__new__(cublaslt.Workspace)
    ws.nbytes, ws.ptr = 32 << 20, _PTR
    handle = types.SimpleNamespace(ptr=0)
    build = cublaslt.Matmul._heuristic
    cublaslt.Matmul._heuristic = lambda self: [cublaslt._Algo()]
    descriptors = cublaslt._Descriptors
    cublaslt._Descriptors = _NullDescriptors
    try:
        return cublaslt.Matmul(
            handle, 8192, 32, 8192, transa=True, transb=False, ab_type=cublaslt.DataType.R_16F,
            cd_type=cublaslt.DataType.R_16F, compute=cublaslt.ComputeType.COMPUTE_32F, epilogue=epilogue, workspace=ws,
        )  # fmt: skip
    finally:
        cublaslt.Matmul._heuristic = build
        cublaslt._Descriptors = descriptors


class _NullDescriptors:
    """cublaslt._Descriptors with NULL descriptors (the stub's calls succeed for a NULL first argument)."""

    def __init__(self, *args, **kwargs) -> None:
        null = types.SimpleNamespace(ptr=0, set=lambda attr, value: None, close=lambda: None)
        self.desc = self.a = self.b = self.cd = null

    def close(self) -> None:
        pass


def fake_softmax() -> cudnn.Softmax:
    """cudnn.Softmax of a batch of 32 logits (fp16), as the graph engine builds it, with a NULL descriptor."""
    descriptor = cudnn._TensorDesc
    cudnn._TensorDesc = lambda *args: types.SimpleNamespace(ptr=0, close=lambda: None)
    try:
        return cudnn.Softmax(types.SimpleNamespace(ptr=0), 32, 10, "fp16")
    finally:
        cudnn._TensorDesc = descriptor


def fake_engine() -> types.SimpleNamespace:
    """What graph/kernels.py reads of the graph engine's Resources record, for MLP 784-8192x3-10 in "mixed" with SGD."""
    config = EngineConfig(model=MLP([784, 8192, 8192, 8192, 10]), optimizer=SGD(lr=0.1, momentum=0.9), batch_size=32)
    module = types.SimpleNamespace(_alive=lambda: None)
    kernel_cache: dict[str, driver.Kernel] = {}

    def function(name: str) -> driver.Kernel:
        return kernel_cache.setdefault(name, driver.Kernel(module, name, 0))

    mod = types.SimpleNamespace(function=function)
    buf = types.SimpleNamespace(ptr=_PTR)
    spec = precision_spec(config.precision)
    layout = param_layout(config.model)
    return types.SimpleNamespace(
        config=config, spec=spec, layout=layout, opt_names=config.optimizer.state_names, train_state=buf, grads=buf,
        w16=buf, epoch_state=buf, param_bytes=layout.total * 4, opt_bytes=layout.total * 4, feature_affine={},
        dev=types.SimpleNamespace(sm_count=132), stream=types.SimpleNamespace(handle=0, ptr=0), update_mod=mod,
        loss_mod=mod, gather_mod=mod, y_words=1, regression=False,
    )  # fmt: skip


def time_calls(fn, calls: int) -> float:
    """Microseconds of this process's CPU time per call of fn(), best of five rounds of `calls` (CPU time: the
    machines this runs on are shared, and wall time counts other processes' turns)."""
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, time.process_time() - t0)
    return best / calls * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args(argv)
    stub_libraries()
    fwd = fake_matmul(cublaslt.Epilogue.RELU_AUX_BIAS)
    sm = fake_softmax()
    eng = fake_engine()
    x = types.SimpleNamespace(ptr=_PTR)
    gather = (x, x, 60000, np.dtype(np.uint8), 32, 32, x, _PTR)
    stream = eng.stream
    p = _PTR

    def matmul() -> None:
        fwd(p, p, p, p, stream, bias=p, aux=p)

    def softmax() -> None:
        sm.forward(p, p)

    def loss() -> None:
        kernels.record_loss(eng, p, p, p, 32, p, p, 0, p, 32)

    def update() -> None:
        kernels.record_update(eng, 5, 1875, gather)

    def step() -> None:
        for _ in range(11):
            matmul()
        softmax()
        loss()
        update()

    rows = [(name, time_calls(fn, args.calls if name != "step" else max(1, args.calls // 10)))
            for name, fn in (("matmul", matmul), ("softmax", softmax), ("loss", loss), ("update", update),
                             ("step", step))]  # fmt: skip
    print("| call | us per call |\n|---|---:|")
    for name, us in rows:
        print(f"| {name} | {us:.2f} |")
    print(f"\nan epoch of 1,875 steps: {rows[-1][1] * 1875 / 1e6:.2f} s of Python")


if __name__ == "__main__":
    main()
