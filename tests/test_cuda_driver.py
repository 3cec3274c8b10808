"""fastnn.cuda.driver: status mapping, ownership and no-GPU behaviour on the CPU; the real API on a GPU."""

from __future__ import annotations

import ctypes
import gc
import pickle
import threading

import numpy as np
import pytest

pytestmark = pytest.mark.bindings  # every test here reads cuda-bindings' enums, GPU or not
cu = pytest.importorskip("cuda.bindings.driver", reason='needs the CUDA wheels: pip install -e ".[cu12]"')

from fastnn._device import cuda_status  # noqa: E402
from fastnn._errors import ConfigError, DeviceUnavailable, FastnnError  # noqa: E402
from fastnn.cuda import driver  # noqa: E402
from fastnn.cuda._loader import CudaDriverError, CudaLibraryError  # noqa: E402

SUCCESS = cu.CUresult.CUDA_SUCCESS
NO_GPU = not cuda_status()[0]


# ---------------------------------------------------------------------------------------------------------------
# CPU: status mapping
# ---------------------------------------------------------------------------------------------------------------


def test_check_raises_driver_error_with_the_status_name():
    with pytest.raises(CudaDriverError) as info:
        driver._check((cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY,), "cuMemAlloc(64 bytes)")
    err = info.value
    assert isinstance(err, CudaLibraryError) and isinstance(err, FastnnError)
    assert err.status == 2
    assert err.status_name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert err.what == "cuMemAlloc(64 bytes)"
    assert str(err) == "cuMemAlloc(64 bytes) failed: CUDA_ERROR_OUT_OF_MEMORY (2)"
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), copy.status, copy.status_name, str(copy)) == (CudaDriverError, 2, err.status_name, str(err))


def test_check_failure_with_values_still_raises():
    with pytest.raises(CudaDriverError, match="CUDA_ERROR_INVALID_VALUE"):
        driver._check((cu.CUresult.CUDA_ERROR_INVALID_VALUE, None), "cuMemAlloc")


def test_check_unwraps_values():
    assert driver._check((SUCCESS,), "x") is None
    assert driver._check((SUCCESS, 7), "x") == 7
    assert driver._check((SUCCESS, 1, 2), "x") == (1, 2)


def test_status_name_prefers_cugeterrorname(monkeypatch):
    monkeypatch.setattr(cu, "cuGetErrorName", lambda err: (SUCCESS, b"NAME_FROM_DRIVER"))
    with pytest.raises(CudaDriverError) as info:
        driver._check((cu.CUresult.CUDA_ERROR_LAUNCH_FAILED,), "cuLaunchKernel('k')")
    assert info.value.status_name == "NAME_FROM_DRIVER"
    assert info.value.status == int(cu.CUresult.CUDA_ERROR_LAUNCH_FAILED)


def test_status_name_falls_back_to_the_enum_name(monkeypatch):
    def broken(err):
        raise RuntimeError("no driver")

    monkeypatch.setattr(cu, "cuGetErrorName", broken)
    assert driver._status_name(cu.CUresult.CUDA_ERROR_NOT_FOUND) == "CUDA_ERROR_NOT_FOUND"


# ---------------------------------------------------------------------------------------------------------------
# CPU: initialization failures become DeviceUnavailable
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not NO_GPU, reason="this machine has a usable GPU")
def test_device_without_gpu_is_unavailable_with_a_fix():
    with pytest.raises(DeviceUnavailable) as info:
        driver.Device()
    message = str(info.value)
    assert "fix" in message or "nvidia-smi" in message
    with pytest.raises(DeviceUnavailable):
        driver.get_device(0)
    with pytest.raises(DeviceUnavailable):
        driver.driver_version()


def _fake_cuinit(monkeypatch, status):
    monkeypatch.setattr(driver, "_initialized", False)
    monkeypatch.setattr(cu, "cuInit", lambda flags: (status,))


def test_no_device_status_means_zero_devices(monkeypatch):
    _fake_cuinit(monkeypatch, cu.CUresult.CUDA_ERROR_NO_DEVICE)
    assert driver.device_count() == 0
    with pytest.raises(DeviceUnavailable, match="no CUDA device"):
        driver.Device(0)


def test_init_failure_names_status_and_fix(monkeypatch):
    _fake_cuinit(monkeypatch, cu.CUresult.CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)
    with pytest.raises(DeviceUnavailable) as info:
        driver.device_count()
    assert "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH" in str(info.value)
    assert "fix:" in str(info.value)
    assert isinstance(info.value.__cause__, CudaDriverError)


