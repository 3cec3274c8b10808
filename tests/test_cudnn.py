"""cuDNN bindings: CPU checks against the installed library and its headers; GPU softmax against NumPy float64."""

from __future__ import annotations

import ctypes
import pickle
import re
from pathlib import Path

import numpy as np
import pytest

from fastnn._errors import ConfigError, DeviceUnavailable, FastnnError
from fastnn.cuda import cudnn
from fastnn.cuda._loader import CudaLibraryError, checked_argtype, library_path

# ---------------------------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def header_text() -> str:
    include = Path(library_path("cudnn")).parent.parent / "include"
    if not (include / "cudnn_graph.h").is_file():
        pytest.skip(f"the installed cuDNN wheel ships no headers next to its library ({include})")
    return "\n".join((include / name).read_text() for name in ("cudnn_graph.h", "cudnn_ops.h", "cudnn_version.h"))


@pytest.mark.bindings
@pytest.mark.parametrize(
    "enum, prefix",
    [
        (cudnn.Status, "CUDNN_STATUS_"),
        (cudnn.DataType, "CUDNN_DATA_"),
        (cudnn.TensorFormat, "CUDNN_TENSOR_"),
        (cudnn.SoftmaxAlgorithm, "CUDNN_SOFTMAX_"),
        (cudnn.SoftmaxMode, "CUDNN_SOFTMAX_MODE_"),
    ],
)
def test_enum_values_match_the_header(header_text, enum, prefix):
    for member in enum:
        found = re.findall(rf"\b{prefix}{member.name}\b[^=,\n]*=\s*(\d+)", header_text)
        assert found, f"{prefix}{member.name} not found in the cuDNN headers"
        assert member.value == int(found[0]), f"{enum.__name__}.{member.name}"


@pytest.mark.bindings
def test_version_is_plausible_and_matches_the_header(header_text):
    v = cudnn.version()
    assert 90000 <= v < 1000000, v
    major = int(re.search(r"#define CUDNN_MAJOR (\d+)", header_text).group(1))
    assert v // 10000 == major


@pytest.mark.bindings
def test_every_symbol_of_the_signature_table_resolves():
    lib = cudnn._lib()
    for name, (restype, argtypes) in cudnn._SIGNATURES.items():
        fn = getattr(lib, name)
        assert fn.argtypes == [checked_argtype(t) for t in argtypes], name  # integers range-checked
        if restype is cudnn._STATUS:
            assert fn.restype is ctypes.c_int and fn.errcheck is cudnn._errcheck, name
        else:
            assert fn.restype is restype, name


@pytest.mark.bindings
def test_softmax_forward_is_recorded_through_its_own_unchecked_declaration(monkeypatch):
    """Softmax.forward (once per recorded step) calls a declaration of cudnnSoftmaxForward without the per-call range
    check of its constant integers; a failure still names the softmax."""
    fn = cudnn._softmax_forward()
    restype, argtypes = cudnn._SIGNATURES["cudnnSoftmaxForward"]
    assert fn.argtypes == argtypes and fn.restype is ctypes.c_int and fn.errcheck is cudnn._errcheck
    assert fn is not cudnn._lib().cudnnSoftmaxForward
    calls = []

    def cudnnSoftmaxForward(*args):
        calls.append(args)
        raise cudnn.CudnnError(2000, "CUDNN_STATUS_BAD_PARAM", "cudnnSoftmaxForward")

    monkeypatch.setattr(cudnn, "_softmax_forward", lambda: cudnnSoftmaxForward)
    monkeypatch.setattr(cudnn, "_TensorDesc", lambda *args: type("Desc", (), {"ptr": 5, "close": lambda self: None})())
    sm = cudnn.Softmax(type("Handle", (), {"ptr": 3})(), 32, 10, "fp16")
    with pytest.raises(cudnn.CudnnError, match=r"softmax forward \(32, 10\) HALF"):
        sm.forward(4096, 8192)
    ((handle, algo, mode, one, x_desc, x, zero, y_desc, y),) = calls
    assert (handle, algo, mode, x_desc, x, y_desc, y) == (3, 1, 0, 5, 4096, 5, 8192)


