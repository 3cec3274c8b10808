"""Validation of user arrays and the one definition of how inputs are scaled.

Inputs stay in their own dtype (uint8 or float32) until a batch is gathered; then every engine maps
x to `x * scale + shift` with the (scale, shift) of `input_affine`: uint8 is divided by 255, and
`normalize=(mean, std)` subtracts and divides after that.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import ConfigError, DataError

__all__ = ["check_inputs", "check_labels", "check_normalize", "input_affine", "prepare_batch"]


def check_normalize(normalize: Any) -> tuple[float, float] | None:
    """`normalize` as (mean, std) floats, or None; std must be > 0."""
    if normalize is None:
        return None
    try:
        mean, std = (float(v) for v in normalize)
    except (TypeError, ValueError):
        raise ConfigError(f"normalize must be None or (mean, std), got {normalize!r}") from None
    if not (np.isfinite(mean) and np.isfinite(std) and std > 0):
        raise ConfigError(f"normalize must be (finite mean, std > 0), got {normalize!r}")
    # Engines compute x * scale + shift in float32: both must survive the cast, for uint8 and float inputs.
    for dtype in (np.uint8, np.float32):
        scale, shift = input_affine(np.dtype(dtype), (mean, std))
        with np.errstate(over="ignore", under="ignore"):
            scale32, shift32 = np.float32(scale), np.float32(shift)
        if not (np.isfinite(scale32) and np.isfinite(shift32) and scale32 > 0):
            raise ConfigError(
                f"normalize={normalize!r} maps {np.dtype(dtype)} inputs to x * {scale:g} + {shift:g}, which float32 "
                f"(the engines' input type) holds as x * {scale32} + {shift32}: it must stay finite, the scale nonzero"
            )
    return (mean, std)


def input_affine(dtype: np.dtype, normalize: tuple[float, float] | None) -> tuple[float, float]:
    """(scale, shift) such that the network sees `x * scale + shift` for stored x of `dtype`."""
    scale = 1.0 / 255.0 if np.dtype(dtype) == np.uint8 else 1.0
    shift = 0.0
    if normalize is not None:
        mean, std = normalize
        scale, shift = scale / std, -mean / std
    return scale, shift


#: Largest number of rows of x (training, evaluation or prediction) on every engine: the shuffle permutes 32-bit
#: positions and the GPU gather takes u32 positions and an i32 first position.
MAX_ROWS = 2**31 - 1


def check_inputs(x: Any, features: int, name: str = "x") -> np.ndarray:
    """`x` as a C-contiguous (N, features) uint8 or float32 array; raises DataError naming `name`."""
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception:
            raise DataError(f"{name} must be an array of shape (N, {features}), got {type(x).__name__}") from None
    if x.ndim != 2:
        raise DataError(f"{name} must be 2-D (N, {features}), got shape {x.shape}")
    if x.shape[0] == 0:
        raise DataError(f"{name} is empty: shape {x.shape}")
    if x.shape[1] != features:
        raise DataError(f"{name} has {x.shape[1]} features per row but the model takes {features}: shape {x.shape}")
    if x.shape[0] > MAX_ROWS:
        raise DataError(
            f"{name} has {x.shape[0]} rows; fastnn takes at most {MAX_ROWS} (2**31 - 1) rows per array: the shuffle "
            f"and the GPU kernels index rows with 32-bit integers. Split it into several fits"
        )
    if x.dtype == np.uint8:
        return np.ascontiguousarray(x)
    if x.dtype.kind != "f":
        raise DataError(f"{name} must be uint8 or floating point, got dtype {x.dtype}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        row, col = (int(i) for i in np.argwhere(~np.isfinite(x))[0])
        raise DataError(f"{name} must hold finite values, got {float(x[row, col])} in row {row}, column {col}")
    return x


def check_labels(y: Any, n: int, classes: int, name: str = "y") -> np.ndarray:
    """`y` as an int32 (n,) array of values in [0, classes); raises DataError naming `name`."""
    if not isinstance(y, np.ndarray):
        try:
            y = np.asarray(y)
        except Exception:  # ragged nested lists, objects numpy cannot convert
            raise DataError(
                f"{name} must be a 1-D array of {n} integer labels, got a {type(y).__name__} "
                f"that is not a regular array (ragged?)"
            ) from None
    if y.ndim != 1:
        raise DataError(f"{name} must be 1-D (N,), got shape {y.shape}")
    if y.shape[0] != n:
        raise DataError(f"{name} has {y.shape[0]} labels but the inputs have {n} rows")
    if y.dtype.kind not in "iu":
        if y.dtype.kind == "f" and np.isfinite(y).all() and (y == np.round(y)).all():
            raise DataError(f"{name} must have an integer dtype, got {y.dtype} (cast with .astype(int))")
        raise DataError(f"{name} must have an integer dtype, got {y.dtype}")
    if y.size and (y.min() < 0 or y.max() >= classes):
        bad = int(y.min()) if y.min() < 0 else int(y.max())
        raise DataError(f"{name} holds label {bad}, outside [0, {classes}) for a model with {classes} classes")
    return np.ascontiguousarray(y, dtype=np.int32)


def prepare_batch(x: np.ndarray, scale: float, shift: float, dtype: type = np.float32) -> np.ndarray:
    """Rows of stored x mapped to what the network sees (the CPU form of the gather kernel's math)."""
    out = x.astype(dtype) * dtype(scale)
    if shift:
        out += dtype(shift)
    return out
