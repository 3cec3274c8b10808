"""`MultiTrainer`'s per-model arguments: each a scalar (every model the same) or a length-K sequence, checked by
name before any work, and turned into K ordinary optimizers (the same classes, so their checks and update rules
are the one definition) and K init seeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._checks import integer, shown
from ._errors import ConfigError, DataError
from ._optim import Optimizer

__all__ = ["MAX_MODELS", "check_masks", "model_count", "per_model_optimizers", "per_model_seeds"]

#: The most models one MultiTrainer trains: far above what fits one GPU at once, and a bound on the tables built.
MAX_MODELS = 2**20


def _is_sequence(name: str, value: Any) -> bool:
    """Whether `value` is a per-model sequence rather than one value for every model. `betas` is a pair for every
    model, so for it a sequence of pairs is the per-model form."""
    if isinstance(value, (str, bytes, Mapping)):
        return False
    if name == "betas":
        try:
            return len(value) > 0 and all(not isinstance(v, (str, bytes)) and np.ndim(v) == 1 for v in value)
        except TypeError:
            return False
    if isinstance(value, np.ndarray):
        return value.ndim >= 1
    return isinstance(value, Sequence)


def model_count(models: Any, per_model: Mapping[str, Any]) -> int:
    """K: `models`, else the length of the per-model sequences, which must all agree with it.

    Raises:
        ConfigError: `models` is not an integer in [1, MAX_MODELS], or a sequence's length differs from K (the
            message names the argument), or K is given nowhere.
    """
    if models is not None:
        count = integer("models", models, 1, MAX_MODELS + 1)
        source = f"models={count}"
    else:
        count, source = None, ""
    for name, value in per_model.items():
        if value is None or not _is_sequence(name, value):
            continue
        n = len(value)
        if count is None:
            if n < 1:
                raise ConfigError(f"{name} must be a number or a non-empty sequence (one value per model), got []")
            if n > MAX_MODELS:
                raise ConfigError(f"{name} has {n:,} values: at most {MAX_MODELS:,} models are supported")
            count, source = n, f"{name} has {n} values"
        elif n != count:
            raise ConfigError(f"{name} must have one value per model: {source}, but {name} has {n}")
    if count is None:
        raise ConfigError("the number of models is not given: pass models=K or a length-K sequence (lr, seeds, ...)")
    return count


def _values(name: str, value: Any, count: int) -> list[Any]:
    """`value` for each of `count` models."""
    if _is_sequence(name, value):
        return [v.item() if isinstance(v, np.generic) else v for v in value]
    return [value] * count


def per_model_optimizers(optimizer: Optimizer, count: int, hparams: Mapping[str, Any]) -> list[Optimizer]:
    """K copies of `optimizer` with each model's hyperparameters (None keeps the optimizer's value), each checked by
    the optimizer's own rules; an error names the argument and the model ("lr[3]").

    Raises:
        ConfigError: a hyperparameter the optimizer does not have, or a value it refuses.
    """
    fields = {f.name for f in dataclasses.fields(optimizer)}
    for name in hparams:
        if name not in fields:
            raise ConfigError(
                f"{type(optimizer).__name__} has no hyperparameter {name!r}: per-model values can be given for "
                f"{sorted(fields)}"
            )
    given = {n: _values(n, v, count) for n, v in hparams.items() if v is not None}
    if not given:
        return [optimizer] * count
    out: list[Optimizer] = []
    for k in range(count):
        changes = {n: vs[k] for n, vs in given.items()}
        try:
            out.append(dataclasses.replace(optimizer, **changes))
        except ConfigError as exc:
            per = [n for n in changes if _is_sequence(n, hparams[n])]
            where = ", ".join(f"{n}[{k}]={shown(changes[n])}" for n in per) or "the values given"
            raise ConfigError(f"model {k} ({where}): {exc}") from None
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"model {k}: {exc}") from None
    return out


def per_model_seeds(seeds: Any, count: int) -> list[int]:
    """Each model's init seed: `seeds` (an int s gives s, s+1, ...; None is 0) or a length-K sequence of ints.

    Raises:
        ConfigError: a seed outside [0, 2**64), or s + K - 1 beyond it.
    """
    if seeds is None:
        seeds = 0
    if _is_sequence("seeds", seeds):
        return [integer(f"seeds[{k}]", s, 0, 2**64) for k, s in enumerate(seeds)]
    first = integer("seeds", seeds, 0, 2**64 - count + 1)
    return [first + k for k in range(count)]


def check_masks(masks: Any, count: int, n: int, name: str = "masks") -> np.ndarray | None:
    """`masks` as a C-contiguous bool (K, N) array (row k: the rows model k trains on), or None.

    Raises:
        DataError: not boolean, not of shape (K, N), or a model with no row (the message names the model).
    """
    if masks is None:
        return None
    arr = np.asarray(masks) if not isinstance(masks, np.ndarray) else masks
    if arr.dtype != np.bool_:
        raise DataError(f"{name} must be a boolean array of shape (models, rows) = ({count}, {n}), got dtype "
                        f"{arr.dtype}")  # fmt: skip
    if arr.shape != (count, n):
        raise DataError(f"{name} must have shape (models, rows) = ({count}, {n}), got {arr.shape}")
    empty = np.flatnonzero(~arr.any(axis=1))
    if empty.size:
        raise DataError(f"{name}[{int(empty[0])}] selects no row: model {int(empty[0])} would have nothing to train on")
    return np.ascontiguousarray(arr)