@pytest.mark.bindings
def test_status_names_come_from_cudnn():
    assert cudnn.status_name(2000) == "CUDNN_STATUS_BAD_PARAM"
    assert cudnn.status_name(1001) == "CUDNN_STATUS_NOT_INITIALIZED"
    assert cudnn.status_name(0) == "CUDNN_STATUS_SUCCESS"


@pytest.mark.bindings
def test_failing_call_raises_cudnn_error_with_name_and_what():
    # A 4-D descriptor with a negative size is rejected on the host: no GPU needed.
    with pytest.raises(cudnn.CudnnError) as info:
        cudnn._TensorDesc(cudnn.DataType.FLOAT, -3, 10)
    err = info.value
    assert isinstance(err, CudaLibraryError) and isinstance(err, FastnnError)
    assert err.status_name.startswith("CUDNN_STATUS_BAD_PARAM"), err.status_name
    assert err.status == cudnn.Status[err.status_name.removeprefix("CUDNN_STATUS_")]
    assert err.what.startswith("cudnnSetTensor4dDescriptor (describing an NCHW FLOAT tensor (-3, 10, 1, 1))")
    assert str(err).startswith(f"{err.what} failed: {err.status_name} ({err.status})")
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is cudnn.CudnnError and copy.status == err.status


@pytest.mark.bindings
def test_errcheck_maps_bad_param():
    def cudnnSoftmaxForward():  # stands in for the ctypes function (only __name__ is read)
        pass

    with pytest.raises(cudnn.CudnnError) as info:
        cudnn._errcheck(2000, cudnnSoftmaxForward, ())
    assert info.value.status == 2000 and info.value.status_name == "CUDNN_STATUS_BAD_PARAM"
    assert info.value.what == "cudnnSoftmaxForward"
    assert cudnn._errcheck(0, cudnnSoftmaxForward, ()) == 0


@pytest.mark.bindings
def test_tensor_descriptor_is_created_and_destroyed_once():
    desc = cudnn._TensorDesc(cudnn.DataType.HALF, 32, 10)
    assert desc.ptr and not desc.closed
    desc.close()
    desc.close()
    assert desc.closed


@pytest.mark.parametrize(
    "n, c, dtype, out_dtype, named",
    [
        (0, 10, "fp32", None, "n must be"),
        (4, 0, "fp32", None, "c must be"),
        (4, 10, "bf16", None, "dtype must be"),
        (4, 10, "fp16", "fp32", "same type"),
        (4, 10, cudnn.DataType.DOUBLE, None, "fp16 or fp32"),
    ],
)
def test_softmax_rejects_bad_arguments(n, c, dtype, out_dtype, named):
    with pytest.raises(ConfigError, match=named):
        cudnn.Softmax(None, n, c, dtype, out_dtype)


@pytest.mark.bindings
def test_handle_without_gpu_is_device_unavailable():
    from fastnn._device import cuda_status

    if cuda_status()[0]:
        pytest.skip("a GPU is usable here: cudnnCreate succeeds")
    with pytest.raises(DeviceUnavailable, match="CUDNN_STATUS_NOT_INITIALIZED.*no usable CUDA driver or GPU"):
        cudnn.Handle()


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------

# numpy type, tolerance on max|err| (probabilities are in [0, 1]; dx relative to max|dx|)
TYPES = {"fp32": (np.float32, 2e-6), "fp16": (np.float16, 2e-3)}
SHAPES = [(32, 10), (1, 10), (129, 7), (256, 1000)]


