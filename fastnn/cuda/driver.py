"""The CUDA driver API through cuda.bindings.driver: device, primary context, streams, graphs, events, memory, kernels.

Every call goes through `_check`, which unwraps cuda-python's `(err, *values)` tuples and raises
CudaDriverError named by cuGetErrorName. Every object that owns a driver resource frees it exactly once:
on `close()`, or through a `weakref.finalize` when it is collected. Finalizers do not run at interpreter
exit (the driver frees everything with the process), so shutdown never calls into a half-torn-down binding.

cuda-bindings 12.x and 13.x expose the same Python signatures for every function used here (checked against
12.9 and 13.5: cuCtxSynchronize and cuEventElapsedTime keep their 12.x forms, the new ones gained `_v2`);
should one ever differ, branch on `BINDINGS_MAJOR` in this module only.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import functools
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from cuda.bindings import __version__ as _bindings_version
from cuda.bindings import driver as cu

from .._errors import ConfigError, DeviceUnavailable
from .._install import pip_install
from . import _capture, _exit
from ._loader import DRIVER_HINT, CudaDriverError, c_int_value

_exit.skip_final_collection()  # this process loaded cuda.bindings: no collector passes over it at exit (_exit.py)

__all__ = [
    "BINDINGS_MAJOR",
    "arg_f32",
    "arg_i32",
    "arg_ptr",
    "arg_struct",
    "arg_u32",
    "arg_u64",
    "Device",
    "DeviceBuffer",
    "Event",
    "Graph",
    "GraphExec",
    "Kernel",
    "MappedHostBuffer",
    "Module",
    "PinnedBuffer",
    "Stream",
    "copy_dtod",
    "copy_dtoh",
    "copy_htod",
    "device_count",
    "device_name",
    "driver_version",
    "get_device",
    "memset_d32",
    "pointer_device",
    "time_captured",
]

#: Major version of cuda-bindings (12 or 13): the one place to branch if the two APIs ever differ.
BINDINGS_MAJOR = int(_bindings_version.split(".")[0])

_SUCCESS = cu.CUresult.CUDA_SUCCESS
# cuMemFree etc. after the driver has shut down: nothing is left to free.
_GONE = (cu.CUresult.CUDA_ERROR_DEINITIALIZED, cu.CUresult.CUDA_ERROR_CONTEXT_IS_DESTROYED)
# Default dynamic shared memory limit; above it a kernel must opt in with cuFuncSetAttribute.
_DEFAULT_MAX_SHARED = 48 * 1024


def _status_name(err: Any) -> str:
    """The driver's own name for a CUresult (cuGetErrorName), or the enum's C name if the driver can't say."""
    try:
        name_err, name = cu.cuGetErrorName(err)
        if name_err == _SUCCESS and name:
            return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # no driver library: the enum member's name is the same C name
        pass
    try:
        return cu.CUresult(int(err)).name
    except ValueError:
        return f"CUresult {int(err)}"


def _check(result: Any, what: str) -> Any:
    """Unwrap a cuda-python result tuple: raise CudaDriverError on failure, else return the value(s).

    Returns None for `(err,)`, the value for `(err, value)` and a tuple for more values.
    """
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != _SUCCESS:
        raise CudaDriverError(int(err), _status_name(err), what)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


# ---------------------------------------------------------------------------------------------------------------
# Initialization, device, primary context
# ---------------------------------------------------------------------------------------------------------------

_init_lock = threading.Lock()
_initialized = False


def _unavailable_reason(exc: CudaDriverError) -> str:
    """A user-facing reason and fix for a cuInit failure."""
    name = exc.status_name
    if name == "CUDA_ERROR_NO_DEVICE":
        return f"{exc}: no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
    if name == "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH":
        return f"{exc}: the NVIDIA kernel module and libcuda versions differ; fix: reinstall the driver or reboot"
    return f"{exc}; fix: check the NVIDIA driver (nvidia-smi)"


def _check_driver_version() -> None:
    """cuda-bindings 13 needs a CUDA 13 driver: say so plainly instead of failing later on a missing symbol."""
    version = int(_check(cu.cuDriverGetVersion(), "cuDriverGetVersion"))
    if version // 1000 < BINDINGS_MAJOR:
        raise DeviceUnavailable(
            f"the NVIDIA driver supports CUDA {version // 1000}.{version % 1000 // 10} but cuda-bindings "
            f"{_bindings_version} needs a CUDA {BINDINGS_MAJOR} driver; fix: upgrade the driver, or "
            f"{pip_install(f'cu{version // 1000}')} to match it"
        )


def _init() -> None:
    """cuInit once per process; any failure becomes DeviceUnavailable with the reason and the fix."""
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if _initialized:
            return
        try:
            result = cu.cuInit(0)
        except Exception as exc:  # cuda-bindings raises when libcuda.so cannot be loaded at all
            raise DeviceUnavailable(f"the CUDA driver library cannot be loaded ({exc}); fix: {DRIVER_HINT}") from exc
        try:
            _check(result, "cuInit")
        except CudaDriverError as exc:
            raise DeviceUnavailable(_unavailable_reason(exc)) from exc
        _check_driver_version()
        _initialized = True


