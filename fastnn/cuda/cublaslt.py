"""cuBLASLt bindings (ctypes): every matmul of the GPU engine, with bias/activation fused into the epilogue.

Column-major only. A row-major (R, C) array is a column-major (C, R) matrix with ld=C, so the engine maps a
row-major product Y = X @ W.T (X: (B, I), W: (O, I)) to the column-major Y^T (O x B) = W (O x I) @ X^T (I x B),
i.e. m=O, n=B, k=I, transa=True, transb=False. cuBLASLt does not support epilogues that combine an
activation and a bias with a row-major D, so this module offers column-major layouts only.

Facts from cublasLt.h that bite (all enforced or computed here):
- ReLU bit-mask AUX_LD is counted in bits, a multiple of 128 and >= rows of D; GELU aux LD (elements) a
  multiple of 8 and >= rows of D. `default_aux_ld` computes both.
- The workspace must be 256-byte aligned (cuMemAlloc gives at least that).
- C and D may alias only with identical descriptors: a `Matmul` uses ONE layout for both, so C == D is legal.
- The bias / bias-gradient vector has the D (= C) type. BIAS adds bias[i] to row i (length m); BGRADA reduces
  op(A) over k into a vector of length m, BGRADB reduces op(B) over k into a vector of length n; DRELU_BGRAD
  and DGELU_BGRAD write the row sums of the gradient they produce (length m).
- The heuristic reads the alignment of the bias and aux pointers, so placeholders are set before the query.

Status names come from a table of cublasStatus_t (cublasLtGetStatusName is missing from older 12.x builds).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
from collections.abc import Iterator
from enum import IntEnum
from typing import Any

import numpy as np

from .._errors import ConfigError, DeviceUnavailable
from ._loader import (
    CudaLibraryError,
    LibraryObject,
    argument_error,
    bind_library,
    c_int_value,
    in_current_context,
    int_range,
    stream_ptr,
    unchecked_function,
)

__all__ = [
    "ComputeType",
    "CublasError",
    "DataType",
    "Epilogue",
    "Handle",
    "Matmul",
    "MatmulDescAttribute",
    "MatmulPreferenceAttribute",
    "MatrixLayoutAttribute",
    "Status",
    "Workspace",
    "aux_nbytes",
    "bias_length",
    "default_aux_ld",
    "epilogue_reads_aux",
    "epilogue_uses_aux",
    "epilogue_uses_bias",
    "epilogue_writes_bias",
    "itemsize",
    "scale_type",
    "status_name",
    "version",
    "warm_up",
]

# ---------------------------------------------------------------------------------------------------------------
# Enums: C names without the prefix, values read from cublas_api.h, cublasLt.h and library_types.h
# ---------------------------------------------------------------------------------------------------------------


class Status(IntEnum):
    """cublasStatus_t (cublas_api.h)."""

    SUCCESS = 0
    NOT_INITIALIZED = 1
    ALLOC_FAILED = 3
    INVALID_VALUE = 7
    ARCH_MISMATCH = 8
    MAPPING_ERROR = 11
    EXECUTION_FAILED = 13
    INTERNAL_ERROR = 14
    NOT_SUPPORTED = 15
    LICENSE_ERROR = 16


class DataType(IntEnum):
    """cudaDataType_t (library_types.h): element types of matrices, bias and scalars."""

    R_16F = 2
    R_16BF = 14
    R_32F = 0
    R_64F = 1
    R_8I = 3
    R_8U = 8
    R_32I = 10
    R_8F_E4M3 = 28
    R_8F_E5M2 = 29


class ComputeType(IntEnum):
    """cublasComputeType_t (cublas_api.h): the multiply-accumulate type."""

    COMPUTE_16F = 64
    COMPUTE_16F_PEDANTIC = 65
    COMPUTE_32F = 68
    COMPUTE_32F_PEDANTIC = 69
    COMPUTE_32F_FAST_16F = 74
    COMPUTE_32F_FAST_16BF = 75
    COMPUTE_32F_FAST_TF32 = 77
    COMPUTE_64F = 70
    COMPUTE_64F_PEDANTIC = 71
    COMPUTE_32I = 72
    COMPUTE_32I_PEDANTIC = 73


class Operation(IntEnum):
    """cublasOperation_t (cublas_api.h)."""

    N = 0
    T = 1
    C = 2


class PointerMode(IntEnum):
    """cublasLtPointerMode_t: where alpha and beta live."""

    HOST = 0
    DEVICE = 1


class Order(IntEnum):
    """cublasLtOrder_t."""

    COL = 0
    ROW = 1


class Epilogue(IntEnum):
    """cublasLtEpilogue_t: what cuBLASLt applies to the product before storing D."""

    DEFAULT = 1
    RELU = 2
    RELU_AUX = 2 | 128
    BIAS = 4
    RELU_BIAS = 2 | 4
    RELU_AUX_BIAS = 2 | 128 | 4
    DRELU = 8 | 128
    DRELU_BGRAD = 8 | 128 | 16
    GELU = 32
    GELU_AUX = 32 | 128
    GELU_BIAS = 32 | 4
    GELU_AUX_BIAS = 32 | 128 | 4
    DGELU = 64 | 128
    DGELU_BGRAD = 64 | 128 | 16
    BGRADA = 256
    BGRADB = 512


class MatrixLayoutAttribute(IntEnum):
    """cublasLtMatrixLayoutAttribute_t."""

    TYPE = 0
    ORDER = 1
    ROWS = 2
    COLS = 3
    LD = 4
    BATCH_COUNT = 5
    STRIDED_BATCH_OFFSET = 6


class MatmulDescAttribute(IntEnum):
    """cublasLtMatmulDescAttributes_t (the ones fastnn uses)."""

    COMPUTE_TYPE = 0
    SCALE_TYPE = 1
    POINTER_MODE = 2
    TRANSA = 3
    TRANSB = 4
    TRANSC = 5
    FILL_MODE = 6
    EPILOGUE = 7
    BIAS_POINTER = 8
    BIAS_BATCH_STRIDE = 10
    EPILOGUE_AUX_POINTER = 11
    EPILOGUE_AUX_LD = 12
    EPILOGUE_AUX_BATCH_STRIDE = 13
    ALPHA_VECTOR_BATCH_STRIDE = 14
    SM_COUNT_TARGET = 15
    EPILOGUE_AUX_DATA_TYPE = 22
    BIAS_DATA_TYPE = 26


class MatmulPreferenceAttribute(IntEnum):
    """cublasLtMatmulPreferenceAttributes_t."""

    SEARCH_MODE = 0
    MAX_WORKSPACE_BYTES = 1
    REDUCTION_SCHEME_MASK = 3
    MIN_ALIGNMENT_A_BYTES = 5
    MIN_ALIGNMENT_B_BYTES = 6
    MIN_ALIGNMENT_C_BYTES = 7
    MIN_ALIGNMENT_D_BYTES = 8
    MAX_WAVES_COUNT = 9
    IMPL_MASK = 12


# The C type of every attribute, from the comments in cublasLt.h: the library checks sizeInBytes, and this
# table is the only place a size comes from, so a wrong size cannot be passed.
_LAYOUT_ATTR_TYPES: dict[MatrixLayoutAttribute, type] = {
    MatrixLayoutAttribute.TYPE: ctypes.c_uint32,
    MatrixLayoutAttribute.ORDER: ctypes.c_int32,
    MatrixLayoutAttribute.ROWS: ctypes.c_uint64,
    MatrixLayoutAttribute.COLS: ctypes.c_uint64,
    MatrixLayoutAttribute.LD: ctypes.c_int64,
    MatrixLayoutAttribute.BATCH_COUNT: ctypes.c_int32,
    MatrixLayoutAttribute.STRIDED_BATCH_OFFSET: ctypes.c_int64,
}
_DESC_ATTR_TYPES: dict[MatmulDescAttribute, type] = {
    MatmulDescAttribute.COMPUTE_TYPE: ctypes.c_int32,
    MatmulDescAttribute.SCALE_TYPE: ctypes.c_int32,
    MatmulDescAttribute.POINTER_MODE: ctypes.c_int32,
    MatmulDescAttribute.TRANSA: ctypes.c_int32,
    MatmulDescAttribute.TRANSB: ctypes.c_int32,
    MatmulDescAttribute.TRANSC: ctypes.c_int32,
    MatmulDescAttribute.FILL_MODE: ctypes.c_int32,
    MatmulDescAttribute.EPILOGUE: ctypes.c_uint32,
    MatmulDescAttribute.BIAS_POINTER: ctypes.c_void_p,
    MatmulDescAttribute.BIAS_BATCH_STRIDE: ctypes.c_int64,
    MatmulDescAttribute.EPILOGUE_AUX_POINTER: ctypes.c_void_p,
    MatmulDescAttribute.EPILOGUE_AUX_LD: ctypes.c_int64,
    MatmulDescAttribute.EPILOGUE_AUX_BATCH_STRIDE: ctypes.c_int64,
    MatmulDescAttribute.ALPHA_VECTOR_BATCH_STRIDE: ctypes.c_int64,
    MatmulDescAttribute.SM_COUNT_TARGET: ctypes.c_int32,
    MatmulDescAttribute.EPILOGUE_AUX_DATA_TYPE: ctypes.c_int32,
    MatmulDescAttribute.BIAS_DATA_TYPE: ctypes.c_int32,
}
_PREF_ATTR_TYPES: dict[MatmulPreferenceAttribute, type] = {
    MatmulPreferenceAttribute.SEARCH_MODE: ctypes.c_uint32,
    MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES: ctypes.c_uint64,
    MatmulPreferenceAttribute.REDUCTION_SCHEME_MASK: ctypes.c_uint32,
    MatmulPreferenceAttribute.MIN_ALIGNMENT_A_BYTES: ctypes.c_uint32,
    MatmulPreferenceAttribute.MIN_ALIGNMENT_B_BYTES: ctypes.c_uint32,
    MatmulPreferenceAttribute.MIN_ALIGNMENT_C_BYTES: ctypes.c_uint32,
    MatmulPreferenceAttribute.MIN_ALIGNMENT_D_BYTES: ctypes.c_uint32,
    MatmulPreferenceAttribute.MAX_WAVES_COUNT: ctypes.c_float,
    MatmulPreferenceAttribute.IMPL_MASK: ctypes.c_uint64,
}

_ITEMSIZE = {
    DataType.R_16F: 2,
    DataType.R_16BF: 2,
    DataType.R_32F: 4,
    DataType.R_64F: 8,
    DataType.R_8I: 1,
    DataType.R_8U: 1,
    DataType.R_32I: 4,
    DataType.R_8F_E4M3: 1,
    DataType.R_8F_E5M2: 1,
}
_SCALE_NUMPY = {DataType.R_16F: np.float16, DataType.R_32F: np.float32, DataType.R_64F: np.float64}

# ---------------------------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------------------------


class CublasError(CudaLibraryError):
    """A cuBLASLt call failed; `.status_name` is the cublasStatus_t name, e.g. CUBLAS_STATUS_NOT_SUPPORTED."""


def status_name(status: int) -> str:
    """The cublasStatus_t name of `status` (e.g. 15 -> "CUBLAS_STATUS_NOT_SUPPORTED")."""
    try:
        return f"CUBLAS_STATUS_{Status(status).name}"
    except ValueError:
        return f"CUBLAS_STATUS_UNKNOWN_{int(status)}"


# What the caller is doing, added to the error of any failing call inside `_doing(...)`: the errcheck
# only knows the C function, the plan knows the shape and types.
_activity: contextvars.ContextVar[str] = contextvars.ContextVar("fastnn_cublaslt_activity", default="")


@contextlib.contextmanager
def _doing(what: str) -> Iterator[None]:
    token = _activity.set(what)
    try:
        yield
    except ctypes.ArgumentError as exc:  # an integer that would wrap in C (see _loader.checked_argtype)
        raise argument_error(exc, what) from exc
    finally:
        _activity.reset(token)


def _errcheck(result: int, func: Any, args: tuple) -> int:
    if result != Status.SUCCESS:
        activity = _activity.get()
        what = f"{func.__name__} ({activity})" if activity else func.__name__
        raise CublasError(result, status_name(result), what)
    return result


# ---------------------------------------------------------------------------------------------------------------
# Loading: one signature table, applied once when the library is first used
# ---------------------------------------------------------------------------------------------------------------


class _Algo(ctypes.Structure):
    """cublasLtMatmulAlgo_t: 64 opaque bytes, copied by value into each plan."""

    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _HeuristicResult(ctypes.Structure):
    """cublasLtMatmulHeuristicResult_t."""

    _fields_ = [
        ("algo", _Algo),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


_STATUS = object()  # restype marker: returns cublasStatus_t, checked by _errcheck
_VP = ctypes.c_void_p
_PVP = ctypes.POINTER(ctypes.c_void_p)

_SIGNATURES: dict[str, tuple[Any, list]] = {
    "cublasLtGetVersion": (ctypes.c_size_t, []),
    "cublasLtGetCudartVersion": (ctypes.c_size_t, []),
    "cublasLtCreate": (_STATUS, [_PVP]),
    "cublasLtDestroy": (_STATUS, [_VP]),
    "cublasLtMatmulDescCreate": (_STATUS, [_PVP, ctypes.c_int, ctypes.c_int]),
    "cublasLtMatmulDescDestroy": (_STATUS, [_VP]),
    "cublasLtMatmulDescSetAttribute": (_STATUS, [_VP, ctypes.c_int, _VP, ctypes.c_size_t]),
    "cublasLtMatmulDescGetAttribute": (
        _STATUS,
        [_VP, ctypes.c_int, _VP, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "cublasLtMatrixLayoutCreate": (_STATUS, [_PVP, ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64]),
    "cublasLtMatrixLayoutDestroy": (_STATUS, [_VP]),
    "cublasLtMatrixLayoutSetAttribute": (_STATUS, [_VP, ctypes.c_int, _VP, ctypes.c_size_t]),
    "cublasLtMatrixLayoutGetAttribute": (
        _STATUS,
        [_VP, ctypes.c_int, _VP, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)],
    ),
    "cublasLtMatmulPreferenceCreate": (_STATUS, [_PVP]),
    "cublasLtMatmulPreferenceDestroy": (_STATUS, [_VP]),
    "cublasLtMatmulPreferenceSetAttribute": (_STATUS, [_VP, ctypes.c_int, _VP, ctypes.c_size_t]),
    "cublasLtMatmulAlgoGetHeuristic": (
        _STATUS,
        [
            _VP,
            _VP,
            _VP,
            _VP,
            _VP,
            _VP,
            _VP,
            ctypes.c_int,
            ctypes.POINTER(_HeuristicResult),
            ctypes.POINTER(ctypes.c_int),
        ],
    ),
    "cublasLtMatmul": (
        _STATUS,
        # handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace, size, stream
        [_VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, _VP, ctypes.POINTER(_Algo), _VP, ctypes.c_size_t, _VP],
    ),
}


@functools.cache
def _lib() -> ctypes.CDLL:
    """libcublasLt, loaded on first use with every function of the signature table bound."""
    return bind_library("cublasLt", "cuBLASLt", "cublasLtGetVersion", _SIGNATURES, _STATUS, _errcheck)


@functools.cache
def _matmul_call() -> Any:
    """cublasLtMatmul for Matmul.__call__ (recorded ~20,000 times per epoch graph): its one integer argument, the
    workspace size, is range-checked once per plan instead of at each call (`unchecked_function`)."""
    return unchecked_function(_lib(), "cublasLtMatmul", _SIGNATURES, _STATUS, _errcheck)


def version() -> int:
    """cuBLASLt's version number (cublasLtGetVersion: major*10000 + minor*100 + patch, e.g. 120903)."""
    return int(_lib().cublasLtGetVersion())


