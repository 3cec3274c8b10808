"""Validation of user arrays and the one definition of how inputs are scaled.

Inputs stay in their own dtype (uint8 or float32) until a batch is gathered; then every engine maps
x to `x * scale + shift` with the (scale, shift) of `input_affine`: uint8 is divided by 255, and
`normalize=(mean, std)` subtracts and divides after that.
"""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ._checks import shown
from ._errors import ConfigError, DataError
from ._gpu_arrays import CudaArray, cuda_array
from ._state import FP16_MAX

__all__ = [
    "check_inputs", "check_labels", "check_normalize", "check_operand_range", "check_sample_weight", "check_targets",
    "input_affine", "prepare_batch", "sample_weight_array",
]  # fmt: skip


Normalize = tuple[float | tuple[float, ...], float | tuple[float, ...]]


def _stat(value: Any, what: str, features: int | None) -> float | tuple[float, ...]:
    """normalize's mean or std as a float, or a tuple of `features` floats (a per-feature vector)."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int a float cannot hold (10**400)
        raise ConfigError(
            f"normalize {what} must be a number or a vector of finite numbers, got {_unconvertible(value, what)}"
        ) from None
    if arr.ndim == 0:
        return float(arr)
    if arr.ndim != 1 or (features is not None and arr.shape[0] != features):
        raise ConfigError(
            f"normalize {what} must be a number or a vector of {features or 'in_features'} numbers (one per input "
            f"feature), got shape {arr.shape}"
        )
    return tuple(float(v) for v in arr)


def _unconvertible(value: Any, what: str) -> str:
    """For a message: the first entry of a vector `value` that is not a float ("std[3] = ..."), else `value`."""
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            try:
                float(v)
            except (TypeError, ValueError, OverflowError):
                return f"{what}[{i}] = {shown(v)}"
    return shown(value)


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
            raise _host_only(dev, name)
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
    return _finite_f32(x, name)  # ints and bools: their values, as float32


#: The largest finite float32, the type every engine trains in.
_F32_MAX = float(np.finfo(np.float32).max)
#: The largest regression target taken: beyond it (~1.84e19) a prediction of 0 has a squared error float32 cannot
#: hold, so the first epoch's loss would be inf (a TrainingDiverged that blames the learning rate).
TARGET_MAX = float(np.sqrt(np.float32(_F32_MAX)))


def _finite_f32(given: np.ndarray, name: str) -> np.ndarray:
    """`given` as a C-contiguous float32 array; DataError naming its first entry that is not finite there: a NaN
    or an infinity given (missing values?), or a finite number beyond float32's range, which the cast made inf."""
    with np.errstate(over="ignore", invalid="ignore"):
        as_f32 = _c_array(given, np.float32)
        bad = ~np.isfinite(as_f32)
        if not bad.any():
            return as_f32
        at = tuple(int(i) for i in np.argwhere(bad)[0])
        where = f"row {at[0]}" + (f", column {at[1]}" if len(at) > 1 else "")
        value = given[at].item()
        if np.isfinite(np.float64(value)):
            raise DataError(
                f"{name} holds {value!r} in {where}: a finite number, but beyond float32's range (magnitude at most "
                f"{_F32_MAX:.8g}), which fastnn trains in: rescale it first (e.g. sklearn's StandardScaler)"
            )
        raise DataError(
            f"{name} must hold finite values, got {float(value)} in {where} (missing values? fill or drop them first)"
        )


