"""cuDNN bindings (ctypes): the softmax of the output layer, forward and backward, through the legacy API.

cuDNN 9 ships as libcudnn.so.9, a front that loads sub-libraries (libcudnn_ops, libcudnn_graph, ...) on
demand; pathfinder's "cudnn" finds the front, which exports every function bound here. A logits matrix of
N rows and C classes is the NCHW tensor (N, C, 1, 1); mode INSTANCE takes the softmax over C, H, W of each
row, i.e. over the C classes. Status names come from cudnnGetErrorString; the detail of the last failure
from cudnnGetLastErrorString is added to the message.
"""

from __future__ import annotations

import ctypes
import functools
from enum import IntEnum
from typing import Any

import numpy as np

from .._errors import ConfigError, DeviceUnavailable
from ._loader import (
    CudaLibraryError,
    LibraryObject,
    argument_error,
    bind_library,
    in_current_context,
    stream_ptr,
    unchecked_function,
)

__all__ = [
    "CudnnError",
    "DataType",
    "Handle",
    "Softmax",
    "SoftmaxAlgorithm",
    "SoftmaxMode",
    "Status",
    "TensorFormat",
    "status_name",
    "version",
]

# ---------------------------------------------------------------------------------------------------------------
# Enums: C names without the prefix, values read from cudnn_graph.h and cudnn_ops.h (cuDNN 9)
# ---------------------------------------------------------------------------------------------------------------


class Status(IntEnum):
    """cudnnStatus_t (the codes fastnn acts on; cudnnGetErrorString names all of them)."""

    SUCCESS = 0
    NOT_INITIALIZED = 1001
    SUBLIBRARY_VERSION_MISMATCH = 1002
    SUBLIBRARY_LOADING_FAILED = 1008
    BAD_PARAM = 2000
    BAD_PARAM_NULL_POINTER = 2002
    BAD_PARAM_MISALIGNED_POINTER = 2003
    NOT_SUPPORTED = 3000
    NOT_SUPPORTED_DATA_TYPE = 3003
    NOT_SUPPORTED_ARCH_MISMATCH = 3007
    INTERNAL_ERROR = 4000
    EXECUTION_FAILED = 5000


class DataType(IntEnum):
    """cudnnDataType_t."""

    FLOAT = 0
    DOUBLE = 1
    HALF = 2
    INT8 = 3
    INT32 = 4
    UINT8 = 6
    BFLOAT16 = 9


class TensorFormat(IntEnum):
    """cudnnTensorFormat_t."""

    NCHW = 0
    NHWC = 1


class SoftmaxAlgorithm(IntEnum):
    """cudnnSoftmaxAlgorithm_t: ACCURATE subtracts the row maximum first (no overflow)."""

    FAST = 0
    ACCURATE = 1
    LOG = 2


class SoftmaxMode(IntEnum):
    """cudnnSoftmaxMode_t."""

    INSTANCE = 0
    CHANNEL = 1


_DTYPE_NAMES = {"fp32": DataType.FLOAT, "fp16": DataType.HALF}

# ---------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------


class CudnnError(CudaLibraryError):
    """A cuDNN call failed; `.status_name` is cuDNN's own name (cudnnGetErrorString), e.g. CUDNN_STATUS_BAD_PARAM."""


def status_name(status: int) -> str:
    """cuDNN's name for `status` (cudnnGetErrorString), e.g. 2000 -> "CUDNN_STATUS_BAD_PARAM"."""
    name = _lib().cudnnGetErrorString(int(status))
    return name.decode(errors="replace") if name else f"CUDNN_STATUS_UNKNOWN_{int(status)}"


def _last_error() -> str:
    buf = ctypes.create_string_buffer(1024)
    _lib().cudnnGetLastErrorString(buf, ctypes.sizeof(buf))
    return buf.value.decode(errors="replace").strip()


def _errcheck(result: int, func: Any, args: tuple) -> int:
    if result != Status.SUCCESS:
        error = CudnnError(result, status_name(result), func.__name__)
        detail = _last_error()
        if detail:
            error.args = (f"{error.args[0]}: {detail}",)
        raise error
    return result


def _call(what: str, fn: Any, *args: Any) -> None:
    """Call a status-returning function; a failure's `.what` says what was being attempted."""
    try:
        fn(*args)
    except ctypes.ArgumentError as exc:  # an integer that would wrap in C (see _loader.checked_argtype)
        raise argument_error(exc, what) from exc
    except CudnnError as exc:
        exc.what = f"{exc.what} ({what})"
        exc.args = (exc.args[0].replace(fn.__name__, exc.what, 1),)
        raise


# ---------------------------------------------------------------------------------------------------------------
# Loading: one signature table, applied once when the library is first used
# ---------------------------------------------------------------------------------------------------------------