# ---------------------------------------------------------------------------------------------------------------
# Handles and descriptors: small owners with close(), context manager and a finalizer
# ---------------------------------------------------------------------------------------------------------------


def _destroy_by_name(name: str, ptr: int) -> None:
    getattr(_lib(), name)(ptr)


class _Owned(LibraryObject):
    """Something cuBLASLt created that must be destroyed exactly once (by its `_destroy` function); a handle
    (`_in_context`) with the CUDA context it was made in current."""

    _destroy = ""
    _in_context = False

    def __init__(self, ptr: int) -> None:
        destroy = functools.partial(_destroy_by_name, self._destroy)
        super().__init__(ptr, in_current_context(destroy) if self._in_context else destroy)


class Handle(_Owned):
    """A cuBLASLt context (cublasLtCreate) on the current CUDA context; one per device is enough."""

    _destroy = "cublasLtDestroy"
    _in_context = True

    def __init__(self, device: Any = None) -> None:
        """Args: device: a fastnn.cuda.driver.Device to make current first (else the current context is used).

        Raises:
            DeviceUnavailable: no usable GPU or driver (cublasLtCreate reports CUBLAS_STATUS_NOT_INITIALIZED).
        """
        lib = _lib()
        if device is not None:
            device.make_current()
        handle = ctypes.c_void_p()
        try:
            lib.cublasLtCreate(ctypes.byref(handle))
        except CublasError as exc:
            if exc.status == Status.NOT_INITIALIZED:
                raise DeviceUnavailable(
                    f"cannot create a cuBLASLt handle: {exc}; there is no usable CUDA driver or GPU "
                    f"(check `nvidia-smi`, or use device='cpu')"
                ) from exc
            raise
        super().__init__(handle.value)


