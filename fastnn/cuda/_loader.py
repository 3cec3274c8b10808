"""Shared base of the CUDA bindings: finding NVIDIA libraries and the exception every binding raises.

Libraries are found with cuda.pathfinder (the pip wheels, conda, then the system loader), never by a
hard-coded soname, so the same code runs on the CUDA 12 and CUDA 13 wheels.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import operator
import weakref
from collections.abc import Callable
from typing import Any

from .._errors import ConfigError, DeviceUnavailable, FastnnError
from .._install import pip_install
from . import _capture

__all__ = [
    "DRIVER_HINT",
    "INSTALL_HINT",
    "NCCL_HINT",
    "CudaDriverError",
    "CudaLibraryError",
    "LibraryObject",
    "NvrtcError",
    "argument_error",
    "bind_library",
    "c_int_value",
    "checked_argtype",
    "int_range",
    "library_path",
    "load_library",
    "stream_ptr",
    "unchecked_function",
]

#: The fix for a missing toolkit library: the extras pin matching wheels of every library fastnn loads.
INSTALL_HINT = f"{pip_install('cu12')} for a driver for CUDA 12, or cu13 for CUDA 13"

#: The fix for a missing driver library: it comes with the display driver, never from pip.
DRIVER_HINT = "install the NVIDIA display driver (libcuda.so.1 must be on the system loader path)"

#: The fix for a missing NCCL: optional (multi-GPU training only), in extras of its own.
NCCL_HINT = f"{pip_install('multi-cu12')} for a driver for CUDA 12, or multi-cu13 for CUDA 13"

# pathfinder's names of the driver-provided libraries; they cannot come from a wheel.
_DRIVER_LIBS = frozenset({"cuda", "nvml"})


def _hint(libname: str) -> str:
    """The fix to print when `libname` is missing or incomplete."""
    return DRIVER_HINT if libname in _DRIVER_LIBS else NCCL_HINT if libname == "nccl" else INSTALL_HINT


class CudaLibraryError(FastnnError, RuntimeError):
    """A CUDA library call returned a failing status; `.status_name` is the library's own name for it."""

    def __init__(self, status: int, status_name: str, what: str) -> None:
        self.status = int(status)
        self.status_name = status_name
        self.what = what
        super().__init__(f"{what} failed: {status_name} ({self.status})")

    def __reduce__(self):  # keep pickling (multiprocessing, pytest-xdist) working despite the custom __init__
        return (type(self), (self.status, self.status_name, self.what))


class CudaDriverError(CudaLibraryError):
    """A CUDA driver API call failed (status names from cuGetErrorName, e.g. CUDA_ERROR_OUT_OF_MEMORY)."""


class NvrtcError(CudaLibraryError):
    """An NVRTC call failed; for a compile error `.log` holds the full program log (also in the message)."""

    def __init__(self, status: int, status_name: str, what: str, log: str = "") -> None:
        self.log = log
        super().__init__(status, status_name, what)
        if log:
            self.args = (f"{self.args[0]}\n{log.rstrip()}",)

    def __reduce__(self):
        return (type(self), (self.status, self.status_name, self.what, self.log))


