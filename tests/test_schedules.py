"""lr_table: the whole-array paths give the very rates the schedule gives step by step, and refuse the same steps."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastnn import ConfigError
from fastnn.schedules import Constant, Cosine, StepDecay, _rates, lr_table


def step_by_step(schedule, first_step: int, steps: int) -> np.ndarray:
    """The definition: each step's float(schedule(step)) stored as float32."""
    return np.array([float(schedule(first_step + i)) for i in range(steps)], dtype=np.float64).astype(np.float32)


class Subclassed(Constant):
    def __call__(self, step: int) -> float:  # a subclass is called, never filled as its base would be
        return 0.5 * step


@pytest.mark.parametrize(
    "schedule",
    [
        Constant(0.003),
        Constant(0.1 + 0.2),  # a float64 whose float32 rounding is visible
        StepDecay(step_size=7, gamma=0.3, lr=0.1),
        StepDecay(step_size=1000, gamma=0.5, lr=1.0),
        StepDecay(step_size=1, gamma=0.999, lr=0.1),  # a period a step: called step by step
        StepDecay(step_size=3, gamma=1e-9, lr=1e-3),  # underflows to 0 in float32: allowed (>= 0)
        Cosine(total_steps=500, warmup_steps=40, min_lr=1e-4, lr=0.01),
        Cosine(total_steps=3000, lr=0.1),  # no warm-up
        Cosine(total_steps=10**6, warmup_steps=130_000, min_lr=1e-5, lr=3e-4),  # ranges inside warm-up and decay
        Subclassed(1.0),
        lambda step: 1e-3 / math.sqrt(1 + step),
    ],
    ids=["constant", "constant-rounded", "stepdecay-7", "stepdecay-1000", "stepdecay-1", "stepdecay-underflow",
         "cosine", "cosine-nowarmup", "cosine-long", "subclass", "callable"],  # fmt: skip
)
@pytest.mark.parametrize("first_step,steps", [(0, 1), (0, 2500), (6, 999), (123_457, 3000), (2**40, 64), (5, 0)])
def test_table_equals_the_step_by_step_rates(schedule, first_step: int, steps: int) -> None:
    got = lr_table(schedule, first_step, steps)
    want = step_by_step(schedule, first_step, steps)
    assert got.dtype == np.float32 and got.shape == (steps,)
    assert got.tobytes() == want.tobytes()


@pytest.mark.parametrize(
    "schedule",
    [
        Constant(0.1 + 0.2),
        StepDecay(step_size=7, gamma=0.3, lr=0.1),
        Cosine(total_steps=500, warmup_steps=40, min_lr=1e-4, lr=0.01),
        Cosine(total_steps=10**6, warmup_steps=130_000, min_lr=1e-5, lr=3e-4),
    ],
)
@pytest.mark.parametrize("first_step,steps", [(0, 2500), (123_457, 3000), (2**53 - 10, 20)])
def test_builtin_rates_are_their_call_in_float64(schedule, first_step: int, steps: int) -> None:
    """Before the float32 store too: the whole-array paths do __call__'s operations in its order."""
    want = np.array([float(schedule(first_step + i)) for i in range(steps)], dtype=np.float64)
    assert _rates(schedule, first_step, steps).tobytes() == want.tobytes()


def test_cosine_past_float64_integers_is_still_its_call() -> None:
    """total_steps - warmup_steps = 2**53 + 1 rounds to 2**53 in float64: step 2**52's t would be 0.5 exactly,
    where __call__'s is the double below it, and cos(pi * t) near 0 makes 1 + cos differ in the last bit."""
    schedule = Cosine(total_steps=2**53 + 1, lr=0.1)
    want = np.array([float(schedule(2**52 + i)) for i in range(4)], dtype=np.float64)
    assert _rates(schedule, 2**52, 4).tobytes() == want.tobytes()


def test_stepdecay_overflowing_float32_names_the_first_such_step() -> None:
    schedule = StepDecay(step_size=10, gamma=1e10, lr=1.0)  # 1e40 in period 4: inf in float32
    with pytest.raises(ConfigError, match=r"schedule\(40\) returned lr=1e\+40 by StepDecay\(step_size=10, .*float32"):
        lr_table(schedule, 3, 200)


@pytest.mark.parametrize(
    "schedule,first_step,words",
    [
        (lambda s: 0.1 if s < 5 else 1e300, 0, "schedule(5) returned lr=1e+300"),
        (lambda s: -0.1 if s == 9 else 0.1, 2, "schedule(9) returned lr=-0.1"),
        (lambda s: float("nan") if s >= 3 else 0.1, 0, "schedule(3) returned lr=nan"),
        (lambda s: 0.1 if s != 7 else 1 / 0, 0, "schedule(7) raised ZeroDivisionError"),
        (lambda s: -1.0 if s == 4 else (0.1 if s < 6 else 1 / 0), 0, "schedule(4) returned lr=-1.0"),  # first wins
        (lambda s: "fast", 11, "schedule(11) raised ValueError"),
        (Constant(), 0, "schedule(0) raised TypeError"),  # unbound: no optimizer lr filled in
    ],
)
def test_the_first_bad_step_is_named(schedule, first_step: int, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        lr_table(schedule, first_step, 20)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "make,name",
    [
        (lambda: StepDecay(step_size=2**63, lr=0.1), "step_size"),  # raw OverflowError in the table before
        (lambda: Cosine(total_steps=10**400, warmup_steps=10**399, lr=0.1), "total_steps"),
        (lambda: Cosine(total_steps=2**63 + 5, warmup_steps=2**63, lr=0.1), "total_steps"),
    ],
)
def test_step_counts_beyond_a_trainers_steps_are_refused_by_name(make, name: str) -> None:
    """A trainer counts at most 2**63 - 1 steps: a longer step count is refused by its constructor, naming it,
    instead of a raw OverflowError from the lr table at fit time."""
    with pytest.raises(ConfigError, match=rf"^{name} must be an integer in \[\d, 9223372036854775808\), got"):
        make()


@pytest.mark.parametrize("first_step", [0, 2**63 - 40])
def test_stepdecay_at_the_largest_step_size_is_its_call(first_step: int) -> None:
    schedule = StepDecay(step_size=2**63 - 1, gamma=0.5, lr=0.1)
    assert lr_table(schedule, first_step, 39).tobytes() == step_by_step(schedule, first_step, 39).tobytes()


def test_stepdecay_whose_powers_leave_float64_names_the_step_and_the_schedule() -> None:
    """gamma**k past float64 raised OverflowError from inside the table (few periods: each one called once)."""
    schedule = StepDecay(step_size=100, gamma=1e300, lr=0.1)
    assert schedule(199) == 0.1 * 1e300 and schedule(200) == math.inf  # unbounded, not an exception
    words = r"schedule\(100\) returned lr=1e\+299 by StepDecay\(step_size=100, gamma=1e\+300, lr=0.1\); it must be"
    with pytest.raises(ConfigError, match=words):
        lr_table(schedule, 0, 400)
    assert StepDecay(step_size=1, gamma=1e300, lr=0.0)(5) == 0.0  # a zero rate stays zero