class _Layout(_Owned):
    """cublasLtMatrixLayout_t of a column-major rows x cols matrix."""

    _destroy = "cublasLtMatrixLayoutDestroy"

    def __init__(self, dtype: DataType, rows: int, cols: int, ld: int) -> None:
        ptr = ctypes.c_void_p()
        with _doing(f"creating a {dtype.name} layout of {rows} x {cols}, ld {ld}"):
            _lib().cublasLtMatrixLayoutCreate(ctypes.byref(ptr), int(dtype), rows, cols, ld)
        super().__init__(ptr.value)

    def set(self, attr: MatrixLayoutAttribute, value: int) -> None:
        _set_attr(_lib().cublasLtMatrixLayoutSetAttribute, self.ptr, attr, _LAYOUT_ATTR_TYPES[attr], value)

    def get(self, attr: MatrixLayoutAttribute) -> int:
        return _get_attr(_lib().cublasLtMatrixLayoutGetAttribute, self.ptr, attr, _LAYOUT_ATTR_TYPES[attr])


class _MatmulDesc(_Owned):
    """cublasLtMatmulDesc_t: compute/scale type, transposes, epilogue and its pointers."""

    _destroy = "cublasLtMatmulDescDestroy"

    def __init__(self, compute: ComputeType, scale: DataType) -> None:
        ptr = ctypes.c_void_p()
        _lib().cublasLtMatmulDescCreate(ctypes.byref(ptr), int(compute), int(scale))
        super().__init__(ptr.value)

    def set(self, attr: MatmulDescAttribute, value: int) -> None:
        _set_attr(_lib().cublasLtMatmulDescSetAttribute, self.ptr, attr, _DESC_ATTR_TYPES[attr], value)

    def get(self, attr: MatmulDescAttribute) -> int:
        return _get_attr(_lib().cublasLtMatmulDescGetAttribute, self.ptr, attr, _DESC_ATTR_TYPES[attr])