def test_driver_older_than_bindings_is_unavailable_with_the_matching_extra(monkeypatch):
    _fake_cuinit(monkeypatch, SUCCESS)
    old = (driver.BINDINGS_MAJOR - 1) * 1000 + 80
    monkeypatch.setattr(cu, "cuDriverGetVersion", lambda: (SUCCESS, old))
    with pytest.raises(DeviceUnavailable) as info:
        driver.device_count()
    assert f'pip install -e ".[cu{driver.BINDINGS_MAJOR - 1}]"' in str(info.value)
    assert driver.driver_version() == old  # still reported, for `fastnn info`
    assert driver._initialized is False


def test_driver_library_missing_is_unavailable(monkeypatch):
    def missing(flags):
        raise RuntimeError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(driver, "_initialized", False)
    monkeypatch.setattr(cu, "cuInit", missing)
    with pytest.raises(DeviceUnavailable, match="libcuda.so.1"):
        driver.driver_version()


@pytest.mark.parametrize("ordinal", [-1, True, 1.0, "0"])
def test_bad_ordinal_is_config_error(ordinal):
    with pytest.raises(ConfigError, match="ordinal"):
        driver.Device(ordinal)


@pytest.mark.parametrize("nbytes", [-1, 2.0, None, True])
def test_bad_buffer_size_is_config_error(nbytes):
    with pytest.raises(ConfigError, match="nbytes"):
        driver.DeviceBuffer(nbytes)
    with pytest.raises(ConfigError, match="nbytes"):
        driver.PinnedBuffer(nbytes)


# ---------------------------------------------------------------------------------------------------------------
# CPU: ownership (free exactly once, by close() or by garbage collection)
# ---------------------------------------------------------------------------------------------------------------


class _FakeDevice:
    context = object()


class _Thing(driver._Owned):
    def __init__(self, free, handle="h"):
        self._own(_FakeDevice(), free, handle, "fakeFree")


@pytest.fixture
def ctx_calls(monkeypatch):
    """The contexts pushed (made current for a free) and the pops that restore the thread's own."""
    calls = []
    monkeypatch.setattr(cu, "cuCtxPushCurrent", lambda ctx: calls.append(ctx) or (SUCCESS,))
    monkeypatch.setattr(cu, "cuCtxPopCurrent", lambda: calls.append("pop") or (SUCCESS, None))
    return calls


def test_close_frees_once_with_context_current(ctx_calls):
    freed = []
    thing = _Thing(lambda h: freed.append(h) or (SUCCESS,))
    assert not thing.closed
    thing.close()
    thing.close()
    assert freed == ["h"]
    assert ctx_calls == [_FakeDevice.context, "pop"]  # the thread's own context is current again after the free
    assert thing.closed
    with pytest.raises(ConfigError, match="_Thing is closed"):
        thing._alive()


def test_garbage_collection_frees_once(ctx_calls):
    freed = []
    thing = _Thing(lambda h: freed.append(h) or (SUCCESS,))
    finalizer = thing._finalizer
    assert finalizer.atexit is False  # the process exit frees device resources, not a half-torn-down binding
    del thing
    gc.collect()
    assert freed == ["h"]
    assert not finalizer.alive


def test_context_manager_closes(ctx_calls):
    freed = []
    with _Thing(lambda h: freed.append(h) or (SUCCESS,)) as thing:
        assert not thing.closed
    assert freed == ["h"] and thing.closed


def test_free_failure_raises_but_driver_shutdown_is_ignored(ctx_calls):
    bad = _Thing(lambda h: (cu.CUresult.CUDA_ERROR_INVALID_VALUE,))
    with pytest.raises(CudaDriverError, match="fakeFree failed: CUDA_ERROR_INVALID_VALUE"):
        bad.close()
    assert bad.closed
    gone = _Thing(lambda h: (cu.CUresult.CUDA_ERROR_DEINITIALIZED,))
    gone.close()
    assert gone.closed


