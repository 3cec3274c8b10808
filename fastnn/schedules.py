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

from .errors import ConfigError

__all__ = ["Constant", "Cosine", "StepDecay", "Schedule", "constant", "cosine", "lr_table", "step_decay"]

Schedule = Callable[[int], float]


@dataclass(frozen=True)
class Constant:
    """The same rate at every step."""

    lr: float | None = None

    def __call__(self, step: int) -> float:
        return float(self.lr)  # type: ignore[arg-type]


@dataclass(frozen=True)
class StepDecay:
    """Multiply the rate by `gamma` every `step_size` steps."""

    step_size: int
    gamma: float = 0.1
    lr: float | None = None

    def __post_init__(self) -> None:
        if int(self.step_size) != self.step_size or self.step_size < 1:
            raise ConfigError(f"step_size must be an integer >= 1, got {self.step_size!r}")
        if not (math.isfinite(self.gamma) and self.gamma > 0):
            raise ConfigError(f"gamma must be a finite number > 0, got {self.gamma!r}")

    def __call__(self, step: int) -> float:
        return float(self.lr) * self.gamma ** (step // self.step_size)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Cosine:
    """Linear warm-up from 0 over `warmup_steps`, then cosine decay to `min_lr` at `total_steps`."""

    total_steps: int
    warmup_steps: int = 0
    min_lr: float = 0.0
    lr: float | None = None

    def __post_init__(self) -> None:
        if int(self.total_steps) != self.total_steps or self.total_steps < 1:
            raise ConfigError(f"total_steps must be an integer >= 1, got {self.total_steps!r}")
        if int(self.warmup_steps) != self.warmup_steps or not 0 <= self.warmup_steps < self.total_steps:
            raise ConfigError(f"warmup_steps must be an integer in [0, total_steps), got {self.warmup_steps!r}")
        if not (math.isfinite(self.min_lr) and self.min_lr >= 0):
            raise ConfigError(f"min_lr must be a finite number >= 0, got {self.min_lr!r}")

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
    if not callable(schedule):
        raise ConfigError(f"schedule must be callable (step -> lr), got {schedule!r}")
    return schedule


def lr_table(schedule: Schedule, first_step: int, steps: int) -> np.ndarray:
    """float32 rates for global steps first_step .. first_step+steps-1; each must be finite and >= 0."""
    table = np.empty(steps, dtype=np.float32)
    for i in range(steps):
        try:
            lr = float(schedule(first_step + i))
        except Exception as exc:  # a user's callable: report which step broke it
            raise ConfigError(f"schedule({first_step + i}) raised {exc!r}") from exc
        if not math.isfinite(lr) or lr < 0:
            raise ConfigError(f"schedule({first_step + i}) returned lr={lr!r}; it must be finite and >= 0")
        table[i] = lr
    return table