@functools.cache
def _load(libname: str):
    """pathfinder's LoadedDL for `libname`, or DeviceUnavailable saying why and how to fix it."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError as exc:
        raise DeviceUnavailable(f"cuda-pathfinder is not importable ({exc}); fix: {INSTALL_HINT}") from exc
    try:
        return load_nvidia_dynamic_lib(libname)
    except Exception as exc:  # pathfinder raises DynamicLibNotFoundError, RuntimeError, OSError...
        raise DeviceUnavailable(f"cannot load NVIDIA library {libname!r}: {exc}; fix: {_hint(libname)}") from exc


def library_path(libname: str) -> str:
    """Absolute path of the NVIDIA library `libname` (pathfinder's short name: "cublasLt", "cudnn", "nvrtc").

    Raises:
        DeviceUnavailable: the library cannot be found or loaded; the message gives the fix.
    """
    return _load(libname).abs_path


@functools.cache
def load_library(libname: str) -> ctypes.CDLL:
    """The NVIDIA library `libname` as a ctypes.CDLL, loaded once per process.

    Args:
        libname: pathfinder's short name, e.g. "cublasLt", "cudnn", "nvrtc".
    Raises:
        DeviceUnavailable: the library cannot be found or loaded; the message gives the fix.
    """
    path = _load(libname).abs_path
    try:
        # pathfinder has already dlopen'ed this path, so this returns the same handle (never dlclose it).
        return ctypes.CDLL(path)
    except OSError as exc:
        msg = f"cannot load NVIDIA library {libname!r} from {path}: {exc}; fix: {_hint(libname)}"
        raise DeviceUnavailable(msg) from exc


def _destroy_quietly(destroy: Callable[[int], Any], ptr: int) -> None:
    # Runs from close() or the finalizer, possibly after the CUDA context is gone: a failing destroy has
    # nothing useful left to report, so it must not raise.
    with contextlib.suppress(Exception):
        destroy(ptr)


def in_current_context(destroy: Callable[[int], Any]) -> Callable[[int], Any]:
    """`destroy` run with the CUDA context current now made current again (driver.in_context), for a library
    handle made in it: cudnnDestroy and cublasLtDestroy synchronize and free on the current device, and a garbage
    collection may run them on a thread where another GPU's context is current."""
    from . import driver  # cuda-python: loaded by the time any handle exists

    return functools.partial(driver.in_context, driver.current_context(), destroy)


class LibraryObject:
    """A handle or descriptor a ctypes-bound library created, destroyed exactly once: by close(), at the
    end of a `with` block, or when garbage-collected. Not at interpreter exit: the process's end frees
    library state along with the context."""

    def __init__(self, ptr: int, destroy: Callable[[int], Any]) -> None:
        self.ptr = ptr
        # Through _capture: a destroy that frees or synchronizes would invalidate a capture under way on this thread.
        self._finalizer = weakref.finalize(self, _capture.release, _destroy_quietly, destroy, ptr)
        self._finalizer.atexit = False

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Destroy it now (idempotent)."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stream_ptr(stream: Any) -> int:
    """A cudaStream_t value for ctypes: a driver.Stream (its .ptr), a raw int, or None (the legacy stream)."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "ptr"):
        return int(stream.ptr)
    return int(stream)  # numpy integers


# ---------------------------------------------------------------------------------------------------------------
# Integers crossing into C: ctypes wraps out-of-range values silently (c_int(2**32 + 8).value == 8), so a
# cuDNN tensor of 2**32 + 8 rows would be described as 8 rows. Every integer argument is range-checked instead.
# ---------------------------------------------------------------------------------------------------------------

_INT_CODES = frozenset("bBhHiIlLqQ")  # the struct codes of ctypes' integer types (c_int, c_size_t, c_uint64...)


@functools.cache
def int_range(ctype: type) -> tuple[int, int] | None:
    """(lowest, highest) value of a ctypes integer type, or None for other types (pointers, floats). Cached: every
    integer crossing into C asks, tens of thousands of times while an epoch graph is recorded."""
    code = getattr(ctype, "_type_", None)
    if not isinstance(code, str) or code not in _INT_CODES:
        return None
    bits = 8 * ctypes.sizeof(ctype)
    return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if code.islower() else (0, (1 << bits) - 1)


def _checked_int(ctype: type, value: Any, what: str) -> int:
    lo, hi = int_range(ctype)  # type: ignore[misc]
    if type(value) is int and lo <= value <= hi:  # the common case, decided without operator.index
        return value
    try:
        v = operator.index(value)  # ints, IntEnums, numpy integers; not floats (no silent truncation)
    except TypeError:
        raise ConfigError(f"{what} must be an integer for C type {ctype.__name__}, got {value!r}") from None
    if not lo <= v <= hi:
        raise ConfigError(f"{what} = {v} does not fit C type {ctype.__name__} (range {lo} to {hi})")
    return v


def c_int_value(ctype: type, value: Any, what: str) -> Any:
    """`ctype(value)` for a ctypes integer type, or ConfigError naming `what` when `value` would wrap."""
    return ctype(_checked_int(ctype, value, what))


@functools.cache
def checked_argtype(ctype: type) -> type:
    """`ctype` itself for non-integer types; for integer types a subclass whose from_param refuses values that
    would wrap (ctypes reports it as ctypes.ArgumentError around the ConfigError; bindings re-raise the latter)."""
    bounds = int_range(ctype)
    if bounds is None:
        return ctype
    lo, hi = bounds

    def from_param(cls: type, value: Any) -> Any:
        if type(value) is int and lo <= value <= hi:  # the common case first: from_param runs on every call
            return ctype(value)
        if isinstance(value, (ctypes._SimpleCData, ctypes._Pointer)) or value is None:
            return ctype.from_param(value)
        return ctype(_checked_int(ctype, value, "argument"))

    return type(f"checked_{ctype.__name__}", (ctype,), {"from_param": classmethod(from_param)})


def argument_error(exc: ctypes.ArgumentError, what: str) -> ConfigError:
    """The ConfigError for a refused argument of a bound C function (see checked_argtype)."""
    return ConfigError(f"{what}: {exc}")


def unchecked_function(lib: ctypes.CDLL, name: str, signatures: dict, status: object, errcheck: Callable) -> Any:
    """A second function object for `name` of a library bound by bind_library: the same declaration (and errcheck for
    a status), but integer arguments are not range-checked at each call. For hot paths (a call recorded thousands of
    times per epoch graph) whose caller checked its integers once, when they were fixed; a per-call check runs Python
    code for every integer argument of every call."""
    restype, argtypes = signatures[name]
    fn = lib[name]  # a new function object: lib.<name> keeps its checked declaration
    _declare(fn, restype, list(argtypes), status, errcheck)
    return fn


def _declare(fn: Any, restype: Any, argtypes: list, status: object, errcheck: Callable) -> None:
    """Declare `fn`'s types; a restype of `status` becomes a C int checked by `errcheck`."""
    fn.argtypes = argtypes
    if restype is status:
        fn.restype = ctypes.c_int
        fn.errcheck = errcheck
    else:
        fn.restype = restype


def bind_library(libname: str, display: str, version_symbol: str | None, signatures: dict, status: object,
                 errcheck: Callable) -> ctypes.CDLL:  # fmt: skip
    """`libname` loaded with every function of `signatures` ({name: (restype, argtypes)}) declared.

    A restype of `status` marks a function returning the library's status code: it gets `errcheck`, so no
    call site can forget to check. Integer arguments are range-checked (checked_argtype), never wrapped.
    A missing symbol raises DeviceUnavailable naming the library and version.
    """
    lib = load_library(libname)
    describe = f"{display} (version unknown) at {library_path(libname)}"
    if version_symbol is not None:  # None: the library has no size_t version() (NCCL's takes an int*)
        with contextlib.suppress(AttributeError):
            getattr(lib, version_symbol).restype = ctypes.c_size_t
            describe = f"{display} {getattr(lib, version_symbol)()} at {library_path(libname)}"
    for name, (restype, argtypes) in signatures.items():
        try:
            fn = getattr(lib, name)
        except AttributeError as exc:
            raise DeviceUnavailable(
                f"{describe} lacks the symbol {name} that fastnn needs; fix: {_hint(libname)}"
            ) from exc
        _declare(fn, restype, [checked_argtype(t) for t in argtypes], status, errcheck)  # no int may wrap
    return lib