def driver_version() -> int:
    """The driver's CUDA version as 1000 * major + 10 * minor (e.g. 12080 for 12.8).

    Raises:
        DeviceUnavailable: no usable driver.
    """
    try:
        _init()
    except DeviceUnavailable:
        # a driver too old for these bindings still reports its version (for `fastnn info`)
        try:
            return int(_check(cu.cuDriverGetVersion(), "cuDriverGetVersion"))
        except Exception:
            pass
        raise
    return int(_check(cu.cuDriverGetVersion(), "cuDriverGetVersion"))


def device_count() -> int:
    """Number of CUDA devices visible to this process (0 when the driver reports none)."""
    try:
        _init()
    except DeviceUnavailable as exc:
        if isinstance(exc.__cause__, CudaDriverError) and exc.__cause__.status_name == "CUDA_ERROR_NO_DEVICE":
            return 0
        raise
    return int(_check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))


def device_name(ordinal: int = 0) -> str:
    """The name of device `ordinal` without creating a context (no device memory is used)."""
    _init()
    dev = _check(cu.cuDeviceGet(int(ordinal)), f"cuDeviceGet({ordinal})")
    return _decode_name(_check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName"))


def _decode_name(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace").strip()


_primary_lock = threading.Lock()
_primary_contexts: dict[int, Any] = {}  # ordinal -> retained primary CUcontext, never released
_thread_state = threading.local()  # .device: the Device this thread made current last


#: Why a GPU that is visible cannot open a context, by the driver's status name (the rest: see nvidia-smi).
_NO_CONTEXT = {
    "CUDA_ERROR_DEVICE_UNAVAILABLE": "the GPU is in exclusive-process (or prohibited) compute mode and another "
    "process holds it",
    "CUDA_ERROR_DEVICE_BUSY": "the GPU is busy: another process holds it in exclusive-process compute mode",
    "CUDA_ERROR_OUT_OF_MEMORY": "its memory is full (other processes' allocations)",
}


def _primary_context(ordinal: int, dev: Any) -> Any:
    """Retain the primary context of `ordinal` once per process (shared with cuBLASLt/cuDNN/torch).

    Raises:
        DeviceUnavailable: the driver cannot open it (exclusive-process mode held by another job, no free memory):
            the GPU is there but unusable by this process, as for no GPU at all (device="auto" trains on the CPU).
    """
    with _primary_lock:
        ctx = _primary_contexts.get(ordinal)
        if ctx is None:
            try:
                ctx = _check(cu.cuDevicePrimaryCtxRetain(dev), f"cuDevicePrimaryCtxRetain(device {ordinal})")
            except CudaDriverError as exc:
                why = _NO_CONTEXT.get(exc.status_name, "see nvidia-smi for its state and the processes using it")
                raise DeviceUnavailable(f"cannot open a CUDA context on GPU {ordinal}: {exc}: {why}") from exc
            _primary_contexts[ordinal] = ctx
        return ctx


class Device:
    """A CUDA device with its primary context retained and made current on the calling thread.

    Prefer `get_device(ordinal)`, which caches one Device per ordinal.

    Raises:
        DeviceUnavailable: no usable driver or device; ConfigError: `ordinal` out of range.
    """

    def __init__(self, ordinal: int = 0) -> None:
        if isinstance(ordinal, bool) or not isinstance(ordinal, (int, np.integer)) or ordinal < 0:
            raise ConfigError(f"device ordinal must be a non-negative int, got {ordinal!r}")
        count = device_count()
        if count == 0:
            raise DeviceUnavailable("no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)")
        if ordinal >= count:
            raise ConfigError(f"device ordinal {ordinal} is out of range: {count} device(s) visible")
        self.ordinal = int(ordinal)
        self._dev = _check(cu.cuDeviceGet(self.ordinal), f"cuDeviceGet({self.ordinal})")
        self._ctx = _primary_context(self.ordinal, self._dev)
        self.make_current()
        self.name: str = _decode_name(_check(cu.cuDeviceGetName(256, self._dev), "cuDeviceGetName"))
        attr = cu.CUdevice_attribute
        major = self.attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = self.attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        self.compute_capability: tuple[int, int] = (major, minor)
        self.arch: str = f"sm_{major}{minor}"
        self.sm_count: int = self.attribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        self.total_memory: int = int(_check(cu.cuDeviceTotalMem(self._dev), "cuDeviceTotalMem"))
        #: Largest dynamic shared memory a kernel may opt in to (see Kernel.launch).
        self.max_shared_memory_optin: int = self.attribute(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)

    def __repr__(self) -> str:
        return f"Device({self.ordinal}: {self.name}, {self.arch}, {self.sm_count} SMs)"

    def attribute(self, attrib: cu.CUdevice_attribute) -> int:
        """One cuDeviceGetAttribute value."""
        return int(_check(cu.cuDeviceGetAttribute(attrib, self._dev), f"cuDeviceGetAttribute({attrib.name})"))

    @property
    def context(self) -> Any:
        """The retained primary CUcontext."""
        return self._ctx

    def make_current(self) -> None:
        """Make the primary context current on the calling thread; engines call it on entry from any thread."""
        _check(cu.cuCtxSetCurrent(self._ctx), f"cuCtxSetCurrent(device {self.ordinal})")
        _thread_state.device = self

    def highest_stream_priority(self) -> int:
        """The priority value of this device's most urgent streams (cuCtxGetStreamPriorityRange's greatest)."""
        self.make_current()
        _, greatest = _check(cu.cuCtxGetStreamPriorityRange(), "cuCtxGetStreamPriorityRange")
        return int(greatest)

    def mem_info(self) -> tuple[int, int]:
        """(free, total) device memory in bytes."""
        self.make_current()
        free, total = _check(cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def synchronize(self) -> None:
        """Wait for all work queued on this device's context, on every stream."""
        self.make_current()
        _check(cu.cuCtxSynchronize(), "cuCtxSynchronize")


_devices_lock = threading.Lock()
_devices: dict[int, Device] = {}


def get_device(ordinal: int = 0) -> Device:
    """The process-wide Device for `ordinal` (created on first use), made current on the calling thread."""
    with _devices_lock:
        device = _devices.get(ordinal)
        if device is None:
            device = _devices[ordinal] = Device(ordinal)
    device.make_current()
    return device


def _resolve(device: Device | None) -> Device:
    """`device`, else the one this thread made current last, else device 0; made current."""
    if device is None:
        device = getattr(_thread_state, "device", None) or get_device(0)
    device.make_current()
    return device


# ---------------------------------------------------------------------------------------------------------------
# Ownership: one release per resource
# ---------------------------------------------------------------------------------------------------------------


def current_context() -> Any:
    """The CUcontext current on this thread, or None: a library handle made now belongs to it (see in_context)."""
    err, ctx = cu.cuCtxGetCurrent()
    return ctx if err == _SUCCESS and int(ctx) else None


def in_context(ctx: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) with `ctx` current, then the thread's own context back: a finalizer may run on any thread, and a
    collection on one GPU's worker thread must neither free on another GPU's context nor leave it current there.
    When `ctx` cannot be made current (gone at process exit), fn is not run and the push's result is returned;
    with ctx None, fn runs in whatever context is current."""
    if ctx is None:
        return fn(*args)
    pushed = cu.cuCtxPushCurrent(ctx)
    if pushed[0] != _SUCCESS:
        return pushed
    try:
        return fn(*args)
    finally:
        cu.cuCtxPopCurrent()


def _release(ctx: Any, free: Callable[[Any], Any], handle: Any, what: str) -> None:
    """Free one driver resource with its context current (in_context). Called through _capture.release, so a free
    on a capturing thread waits for the capture's end."""
    try:
        result = in_context(ctx, free, handle)  # a failed push (the context gone) is reported below like a free's
    except Exception:  # binding already torn down: the process is exiting and the driver frees all
        return
    err = result[0] if isinstance(result, tuple) else result
    if err in _GONE:
        return
    _check(result, what)


class _Owned:
    """Base of every object owning a driver resource: close() or garbage collection frees it exactly once."""

    _finalizer: weakref.finalize | None = None

    def _own(self, device: Device, free: Callable[[Any], Any], handle: Any, what: str) -> None:
        self._finalizer = weakref.finalize(self, _capture.release, _release, device.context, free, handle, what)
        self._finalizer.atexit = False  # the driver frees everything at process exit

    @property
    def closed(self) -> bool:
        """True once the resource has been freed."""
        return self._finalizer is None or not self._finalizer.alive

    def _alive(self) -> None:
        if self.closed:
            raise ConfigError(f"{type(self).__name__} is closed")

    def close(self) -> None:
        """Free the resource now; later calls do nothing."""
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------------------
# Streams, graphs, events
# ---------------------------------------------------------------------------------------------------------------


class Stream(_Owned):
    """A non-blocking stream: it never synchronizes with the legacy NULL stream, so libraries can't stall it."""

    def __init__(self, device: Device | None = None, priority: int = 0) -> None:
        self.device = _resolve(device)
        flags = cu.CUstream_flags.CU_STREAM_NON_BLOCKING
        if priority:  # lower numbers run first (Device.highest_stream_priority); captured kernels keep it per node
            self.handle = _check(cu.cuStreamCreateWithPriority(flags, priority), "cuStreamCreateWithPriority")
        else:
            self.handle = _check(cu.cuStreamCreate(flags), "cuStreamCreate")
        #: The stream's address, for ctypes libraries (cuBLASLt, cuDNN) that take it as void*.
        self.ptr: int = int(self.handle)
        self._own(self.device, cu.cuStreamDestroy, self.handle, "cuStreamDestroy")

    def synchronize(self) -> None:
        """Wait until all work queued on this stream is done."""
        self._alive()
        _check(cu.cuStreamSynchronize(self.handle), "cuStreamSynchronize")

    def wait(self, event: Event) -> None:
        """Make later work on this stream wait for `event`'s recorded point (inside a capture: a graph edge, the
        way a side stream forks from and joins the captured one)."""
        self._alive()
        event._alive()
        _check(cu.cuStreamWaitEvent(self.handle, event.handle, 0), "cuStreamWaitEvent")

    def begin_capture(self) -> None:
        """Start recording this stream's work into a graph (thread-local mode: other threads are unaffected).
        Until end_capture, this thread's resource frees wait (see _capture)."""
        self._alive()
        self.device.make_current()
        mode = cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        _check(cu.cuStreamBeginCapture(self.handle, mode), "cuStreamBeginCapture")
        _capture.begin()

    def end_capture(self) -> Graph:
        """Stop recording and return the captured Graph; then the frees deferred during the capture run."""
        self._alive()
        try:
            graph = _check(cu.cuStreamEndCapture(self.handle), "cuStreamEndCapture")
        finally:
            _capture.end()
        return Graph._adopt(self.device, graph)


class Graph(_Owned):
    """A captured CUDA graph (from Stream.end_capture)."""

    def __init__(self) -> None:
        raise TypeError("Graph objects come from Stream.end_capture()")

    @classmethod
    def _adopt(cls, device: Device, handle: Any) -> Graph:
        self = cls.__new__(cls)
        self.device = device
        self.handle = handle
        self._own(device, cu.cuGraphDestroy, handle, "cuGraphDestroy")
        return self

    def num_nodes(self) -> int:
        """Number of nodes (kernels, copies, memsets...) in the graph."""
        self._alive()
        _, count = _check(cu.cuGraphGetNodes(self.handle, 0), "cuGraphGetNodes")
        return int(count)

    def instantiate(self, node_priority: bool = False) -> GraphExec:
        """An executable graph; the Graph may be closed afterwards, the GraphExec stays valid. node_priority: its
        kernels run at the priority of the stream each was captured from, not the one it is launched into."""
        self._alive()
        self.device.make_current()
        flags = cu.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY if node_priority else 0
        handle = _check(cu.cuGraphInstantiate(self.handle, int(flags)), "cuGraphInstantiate")
        return GraphExec._adopt(self.device, handle)


class GraphExec(_Owned):
    """An instantiated graph, replayed with launch()."""

    def __init__(self) -> None:
        raise TypeError("GraphExec objects come from Graph.instantiate()")

    @classmethod
    def _adopt(cls, device: Device, handle: Any) -> GraphExec:
        self = cls.__new__(cls)
        self.device = device
        self.handle = handle
        self._own(device, cu.cuGraphExecDestroy, handle, "cuGraphExecDestroy")
        return self

    def launch(self, stream: Stream) -> None:
        """Queue one replay of the whole graph on `stream`."""
        self._alive()
        _check(cu.cuGraphLaunch(self.handle, stream.handle), "cuGraphLaunch")


class Event(_Owned):
    """A CUDA event; timing=True records timestamps (otherwise the cheaper no-timing kind)."""

    def __init__(self, timing: bool = False, device: Device | None = None) -> None:
        self.device = _resolve(device)
        self.timing = bool(timing)
        flags = cu.CUevent_flags.CU_EVENT_DEFAULT if timing else cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
        self.handle = _check(cu.cuEventCreate(flags), "cuEventCreate")
        self._own(self.device, cu.cuEventDestroy, self.handle, "cuEventDestroy")

    def record(self, stream: Stream) -> None:
        """Mark the current end of `stream`'s queue."""
        self._alive()
        _check(cu.cuEventRecord(self.handle, stream.handle), "cuEventRecord")

    def query(self) -> bool:
        """True when all work before the recorded point is complete (never blocks)."""
        self._alive()
        (err,) = cu.cuEventQuery(self.handle)
        if err == cu.CUresult.CUDA_ERROR_NOT_READY:
            return False
        _check((err,), "cuEventQuery")
        return True

    def synchronize(self) -> None:
        """Wait until the recorded point is reached."""
        self._alive()
        _check(cu.cuEventSynchronize(self.handle), "cuEventSynchronize")

    def elapsed_ms(self, end: Event) -> float:
        """Milliseconds from this (start) event to `end`; both need timing=True and must have completed."""
        self._alive()
        end._alive()
        if not (self.timing and end.timing):
            raise ConfigError("elapsed_ms needs two events created with timing=True")
        return float(_check(cu.cuEventElapsedTime(self.handle, end.handle), "cuEventElapsedTime"))


def time_captured(stream: Stream, record: Callable[[], None]) -> float:
    """Milliseconds of one replay of the graph that `record()` queues on `stream` when captured.

    Timed as the engines run their work, inside a graph: eager back-to-back calls would time the host's launch
    rate instead (a small node takes about as long to launch as to run). The first replay, which uploads the graph,
    loads its kernels and fills caches, is not timed. What `record` queues really runs, twice. The GEMM autotuner
    (cublaslt.Matmul.autotune) and the graph engine's profiler time with it. Not for use inside a capture.
    """
    start, end = Event(timing=True), Event(timing=True)
    try:
        stream.synchronize()
        stream.begin_capture()
        try:
            record()
        except BaseException:
            with contextlib.suppress(Exception):  # the recording's error is the one to report
                stream.end_capture().close()
            raise
        graph = stream.end_capture()
        try:
            replay = graph.instantiate()
        finally:
            graph.close()
        try:
            replay.launch(stream)  # warm-up
            start.record(stream)
            replay.launch(stream)
            end.record(stream)
            end.synchronize()
        finally:
            replay.close()
        return start.elapsed_ms(end)
    finally:
        start.close()
        end.close()


# ---------------------------------------------------------------------------------------------------------------
# Memory
# ---------------------------------------------------------------------------------------------------------------


def _check_host_array(array: np.ndarray, argument: str, writeable: bool = False) -> None:
    if not isinstance(array, np.ndarray):
        raise ConfigError(f"{argument} must be a numpy array, got {type(array).__name__}")
    if not array.flags.c_contiguous:
        raise ConfigError(f"{argument} must be C-contiguous (use np.ascontiguousarray)")
    if writeable and not array.flags.writeable:
        raise ConfigError(f"{argument} must be writeable")


def _check_range(offset: int, nbytes: int, size: int, what: str) -> None:
    if offset < 0 or offset + nbytes > size:
        raise ConfigError(f"{what}: bytes [{offset}, {offset + nbytes}) are outside the buffer of {size} bytes")


class DeviceBuffer(_Owned):
    """Device memory from cuMemAlloc (aligned to at least 256 bytes). nbytes may be 0 (1 byte is allocated)."""

    def __init__(self, nbytes: int, device: Device | None = None) -> None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ConfigError(f"nbytes must be a non-negative int, got {nbytes!r}")
        self.device = _resolve(device)
        self.nbytes = int(nbytes)
        self._dptr = _check(cu.cuMemAlloc(max(1, self.nbytes)), f"cuMemAlloc({self.nbytes} bytes)")
        self.ptr: int = int(self._dptr)
        self._own(self.device, cu.cuMemFree, self._dptr, "cuMemFree")

    def __repr__(self) -> str:
        return f"DeviceBuffer({self.nbytes} bytes at {self.ptr:#x})"

    def upload(self, array: np.ndarray, stream: Stream | None = None, offset: int = 0) -> None:
        """Copy `array`'s bytes to this buffer at byte `offset`.

        Without a stream the copy is synchronous: it waits for all work on the device before and after (so it
        races no replay on a non-blocking stream). With a stream it is queued there; the caller keeps `array` alive (and
        pinned, for a truly asynchronous copy) until the stream has passed it.
        """
        self._alive()
        _check_host_array(array, "array")
        _check_range(offset, array.nbytes, self.nbytes, "upload")
        if array.nbytes == 0:
            return
        if stream is None:
            self.device.synchronize()
            _check(cu.cuMemcpyHtoD(self.ptr + offset, array.ctypes.data, array.nbytes), "cuMemcpyHtoD")
            # from pageable memory cuMemcpyHtoD returns once the bytes are staged, not landed; non-blocking
            # streams would not wait for the DMA, so wait here
            self.device.synchronize()
        else:
            copy_htod(self.ptr + offset, array.ctypes.data, array.nbytes, stream)

    def download(self, out: np.ndarray, offset: int = 0) -> np.ndarray:
        """Fill `out` with this buffer's bytes from `offset`, after all work on the device; returns `out`."""
        self._alive()
        _check_host_array(out, "out", writeable=True)
        _check_range(offset, out.nbytes, self.nbytes, "download")
        if out.nbytes:
            self.device.synchronize()
            _check(cu.cuMemcpyDtoH(out.ctypes.data, self.ptr + offset, out.nbytes), "cuMemcpyDtoH")
        return out

    def memset(self, byte: int, stream: Stream | None = None) -> None:
        """Set every byte to `byte` (0..255): queued on `stream`, or synchronous after all device work."""
        self._alive()
        if not 0 <= int(byte) <= 255:
            raise ConfigError(f"byte must be in 0..255, got {byte!r}")
        if self.nbytes == 0:
            return
        if stream is None:
            self.device.synchronize()
            _check(cu.cuMemsetD8(self.ptr, int(byte), self.nbytes), "cuMemsetD8")
            self.device.synchronize()
        else:
            _check(cu.cuMemsetD8Async(self.ptr, int(byte), self.nbytes, stream.handle), "cuMemsetD8Async")


class PinnedBuffer(_Owned):
    """Page-locked host memory from cuMemHostAlloc: the DMA engines read it directly, so async copies overlap."""

    def __init__(self, nbytes: int, device: Device | None = None) -> None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ConfigError(f"nbytes must be a non-negative int, got {nbytes!r}")
        self.device = _resolve(device)
        self.nbytes = int(nbytes)
        self.ptr: int = int(_check(cu.cuMemHostAlloc(max(1, self.nbytes), 0), f"cuMemHostAlloc({self.nbytes} bytes)"))
        self.host_ptr: int = self.ptr  #: the host address (a MappedHostBuffer's `ptr` is the device's)
        self._own(self.device, cu.cuMemFreeHost, self.ptr, "cuMemFreeHost")

    def __repr__(self) -> str:
        return f"PinnedBuffer({self.nbytes} bytes at {self.ptr:#x})"

    def view(self, dtype: Any, shape: int | tuple[int, ...]) -> np.ndarray:
        """A numpy view (no copy) of the first bytes as `dtype` with `shape`; it keeps this buffer from being
        collected, but close() frees the memory regardless, so drop views before closing."""
        self._alive()
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        count = int(np.prod(shape, dtype=np.int64))
        if count < 0 or count * dtype.itemsize > self.nbytes:
            raise ConfigError(
                f"view {dtype}{list(shape)} needs {count * dtype.itemsize} bytes, buffer has {self.nbytes}"
            )
        raw = (ctypes.c_char * max(1, self.nbytes)).from_address(self.host_ptr)
        raw._owner = self  # the numpy array's base chain keeps this PinnedBuffer alive
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)


class MappedHostBuffer(PinnedBuffer):
    """Page-locked host memory mapped into the GPU's address space (cuMemHostAlloc DEVICEMAP): kernels read it
    over the bus, so data larger than GPU memory can stay on the host. `ptr` is the device pointer kernels take,
    `host_ptr` the host address; `view` is a host view."""

    def __init__(self, nbytes: int, device: Device | None = None) -> None:
        if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise ConfigError(f"nbytes must be a non-negative int, got {nbytes!r}")
        self.device = _resolve(device)
        self.nbytes = int(nbytes)
        flags = int(cu.CU_MEMHOSTALLOC_DEVICEMAP) | int(cu.CU_MEMHOSTALLOC_PORTABLE)
        what = f"cuMemHostAlloc({self.nbytes} bytes, DEVICEMAP)"
        self.host_ptr = int(_check(cu.cuMemHostAlloc(max(1, self.nbytes), flags), what))
        self._own(self.device, cu.cuMemFreeHost, self.host_ptr, "cuMemFreeHost")
        self.ptr = int(_check(cu.cuMemHostGetDevicePointer(self.host_ptr, 0), "cuMemHostGetDevicePointer"))

    def __repr__(self) -> str:
        return f"MappedHostBuffer({self.nbytes} bytes at host {self.host_ptr:#x}, device {self.ptr:#x})"


def copy_htod(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    """Queue a host-to-device copy of raw pointers on `stream` (async only when `src` is pinned)."""
    if nbytes:
        _check(cu.cuMemcpyHtoDAsync(dst, src, nbytes, stream.handle), "cuMemcpyHtoDAsync")


def copy_dtoh(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    """Queue a device-to-host copy of raw pointers on `stream` (async only when `dst` is pinned)."""
    if nbytes:
        _check(cu.cuMemcpyDtoHAsync(dst, src, nbytes, stream.handle), "cuMemcpyDtoHAsync")


def copy_dtod(dst: int, src: int, nbytes: int, stream: Stream) -> None:
    """Queue a device-to-device copy of raw pointers on `stream`."""
    if nbytes:
        _check(cu.cuMemcpyDtoDAsync(dst, src, nbytes, stream.handle), "cuMemcpyDtoDAsync")


def pointer_device(ptr: int) -> int | None:
    """The ordinal of the device whose memory `ptr` addresses, or None for host or unknown memory."""
    attr = cu.CUpointer_attribute
    err, kind = cu.cuPointerGetAttribute(attr.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
    if err != _SUCCESS or int(kind) != int(cu.CUmemorytype.CU_MEMORYTYPE_DEVICE):
        return None
    return int(_check(cu.cuPointerGetAttribute(attr.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, ptr), "cuPointerGetAttribute"))


def memset_d32(ptr: int, value: int, count: int, stream: Stream) -> None:
    """Queue setting `count` 32-bit words at `ptr` (4-byte aligned) to `value` (an unsigned 32-bit pattern)."""
    if ptr % 4:
        raise ConfigError(f"memset_d32 needs a 4-byte aligned pointer, got {ptr:#x}")
    if not -(1 << 31) <= int(value) <= _U32_MAX:  # a 32-bit pattern: signed or unsigned, never silently masked
        raise ConfigError(f"memset_d32 value must fit 32 bits, got {value!r}")
    if count:
        _check(cu.cuMemsetD32Async(ptr, int(value) & 0xFFFFFFFF, count, stream.handle), "cuMemsetD32Async")


# ---------------------------------------------------------------------------------------------------------------
# Modules and kernels
# ---------------------------------------------------------------------------------------------------------------


class Module(_Owned):
    """A loaded CUBIN (from nvrtc.compile_native); load it when the engine is built, never during capture."""

    def __init__(self, cubin: bytes, device: Device | None = None) -> None:
        if not isinstance(cubin, (bytes, bytearray)) or not cubin:
            raise ConfigError("cubin must be non-empty bytes (a CUBIN from fastnn.cuda.nvrtc)")
        self.device = _resolve(device)
        self.handle = _check(cu.cuModuleLoadData(bytes(cubin)), "cuModuleLoadData")
        self._own(self.device, cu.cuModuleUnload, self.handle, "cuModuleUnload")
        self._kernels: dict[str, Kernel] = {}

    def function(self, name: str) -> Kernel:
        """The kernel `name` (declare it extern "C" so the name is not mangled)."""
        self._alive()
        kernel = self._kernels.get(name)
        if kernel is None:
            handle = _check(cu.cuModuleGetFunction(self.handle, name.encode()), f"cuModuleGetFunction({name!r})")
            kernel = self._kernels[name] = Kernel(self, name, handle)
        return kernel


def _dims(value: Sequence[int], argument: str) -> tuple[int, int, int]:
    if type(value) is tuple and len(value) == 3:  # the common case, decided in a few comparisons
        x, y, z = value
        if type(x) is int and type(y) is int and type(z) is int and 1 <= x <= _U32_MAX and 1 <= y <= _U32_MAX \
                and 1 <= z <= _U32_MAX:  # fmt: skip
            return value  # type: ignore[return-value]
    dims = tuple(value)
    if len(dims) != 3 or any(not isinstance(d, (int, np.integer)) or isinstance(d, bool) for d in dims):
        raise ConfigError(f"{argument} must be three positive ints, got {value!r}")
    if min(dims) < 1 or max(dims) > _U32_MAX:
        raise ConfigError(f"{argument} must be three ints in [1, {_U32_MAX}], got {value!r}")
    return tuple(int(d) for d in dims)  # type: ignore[return-value]


_U32_MAX = (1 << 32) - 1


# Kernel arguments, each typed as the kernel's C parameter (int, unsigned, unsigned long long, float, a
# pointer), so code above the bindings passes plain Python numbers and never touches ctypes. Integers are
# range-checked: ctypes would wrap 2**31 to -2**31 silently (ConfigError naming the type and the value).
# Each first decides the common case (a Python int in range, a float within float32's range) in a comparison or two:
# they run some 30 times per recorded step, 60,000 times per epoch graph. Anything else takes the full check.
_U64_MAX = (1 << 64) - 1
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_F32_MAX = float(np.finfo(np.float32).max)


def arg_ptr(address: int) -> ctypes.c_void_p:
    if type(address) is int and 0 <= address <= _U64_MAX:
        return ctypes.c_void_p(address)
    return ctypes.c_void_p(c_int_value(ctypes.c_uint64, address, "kernel pointer argument").value)


def arg_i32(value: int) -> ctypes.c_int32:
    if type(value) is int and _I32_MIN <= value <= _I32_MAX:
        return ctypes.c_int32(value)
    return c_int_value(ctypes.c_int32, value, "kernel int32 argument")


def arg_u32(value: int) -> ctypes.c_uint32:
    if type(value) is int and 0 <= value <= _U32_MAX:
        return ctypes.c_uint32(value)
    return c_int_value(ctypes.c_uint32, value, "kernel uint32 argument")


def arg_u64(value: int) -> ctypes.c_uint64:
    if type(value) is int and 0 <= value <= _U64_MAX:
        return ctypes.c_uint64(value)
    return c_int_value(ctypes.c_uint64, value, "kernel uint64 argument")


def arg_f32(value: float) -> ctypes.c_float:
    v = float(value)
    if -_F32_MAX <= v <= _F32_MAX:  # cannot overflow (NaN, infinities and the rest: checked below)
        return ctypes.c_float(v)
    with np.errstate(over="ignore"):
        overflows = math.isfinite(v) and not math.isfinite(float(np.float32(v)))
    if overflows:
        raise ConfigError(f"kernel float argument {v!r} overflows float32 (largest 3.4028235e+38)")
    return ctypes.c_float(v)


#: A struct field's type name: its ctypes type and the check of its value.
_STRUCT_FIELDS = {
    "i32": (ctypes.c_int32, arg_i32),
    "u32": (ctypes.c_uint32, arg_u32),
    "u64": (ctypes.c_uint64, arg_u64),
    "f32": (ctypes.c_float, arg_f32),
}


@functools.cache
def _struct_type(fields: tuple[tuple[str, str], ...]) -> type[ctypes.Structure]:
    layout = [(name, _STRUCT_FIELDS[kind][0]) for name, kind in fields]
    return type("KernelStruct", (ctypes.Structure,), {"_fields_": layout})


def arg_struct(fields: Sequence[tuple[str, str, float]]) -> ctypes.Structure:
    """A C struct kernel argument, passed by value: (name, type, value) per field in the struct's order, the type one
    of "i32", "u32", "u64", "f32" and each value checked as arg_<type> checks it. ctypes lays the fields out as the
    C compiler does (natural alignment), so the struct matches the kernel's declaration field for field."""
    for name, kind, _ in fields:
        if kind not in _STRUCT_FIELDS:
            raise ConfigError(f"kernel struct field {name!r} has type {kind!r}, not one of {sorted(_STRUCT_FIELDS)}")
    struct = _struct_type(tuple((name, kind) for name, kind, _ in fields))
    return struct(*[_STRUCT_FIELDS[kind][1](value).value for _, kind, value in fields])


#: ctypes value types Kernel.launch has accepted as arguments (scalars and structs): later launches check membership.
_ARG_TYPES: set[type] = set()
#: The array.array type code of a pointer-sized unsigned integer: a kernelParams array element.
_POINTER_CODE = next(code for code in "QLI" if array.array(code).itemsize == ctypes.sizeof(ctypes.c_void_p))


class Kernel:
    """A kernel function of a Module; the Module stays loaded while any of its Kernels lives."""

    def __init__(self, module: Module, name: str, handle: Any) -> None:
        self.module = module
        self.name = name
        self.handle = handle
        self._shared_optin = _DEFAULT_MAX_SHARED
        self._non_portable = False
        self._launch_what = f"cuLaunchKernel({name!r})"  # made once: launch runs thousands of times per capture

    def __repr__(self) -> str:
        return f"Kernel({self.name!r})"

    def _opt_in_shared(self, shared_mem: int) -> None:
        """Above 48 KiB of dynamic shared memory a kernel must opt in (once, up to the device's limit)."""
        if shared_mem > self._shared_optin:
            attrib = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(cu.cuFuncSetAttribute(self.handle, attrib, int(shared_mem)), f"cuFuncSetAttribute({self.name!r})")
            self._shared_optin = int(shared_mem)

    def launch(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        args: Sequence[ctypes._SimpleCData],
        stream: Stream,
        shared_mem: int = 0,
        cluster: int | None = None,
        cooperative: bool = False,
    ) -> None:
        """Queue the kernel on `stream` (also inside stream capture).

        Args:
            args: one ctypes value per kernel parameter, in order and of the parameter's exact C type
                (c_void_p(ptr), c_int, c_float, c_uint64...): the driver copies each by its ctypes size.
            shared_mem: dynamic shared memory bytes; above 48 KiB the kernel is opted in once (up to
                Device.max_shared_memory_optin).
            cluster: launch in thread-block clusters of this many CTAs along x (sm_90+; grid a multiple).
            cooperative: a cooperative launch (CU_LAUNCH_ATTRIBUTE_COOPERATIVE): every CTA of the grid is resident
                at once, or the launch fails (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE) instead of deadlocking a
                kernel whose CTAs wait for each other.
        """
        self.module._alive()
        grid_dims = _dims(grid, "grid")
        block_dims = _dims(block, "block")
        if not _ARG_TYPES.issuperset(map(type, args)):  # a type not seen before: check each argument
            for i, arg in enumerate(args):
                if not isinstance(arg, (ctypes._SimpleCData, ctypes.Structure)):
                    msg = f"kernel {self.name!r} argument {i} must be a ctypes value, got {type(arg).__name__}"
                    raise ConfigError(msg)
            _ARG_TYPES.update(map(type, args))
        if not 0 <= int(shared_mem) <= _U32_MAX:
            raise ConfigError(f"kernel {self.name!r} shared_mem must be in [0, {_U32_MAX}] bytes, got {shared_mem!r}")
        self._opt_in_shared(shared_mem)
        # kernelParams is a void** of the arguments' addresses; cuLaunchKernel copies the values before
        # returning (into the graph node when capturing), so `args` and `params` need only outlive this call.
        # An array.array of pointer-sized integers: built in C, twice as fast as a ctypes array of c_void_p.
        params = array.array(_POINTER_CODE, map(ctypes.addressof, args)) if args else array.array(_POINTER_CODE, [0])
        params_ptr = params.buffer_info()[0]
        if cluster is not None or cooperative:
            config = self._launch_config(grid_dims, block_dims, int(shared_mem), stream, cluster, cooperative)
            _check(
                cu.cuLaunchKernelEx(config, self.handle, params_ptr, 0),
                f"cuLaunchKernelEx({self.name!r}, cluster={cluster}, cooperative={cooperative})",
            )
            return
        _check(
            cu.cuLaunchKernel(self.handle, *grid_dims, *block_dims, int(shared_mem), stream.handle, params_ptr, 0),
            self._launch_what,
        )

    def _launch_config(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        shared_mem: int,
        stream: Stream | None,
        cluster: int | None,
        cooperative: bool = False,
    ) -> Any:
        """A CUlaunchConfig for a launch in thread-block clusters of `cluster` CTAs along x (more than 8 CTAs
        needs the kernel's non-portable cluster size attribute, set here once) and/or a cooperative one."""
        if cluster is not None and cluster > 8 and not self._non_portable:
            attrib = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
            _check(cu.cuFuncSetAttribute(self.handle, attrib, 1), f"cuFuncSetAttribute({self.name!r}, non-portable)")
            self._non_portable = True
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes = shared_mem
        config.hStream = stream.handle if stream is not None else 0
        attrs = []
        if cluster is not None:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster, 1, 1
            attrs.append(attr)
        if cooperative:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            attr.value.cooperative = 1
            attrs.append(attr)
        config.attrs = attrs
        config.numAttrs = len(attrs)
        return config

    def max_active_clusters(self, grid: tuple[int, int, int], block: tuple[int, int, int], shared_mem: int,
                            cluster: int) -> int:  # fmt: skip
        """How many clusters of `cluster` CTAs with this block and shared memory fit on the device at once
        (0: such a cluster cannot be launched at all)."""
        self._opt_in_shared(shared_mem)
        config = self._launch_config(_dims(grid, "grid"), _dims(block, "block"), int(shared_mem), None, cluster)
        return int(_check(cu.cuOccupancyMaxActiveClusters(self.handle, config), "cuOccupancyMaxActiveClusters"))

    def max_active_blocks(self, threads: int, shared_mem: int) -> int:
        """How many CTAs of `threads` threads and `shared_mem` bytes of dynamic shared memory one SM holds at once
        (a cooperative launch of one CTA per SM needs at least 1)."""
        self._opt_in_shared(shared_mem)
        return int(_check(cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(self.handle, int(threads), int(shared_mem)),
                          "cuOccupancyMaxActiveBlocksPerMultiprocessor"))  # fmt: skip