class _Preference(_Owned):
    """cublasLtMatmulPreference_t: limits for the heuristic (workspace size, pointer alignment)."""

    _destroy = "cublasLtMatmulPreferenceDestroy"

    def __init__(self) -> None:
        ptr = ctypes.c_void_p()
        _lib().cublasLtMatmulPreferenceCreate(ctypes.byref(ptr))
        super().__init__(ptr.value)

    def set(self, attr: MatmulPreferenceAttribute, value: float) -> None:
        _set_attr(_lib().cublasLtMatmulPreferenceSetAttribute, self.ptr, attr, _PREF_ATTR_TYPES[attr], value)


def _set_attr(fn: Any, ptr: int, attr: IntEnum, ctype: type, value: Any) -> None:
    # Integer attributes are range-checked: ctype(value) would wrap a row count of 2**64 + 8 to 8.
    buf = c_int_value(ctype, value, f"{type(attr).__name__}.{attr.name}") if int_range(ctype) else ctype(value)
    with _doing(f"setting {type(attr).__name__}.{attr.name} = {value}"):
        fn(ptr, int(attr), ctypes.byref(buf), ctypes.sizeof(buf))


def _get_attr(fn: Any, ptr: int, attr: IntEnum, ctype: type) -> Any:
    buf = ctype()
    written = ctypes.c_size_t()
    with _doing(f"reading {type(attr).__name__}.{attr.name}"):
        fn(ptr, int(attr), ctypes.byref(buf), ctypes.sizeof(buf), ctypes.byref(written))
    return buf.value if buf.value is not None else 0


class Workspace:
    """One device buffer shared by every plan on a stream (cuBLASLt scratch space, e.g. for split-K).

    32 MiB by default: the size NVIDIA recommends for Hopper, where the fastest kernels for large shapes need
    it; cuBLASLt requires 256-byte alignment, which cuMemAlloc guarantees.
    """

    def __init__(self, nbytes: int = 32 << 20, device: Any = None) -> None:
        """Args: nbytes: size in bytes; device: a driver.Device (default: the current one)."""
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ConfigError(f"workspace nbytes must be an int >= 0, got {nbytes!r}")
        from .driver import DeviceBuffer

        self.nbytes = nbytes
        self._buffer = DeviceBuffer(max(nbytes, 256), device)
        self.ptr = int(self._buffer.ptr)
        if self.ptr % 256:
            raise CublasError(Status.INVALID_VALUE, status_name(Status.INVALID_VALUE), "workspace 256-byte alignment")

    def close(self) -> None:
        """Free the buffer (idempotent); plans using it must not run afterwards."""
        self._buffer.close()

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------------------------
# Epilogue rules (pure functions: the engine sizes its buffers with them, CPU tests check them)
# ---------------------------------------------------------------------------------------------------------------

_RELU_MASK_EPILOGUES = frozenset({Epilogue.RELU_AUX, Epilogue.RELU_AUX_BIAS, Epilogue.DRELU, Epilogue.DRELU_BGRAD})
_GELU_AUX_EPILOGUES = frozenset({Epilogue.GELU_AUX, Epilogue.GELU_AUX_BIAS, Epilogue.DGELU, Epilogue.DGELU_BGRAD})
_AUX_READERS = frozenset({Epilogue.DRELU, Epilogue.DRELU_BGRAD, Epilogue.DGELU, Epilogue.DGELU_BGRAD})
_BIAS_INPUTS = frozenset(
    {Epilogue.BIAS, Epilogue.RELU_BIAS, Epilogue.RELU_AUX_BIAS, Epilogue.GELU_BIAS, Epilogue.GELU_AUX_BIAS}
)
_BIAS_OUTPUTS = frozenset({Epilogue.DRELU_BGRAD, Epilogue.DGELU_BGRAD, Epilogue.BGRADA, Epilogue.BGRADB})


