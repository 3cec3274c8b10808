"""Learning-rate schedules: callables mapping the global step (from 0) to a learning rate.

Any callable `step -> lr` works. The built-ins take `lr=None` to mean "the optimizer's lr". Both
engines evaluate the schedule on the host into a table of per-step rates before a `fit` starts
(`lr_table`); the GPU engine uploads that table, so a schedule never forces a graph re-capture.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ._checks import integer, number
from ._errors import ConfigError
from .engine.base import steps_per_epoch as _steps

__all__ = [
    "Constant", "Cosine", "StepDecay", "Schedule", "constant", "cosine", "lr_table", "step_decay", "steps_per_epoch",
]  # fmt: skip

Schedule = Callable[[int], float]

#: Step counts of the built-ins (step_size, total_steps, warmup_steps) are below this: a trainer counts at most
#: 2**63 - 1 optimizer steps (fastnn._state.MAX_STEP), so a larger count means nothing and would overflow the int64
#: arithmetic of the lr table.
_STEP_LIMIT = 2**63


def steps_per_epoch(rows: int, batch_size: int, drop_last: bool = False) -> int:
    """Optimizer steps in one epoch of `rows` training samples: ceil(rows / batch_size), or rows // batch_size with
    `drop_last`. A schedule counts steps: `Cosine(total_steps=epochs * steps_per_epoch(len(x), batch_size))`.

    Raises:
        ConfigError: rows is not an integer >= 0, batch_size not one >= 1, or drop_last not True or False.
    """
    if not isinstance(drop_last, (bool, np.bool_)):
        raise ConfigError(f"drop_last must be True or False, got {drop_last!r}")
    return _steps(integer("rows", rows, 0), integer("batch_size", batch_size, 1), bool(drop_last))


def _check_lr(lr: object) -> float | None:
    return None if lr is None else number("lr", lr, "None or a finite number >= 0", lambda v: v >= 0)


def _step_count(name: str, value: object, lo: int) -> int:
    """A built-in's step count: an integer in [lo, _STEP_LIMIT), else a ConfigError naming it."""
    return integer(name, value, lo, _STEP_LIMIT, integral_floats=True)


def check_schedule(schedule: object) -> None:
    """Raise ConfigError unless `schedule` is None or callable (step -> lr)."""
    if schedule is not None and not callable(schedule):
        raise ConfigError(f"schedule must be callable (step -> lr), got {schedule!r}")


@dataclass(frozen=True)
class Constant:
    """The same rate at every step."""

    lr: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "lr", _check_lr(self.lr))

    def __call__(self, step: int) -> float:
        return float(self.lr)  # type: ignore[arg-type]