def test_a_free_while_this_thread_captures_waits_for_the_capture_to_end(ctx_calls, monkeypatch):
    """The garbage collector may run a finalizer mid-capture; the free (a call a capture prohibits) must wait,
    a driver object's and a library object's (cudnnDestroy, ncclCommDestroy...) alike."""
    from fastnn.cuda import _capture
    from fastnn.cuda._loader import LibraryObject

    freed = []
    thing = _Thing(lambda h: freed.append(h) or (SUCCESS,))
    failing = _Thing(lambda h: (cu.CUresult.CUDA_ERROR_INVALID_VALUE,), handle="bad")
    library = LibraryObject(7, freed.append)
    reported = []
    monkeypatch.setattr(_capture.sys, "unraisablehook", reported.append)
    _capture.begin()
    try:
        _capture.begin()  # nested: only the outermost end runs the deferred frees
        failing.close()
        thing.close()
        library.close()
        assert freed == [] and thing.closed and library.closed  # closed for their owners at once; the calls wait
        other_thread = threading.Thread(target=_Thing(lambda h: freed.append(h) or (SUCCESS,), "t").close)
        other_thread.start()
        other_thread.join()
        assert freed == ["t"]  # another thread is not capturing: its frees run at once
        _capture.end()
        assert freed == ["t"] and _capture.capturing()
    finally:
        _capture.end()
    assert not _capture.capturing()
    assert freed == ["t", "h", 7]
    (failure,) = reported  # the failing free is reported as a finalizer's would be; the next ones still ran
    assert "fakeFree failed" in str(failure.exc_value)


def test_in_context_runs_with_the_context_current_and_restores_the_threads(ctx_calls, monkeypatch):
    """Library handles are destroyed through driver.in_context: their context pushed (a finalizer runs on any
    thread), popped after even a failing destroy; nothing runs when the context is gone; None runs as is."""
    from fastnn.cuda import _loader

    def failing() -> None:
        raise RuntimeError("destroy failed")

    ran = []
    assert driver.in_context("ctx", lambda a: ran.append(a) or "done", 1) == "done"
    with pytest.raises(RuntimeError, match="destroy failed"):
        driver.in_context("ctx", failing)
    assert driver.in_context(None, ran.append, 2) is None
    assert ctx_calls == ["ctx", "pop", "ctx", "pop"] and ran == [1, 2]
    gone = (cu.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED,)
    monkeypatch.setattr(cu, "cuCtxPushCurrent", lambda ctx: gone)
    assert driver.in_context("ctx", ran.append, 3) == gone and ran == [1, 2]
    monkeypatch.setattr(driver, "current_context", lambda: "made-in")
    destroy = _loader.in_current_context(ran.append)
    monkeypatch.setattr(driver, "current_context", lambda: "another")
    monkeypatch.setattr(cu, "cuCtxPushCurrent", lambda ctx: ctx_calls.append(ctx) or (SUCCESS,))
    destroy(4)
    assert ctx_calls[-2:] == ["made-in", "pop"] and ran == [1, 2, 4]


def test_a_deferring_call_frees_what_it_dropped_once_it_returns_or_raises(ctx_calls):
    """A replica's epoch launch defers this thread's frees (another GPU may be waiting on the launch); they run as
    it returns, and when it raises."""
    from fastnn.cuda import _capture

    freed = []

    def launch(tag: str, fail: bool = False) -> str:
        _Thing(lambda h: freed.append(h) or (SUCCESS,), tag).close()
        assert freed == [] and _capture.capturing()
        if fail:
            raise RuntimeError("launch failed")
        return tag

    assert _capture.deferring(launch)("a") == "a" and freed == ["a"]
    freed.clear()
    with pytest.raises(RuntimeError, match="launch failed"):
        _capture.deferring(launch)("b", fail=True)
    assert freed == ["b"] and not _capture.capturing()


# ---------------------------------------------------------------------------------------------------------------
# CPU: a kernel launch's checks and arguments (cuLaunchKernel replaced by a recorder)
# ---------------------------------------------------------------------------------------------------------------


class _Module:
    def _alive(self) -> None:
        pass