def itemsize(dtype: DataType) -> int:
    """Bytes per element of `dtype`."""
    return _ITEMSIZE[DataType(dtype)]


def scale_type(compute: ComputeType) -> DataType:
    """The alpha/beta type fastnn uses with `compute`: R_16F for the 16F compute types, else R_32F / R_64F."""
    compute = ComputeType(compute)
    if compute in (ComputeType.COMPUTE_16F, ComputeType.COMPUTE_16F_PEDANTIC):
        return DataType.R_16F
    if compute in (ComputeType.COMPUTE_64F, ComputeType.COMPUTE_64F_PEDANTIC):
        return DataType.R_64F
    if compute in (ComputeType.COMPUTE_32I, ComputeType.COMPUTE_32I_PEDANTIC):
        raise ConfigError(f"compute {compute.name} (integer GEMM) is not supported by fastnn's Matmul")
    return DataType.R_32F


def epilogue_uses_aux(epilogue: Epilogue) -> bool:
    """True when the epilogue writes (forward) or reads (backward) the aux buffer."""
    return Epilogue(epilogue) in _RELU_MASK_EPILOGUES | _GELU_AUX_EPILOGUES


def epilogue_reads_aux(epilogue: Epilogue) -> bool:
    """True for the backward epilogues that read the aux buffer written by a forward one."""
    return Epilogue(epilogue) in _AUX_READERS


def epilogue_uses_bias(epilogue: Epilogue) -> bool:
    """True when the epilogue reads a bias vector or writes a bias gradient (both via BIAS_POINTER)."""
    return Epilogue(epilogue) in _BIAS_INPUTS | _BIAS_OUTPUTS


def epilogue_writes_bias(epilogue: Epilogue) -> bool:
    """True when the bias pointer is an output (a bias gradient)."""
    return Epilogue(epilogue) in _BIAS_OUTPUTS


def bias_length(epilogue: Epilogue, m: int, n: int) -> int:
    """Elements of the bias / bias-gradient vector: n for BGRADB (reduces op(B) over k), m otherwise."""
    return n if Epilogue(epilogue) == Epilogue.BGRADB else m


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def default_aux_ld(epilogue: Epilogue, m: int) -> int | None:
    """The tight AUX_LD for `epilogue` with m rows of D, or None when it uses no aux buffer.

    ReLU bit-mask: in bits, a multiple of 128 and >= m. GELU pre-activation: in elements, a multiple of 8, >= m.
    """
    epilogue = Epilogue(epilogue)
    if epilogue in _RELU_MASK_EPILOGUES:
        return _round_up(m, 128)
    if epilogue in _GELU_AUX_EPILOGUES:
        return _round_up(m, 8)
    return None


def _check_aux_ld(epilogue: Epilogue, m: int, aux_ld: int | None) -> int | None:
    default = default_aux_ld(epilogue, m)
    if aux_ld is None:
        return default
    if default is None:
        raise ConfigError(f"aux_ld={aux_ld!r} given but epilogue {epilogue.name} uses no aux buffer")
    multiple, unit = (128, "bits") if epilogue in _RELU_MASK_EPILOGUES else (8, "elements")
    if not isinstance(aux_ld, int) or isinstance(aux_ld, bool) or aux_ld < m or aux_ld % multiple:
        raise ConfigError(
            f"aux_ld for {epilogue.name} must be an int multiple of {multiple} and >= m={m} ({unit}), got {aux_ld!r}"
        )
    return aux_ld


def aux_nbytes(epilogue: Epilogue, m: int, n: int, cd_type: DataType, aux_ld: int | None = None) -> int:
    """Bytes the aux buffer of an m x n D needs (0 without one): ReLU mask aux_ld/8 * n; GELU aux_ld * n * size(D)."""
    epilogue = Epilogue(epilogue)
    ld = _check_aux_ld(epilogue, m, aux_ld)
    if ld is None:
        return 0
    if epilogue in _RELU_MASK_EPILOGUES:
        return ld // 8 * n
    return ld * n * itemsize(cd_type)


# ---------------------------------------------------------------------------------------------------------------
# Matmul: one plan per shape, built once, called many times (also inside stream capture)
# ---------------------------------------------------------------------------------------------------------------


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def _leading_dim(name: str, value: int | None, rows: int) -> int:
    if value is None:
        return rows
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < rows:
        raise ConfigError(f"{name} must be an int >= {rows} (rows of the stored column-major matrix), got {value!r}")
    return int(value)


_PTR_MAX = (1 << 64) - 1


def _is_ptr(ptr: Any, align: int) -> bool:
    """The common case of Matmul._check_ptr, decided in a few comparisons: a Python int in [1, 2**64), aligned."""
    return type(ptr) is int and 0 < ptr <= _PTR_MAX and not ptr % align


