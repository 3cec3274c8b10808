"""Validation of user arrays and the one definition of how inputs are scaled.

Inputs stay in their own dtype (uint8 or float32) until a batch is gathered; then every engine maps
x to `x * scale + shift` with the (scale, shift) of `input_affine`: uint8 is divided by 255, and
`normalize=(mean, std)` subtracts and divides after that.
"""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import ConfigError, DataError
from .gpu_arrays import CudaArray, cuda_array

__all__ = ["check_inputs", "check_labels", "check_normalize", "input_affine", "prepare_batch"]


Normalize = tuple[float | tuple[float, ...], float | tuple[float, ...]]


def _stat(value: Any, what: str, features: int | None) -> float | tuple[float, ...]:
    """normalize's mean or std as a float, or a tuple of `features` floats (a per-feature vector)."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(
            f"normalize {what} must be a number or a vector of numbers, got {reprlib.repr(value)}"
        ) from None
    if arr.ndim == 0:
        return float(arr)
    if arr.ndim != 1 or (features is not None and arr.shape[0] != features):
        raise ConfigError(
            f"normalize {what} must be a number or a vector of {features or 'in_features'} numbers (one per input "
            f"feature), got shape {arr.shape}"
        )
    return tuple(float(v) for v in arr)


def _first_bad(values: np.ndarray, bad: np.ndarray, what: str) -> str:
    """The first few offending entries only ("std[3] = 0.0, std[9] = -1.0, ... (5 of 784)"), never all of them."""
    if values.ndim == 0:
        return f"{what} = {float(values)!r}"
    idx = np.flatnonzero(bad)
    shown = ", ".join(f"{what}[{i}] = {float(values[i])!r}" for i in idx[:3])
    return shown + (f", ... ({idx.size} of {values.size} entries)" if idx.size > 3 else "")


def check_normalize(normalize: Any, features: int | None = None) -> Normalize | None:
    """`normalize` as (mean, std), each a float or a per-feature tuple of `features` floats; std must be > 0."""
    if normalize is None:
        return None
    try:
        mean, std = normalize
    except (TypeError, ValueError):
        raise ConfigError(f"normalize must be None or (mean, std), got {reprlib.repr(normalize)}") from None
    mean, std = _stat(mean, "mean", features), _stat(std, "std", features)
    m, sd = np.asarray(mean), np.asarray(std)
    if not np.isfinite(m).all():
        raise ConfigError(
            f"normalize mean must be finite, got normalize={reprlib.repr(normalize)}: "
            f"{_first_bad(m, ~np.isfinite(m), 'mean')}"
        )
    bad = ~(np.isfinite(sd) & (sd > 0))
    if bad.any():
        raise ConfigError(
            f"normalize std must be finite and > 0, got normalize={reprlib.repr(normalize)}: "
            f"{_first_bad(sd, bad, 'std')}"
        )
    # Engines compute x * scale + shift in float32: both must survive the cast, for uint8 and float inputs.
    for dtype in (np.uint8, np.float32):
        scale, shift = input_affine(np.dtype(dtype), (mean, std))
        with np.errstate(over="ignore", under="ignore"):
            scale32, shift32 = np.float32(scale), np.float32(shift)
        broken = np.atleast_1d(~(np.isfinite(scale32) & np.isfinite(shift32) & (scale32 > 0)))
        if broken.any():
            k = int(np.flatnonzero(broken)[0])
            s64, h64 = (float(np.atleast_1d(v)[k if np.ndim(v) else 0]) for v in (scale, shift))
            at = f" (feature {k})" if np.ndim(scale) else ""
            with np.errstate(over="ignore", under="ignore"):
                s32, h32 = np.float32(s64), np.float32(h64)
            raise ConfigError(
                f"normalize={reprlib.repr(normalize)} maps {np.dtype(dtype)} inputs to x * {s64:g} + {h64:g}{at}, "
                f"which float32 (the engines' input type) holds as x * {s32} + {h32}: it must stay finite, the scale "
                f"nonzero"
            )
    return (mean, std)


def input_affine(dtype: np.dtype, normalize: Normalize | None) -> tuple[Any, Any]:
    """(scale, shift) such that the network sees `x * scale + shift` for stored x of `dtype`: floats, or float64
    arrays of one entry per feature when normalize has a per-feature vector."""
    scale = 1.0 / 255.0 if np.dtype(dtype) == np.uint8 else 1.0
    shift = 0.0
    if normalize is not None:
        mean, std = normalize
        if np.ndim(mean) or np.ndim(std):
            m, sd = np.broadcast_arrays(np.asarray(mean, np.float64), np.asarray(std, np.float64))
            return scale / sd, -m / sd
        scale, shift = scale / std, -mean / std
    return scale, shift


#: Largest number of rows of x (training, evaluation or prediction) on every engine: the shuffle permutes 32-bit
#: positions and the GPU gather takes u32 positions and an i32 first position.
MAX_ROWS = 2**31 - 1


def _not_an_array(x: Any, name: str, what: str) -> DataError | None:
    """A DataError for objects that are not arrays but are often passed as one, saying what to pass instead."""
    if getattr(x, "requires_grad", False) is True:  # a torch tensor in an autograd graph
        return DataError(f"{name} is a {type(x).__name__} that requires grad: pass {name}.detach() (then .cpu() or "
                         f"leave it on the GPU)")  # fmt: skip
    if hasattr(x, "toarray") and hasattr(x, "nnz"):  # scipy.sparse
        return DataError(f"{name} is a scipy sparse matrix ({type(x).__name__}); fastnn needs a dense array: "
                         f"pass {name}.toarray()")  # fmt: skip
    if inspect.isgenerator(x) or (isinstance(x, Iterator) and not hasattr(x, "__array__")):
        return DataError(f"{name} is a {type(x).__name__} (an iterator); pass {what}, e.g. numpy.asarray(list({name}))")
    return None


def _host_array(x: Any, name: str, what: str) -> np.ndarray:
    """x as a NumPy array: pandas frames with missing values become NaN (refused later, with a hint)."""
    if isinstance(x, np.ndarray):
        return x
    bad = _not_an_array(x, name, what)
    if bad is not None:
        raise bad
    if hasattr(x, "to_numpy") and hasattr(x, "dtypes") and not hasattr(x, "__cuda_array_interface__"):  # pandas
        if all(str(dt) == "uint8" for dt in np.atleast_1d(x.dtypes)):
            return x.to_numpy()  # uint8 stays uint8 (pixels, scaled by 1/255) as for a NumPy array
        try:
            return x.to_numpy(dtype=np.float64, na_value=np.nan)
        except (TypeError, ValueError) as exc:
            raise DataError(f"{name} is a pandas {type(x).__name__} that does not convert to numbers: {exc}") from None
    try:
        return np.asarray(x)
    except Exception:
        raise DataError(f"{name} must be {what}, got {type(x).__name__}") from None


def check_inputs(x: Any, features: int, name: str = "x", gpu: bool = False) -> np.ndarray | CudaArray:
    """`x` as a C-contiguous (N, features) uint8 or float32 array; raises DataError naming `name`.

    Integer and bool arrays become float32 (their values as given, not scaled). With `gpu`, an array already
    in GPU memory (torch, CuPy, JAX: `__cuda_array_interface__`) is returned as a `CudaArray` to be used in
    place; it must be uint8 or float32 (its values are not checked for NaN here: a non-finite input shows as
    TrainingDiverged). Without `gpu` (the CPU engine), such an array is refused with a hint.
    """
    dev = cuda_array(x, name)
    if dev is not None:
        if not gpu:
            raise DataError(
                f"{name} is {dev.describe()}, but this trainer runs on the CPU: pass a host array (torch: "
                f"{name}.cpu().numpy(); CuPy: cupy.asnumpy({name})), or train with device='cuda'"
            )
        _check_shape(dev.shape, features, name)
        if dev.dtype not in (np.uint8, np.float32):
            raise DataError(
                f"{name} is {dev.describe()}; GPU arrays are used in place and must be uint8 or float32: convert "
                f"on the GPU first (torch: {name}.float(); CuPy: {name}.astype(cupy.float32))"
            )
        return dev
    x = _host_array(x, name, f"an array of shape (N, {features})")
    _check_shape(x.shape, features, name)
    if x.dtype == np.uint8:
        return _c_array(x, np.uint8)
    if x.dtype.kind == "O":
        try:
            x = x.astype(np.float64)
        except (TypeError, ValueError):
            raise DataError(
                f"{name} has dtype object and does not convert to numbers (missing values such as pandas.NA or "
                f"None? fill or drop them first, e.g. df.fillna(0) or df.dropna())"
            ) from None
    if x.dtype.kind not in "fiub":
        raise DataError(f"{name} must hold numbers (uint8, float, int or bool), got dtype {x.dtype}")
    x = _c_array(x, np.float32)  # ints and bools: their values, as float32
    if not np.isfinite(x).all():
        row, col = (int(i) for i in np.argwhere(~np.isfinite(x))[0])
        raise DataError(
            f"{name} must hold finite values, got {float(x[row, col])} in row {row}, column {col} (missing values? "
            f"fill or drop them first)"
        )
    return x


def _c_array(x: np.ndarray, dtype: type) -> np.ndarray:
    """`x` as a C-contiguous array of `dtype`, copied only when it is not one. A memory map (a dataset loaded from
    fastnn's cache) is returned as itself: np.ascontiguousarray gives a new view object on every call, and the GPU
    engines know the data they already hold by the array object, so every fit would upload it again."""
    if isinstance(x, np.memmap) and x.dtype == dtype and x.flags.c_contiguous:
        return x
    return np.ascontiguousarray(x, dtype=dtype)


def _check_shape(shape: tuple[int, ...], features: int, name: str) -> None:
    if len(shape) != 2:
        raise DataError(f"{name} must be 2-D (N, {features}), got shape {shape}")
    if shape[0] == 0:
        raise DataError(f"{name} is empty: shape {shape}")
    if shape[1] != features:
        raise DataError(f"{name} has {shape[1]} features per row but the model takes {features}: shape {shape}")
    if shape[0] > MAX_ROWS:
        raise DataError(
            f"{name} has {shape[0]} rows; fastnn takes at most {MAX_ROWS} (2**31 - 1) rows per array: the shuffle "
            f"and the GPU kernels index rows with 32-bit integers. Split it into several fits"
        )


def check_labels(y: Any, n: int, classes: int, name: str = "y") -> np.ndarray:
    """`y` as an int32 (n,) array of values in [0, classes); raises DataError naming `name`.

    Labels in GPU memory are copied to the host for this check (4-8 bytes a row)."""
    dev = cuda_array(y, name)
    if dev is not None:
        y = dev.to_host()
    if not isinstance(y, np.ndarray):
        bad = _not_an_array(y, name, f"a 1-D array of {n} integer labels")
        if bad is not None:
            raise bad
        try:
            y = y.to_numpy() if hasattr(y, "to_numpy") else np.asarray(y)
        except Exception:  # ragged nested lists, objects numpy cannot convert
            raise DataError(
                f"{name} must be a 1-D array of {n} integer labels, got a {type(y).__name__} "
                f"that is not a regular array (ragged?)"
            ) from None
    if y.ndim != 1:
        raise DataError(f"{name} must be 1-D (N,), got shape {y.shape}")
    if y.shape[0] != n:
        raise DataError(f"{name} has {y.shape[0]} labels but the inputs have {n} rows")
    if y.dtype.kind == "b":
        y = y.astype(np.int32)
    if y.dtype.kind not in "iu":
        if y.dtype.kind == "f" and np.isfinite(y).all() and (y == np.round(y)).all():
            raise DataError(f"{name} must have an integer dtype, got {y.dtype} (cast with .astype(int))")
        if y.dtype.kind in "USO":
            first = ", ".join(repr(v) for v in y[:3].tolist())
            raise DataError(
                f"{name} holds {'objects' if y.dtype.kind == 'O' else 'strings'} ({first}, ...): fastnn.Trainer takes "
                f"integer labels 0..classes-1. Encode them (classes, {name}_int = numpy.unique({name}, "
                f"return_inverse=True)) or use fastnn.sklearn.MLPClassifier, which takes any labels"
            )
        raise DataError(f"{name} must have an integer dtype, got {y.dtype}")
    if y.size and (y.min() < 0 or y.max() >= classes):
        bad = int(y.min()) if y.min() < 0 else int(y.max())
        raise DataError(f"{name} holds label {bad}, outside [0, {classes}) for a model with {classes} classes")
    return np.ascontiguousarray(y, dtype=np.int32)


def prepare_batch(x: np.ndarray, scale: float, shift: float, dtype: type = np.float32) -> np.ndarray:
    """Rows of stored x mapped to what the network sees (the CPU form of the gather kernel's math)."""
    out = x.astype(dtype) * np.asarray(scale, dtype)
    if np.any(shift):
        out += np.asarray(shift, dtype)
    return out