@pytest.fixture(scope="module")
def gpu():
    from fastnn.cuda import driver

    device = driver.get_device(0)
    stream = driver.Stream(device)
    handle = cudnn.Handle(stream, device)
    yield driver, device, stream, handle
    handle.close()
    stream.close()


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("scale", [3.0, 60.0], ids=["normal", "large-logits"])
def test_softmax_forward_and_backward_against_numpy(gpu, dtype, shape, scale):
    driver, device, stream, handle = gpu
    np_t, tol = TYPES[dtype]
    rows, classes = shape
    rng = np.random.default_rng(rows * 1000 + classes)
    # large-logits: exp would overflow without ACCURATE's max subtraction (fp16 logits up to ~180 still fit)
    x = rng.normal(0, scale, shape).astype(np_t)
    dy = rng.normal(0, 1, shape).astype(np_t)
    bufs = [driver.DeviceBuffer(x.nbytes, device) for _ in range(4)]
    try:
        dx_in, dy_in, dy_out, ddx = bufs
        dx_in.upload(x)
        dy_in.upload(dy)
        dy_out.memset(0xFF)  # NaN: an unwritten element fails
        ddx.memset(0xFF)
        with cudnn.Softmax(handle, rows, classes, dtype) as softmax:
            softmax.forward(dx_in.ptr, dy_out.ptr)
            softmax.backward(dy_out.ptr, dy_in.ptr, ddx.ptr)
            stream.synchronize()
        y = dy_out.download(np.empty(shape, np_t)).astype(np.float64)
        dx = ddx.download(np.empty(shape, np_t)).astype(np.float64)
    finally:
        for buf in bufs:
            buf.close()
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(dx))
    assert np.max(np.abs(y - _softmax(x.astype(np.float64)))) <= tol
    # backward from the GPU's own y (as the engine uses it): dx = y * (dy - sum(dy * y))
    d64 = dy.astype(np.float64)
    expected_dx = y * (d64 - (d64 * y).sum(axis=1, keepdims=True))
    assert np.max(np.abs(dx - expected_dx)) <= tol * max(1.0, np.max(np.abs(expected_dx)))


@pytest.mark.gpu
def test_softmax_in_a_graph_replays(gpu):
    driver, device, stream, handle = gpu
    rows, classes = 64, 10
    rng = np.random.default_rng(1)
    x = rng.normal(0, 2, (rows, classes)).astype(np.float32)
    dx, dy = driver.DeviceBuffer(x.nbytes, device), driver.DeviceBuffer(x.nbytes, device)
    softmax = cudnn.Softmax(handle, rows, classes, "fp32")
    try:
        dx.upload(x)
        softmax.forward(dx.ptr, dy.ptr)  # eager first: kernels loaded before capture
        stream.synchronize()
        dy.memset(0xFF)
        stream.begin_capture()
        softmax.forward(dx.ptr, dy.ptr)
        graph = stream.end_capture()
        exe = graph.instantiate()
        assert np.isnan(dy.download(np.empty_like(x))).all()  # capture ran nothing
        for _ in range(10):
            exe.launch(stream)
        stream.synchronize()
        assert np.max(np.abs(dy.download(np.empty_like(x)) - _softmax(x.astype(np.float64)))) <= 1e-6
        exe.close()
        graph.close()
    finally:
        softmax.close()
        dx.close()
        dy.close()


@pytest.mark.gpu
def test_closed_softmax_refuses_to_run(gpu):
    _, _, _, handle = gpu
    softmax = cudnn.Softmax(handle, 4, 3, "fp16")
    softmax.close()
    softmax.close()
    with pytest.raises(ConfigError, match="closed"):
        softmax.forward(256, 256)


@pytest.mark.gpu
def test_selftest_line():
    from fastnn.cuda.selftest import run_selftest

    line = run_selftest(0)
    assert re.fullmatch(r"self-test: GEMM 64x48x80 fp16 max rel err \S+ ok; softmax 32x10 max err \S+ ok", line), line
