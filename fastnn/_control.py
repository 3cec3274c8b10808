"""Training control for `Trainer.fit`: the seeded validation split, early stopping and epoch callbacks.

All of it runs once per epoch on the host, in the trainer's commit of that epoch's record (the engines
still train whole epochs: no per-step host work). Epochs are numbered from 1 here as everywhere a person
reads them: record["epoch"] == n is the n-th epoch the trainer ever trained, after which trainer.epoch == n.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np

from ._checks import integer, number
from ._errors import ConfigError, DataError, StopTraining

__all__ = [
    "MONITORS",
    "SPLIT_STREAM",
    "Callback",
    "EarlyStopping",
    "StopTraining",
    "check_callbacks",
    "check_early_stopping",
    "check_validation_split",
    "run_callbacks",
    "split_indices",
]

#: What early stopping can watch, and whether smaller is better.
MONITORS = {"eval_loss": True, "eval_accuracy": False}
#: The SeedSequence spawn key of the validation split's stream: PCG64(SeedSequence(seed, spawn_key=(SPLIT_STREAM,)))
#: is independent of the initial weights' PCG64(seed) and of every epoch's shuffle (fastnn/_shuffle.py).
SPLIT_STREAM = 0x5B17

#: A callback receives each epoch's record (a dict copy of the History record) once it is recorded.
Callback = Callable[[dict[str, Any]], Any]


@dataclass
class EarlyStopping:
    """Stop `fit` when `monitor` has not improved by more than `min_delta` for `patience` evaluations in a row.

    Improvement is measured on evaluated epochs only (with `eval_every=k`, patience counts evaluations, not
    epochs); a NaN or infinite value is never an improvement and counts against patience. With `restore_best`,
    the trainer ends `fit` at the end of the best epoch: weights, optimizer state, `trainer.epoch`/`step` and
    the history all go back there, so continuing equals a run that stopped there; the records of the epochs
    trained after it are kept in `discarded`. A fit that raises (Ctrl-C, an error in a callback,
    TrainingDiverged) is not rewound: it ends as such a fit always does.

    Args:
        patience: evaluations without improvement before stopping, an integer >= 1.
        min_delta: how much `monitor` must improve to count, a finite number >= 0.
        monitor: "eval_loss" (lower is better) or "eval_accuracy" (higher is better).
        restore_best: go back to the best epoch when `fit` ends (the state is copied to host memory each time
            `monitor` improves: ~12 bytes per parameter with AdamW, 8 with SGD momentum, 4 without).
    """

    patience: int = 5
    min_delta: float = 0.0
    monitor: str = "eval_loss"
    restore_best: bool = True
    #: After `fit`: the number of the best epoch of that call (None if no evaluation gave a finite value).
    best_epoch: int | None = field(default=None, init=False)
    #: After `fit`: the best value of `monitor`.
    best: float | None = field(default=None, init=False)
    #: After `fit`: the number of the epoch after which early stopping stopped training, or None.
    stopped_epoch: int | None = field(default=None, init=False)
    #: After `fit` with restore_best: the records of the epochs trained after the best one and undone.
    discarded: list[dict[str, Any]] = field(default_factory=list, init=False, repr=False)
    _waited: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        patience = integer("EarlyStopping patience", self.patience, 1)
        min_delta = number("EarlyStopping min_delta", self.min_delta, "a finite number >= 0", lambda v: v >= 0)
        if not isinstance(self.monitor, str) or self.monitor not in MONITORS:
            raise ConfigError(f"EarlyStopping monitor must be one of {tuple(MONITORS)}, got {self.monitor!r}")
        if not isinstance(self.restore_best, (bool, np.bool_)):
            raise ConfigError(f"EarlyStopping restore_best must be True or False, got {self.restore_best!r}")
        self.patience, self.min_delta, self.restore_best = patience, min_delta, bool(self.restore_best)

    def reset(self) -> None:
        """Forget the previous `fit` call: every call judges its own epochs."""
        self.best_epoch = self.best = self.stopped_epoch = None
        self.discarded = []
        self._waited = 0

    def summary(self, rewound: bool) -> str | None:
        """How the last `fit` ended, for the progress display; None when early stopping changed nothing."""
        if self.stopped_epoch is None and not rewound:
            return None
        how = f"stopped after epoch {self.stopped_epoch}" if self.stopped_epoch is not None else "all epochs trained"
        if self.best is None:
            return f"early stopping: {how}; no finite {self.monitor} was seen"
        back = f", back at the end of epoch {self.best_epoch}" if rewound else ""
        return f"early stopping: {how}; best {self.monitor} {self.best:.4f} after epoch {self.best_epoch}{back}"

    def update(self, record: dict[str, Any]) -> tuple[bool, bool]:
        """(improved, stop) after epoch `record`; epochs without eval numbers change nothing."""
        value = record[self.monitor]
        if value is None:
            return False, False
        # A NaN (or infinite) evaluation is never an improvement: it counts against patience like a worse one,
        # so restore_best never rewinds to it. NaN compares False both ways, hence the explicit test.
        value = float(value)
        gain = None if self.best is None else (self.best - value if MONITORS[self.monitor] else value - self.best)
        if math.isfinite(value) and (gain is None or gain > self.min_delta):
            self.best, self.best_epoch, self._waited = value, int(record["epoch"]), 0
            return True, False
        self._waited += 1
        if self._waited >= self.patience:
            self.stopped_epoch = int(record["epoch"])
            return False, True
        return False, False


def check_early_stopping(value: Any) -> EarlyStopping | None:
    """`fit`'s early_stopping: None/False (off), True (defaults), an int (the patience) or an EarlyStopping."""
    if value is None or value is False or (isinstance(value, np.bool_) and not value):
        return None
    if value is True or isinstance(value, np.bool_):
        return EarlyStopping()
    if isinstance(value, (int, np.integer)):
        if value < 1:
            raise ConfigError(f"early_stopping as a patience must be an integer >= 1, got {value!r}")
        return EarlyStopping(patience=int(value))
    if isinstance(value, EarlyStopping):
        return value
    raise ConfigError(
        f"early_stopping must be None, True, a patience (int >= 1) or a fastnn.EarlyStopping, got {reprlib.repr(value)}"
    )