_INT_MAX = (1 << 31) - 1
_STATUS = object()  # restype marker: returns cudnnStatus_t, checked by _errcheck
_VP = ctypes.c_void_p
_INT = ctypes.c_int

_SIGNATURES: dict[str, tuple[Any, list]] = {
    "cudnnGetVersion": (ctypes.c_size_t, []),
    "cudnnGetErrorString": (ctypes.c_char_p, [_INT]),
    "cudnnGetLastErrorString": (None, [ctypes.c_char_p, ctypes.c_size_t]),
    "cudnnCreate": (_STATUS, [ctypes.POINTER(_VP)]),
    "cudnnDestroy": (_STATUS, [_VP]),
    "cudnnSetStream": (_STATUS, [_VP, _VP]),
    "cudnnCreateTensorDescriptor": (_STATUS, [ctypes.POINTER(_VP)]),
    "cudnnSetTensor4dDescriptor": (_STATUS, [_VP, _INT, _INT, _INT, _INT, _INT, _INT]),
    "cudnnDestroyTensorDescriptor": (_STATUS, [_VP]),
    # handle, algo, mode, alpha, xDesc, x, beta, yDesc, y
    "cudnnSoftmaxForward": (_STATUS, [_VP, _INT, _INT, _VP, _VP, _VP, _VP, _VP, _VP]),
    # handle, algo, mode, alpha, yDesc, y, dyDesc, dy, beta, dxDesc, dx
    "cudnnSoftmaxBackward": (_STATUS, [_VP, _INT, _INT, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP]),
}


@functools.cache
def _lib() -> ctypes.CDLL:
    """libcudnn (the cuDNN 9 front library), loaded on first use with the signature table bound."""
    return bind_library("cudnn", "cuDNN", "cudnnGetVersion", _SIGNATURES, _STATUS, _errcheck)


@functools.cache
def _softmax_forward() -> Any:
    """cudnnSoftmaxForward for Softmax.forward (recorded once per step): its integer arguments are the constant
    algorithm and mode, so they are not range-checked at each call (`unchecked_function`)."""
    return unchecked_function(_lib(), "cudnnSoftmaxForward", _SIGNATURES, _STATUS, _errcheck)


def version() -> int:
    """cuDNN's version number (cudnnGetVersion: major*10000 + minor*100 + patch, e.g. 92800)."""
    return int(_lib().cudnnGetVersion())


# ---------------------------------------------------------------------------------------------------------------
# Handles and descriptors
# ---------------------------------------------------------------------------------------------------------------


def _destroy_by_name(name: str, ptr: int) -> None:
    getattr(_lib(), name)(ptr)


class _Owned(LibraryObject):
    """Something cuDNN created that must be destroyed exactly once (by its `_destroy` function); a handle
    (`_in_context`) with the CUDA context it was made in current."""

    _destroy = ""
    _in_context = False

    def __init__(self, ptr: int) -> None:
        destroy = functools.partial(_destroy_by_name, self._destroy)
        super().__init__(ptr, in_current_context(destroy) if self._in_context else destroy)


class Handle(_Owned):
    """A cuDNN context (cudnnCreate) bound to a stream; create it and set the stream before any capture."""

    _destroy = "cudnnDestroy"
    _in_context = True

    def __init__(self, stream: Any = None, device: Any = None) -> None:
        """Args: stream: a driver.Stream (or raw cudaStream_t int) to run on; device: a driver.Device to
        make current first.

        Raises:
            DeviceUnavailable: no usable GPU or driver (cudnnCreate reports CUDNN_STATUS_NOT_INITIALIZED).
        """
        lib = _lib()
        if device is not None:
            device.make_current()
        handle = ctypes.c_void_p()
        try:
            _call("creating a cuDNN handle", lib.cudnnCreate, ctypes.byref(handle))
        except CudnnError as exc:
            if exc.status == Status.NOT_INITIALIZED:
                raise DeviceUnavailable(
                    f"cannot create a cuDNN handle: {exc}; there is no usable CUDA driver or GPU "
                    f"(check `nvidia-smi`, or use device='cpu')"
                ) from exc
            raise
        super().__init__(handle.value)
        self.stream = None
        if stream is not None:
            self.set_stream(stream)

    def set_stream(self, stream: Any) -> None:
        """Run later calls on `stream` (a driver.Stream; keep it alive while the handle uses it)."""
        _call("binding the cuDNN handle to a stream", _lib().cudnnSetStream, self.ptr, stream_ptr(stream))
        self.stream = stream