class _Descriptors:
    """Everything a Matmul describes to cuBLASLt before the heuristic: the desc and the A, B, C(=D) layouts.

    Needs no GPU (descriptor calls are host-only), so CPU tests build it for every epilogue.
    """

    def __init__(
        self,
        m: int,
        n: int,
        k: int,
        transa: bool,
        transb: bool,
        ab_type: DataType,
        cd_type: DataType,
        compute: ComputeType,
        lda: int,
        ldb: int,
        ldc: int,
        epilogue: Epilogue,
        aux_ld: int | None,
        device_scalars: bool,
        placeholder: int,
        sm_count_target: int = 0,
    ) -> None:
        self.scale = scale_type(compute)
        self.desc = _MatmulDesc(compute, self.scale)
        if sm_count_target:
            self.desc.set(MatmulDescAttribute.SM_COUNT_TARGET, sm_count_target)
        self.desc.set(MatmulDescAttribute.TRANSA, Operation.T if transa else Operation.N)
        self.desc.set(MatmulDescAttribute.TRANSB, Operation.T if transb else Operation.N)
        self.desc.set(MatmulDescAttribute.EPILOGUE, epilogue)
        if device_scalars:
            self.desc.set(MatmulDescAttribute.POINTER_MODE, PointerMode.DEVICE)
        if aux_ld is not None:
            self.desc.set(MatmulDescAttribute.EPILOGUE_AUX_LD, aux_ld)
            # The heuristic reads the aux pointer's alignment: a placeholder as aligned as the real one will be.
            self.desc.set(MatmulDescAttribute.EPILOGUE_AUX_POINTER, placeholder)
        if epilogue_uses_bias(epilogue):
            self.desc.set(MatmulDescAttribute.BIAS_POINTER, placeholder)
        # Stored (column-major) shapes: op(A) is m x k, op(B) is k x n.
        self.a = _Layout(ab_type, k if transa else m, m if transa else k, lda)
        self.b = _Layout(ab_type, n if transb else k, k if transb else n, ldb)
        self.cd = _Layout(cd_type, m, n, ldc)  # one layout for C and D: in-place C == D is legal only then

    def close(self) -> None:
        for owned in (self.desc, self.a, self.b, self.cd):
            owned.close()


