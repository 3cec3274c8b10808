"""The data a trainer is given, checked for its model, loss and precision: inputs, targets, an eval pair, and the
validation split's rows. `Trainer.fit`, `evaluate` and `predict` all check through these, so every entry point
refuses the same data with the same words."""

from __future__ import annotations

import reprlib
from typing import Any

import numpy as np

from ._control import split_indices
from ._data import check_inputs, check_labels, check_operand_range, check_targets
from ._errors import DataError
from ._gpu_arrays import CudaArray
from .engine.base import EngineConfig
from .engine.plan import precision_spec

__all__ = ["eval_pair", "held_out", "inputs", "targets"]


def inputs(config: EngineConfig, x: Any, name: str, gpu: bool) -> np.ndarray | CudaArray:
    """`x` checked for this model; arrays in GPU memory are used in place only by the GPU engines (`gpu`)."""
    x = check_inputs(x, config.model.in_features, name, gpu=gpu)
    if isinstance(x, np.ndarray):
        # On the CPU too: the NumPy engine computes in float32 whatever the precision, but the same call must
        # give the same answer on every device, and precision "mixed"/"fp16" says float16 operands (as the
        # state checks of fastnn._state hold the weights to float16's range on the CPU as well).
        operand = precision_spec(config.precision).operand
        check_operand_range(x, config.normalize, operand, name, f"precision={config.precision!r}")
    return x


def targets(config: EngineConfig, y: Any, n: int, name: str, gpu: bool) -> np.ndarray:
    """`y` checked for this model and loss: int32 labels (N,), or float32 regression targets (N, k); in GPU
    memory they are copied over on a GPU trainer (`gpu`) and refused on a CPU one."""
    if config.loss == "mse":
        return check_targets(y, n, config.model.classes, name, gpu=gpu)
    return check_labels(y, n, config.model.classes, name, gpu=gpu)


def eval_pair(config: EngineConfig, eval_data: Any, gpu: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """`fit`'s eval_data, (x_eval, y_eval), each checked as `inputs` and `targets` check them; None stays None."""
    if eval_data is None:
        return None
    if not isinstance(eval_data, (tuple, list)) or len(eval_data) != 2:
        if isinstance(eval_data, (tuple, list)):
            got = f"a {type(eval_data).__name__} of {len(eval_data)} items"
        else:
            got = reprlib.repr(eval_data)
        raise DataError(f"eval_data must be a pair (x_eval, y_eval), got {got}")
    ex = inputs(config, eval_data[0], "eval_data[0]", gpu)
    return ex, targets(config, eval_data[1], ex.shape[0], "eval_data[1]", gpu)


def held_out(
    config: EngineConfig, x: np.ndarray, y: np.ndarray, fraction: float
) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """(x_train, y_train, (x_val, y_val)) of `split_indices` (keyed by the trainer's seed), taken from x as it is now
    on every call.

    Not cached: a cache keyed by x's identity trained on stale rows after `x[:] = ...`, and a digest of x's
    bytes costs more than the split itself (sha256 ~1.5 GB/s against a ~5 GB/s gather). The split's arrays are
    new objects, so the GPU engines load the new training part into the buffers they hold (same shape: no new
    graph), at bus speed. (An x given whole is known to the GPU engines by its identity: changed in place
    between fits, it is not uploaded again, as the data guide says.)"""
    train, val = split_indices(x.shape[0], fraction, config.seed)
    return x[train], y[train], (x[val], y[val])