def check_callbacks(callbacks: Any) -> list[Callback]:
    """`fit`'s callbacks: None or a list/tuple of callables, each taking one record."""
    if callbacks is None:
        return []
    if not isinstance(callbacks, (list, tuple)):
        raise ConfigError(f"callbacks must be a list of callables, got {reprlib.repr(callbacks)}")
    for i, cb in enumerate(callbacks):
        if isinstance(cb, EarlyStopping):
            raise ConfigError(f"callbacks[{i}] is an EarlyStopping: pass it as early_stopping= instead")
        if not callable(cb):
            raise ConfigError(f"callbacks[{i}] must be callable (record -> None or True to stop), got {cb!r}")
    return list(callbacks)


def check_validation_split(value: Any) -> float | None:
    """`fit`'s validation_split: None or a fraction in (0, 1)."""
    if value is None:
        return None
    fraction = number("validation_split", value, "a fraction in (0, 1) or None", lambda v: 0.0 < v < 1.0)
    # As written: np.float32(0.2) is 0.2, not 0.20000000298 (which would hold out 3 rows of 10).
    return float(str(value)) if isinstance(value, np.floating) else fraction


def split_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) row indices of a set of n rows, each ascending: ceil(n * fraction) rows held out.

    The one definition of the split: the first ceil(n * fraction) entries of a permutation of range(n) drawn
    from NumPy's PCG64(SeedSequence(seed, spawn_key=(SPLIT_STREAM,))), so the same seed and n give the same
    split on every engine and every call.

    Raises:
        DataError: either part would be empty.
    """
    n_val = math.ceil(Decimal(repr(fraction)) * n)  # as written: 0.07 of 100 rows is 7, not ceil(7.000000000000001)
    if n_val < 1 or n - n_val < 1:
        raise DataError(
            f"validation_split={fraction} of x's {n} rows leaves {n - n_val} for training and {n_val} for "
            f"validation: both need at least one"
        )
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(SPLIT_STREAM,))))
    order = rng.permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def run_callbacks(callbacks: Sequence[Callback], record: dict[str, Any]) -> bool:
    """Call every callback with a copy of `record`; True when one returned True or raised StopTraining.

    Every callback sees the epoch even when an earlier one asked to stop (a logger still logs the last epoch).
    """
    stop = False
    for cb in callbacks:
        try:
            result = cb(dict(record))
        except StopTraining:
            stop = True
            continue
        if result is True or (isinstance(result, np.bool_) and bool(result)):
            stop = True
    return stop
