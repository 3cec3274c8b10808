"""The one definition of a training state fastnn trusts: what an epoch may end with (else it diverged),
what `Trainer.save` may write, and what `Trainer.load` and `load_state_dict` accept.

Values are checked after conversion to the type that holds them, never before: parameters and optimizer
state are float32 (1e39 is finite in float64 and inf in float32), and with precision "fp16" (weights stored
in float16) or "mixed" (a float16 copy of the float32 weights feeds the GEMMs) the parameters must also be
finite in float16 (|w| <= 65504). AdamW's second moment must be >= 0. The counters are bounded by what
the engines count in: the GPU's epoch counter and the shuffle's epoch key are 32-bit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ._errors import DataError

__all__ = ["FP16_MAX", "MAX_EPOCH", "MAX_STEP", "check_counters", "checked_state", "state_problem"]

FP16_MAX = 65504.0  #: the largest finite float16
#: A trainer counts at most this many epochs: epoch indices are < 2**32 (native/common.cuh's EpochState.epoch
#: is a u32, and the shuffle is keyed by the epoch's low 32 bits), so the counter of epochs done is <= 2**32.
MAX_EPOCH = 2**32
MAX_STEP = 2**63 - 1  #: optimizer steps: EpochState.step0 is a u64; int64 keeps it exact on the host too

_HALF_WHY = {
    "fp16": "precision='fp16' stores the weights in float16",
    "mixed": "precision='mixed' feeds the GEMMs a float16 copy of the weights",
}


def _at(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


def array_problem(name: str, value: np.ndarray, precision: str) -> str | None:
    """Why state entry `name` (parameter "0.weight" or optimizer state "opt.<s>.<param>") holding `value`
    (any real dtype) cannot be trusted under `precision`, or None."""
    with np.errstate(over="ignore", invalid="ignore"):
        f32 = value.astype(np.float32, copy=False)
        bad = ~np.isfinite(f32)
        if bad.any():
            i = _at(bad)
            return f"holds {value[i].item()!r} at {i}, which is not a finite float32"
        if precision in _HALF_WHY and not name.startswith("opt."):
            bad = ~np.isfinite(f32.astype(np.float16))
            if bad.any():
                i = _at(bad)
                return (
                    f"holds {value[i].item()!r} at {i}, beyond float16's range ({FP16_MAX:g}): "
                    f"{_HALF_WHY[precision]} (precision='fp32' takes it)"
                )
        if name.startswith("opt.exp_avg_sq."):
            bad = f32 < 0
            if bad.any():
                i = _at(bad)
                return f"holds {value[i].item()!r} at {i}: AdamW's second moment (exp_avg_sq) must be >= 0"
    return None


def state_problem(state: Mapping[str, np.ndarray], precision: str) -> str | None:
    """The first entry of an engine's state (parameters and optimizer state) that is not trusted, as
    "'name' holds ...", or None: an epoch that leaves such a state has diverged."""
    for name, value in state.items():
        problem = array_problem(name, value, precision)
        if problem is not None:
            return f"{name!r} {problem}"
    return None


def checked_state(
    arrays: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], precision: str, what: str
) -> dict[str, np.ndarray]:
    """float32 copies of `arrays`, which must hold exactly the names of `shapes`, each of its shape and trusted.

    Raises:
        DataError: naming `what`, the entry and the problem.
    """
    if not isinstance(arrays, Mapping):
        raise DataError(f"{what} must be a mapping of names to arrays, got {type(arrays).__name__}")
    missing = [n for n in shapes if n not in arrays]
    unexpected = [n for n in arrays if n not in shapes]
    if missing or unexpected:
        raise DataError(f"{what} does not match the model: missing {missing}, unexpected {unexpected}")
    out = {}
    for name, shape in shapes.items():
        value = arrays[name]
        if hasattr(value, "detach"):  # a torch tensor, possibly on a GPU
            value = value.detach().cpu().numpy()
        arr = np.asarray(value)
        if arr.shape != shape:
            raise DataError(f"{what}[{name!r}] has shape {arr.shape}, the model needs {shape}")
        if arr.dtype.kind not in "fiu":
            raise DataError(f"{what}[{name!r}] must hold finite numbers, got dtype {arr.dtype}")
        problem = array_problem(name, arr, precision)
        if problem is not None:
            raise DataError(f"{what}[{name!r}] {problem}")
        out[name] = arr.astype(np.float32)
    return out


def check_counters(epoch: Any, step: Any) -> tuple[int, int]:
    """(epoch, step) as ints in [0, MAX_EPOCH] and [0, MAX_STEP]; raises ValueError naming the bad one."""
    out = []
    for name, value, hi in (("epoch", epoch, MAX_EPOCH), ("step", step, MAX_STEP)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= hi:
            raise ValueError(f"{name} must be an integer in [0, {hi}], got {value!r}")
        out.append(int(value))
    return out[0], out[1]