class _TensorDesc(_Owned):
    """cudnnTensorDescriptor_t of an NCHW tensor."""

    _destroy = "cudnnDestroyTensorDescriptor"

    def __init__(self, dtype: DataType, n: int, c: int, h: int = 1, w: int = 1) -> None:
        lib = _lib()
        ptr = ctypes.c_void_p()
        _call("creating a tensor descriptor", lib.cudnnCreateTensorDescriptor, ctypes.byref(ptr))
        super().__init__(ptr.value)
        _call(
            f"describing an NCHW {dtype.name} tensor ({n}, {c}, {h}, {w})",
            lib.cudnnSetTensor4dDescriptor,
            self.ptr,
            TensorFormat.NCHW,
            dtype,
            n,
            c,
            h,
            w,
        )


def _data_type(name: str, value: Any) -> DataType:
    if isinstance(value, DataType):
        return value
    if isinstance(value, str) and value in _DTYPE_NAMES:
        return _DTYPE_NAMES[value]
    raise ConfigError(f"{name} must be 'fp16', 'fp32' or a cudnn.DataType, got {value!r}")


class Softmax:
    """Softmax over C for each of N rows (mode INSTANCE, CUDNN_SOFTMAX_ACCURATE), NCHW (N, C, 1, 1)."""

    def __init__(self, handle: Handle, n: int, c: int, dtype: Any = "fp32", out_dtype: Any = None) -> None:
        """Describe the (n, c) logits once; forward/backward then only take pointers (capture-safe).

        Args:
            handle: a cuDNN handle already bound to its stream. n: rows; c: classes. dtype: "fp16" | "fp32".
            out_dtype: must equal dtype: the legacy cudnnSoftmaxForward/Backward reject x and y of different
                types (CUDNN_STATUS_BAD_PARAM in cuDNN's documentation), so fastnn supports same-type only.
        Raises:
            ConfigError: bad sizes or types (named).
        """
        for name, value in (("n", n), ("c", c)):
            # cudnnSetTensor4dDescriptor takes C ints: 2**32 + 8 rows would silently become 8.
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not 1 <= value <= _INT_MAX:
                raise ConfigError(f"Softmax {name} must be an int in [1, {_INT_MAX}] (a C int), got {value!r}")
        self.n, self.c = int(n), int(c)
        self.dtype = _data_type("dtype", dtype)
        self.out_dtype = self.dtype if out_dtype is None else _data_type("out_dtype", out_dtype)
        if self.out_dtype != self.dtype:
            raise ConfigError(
                f"Softmax out_dtype={self.out_dtype.name} differs from dtype={self.dtype.name}: cuDNN's softmax "
                f"needs input and output of the same type"
            )
        if self.dtype not in (DataType.FLOAT, DataType.HALF):
            raise ConfigError(f"Softmax dtype must be fp16 or fp32, got {self.dtype.name}")
        self.handle = handle
        # Scaling factors are host floats for half and float data (cuDNN reads them at each call).
        self._one = ctypes.c_float(1.0)
        self._zero = ctypes.c_float(0.0)
        self._desc: _TensorDesc | None = _TensorDesc(self.dtype, self.n, self.c)
        # Made once: forward is recorded once per step of an epoch graph.
        self._forward_what = f"softmax forward ({self.n}, {self.c}) {self.dtype.name}"

    def _check(self) -> _TensorDesc:
        if self._desc is None:
            raise ConfigError(f"Softmax ({self.n}, {self.c}) is closed")
        return self._desc

    def forward(self, x: int, y: int) -> None:
        """y = softmax(x) row by row (device pointers to n*c elements)."""
        desc = self._check()
        _call(
            self._forward_what,
            _softmax_forward(),
            self.handle.ptr,
            SoftmaxAlgorithm.ACCURATE,
            SoftmaxMode.INSTANCE,
            ctypes.byref(self._one),
            desc.ptr,
            x,
            ctypes.byref(self._zero),
            desc.ptr,
            y,
        )

    def backward(self, y: int, dy: int, dx: int) -> None:
        """dx = y * (dy - sum(dy * y)) row by row, from the forward output y and the gradient dy."""
        desc = self._check()
        _call(
            f"softmax backward ({self.n}, {self.c}) {self.dtype.name}",
            _lib().cudnnSoftmaxBackward,
            self.handle.ptr,
            SoftmaxAlgorithm.ACCURATE,
            SoftmaxMode.INSTANCE,
            ctypes.byref(self._one),
            desc.ptr,
            y,
            desc.ptr,
            dy,
            ctypes.byref(self._zero),
            desc.ptr,
            dx,
        )

    def close(self) -> None:
        """Destroy the descriptor (idempotent); the handle belongs to the caller."""
        if self._desc is not None:
            self._desc.close()
            self._desc = None

    def __enter__(self) -> Softmax:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