class _Launches:
    """cuLaunchKernel's stand-in: records (grid, block, shared, stream, the first `count` kernelParams pointers)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.status = SUCCESS
        self.count = 1

    def __call__(self, fn, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        addresses = list((ctypes.c_uint64 * self.count).from_address(params))
        self.calls.append(((gx, gy, gz), (bx, by, bz), shared, stream, addresses))
        return (self.status,)


@pytest.fixture
def launches(monkeypatch):
    recorder = _Launches()
    monkeypatch.setattr(driver.cu, "cuLaunchKernel", recorder)
    return recorder


def test_launch_passes_the_addresses_of_its_arguments(launches):
    kernel = driver.Kernel(_Module(), "k", 0)
    stream = type("FakeStream", (), {"handle": 7})()
    args = [driver.arg_ptr(4096), driver.arg_i32(-3), driver.arg_f32(0.5), driver.arg_struct([("lr", "f32", 0.1)])]
    launches.count = len(args)
    kernel.launch((2, 1, 1), [32, np.int64(1), 1], args, stream)
    grid, block, shared, handle, addresses = launches.calls[-1]
    assert grid == (2, 1, 1) and block == (32, 1, 1) and type(block[1]) is int and (shared, handle) == (0, 7)
    assert addresses == [ctypes.addressof(a) for a in args]
    launches.count = 1
    kernel.launch((1, 1, 1), (1, 1, 1), [], stream)  # no arguments: still a valid (unused) kernelParams array
    assert len(launches.calls) == 2


@pytest.mark.parametrize(
    "grid, block, args, shared, named",
    [
        ((0, 1, 1), (32, 1, 1), [], 0, "grid must be three ints in"),
        ((1, 1), (32, 1, 1), [], 0, "grid must be three positive ints"),
        ((1, 1, 1), (32, True, 1), [], 0, "block must be three positive ints"),
        ((1, 1, 1), (2**32, 1, 1), [], 0, "block must be three ints in"),
        ((1, 1, 1), (32, 1, 1), [ctypes.c_int(1), 2.5], 0, "argument 1 must be a ctypes value, got float"),
        ((1, 1, 1), (32, 1, 1), [(ctypes.c_int * 2)()], 0, "argument 0 must be a ctypes value, got c_int_Array_2"),
        ((1, 1, 1), (32, 1, 1), [ctypes.pointer(ctypes.c_int())], 0, "argument 0 must be a ctypes value"),
        ((1, 1, 1), (32, 1, 1), [], -1, "shared_mem must be in"),
    ],
)
def test_launch_refuses_bad_arguments_before_the_driver_call(launches, grid, block, args, shared, named):
    kernel = driver.Kernel(_Module(), "k", 0)
    kernel.launch((1, 1, 1), (1, 1, 1), [ctypes.c_int(1), ctypes.c_float(2)], type("S", (), {"handle": 0})())
    # a launch with good arguments came first: their types are known now, and the bad are still refused
    with pytest.raises(ConfigError, match=named):
        kernel.launch(grid, block, args, type("S", (), {"handle": 0})(), shared)
    assert len(launches.calls) == 1


def test_launch_failure_names_the_kernel(launches):
    launches.status = cu.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(CudaDriverError, match=r"cuLaunchKernel\('gather'\) failed: CUDA_ERROR_INVALID_VALUE"):
        driver.Kernel(_Module(), "gather", 0).launch((1, 1, 1), (1, 1, 1), [], type("S", (), {"handle": 0})())


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------

SAXPY = r"""
extern "C" __global__ void saxpy(float a, const float* x, float* y, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
extern "C" __global__ void fill(float* y, float value, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = value;
}
"""


@pytest.fixture(scope="module")
def dev():
    return driver.get_device(0)


@pytest.fixture(scope="module")
def module(dev):
    from fastnn.cuda.nvrtc import compile_source

    return driver.Module(compile_source(SAXPY, "saxpy.cu", dev.arch), dev)


def _grid(n: int, block: int = 256) -> tuple[int, int, int]:
    return (-(-n // block), 1, 1)


def _saxpy(module, a: float, x: driver.DeviceBuffer, y: driver.DeviceBuffer, n: int, stream: driver.Stream) -> None:
    args = [ctypes.c_float(a), ctypes.c_void_p(x.ptr), ctypes.c_void_p(y.ptr), ctypes.c_uint(n)]
    module.function("saxpy").launch(_grid(n), (256, 1, 1), args, stream)


@pytest.mark.gpu
def test_device_properties(dev):
    assert driver.get_device(0) is dev
    assert driver.device_count() >= 1
    assert driver.driver_version() >= 12000
    assert dev.name and dev.name == driver.device_name(0)
    major, minor = dev.compute_capability
    assert major >= 5 and 0 <= minor <= 9
    assert dev.arch == f"sm_{major}{minor}"
    assert dev.sm_count > 0
    assert dev.total_memory > 2**30
    free, total = dev.mem_info()
    assert 0 < free <= total
    assert dev.max_shared_memory_optin >= 48 * 1024
    dev.make_current()
    dev.synchronize()


@pytest.mark.gpu
def test_buffer_round_trip_and_offsets(dev):
    rng = np.random.default_rng(0)
    data = rng.standard_normal(1000).astype(np.float32)
    with driver.DeviceBuffer(8192) as buf:
        assert buf.ptr % 256 == 0 and buf.nbytes == 8192
        buf.upload(data)
        out = np.full(1000, np.nan, np.float32)
        assert buf.download(out) is out
        np.testing.assert_array_equal(out, data)
        tail = np.arange(16, dtype=np.int32)
        buf.upload(tail, offset=4096)
        got = buf.download(np.full(16, -1, np.int32), offset=4096)
        np.testing.assert_array_equal(got, tail)
        np.testing.assert_array_equal(buf.download(np.full(1000, np.nan, np.float32)), data)  # untouched
        with pytest.raises(ConfigError, match="outside"):
            buf.upload(np.zeros(10, np.float32), offset=8192 - 39)
        with pytest.raises(ConfigError, match="outside"):
            buf.download(np.zeros(2049, np.float32))
        with pytest.raises(ConfigError, match="contiguous"):
            buf.upload(np.zeros((8, 8), np.float32)[:, 0])
    with pytest.raises(ConfigError, match="closed"):
        buf.upload(data)
    empty = driver.DeviceBuffer(0)
    assert empty.nbytes == 0 and empty.ptr != 0
    empty.close()


@pytest.mark.gpu
def test_async_upload_from_pinned_and_copies(dev):
    stream = driver.Stream(dev)
    pinned = driver.PinnedBuffer(4096)
    view = pinned.view(np.float32, (8, 32))
    assert view.shape == (8, 32) and view.ctypes.data == pinned.ptr
    view[:] = np.arange(256, dtype=np.float32).reshape(8, 32)
    a, b = driver.DeviceBuffer(1024), driver.DeviceBuffer(1024)
    a.upload(view, stream)  # async: view is pinned and alive
    driver.copy_dtod(b.ptr, a.ptr, 1024, stream)
    back = driver.PinnedBuffer(1024)
    back_view = back.view(np.float32, 256)
    back_view[:] = np.nan
    driver.copy_dtoh(back.ptr, b.ptr, 1024, stream)
    stream.synchronize()
    np.testing.assert_array_equal(back_view, np.arange(256, dtype=np.float32))
    view[:] = -1.0
    driver.copy_htod(a.ptr, pinned.ptr, 1024, stream)
    stream.synchronize()
    np.testing.assert_array_equal(a.download(np.zeros(256, np.float32)), -1.0)
    with pytest.raises(ConfigError, match="needs"):
        pinned.view(np.float64, 513)
    for obj in (a, b, back, pinned, stream):
        obj.close()


@pytest.mark.gpu
def test_memset(dev):
    stream = driver.Stream(dev)
    buf = driver.DeviceBuffer(1000)
    buf.memset(0xAB)
    assert (buf.download(np.zeros(1000, np.uint8)) == 0xAB).all()
    buf.memset(0, stream)
    stream.synchronize()
    assert (buf.download(np.ones(1000, np.uint8)) == 0).all()
    bits = int(np.float32(1.5).view(np.uint32))
    driver.memset_d32(buf.ptr + 8, bits, 100, stream)
    stream.synchronize()
    got = buf.download(np.full(250, np.nan, np.float32))
    assert (got[:2] == 0).all() and (got[2:102] == 1.5).all() and (got[102:] == 0).all()
    with pytest.raises(ConfigError, match="aligned"):
        driver.memset_d32(buf.ptr + 2, 0, 1, stream)
    with pytest.raises(ConfigError, match="0..255"):
        buf.memset(256)
    buf.close()
    stream.close()


@pytest.mark.gpu
def test_nvrtc_kernel_launch_matches_numpy(dev, module):
    n = 10_001  # not a multiple of the block: the bounds check matters
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, n).astype(np.float32)
    y = rng.uniform(-1, 1, n).astype(np.float32)
    stream = driver.Stream(dev)
    xb, yb = driver.DeviceBuffer(x.nbytes), driver.DeviceBuffer(y.nbytes)
    yb.upload(np.full(n, np.nan, np.float32))  # poison: an unwritten element would stay NaN
    xb.upload(x)
    yb.upload(y)
    _saxpy(module, 2.5, xb, yb, n, stream)
    stream.synchronize()
    out = yb.download(np.full(n, np.nan, np.float32))
    expected = 2.5 * x.astype(np.float64) + y.astype(np.float64)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(ConfigError, match="ctypes value"):
        module.function("saxpy").launch((1, 1, 1), (32, 1, 1), [2.5, xb.ptr, yb.ptr, n], stream)
    with pytest.raises(ConfigError, match="grid"):
        module.function("saxpy").launch((0, 1, 1), (32, 1, 1), [], stream)
    with pytest.raises(CudaDriverError) as info:
        module.function("no_such_kernel")
    assert info.value.status_name == "CUDA_ERROR_NOT_FOUND"
    assert module.function("saxpy") is module.function("saxpy")
    for obj in (xb, yb, stream):
        obj.close()


def _epoch(module, stream, x, y, z, acc, pinned, n):
    """Several launches and copies, as an epoch graph would: resets, arithmetic, an accumulator."""
    driver.memset_d32(y.ptr, 0, n, stream)
    driver.copy_htod(z.ptr, pinned.ptr, 4 * n, stream)
    for a in (2.0, -0.5, 0.25):
        _saxpy(module, a, x, z, n, stream)
    _saxpy(module, 1.0, z, y, n, stream)
    _saxpy(module, 0.001, y, acc, n, stream)  # acc keeps growing across replays


@pytest.mark.gpu
def test_graph_capture_replay_equals_eager(dev, module):
    n = 4096
    rng = np.random.default_rng(2)
    stream = driver.Stream(dev)
    pinned = driver.PinnedBuffer(4 * n)
    pinned.view(np.float32, n)[:] = rng.uniform(-1, 1, n).astype(np.float32)
    x_host = rng.uniform(-1, 1, n).astype(np.float32)

    def fresh():
        bufs = [driver.DeviceBuffer(4 * n) for _ in range(4)]
        bufs[0].upload(x_host)
        for b in bufs[1:]:
            b.upload(np.full(n, np.nan if b is not bufs[3] else 0.0, np.float32))
        return bufs

    eager = fresh()
    for _ in range(1000):
        _epoch(module, stream, *eager, pinned, n)
    stream.synchronize()

    graphed = fresh()
    stream.begin_capture()
    try:
        _epoch(module, stream, *graphed, pinned, n)
    finally:
        graph = stream.end_capture()
    assert graph.num_nodes() == 7
    exe = graph.instantiate()
    graph.close()  # the executable graph does not need it
    # nothing ran during capture: the accumulator is still zero
    assert (graphed[3].download(np.full(n, np.nan, np.float32)) == 0).all()
    for _ in range(1000):
        exe.launch(stream)
    stream.synchronize()
    for e, g in zip(eager[1:], graphed[1:]):
        want = e.download(np.full(n, np.nan, np.float32))
        got = g.download(np.full(n, np.nan, np.float32))
        assert np.isfinite(got).all()
        np.testing.assert_array_equal(got, want)
    assert np.abs(want).max() > 0
    for obj in [exe, pinned, stream, *eager, *graphed]:
        obj.close()


@pytest.mark.gpu
def test_time_captured_replays_the_recording_twice_and_times_one(dev, module):
    """driver.time_captured (the GEMM autotuner's and the profiler's timer): the recording is captured, not run
    eagerly (record() is called once), the graph replays twice (the warm-up untimed) and the time is one replay's;
    a recording that raises leaves the stream out of capture, usable."""
    n = 1 << 20
    stream = driver.Stream(dev)
    x, y = driver.DeviceBuffer(4 * n), driver.DeviceBuffer(4 * n)
    x.upload(np.ones(n, np.float32))
    y.upload(np.zeros(n, np.float32))
    calls = []

    def record() -> None:
        calls.append(1)
        for _ in range(10):
            _saxpy(module, 1.0, x, y, n, stream)

    ms = driver.time_captured(stream, record)
    assert calls == [1] and 0 < ms < 1000
    np.testing.assert_array_equal(y.download(np.empty(n, np.float32)), 20.0)  # two replays of ten saxpys
    with pytest.raises(ZeroDivisionError):
        driver.time_captured(stream, lambda: 1 / 0)
    _saxpy(module, 1.0, x, y, n, stream)  # the stream is no longer capturing: this runs
    stream.synchronize()
    np.testing.assert_array_equal(y.download(np.empty(n, np.float32)), 21.0)
    for obj in (x, y, stream):
        obj.close()


def _capture_survives(dev, module, during) -> None:
    """Capture y += 2x, `during()`, y += 3x on one stream: the capture must end valid, every release deferred
    during it must have run at its end, and the graph must give y = 5x."""
    n = 1 << 12
    stream = driver.Stream(dev)
    x, y = driver.DeviceBuffer(4 * n), driver.DeviceBuffer(4 * n)
    x.upload(np.ones(n, np.float32))
    y.memset(0)
    stream.begin_capture()
    try:
        _saxpy(module, 2.0, x, y, n, stream)
        during()
        _saxpy(module, 3.0, x, y, n, stream)
    finally:
        graph = stream.end_capture()
    assert not driver._capture.capturing() and driver._capture._state.deferred == []
    exe = graph.instantiate()
    graph.close()
    exe.launch(stream)
    stream.synchronize()
    np.testing.assert_array_equal(y.download(np.zeros(n, np.float32)), np.full(n, 5.0, np.float32))
    for obj in (exe, x, y, stream):
        obj.close()


def _driver_victims(dev, module) -> list:
    """A device buffer, a pinned buffer and a graph executable: one of each kind of free a trainer's end makes."""
    n = 256
    stream, buf = driver.Stream(dev), driver.DeviceBuffer(4 * n)
    stream.begin_capture()
    _saxpy(module, 1.0, buf, buf, n, stream)
    graph = stream.end_capture()
    victims = [driver.DeviceBuffer(1 << 20), driver.PinnedBuffer(1 << 16), graph.instantiate()]
    for obj in (graph, buf, stream):
        obj.close()
    return victims


@pytest.mark.gpu
def test_resources_collected_during_a_capture_do_not_invalidate_it(dev, module):
    """A trainer dropped without close() may be collected while another one captures its epoch: its frees
    (cuMemFree, cuMemFreeHost, cuGraphExecDestroy) wait for the capture's end instead of invalidating it."""
    victims = _driver_victims(dev, module)

    def collect() -> None:
        victims.pop().close()  # explicit closes and collection take the same path
        del victims[:]
        gc.collect()

    _capture_survives(dev, module, collect)


@pytest.mark.gpu
def test_frees_on_another_thread_during_a_capture_do_not_invalidate_it(dev, module):
    """A replica engine captures on its GPU's worker thread while other threads run: a finalizer (or a close) on
    one of them mid-capture must not invalidate the capture either."""
    victims = _driver_victims(dev, module)

    def close_elsewhere() -> None:
        other = threading.Thread(target=lambda: [v.close() for v in victims])
        other.start()
        other.join()

    _capture_survives(dev, module, close_elsewhere)
    assert all(v.closed for v in victims)


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["cudnn", "cublaslt"])
def test_a_library_handle_is_destroyed_in_its_own_context_from_any_thread(dev, monkeypatch, kind):
    """cudnnDestroy and cublasLtDestroy synchronize and free on the current device; a collection may run them on a
    thread where no context (or another GPU's) is current: the handle's own is made current around the destroy,
    and the thread's own is back after."""
    from fastnn.cuda import cublaslt, cudnn

    lib = cudnn if kind == "cudnn" else cublaslt
    seen = []
    real = lib._destroy_by_name
    monkeypatch.setattr(lib, "_destroy_by_name", lambda name, ptr: (seen.append(driver.current_context()),
                                                                      real(name, ptr)))  # fmt: skip
    stream = driver.Stream(dev)
    handle = _library_object(kind, dev, stream)

    def destroy_elsewhere() -> None:
        _check_ctx(cu.cuCtxSetCurrent(None))  # a fresh thread has none; make sure
        handle.close()
        seen.append(driver.current_context())

    other = threading.Thread(target=destroy_elsewhere)
    other.start()
    other.join()
    assert len(seen) == 2 and int(seen[0]) == int(dev.context) and seen[1] is None, seen
    stream.close()