def check_operand_range(x: np.ndarray, normalize: Normalize | None, operand: type, name: str, why: str) -> None:
    """Refuse host inputs that the network's operand type cannot hold once mapped to `x * scale + shift`.

    `operand` is the type the first layer reads (float16 with precision "mixed" or "fp16"): the GPU gather
    computes x * scale + shift in float32 and converts it, so a value float16 cannot hold becomes inf there and
    every prediction of its row NaN, silently. Checked after `normalize`, which may bring values back in range.
    Cheap: one min and one max per column (the map is increasing in x: scale > 0), and the offending entry is
    looked for only when there is one. Arrays in GPU memory are not read here, as for finiteness.

    Raises:
        DataError: naming `name`, the row, column and value, what it maps to, the limit and the two fixes.
    """
    if np.dtype(operand) != np.float16 or (x.dtype == np.uint8 and normalize is None):  # [0, 1] fits float16
        return
    scale, shift = input_affine(x.dtype, normalize)
    bounds = prepare_batch(np.stack([x.min(axis=0), x.max(axis=0)]), scale, shift)  # what the gather makes of them
    with np.errstate(over="ignore"):
        bad_cols = np.flatnonzero(~np.isfinite(bounds.astype(np.float16)).all(axis=0))
    if bad_cols.size == 0:
        return
    cols = x[:, bad_cols]
    scale_c, shift_c = (v[bad_cols] if np.ndim(v) else v for v in (scale, shift))
    seen = prepare_batch(cols, scale_c, shift_c)
    with np.errstate(over="ignore"):
        row, j = (int(i) for i in np.argwhere(~np.isfinite(seen.astype(np.float16)))[0])
    col, value, mapped = int(bad_cols[j]), x[row, bad_cols[j]].item(), float(seen[row, j])
    after = "" if normalize is None and x.dtype != np.uint8 else f", which the network sees as {mapped:g}"
    raise DataError(
        f"{name} holds {value!r} in row {row}, column {col}{after}: {why} feeds the network float16 operands, "
        f"which hold at most +-{FP16_MAX:g} (beyond it the row's predictions would be NaN). Scale the inputs "
        f"(normalize=(mean, std) to the Trainer, or standardise {name}) or use precision='fp32'"
    )


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


def _host_only(dev: CudaArray, name: str) -> DataError:
    """The refusal of an array in GPU memory given to a trainer on the CPU, saying how to bring it over."""
    return DataError(
        f"{name} is {dev.describe()}, but this trainer runs on the CPU: pass a host array (torch: "
        f"{name}.cpu().numpy(); CuPy: cupy.asnumpy({name})), or train with device='cuda'"
    )


def _check_label_shape(shape: tuple[int, ...], n: int, name: str) -> None:
    if len(shape) != 1:
        raise DataError(f"{name} must be 1-D (N,), got shape {shape}")
    if shape[0] != n:
        raise DataError(f"{name} has {shape[0]} labels but the inputs have {n} rows")


def _host_y(y: Any, name: str, what: str, gpu: bool, check: Callable[[CudaArray], None] | None = None) -> np.ndarray:
    """Labels or targets as a host NumPy array; DataError naming `name` when they are not an array, `what` saying
    what was expected. With `gpu`, an array in GPU memory is copied to the host (4-8 bytes a row) once `check`
    accepts its description; without it (a trainer on the CPU) it is refused, as inputs are, before any CUDA
    library is loaded."""
    dev = cuda_array(y, name)
    if dev is not None:
        if not gpu:
            raise _host_only(dev, name)
        if check is not None:
            check(dev)
        y = dev.to_host()
    if not isinstance(y, np.ndarray):
        bad = _not_an_array(y, name, what)
        if bad is not None:
            raise bad
        try:
            y = y.to_numpy() if hasattr(y, "to_numpy") else np.asarray(y)
        except Exception:  # ragged nested lists, objects numpy cannot convert
            raise DataError(
                f"{name} must be {what}, got a {type(y).__name__} that is not a regular array (ragged?)"
            ) from None
    return y


def check_labels(y: Any, n: int, classes: int, name: str = "y", gpu: bool = False) -> np.ndarray:
    """`y` as an int32 (n,) array of values in [0, classes); raises DataError naming `name`.

    With `gpu`, labels in GPU memory are copied to the host for this check, once their shape and integer dtype
    are checked; without it they are refused (`_host_y`)."""

    def described(dev: CudaArray) -> None:
        _check_label_shape(dev.shape, n, name)
        if dev.dtype.kind not in "biu":
            raise DataError(
                f"{name} is {dev.describe()}; labels must have an integer dtype: convert on the GPU first (torch: "
                f"{name}.long(); CuPy: {name}.astype(cupy.int64))"
            )

    y = _host_y(y, name, f"a 1-D array of {n} integer labels", gpu, described)
    _check_label_shape(y.shape, n, name)
    if y.dtype.kind == "b":
        y = y.astype(np.int32)
    if y.dtype.kind not in "iu":
        if y.dtype.kind == "f" and np.isfinite(y).all() and (y == np.round(y)).all():
            raise DataError(f"{name} must have an integer dtype, got {y.dtype} (cast with .astype(int))")
        if y.dtype.kind == "f" and np.isfinite(y).all():
            i = int(np.flatnonzero(y != np.round(y))[0])
            raise DataError(
                f"{name} holds continuous {y.dtype} values ({y[i]} in row {i}), not integer class labels: "
                f"continuous targets: use loss='mse' / MLPRegressor (fastnn.Trainer(..., loss='mse') with "
                f"MLP([..., k]) for k targets, or fastnn.sklearn.MLPRegressor)"
            )
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