@dataclass(frozen=True)
class StepDecay:
    """Multiply the rate by `gamma` every `step_size` steps."""

    step_size: int
    gamma: float = 0.1
    lr: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "step_size", _step_count("step_size", self.step_size, 1))
        object.__setattr__(self, "gamma", number("gamma", self.gamma, "a finite number > 0", lambda v: v > 0))
        object.__setattr__(self, "lr", _check_lr(self.lr))

    def __call__(self, step: int) -> float:
        lr = float(self.lr)  # type: ignore[arg-type]
        try:
            return lr * self.gamma ** (step // self.step_size)
        except OverflowError:  # gamma > 1 raised past float64: unbounded, which the lr table refuses by step
            return math.inf if lr else 0.0


@dataclass(frozen=True)
class Cosine:
    """Linear warm-up from 0 over `warmup_steps`, then cosine decay to `min_lr` at `total_steps`."""

    total_steps: int
    warmup_steps: int = 0
    min_lr: float = 0.0
    lr: float | None = None

    def __post_init__(self) -> None:
        total = _step_count("total_steps", self.total_steps, 1)
        warmup = _step_count("warmup_steps", self.warmup_steps, 0)
        if warmup >= total:
            raise ConfigError(f"warmup_steps must be an integer in [0, total_steps={total}), got {self.warmup_steps!r}")
        object.__setattr__(self, "total_steps", total)
        object.__setattr__(self, "warmup_steps", warmup)
        object.__setattr__(self, "min_lr", number("min_lr", self.min_lr, "a finite number >= 0", lambda v: v >= 0))
        object.__setattr__(self, "lr", _check_lr(self.lr))

    def __call__(self, step: int) -> float:
        lr = float(self.lr)  # type: ignore[arg-type]
        if step < self.warmup_steps:
            return lr * (step + 1) / (self.warmup_steps + 1)
        t = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.min_lr + 0.5 * (lr - self.min_lr) * (1.0 + math.cos(math.pi * t))


constant = Constant
step_decay = StepDecay
cosine = Cosine


def bind(schedule: Schedule | None, base_lr: float) -> Schedule:
    """The schedule with `lr=None` filled in from the optimizer (a constant one when None)."""
    if schedule is None:
        return Constant(base_lr)
    if isinstance(schedule, (Constant, StepDecay, Cosine)) and schedule.lr is None:
        from dataclasses import replace

        return replace(schedule, lr=base_lr)
    check_schedule(schedule)
    return schedule


def lr_table(schedule: Schedule, first_step: int, steps: int) -> np.ndarray:
    """float32 rates for global steps first_step .. first_step+steps-1; each must be >= 0 and finite as the
    float32 stored (1e300 is finite in Python and inf in the table).

    The table is built before the fit's first step, serially with the GPU: evaluated one step at a time with a
    float32 store each it cost ~1.4 us a step, 7 ms of a 5,000-step fit whose steps take 12-19 us on the grid engine
    (H100). The built-in Constant, StepDecay and Cosine fill it in whole arrays, every value still the float64
    their `__call__` returns; any other callable is called once a step, stored and checked in one pass."""
    return _checked_table(_rates(schedule, first_step, steps), first_step, schedule)


def _rates(schedule: Schedule, first_step: int, steps: int) -> np.ndarray:
    """float64 schedule(first_step + i) for i < steps, equal to calling it step by step."""
    if type(schedule) is Constant and schedule.lr is not None:
        return np.full(steps, float(schedule.lr), dtype=np.float64)  # type: ignore[arg-type]
    if type(schedule) is StepDecay and schedule.lr is not None and steps:
        size = schedule.step_size
        first, last = first_step // size, (first_step + steps - 1) // size  # Python ints: no int64 overflow
        if last - first < steps // 8:  # few periods: each rate computed once, by __call__
            each = np.asarray([schedule(k * size) for k in range(first, last + 1)], dtype=np.float64)
            starts = np.asarray([k * size - first_step for k in range(first + 1, last + 1)], dtype=np.int64)
            return each[np.searchsorted(starts, np.arange(steps, dtype=np.int64), side="right")]
    if type(schedule) is Cosine and schedule.lr is not None:
        return _cosine_rates(schedule, first_step, steps)
    values = np.empty(steps, dtype=np.float64)
    i = 0
    try:
        for i in range(steps):
            values[i] = float(schedule(first_step + i))
    except Exception as exc:  # a user's callable: report which step broke it (or an earlier bad rate)
        _checked_table(values[:i], first_step)
        raise ConfigError(f"schedule({first_step + i}) raised {exc!r}") from exc
    return values


def _cosine_rates(schedule: Cosine, first_step: int, steps: int) -> np.ndarray:
    """Cosine's rates as `__call__` computes them, operation for operation: every step and total_steps below
    2**53 is exact in float64, so NumPy's arithmetic rounds as Python's does; the cosine itself is math.cos
    (NumPy's SIMD one may differ in the last bit); from total_steps on the rate is constant."""
    lr, w, total, low = float(schedule.lr), schedule.warmup_steps, schedule.total_steps, schedule.min_lr  # type: ignore[arg-type]
    end = first_step + steps
    a, b = min(max(first_step, w), end), min(max(first_step, total), end)  # [first, a) warm-up, [a, b) decay
    if total >= 2**53 or b >= 2**53:  # beyond float64's integers: step by step
        return np.array([schedule(s) for s in range(first_step, b)] + [schedule(total)] * (end - b), dtype=np.float64)
    warm = lr * np.arange(first_step + 1, a + 1, dtype=np.float64) / (w + 1)
    t = np.minimum(1.0, (np.arange(a, b, dtype=np.float64) - w) / max(1, total - w))
    cos = np.fromiter(map(math.cos, (math.pi * t).tolist()), dtype=np.float64, count=b - a)
    decay = low + 0.5 * (lr - low) * (1.0 + cos)  # left to right, as in __call__
    return np.concatenate([warm, decay, np.full(end - b, schedule(total))])


def _checked_table(values: np.ndarray, first_step: int, schedule: Schedule | None = None) -> np.ndarray:
    """The float32 table of `values` (rates from step `first_step`); ConfigError naming the first step whose rate is
    negative, NaN or not finite in float32 (and a built-in `schedule`'s arguments)."""
    with np.errstate(over="ignore"):
        table = values.astype(np.float32)
    bad = ~(np.isfinite(table) & (values >= 0))
    if bad.any():
        i = int(np.argmax(bad))
        built_in = f" by {schedule!r}" if isinstance(schedule, (Constant, StepDecay, Cosine)) else ""
        raise ConfigError(
            f"schedule({first_step + i}) returned lr={float(values[i])!r}{built_in}; it must be >= 0 and finite in "
            f"float32 (the lr table)"
        )
    return table