def _check_ctx(result) -> None:
    assert result[0] == SUCCESS, result


def _library_object(kind: str, dev, stream):
    from fastnn.cuda import cublaslt, cudnn, nccl

    if kind == "cudnn":
        return cudnn.Handle(stream, dev)
    if kind == "cublaslt":
        return cublaslt.Handle(dev)
    ok, why = nccl.available()
    if not ok:
        pytest.skip(why)
    return nccl.Comm.clique([dev.ordinal])[0]


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["cudnn", "cublaslt", "nccl"])
def test_library_objects_destroyed_during_a_capture_do_not_invalidate_it(dev, module, kind):
    """A trainer dropped without close() holds cuDNN and cuBLASLt handles and, in a data-parallel run, NCCL
    communicators; their destroys (which may free device memory or synchronize) wait for the capture's end too."""
    other = driver.Stream(dev)  # another trainer's stream
    victim = _library_object(kind, dev, other)
    _capture_survives(dev, module, victim.close)
    assert victim.closed
    other.close()


@pytest.mark.gpu
def test_events_time_a_replay(dev, module):
    n = 1 << 20
    stream = driver.Stream(dev)
    x, y = driver.DeviceBuffer(4 * n), driver.DeviceBuffer(4 * n)
    x.memset(0)
    y.memset(0)
    stream.begin_capture()
    for _ in range(20):
        _saxpy(module, 1.0, x, y, n, stream)
    exe = stream.end_capture().instantiate()
    start, end, marker = driver.Event(timing=True), driver.Event(timing=True), driver.Event()
    start.record(stream)
    exe.launch(stream)
    end.record(stream)
    marker.record(stream)
    end.synchronize()
    assert end.query() and marker.query()
    ms = start.elapsed_ms(end)
    assert 0 < ms < 10_000
    with pytest.raises(ConfigError, match="timing=True"):
        start.elapsed_ms(marker)
    for obj in (start, end, marker, exe, x, y, stream):
        obj.close()