def check_targets(y: Any, n: int, outputs: int, name: str = "y", gpu: bool = False) -> np.ndarray:
    """`y` as a float32 (n, outputs) array of finite regression targets (loss "mse") of magnitude at most
    `TARGET_MAX`; (n,) is taken for one output. Raises DataError naming `name`; targets in GPU memory as `_host_y`
    says."""
    y = _host_y(y, name, f"an array of {n} targets, shape (N,) or (N, {outputs})", gpu)
    if y.dtype.kind == "O":
        try:
            y = y.astype(np.float64)
        except (TypeError, ValueError):
            raise DataError(f"{name} has dtype object and does not convert to numbers (missing values?)") from None
    if y.dtype.kind not in "fiub":
        raise DataError(f"{name} must hold numbers (regression targets), got dtype {y.dtype}")
    if y.ndim == 1 and outputs == 1:
        y = y.reshape(-1, 1)
    if y.ndim != 2 or y.shape[1] != outputs:
        want = "(N,) or (N, 1)" if outputs == 1 else f"(N, {outputs})"
        raise DataError(f"{name} must have shape {want} for a model with {outputs} output(s), got shape {y.shape}")
    if y.shape[0] != n:
        raise DataError(f"{name} has {y.shape[0]} rows of targets but the inputs have {n} rows")
    y = _finite_f32(y, name)
    big = np.abs(y) > TARGET_MAX
    if big.any():
        row, col = (int(i) for i in np.argwhere(big)[0])
        raise DataError(
            f"{name} holds {y[row, col].item():g} in row {row}, column {col}: its squared error overflows float32, in "
            f"which fastnn computes the loss (|{name}| must be at most {TARGET_MAX:.4g}): scale {name} first (e.g. "
            f"divide by its standard deviation, or sklearn's StandardScaler / TransformedTargetRegressor)"
        )
    return y


def prepare_batch(x: np.ndarray, scale: float, shift: float, dtype: type = np.float32) -> np.ndarray:
    """Rows of stored x mapped to what the network sees (the CPU form of the gather kernel's math)."""
    out = x.astype(dtype) * np.asarray(scale, dtype)
    if np.any(shift):
        out += np.asarray(shift, dtype)
    return out


def sample_weight_array(sample_weight: Any, n: int) -> np.ndarray:
    """`sample_weight` (a number or N numbers) as float64 (n,), checked: finite and >= 0 (the one check the Trainer
    and the scikit-learn estimators share).

    Raises:
        DataError: not numbers, not n of them, or one negative or not finite.
    """
    try:
        w = np.asarray(sample_weight, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"sample_weight must be numbers, got {reprlib.repr(sample_weight)}: {exc}") from None
    if w.ndim == 0:
        w = np.full(n, float(w))
    if w.shape != (n,):
        raise DataError(f"sample_weight has shape {w.shape}; x has {n} rows: expected ({n},)")
    if not np.isfinite(w).all() or (w < 0).any():
        raise DataError("sample_weight must hold finite values >= 0")
    return w


def check_sample_weight(sample_weight: Any, x: Any, validation_split: Any = None) -> np.ndarray | None:
    """`fit`'s sample_weight as float32 (N,) weights, or None where it is None or every weight is equal (the
    weighted mean loss is then the unweighted one, which every engine trains).

    Raises:
        DataError: not N finite weights >= 0, or they sum to 0.
        ConfigError: unequal weights with validation_split (the held-out rows' weights would be dropped).
    """
    if sample_weight is None:
        return None
    try:
        n = int(x.shape[0]) if getattr(x, "shape", None) else len(x)
    except TypeError:
        return None  # x itself is malformed: fit's checks of x name it
    w = sample_weight_array(sample_weight, n)
    if not w.sum() > 0:
        raise DataError("sample_weight sums to 0: no row would count")
    if (w == w[0]).all():
        return None
    if validation_split is not None:
        raise ConfigError("sample_weight (unequal weights) with validation_split is not supported: pass eval_data")
    return w.astype(np.float32)