class Matmul:
    """Column-major D (m x n) = alpha * op(A) @ op(B) + beta * C, then the epilogue. Built once per shape."""

    def __init__(
        self,
        handle: Handle,
        m: int,
        n: int,
        k: int,
        *,
        transa: bool,
        transb: bool,
        ab_type: DataType,
        cd_type: DataType,
        compute: ComputeType,
        lda: int | None = None,
        ldb: int | None = None,
        ldc: int | None = None,
        epilogue: Epilogue = Epilogue.DEFAULT,
        aux_ld: int | None = None,
        workspace: Workspace,
        device_scalars: bool = False,
        max_algos: int = 8,
        min_alignment: int = 256,
        sm_count_target: int = 0,
    ) -> None:
        """Describe the product and pick cuBLASLt's algorithms for it (heuristic, up to `max_algos`).

        Args:
            handle: the cuBLASLt handle. m, n, k: op(A) is m x k, op(B) k x n, D m x n (column-major).
            transa, transb: whether A / B are stored transposed. ab_type: type of A and B; cd_type: of C and D
                (and of the bias / bias gradient). compute: accumulation type (alpha/beta: see `scale_type`).
            lda, ldb, ldc: leading dimensions of the stored matrices (default: tight).
            epilogue: what to fuse; aux_ld: the aux buffer's leading dimension (default `default_aux_ld`).
            workspace: scratch space shared by plans. device_scalars: alpha/beta are device pointers.
            max_algos: how many heuristic candidates to keep (for `autotune`).
            min_alignment: byte alignment promised for every pointer (A, B, C, D, bias, aux); checked per call.
            sm_count_target: SMs the kernel may use (0: all); fewer leave SMs to a concurrent stream's kernels.
        Raises:
            ConfigError: a bad argument (named). CublasError: CUBLAS_STATUS_NOT_SUPPORTED when cuBLASLt has no
                algorithm for this combination (the message names it).
        """
        self.m, self.n, self.k = (_positive_int(name, v) for name, v in (("m", m), ("n", n), ("k", k)))
        self.transa, self.transb = bool(transa), bool(transb)
        try:
            self.ab_type, self.cd_type = DataType(ab_type), DataType(cd_type)
            self.compute, self.epilogue = ComputeType(compute), Epilogue(epilogue)
        except ValueError as exc:
            raise ConfigError(f"Matmul: {exc} (use the DataType / ComputeType / Epilogue enums)") from exc
        self.scale_type = scale_type(self.compute)
        if self.scale_type not in _SCALE_NUMPY:
            raise ConfigError(f"compute {self.compute.name} has no supported scale type")
        self.lda = _leading_dim("lda", lda, self.k if self.transa else self.m)
        self.ldb = _leading_dim("ldb", ldb, self.n if self.transb else self.k)
        self.ldc = _leading_dim("ldc", ldc, self.m)
        self.aux_ld = _check_aux_ld(self.epilogue, self.m, aux_ld)
        self.device_scalars = bool(device_scalars)
        self.max_algos = _positive_int("max_algos", max_algos)
        if (
            not isinstance(min_alignment, int)
            or min_alignment < 1
            or min_alignment > 256
            or min_alignment & (min_alignment - 1)
        ):
            raise ConfigError(f"min_alignment must be a power of two in 1..256 bytes, got {min_alignment!r}")
        self.min_alignment = min_alignment
        if not isinstance(sm_count_target, int) or isinstance(sm_count_target, bool) or sm_count_target < 0:
            raise ConfigError(f"sm_count_target must be an int >= 0 (0: every SM), got {sm_count_target!r}")
        self.sm_count_target = sm_count_target
        if not isinstance(workspace, Workspace):
            raise ConfigError(f"workspace must be a cublaslt.Workspace, got {type(workspace).__name__}")
        c_int_value(ctypes.c_size_t, workspace.nbytes, "workspace nbytes")  # once here: calls pass it unchecked
        self.handle, self.workspace = handle, workspace

        # Host scalars packed in the scale type and kept alive by the plan (cuBLASLt reads them at each call).
        np_scale = _SCALE_NUMPY[self.scale_type]
        self._alpha = np.ones(1, dtype=np_scale)
        self._beta = np.zeros(1, dtype=np_scale)

        with _doing(f"building {self.describe()}"):
            self._d = _Descriptors(
                self.m,
                self.n,
                self.k,
                self.transa,
                self.transb,
                self.ab_type,
                self.cd_type,
                self.compute,
                self.lda,
                self.ldb,
                self.ldc,
                self.epilogue,
                self.aux_ld,
                self.device_scalars,
                placeholder=min_alignment,
                sm_count_target=sm_count_target,
            )
            self._bias_ptr = min_alignment if epilogue_uses_bias(self.epilogue) else 0
            self._aux_ptr = min_alignment if self.aux_ld is not None else 0
            self._algos = self._heuristic()
        self.algo_index = 0
        self._algo = self._algos[0]
        # What every call needs and no call changes, worked out once: a step records ~10 of these calls, an
        # epoch graph tens of thousands (the pointers and scalars are still checked at each call).
        self._what = self.describe()
        self._uses_bias = epilogue_uses_bias(self.epilogue)
        self._bias_name = f"bias (needed by {self.epilogue.name})"
        self._aux_name = f"aux (needed by {self.epilogue.name})"
        self._alpha_ptr, self._beta_ptr = self._alpha.ctypes.data, self._beta.ctypes.data

    def describe(self) -> str:
        """A one-line description of the plan for messages and logs."""
        return (
            f"Matmul m={self.m} n={self.n} k={self.k} transa={self.transa} transb={self.transb} "
            f"ab={self.ab_type.name} cd={self.cd_type.name} compute={self.compute.name} "
            f"epilogue={self.epilogue.name}"
        )

    def _heuristic(self) -> list[_Algo]:
        lib = _lib()
        with _Preference() as pref:
            pref.set(MatmulPreferenceAttribute.MAX_WORKSPACE_BYTES, self.workspace.nbytes)
            for attr in (
                MatmulPreferenceAttribute.MIN_ALIGNMENT_A_BYTES,
                MatmulPreferenceAttribute.MIN_ALIGNMENT_B_BYTES,
                MatmulPreferenceAttribute.MIN_ALIGNMENT_C_BYTES,
                MatmulPreferenceAttribute.MIN_ALIGNMENT_D_BYTES,
            ):
                pref.set(attr, self.min_alignment)
            results = (_HeuristicResult * self.max_algos)()
            count = ctypes.c_int(0)
            what = f"finding a cuBLASLt algorithm for {self.describe()}"
            try:
                with _doing(what):
                    lib.cublasLtMatmulAlgoGetHeuristic(
                        self.handle.ptr,
                        self._d.desc.ptr,
                        self._d.a.ptr,
                        self._d.b.ptr,
                        self._d.cd.ptr,
                        self._d.cd.ptr,
                        pref.ptr,
                        self.max_algos,
                        results,
                        ctypes.byref(count),
                    )
            except CublasError:
                self._d.close()
                raise
        algos = []
        for result in results[: count.value]:
            if result.state == Status.SUCCESS and result.workspaceSize <= self.workspace.nbytes:
                algo = _Algo()
                ctypes.memmove(ctypes.byref(algo), ctypes.byref(result.algo), ctypes.sizeof(_Algo))
                algos.append(algo)
        if not algos:
            self._d.close()
            raise CublasError(Status.NOT_SUPPORTED, status_name(Status.NOT_SUPPORTED), f"{what} (no candidates)")
        return algos

    @property
    def algo_count(self) -> int:
        """How many heuristic candidates the plan holds."""
        return len(self._algos)

    def select(self, index: int) -> None:
        """Use heuristic candidate `index` from now on (`autotune` does this for the fastest)."""
        if not 0 <= index < len(self._algos):
            raise ConfigError(f"algo index must be in 0..{len(self._algos) - 1}, got {index!r}")
        self.algo_index = index
        self._algo = self._algos[index]

    def _set_pointer(self, attr: MatmulDescAttribute, ptr: int) -> None:
        self._d.desc.set(attr, ptr)

    def _check_ptr(self, name: str, ptr: Any) -> int:
        # ctypes' c_void_p wraps an int beyond 64 bits silently (2**64 + 4096 would be 4096): refused here too.
        if not isinstance(ptr, (int, np.integer)) or isinstance(ptr, bool) or not 0 < ptr <= _PTR_MAX:
            raise ConfigError(f"{name} must be a device pointer (an int in [1, 2**64)), got {ptr!r}")
        if ptr % self.min_alignment:
            raise ConfigError(
                f"{name}=0x{int(ptr):x} is not {self.min_alignment}-byte aligned as promised by min_alignment"
            )
        return int(ptr)

    def __call__(
        self,
        a: int,
        b: int,
        c: int,
        d: int,
        stream: Any,
        *,
        bias: int = 0,
        aux: int = 0,
        alpha: float | int = 1.0,
        beta: float | int = 0.0,
    ) -> None:
        """Enqueue the product on `stream` (a driver.Stream, a raw cudaStream_t int, or None). Capture-safe.

        a, b, c, d, bias, aux are device pointers; c may be 0 (then c = d: with beta=0 C is not read).
        alpha/beta: host numbers (packed in the scale type and read at this call, so a captured graph keeps
        the values it was captured with) or, with device_scalars=True, device pointers to scale-type values.
        """
        if self._d is None:
            raise ConfigError(f"{self._what} is closed")
        align = self.min_alignment
        # Pointers: ints > 0, aligned as promised; the common case decided inline, anything else by _check_ptr.
        if not (_is_ptr(a, align) and _is_ptr(b, align) and _is_ptr(d, align)):
            a = self._check_ptr("a", a)
            b = self._check_ptr("b", b)
            d = self._check_ptr("d", d)
        if not c:
            c = d
        elif not _is_ptr(c, align):
            c = self._check_ptr("c", c)
        if self._uses_bias:
            if not _is_ptr(bias, align):
                bias = self._check_ptr(self._bias_name, bias)
            if bias != self._bias_ptr:  # host-side descriptor write: legal before and during capture
                self._set_pointer(MatmulDescAttribute.BIAS_POINTER, bias)
                self._bias_ptr = bias
        if self.aux_ld is not None:
            if not _is_ptr(aux, align):
                aux = self._check_ptr(self._aux_name, aux)
            if aux != self._aux_ptr:
                self._set_pointer(MatmulDescAttribute.EPILOGUE_AUX_POINTER, aux)
                self._aux_ptr = aux
        if self.device_scalars:
            alpha_ptr = self._check_ptr("alpha (device_scalars=True)", alpha)
            beta_ptr = self._check_ptr("beta (device_scalars=True)", beta)
        else:
            if not isinstance(alpha, (int, float, np.number)) or not isinstance(beta, (int, float, np.number)):
                raise ConfigError(f"alpha and beta must be numbers, got {alpha!r} and {beta!r}")
            self._alpha[0] = alpha
            self._beta[0] = beta
            alpha_ptr, beta_ptr = self._alpha_ptr, self._beta_ptr
        d_ = self._d
        # The algorithm is always passed: algo=NULL would run the heuristic inside the call, which allocates
        # and can fail during stream capture. The workspace size, the one integer argument, was range-checked
        # when the plan was built, so _matmul_call does not check it again.
        try:
            _matmul_call()(
                self.handle.ptr, d_.desc.ptr, alpha_ptr, a, d_.a.ptr, b, d_.b.ptr, beta_ptr, c, d_.cd.ptr, d, d_.cd.ptr,
                ctypes.byref(self._algo), self.workspace.ptr, self.workspace.nbytes, stream_ptr(stream),
            )  # fmt: skip
        except ctypes.ArgumentError as exc:  # e.g. a pointer beyond 64 bits
            raise argument_error(exc, self._what) from exc
        except CublasError as exc:  # what `with _doing(self._what)` would have said, without its per-call cost
            raise CublasError(exc.status, exc.status_name, f"cublasLtMatmul ({self._what})") from None

    def autotune(
        self,
        a: int,
        b: int,
        c: int,
        d: int,
        stream: Any,
        *,
        bias: int = 0,
        aux: int = 0,
        alpha: float | int = 1.0,
        beta: float | int = 0.0,
        repeats: int = 20,
    ) -> float:
        """Time every heuristic candidate on these buffers and keep the fastest; returns its time in ms.

        Each candidate runs `repeats` times inside a captured CUDA graph and one replay is timed: that is how
        the engine runs GEMMs, and eager back-to-back calls would time the host's launch rate instead (a
        skinny GEMM takes 2-6 us on the GPU, about what launching it costs), so the choice would be noise.
        The buffers are really written (many times): with beta != 0, C == D, or a backward epilogue writing
        a bias gradient, pass scratch buffers or restore them afterwards. `stream` must be a driver.Stream.
        Not for use inside stream capture (it captures itself).

        The choice is kept on disk (`autotune_cache`): a later process with the same GPU, library and plan selects
        it without timing (and without touching the buffers), as long as the heuristic still returns it.
        """
        from . import autotune_cache

        repeats = _positive_int("repeats", repeats)
        key = autotune_cache.entry_key(
            self, autotune_cache.gpu_identity(stream.device), version(), beta=beta, c_is_d=not c or c == d,
            repeats=repeats,
        )  # fmt: skip
        candidates = [bytes(algo) for algo in self._algos]
        cached = autotune_cache.lookup(key, candidates)
        if cached is not None:
            self.select(cached.index)
            return cached.ms
        best_ms = self._time_candidates(a, b, c, d, stream, bias, aux, alpha, beta, repeats)
        autotune_cache.store(key, candidates[self.algo_index], best_ms)
        return best_ms

    def _time_candidates(
        self, a: int, b: int, c: int, d: int, stream: Any, bias: int, aux: int, alpha: Any, beta: Any, repeats: int
    ) -> float:
        """`autotune`'s timing: select the fastest candidate on these buffers; returns its time in ms."""
        from .driver import time_captured

        best_ms, best_index = float("inf"), self.algo_index

        def run() -> None:
            self(a, b, c, d, stream, bias=bias, aux=aux, alpha=alpha, beta=beta)

        try:
            for index in range(len(self._algos)):
                self.select(index)
                try:
                    run()  # a candidate that cannot run these buffers fails here, outside capture
                except CublasError:
                    continue
                ms = time_captured(stream, lambda: [run() for _ in range(repeats)]) / repeats
                if ms < best_ms:
                    best_ms, best_index = ms, index
        finally:
            self.select(best_index)
        if best_ms == float("inf"):
            raise CublasError(
                Status.NOT_SUPPORTED, status_name(Status.NOT_SUPPORTED), f"autotuning {self.describe()}: no algo ran"
            )
        return best_ms

    def close(self) -> None:
        """Destroy the descriptors (idempotent). The handle and workspace belong to the caller."""
        if self._d is not None:
            self._d.close()
            self._d = None

    def __enter__(self) -> Matmul:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def warm_up(handle: Handle, workspace: Workspace) -> None:
    """One small plan made and dropped: cuBLASLt loads its heuristic's tables at the first query of a process
    (0.08 s of the first evaluation of a fused engine on an H100), so a thread can pay that ahead of the plans that
    matter. Host work only: nothing is queued on a stream."""
    Matmul(handle, 64, 64, 64, transa=True, transb=False, ab_type=DataType.R_16F, cd_type=DataType.R_32F,
           compute=ComputeType.COMPUTE_32F, epilogue=Epilogue.BIAS, workspace=workspace, max_algos=1).close()