@pytest.mark.gpu
def test_large_dynamic_shared_memory_opt_in(dev):
    from fastnn.cuda.nvrtc import compile_source

    src = r"""
    extern "C" __global__ void sum_shared(float* out, unsigned int n) {
        extern __shared__ float s[];
        for (unsigned int i = threadIdx.x; i < n; i += blockDim.x) s[i] = 1.0f;
        __syncthreads();
        if (threadIdx.x == 0) { float t = 0; for (unsigned int i = 0; i < n; ++i) t += s[i]; out[0] = t; }
    }
    """
    mod = driver.Module(compile_source(src, "shared.cu", dev.arch), dev)
    floats = min(dev.max_shared_memory_optin, 96 * 1024) // 4
    stream = driver.Stream(dev)
    out = driver.DeviceBuffer(4)
    out.upload(np.array([np.nan], np.float32))
    mod.function("sum_shared").launch(
        (1, 1, 1), (128, 1, 1), [ctypes.c_void_p(out.ptr), ctypes.c_uint(floats)], stream, shared_mem=4 * floats
    )
    stream.synchronize()
    assert out.download(np.zeros(1, np.float32))[0] == floats
    for obj in (out, stream, mod):
        obj.close()


def _cycle(module, dev, n, explicit):
    stream = driver.Stream(dev)
    bufs = [driver.DeviceBuffer(4 * n) for _ in range(3)]
    pinned = driver.PinnedBuffer(4 * n)
    start, end = driver.Event(timing=True), driver.Event(timing=True)
    stream.begin_capture()
    driver.memset_d32(bufs[1].ptr, 0, n, stream)
    _saxpy(module, 1.0, bufs[0], bufs[1], n, stream)
    driver.copy_dtod(bufs[2].ptr, bufs[1].ptr, 4 * n, stream)
    graph = stream.end_capture()
    exe = graph.instantiate()
    start.record(stream)
    exe.launch(stream)
    end.record(stream)
    stream.synchronize()
    objs = [exe, graph, start, end, pinned, *bufs, stream]
    if explicit:
        for obj in objs:
            obj.close()
    del objs, exe, graph, start, end, pinned, bufs, stream
    gc.collect()


@pytest.mark.gpu
def test_create_free_cycles_do_not_leak(dev, module):
    n = 1 << 18  # 1 MiB per buffer: a leak of even one buffer per cycle is visible
    _cycle(module, dev, n, explicit=True)  # warm up lazily allocated driver pools
    dev.synchronize()
    free_before, _ = dev.mem_info()
    for i in range(100):
        _cycle(module, dev, n, explicit=i % 2 == 0)  # half close(), half garbage collection
    dev.synchronize()
    free_after, _ = dev.mem_info()
    assert abs(free_before - free_after) <= 2**20
