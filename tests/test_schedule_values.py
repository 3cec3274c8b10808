"""Every built-in schedule against values worked out by hand from its documented rule, never by calling it: a change
to a schedule's formula fails here even when its `__call__` and its whole-array `lr_table` change together (the
tests of test_schedules.py compare those two with each other)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastnn.schedules import Constant, Cosine, StepDecay, bind, lr_table

R2 = math.sqrt(0.5)  # cos(pi / 4)

#: (schedule, {step: rate}) with each rate from the docstrings' rules, by hand:
#: StepDecay: lr * gamma ** (step // step_size). Cosine: during warm-up lr * (step + 1) / (warmup + 1); then with
#: t = (step - warmup) / (total - warmup), min_lr + (lr - min_lr) * (1 + cos(pi * t)) / 2, and min_lr from total on.
KNOWN = [
    (Constant(0.25), {0: 0.25, 1: 0.25, 999: 0.25, 2**40: 0.25}),
    (StepDecay(step_size=3, gamma=0.5, lr=0.8), {0: 0.8, 2: 0.8, 3: 0.4, 5: 0.4, 6: 0.2, 30: 0.8 / 1024}),
    (StepDecay(step_size=1, gamma=0.1, lr=2.0), {0: 2.0, 1: 0.2, 2: 0.02}),
    # total 11, warm-up 3: warm-up 1/4, 2/4, 3/4 of lr; the peak, lr, at step 3; then 8 steps of decay to min_lr.
    (
        Cosine(total_steps=11, warmup_steps=3, min_lr=0.2, lr=1.0),
        {0: 0.25, 1: 0.5, 2: 0.75, 3: 1.0, 5: 0.2 + 0.4 * (1 + R2), 7: 0.6, 9: 0.2 + 0.4 * (1 - R2), 11: 0.2,
         12: 0.2, 10**6: 0.2},
    ),  # fmt: skip
    # no warm-up: the peak at step 0, then from lr down to 0 over 4 steps
    (Cosine(total_steps=4, lr=2.0), {0: 2.0, 1: 1 + R2, 2: 1.0, 3: 1 - R2, 4: 0.0, 9: 0.0}),
    # one warm-up step: half the rate, then the peak
    (Cosine(total_steps=3, warmup_steps=1, lr=0.6, min_lr=0.1), {0: 0.3, 1: 0.6, 2: 0.35, 3: 0.1}),
]
IDS = ["constant", "stepdecay", "stepdecay-every-step", "cosine-warmup", "cosine", "cosine-one-warmup-step"]


@pytest.mark.parametrize("schedule,known", KNOWN, ids=IDS)
def test_each_rate_is_the_rule_worked_by_hand(schedule, known: dict[int, float]) -> None:
    for step, rate in known.items():
        assert schedule(step) == pytest.approx(rate, rel=1e-12, abs=1e-15), step


@pytest.mark.parametrize("schedule,known", KNOWN, ids=IDS)
def test_the_lr_table_holds_the_same_rates_in_float32(schedule, known: dict[int, float]) -> None:
    """The table the engines upload, read at each known step (from step 0 and from a later first step)."""
    last = max(s for s in known if s < 100)
    for first in (0, 2):
        table = lr_table(schedule, first, last + 1 - first)
        for step, rate in known.items():
            if first <= step <= last:
                assert table[step - first] == pytest.approx(np.float32(rate), rel=1e-7, abs=1e-30), (first, step)


def test_long_tables_hold_the_rule_at_every_period_and_quarter() -> None:
    """Tables long enough for the whole-array paths: StepDecay's constant periods, Cosine's quarter points."""
    decay = lr_table(StepDecay(step_size=1000, gamma=0.5, lr=1.0), 0, 3000)
    assert (decay[:1000] == 1.0).all() and (decay[1000:2000] == 0.5).all() and (decay[2000:] == 0.25).all()
    cosine = lr_table(Cosine(total_steps=1000, warmup_steps=100, lr=1.0), 0, 1200)
    np.testing.assert_allclose(cosine[[0, 49, 99]], [1 / 101, 50 / 101, 100 / 101], rtol=1e-7)
    # decay over 900 steps: t = 1/4, 1/2, 3/4 at steps 325, 550, 775; 0 from step 1000 on
    np.testing.assert_allclose(cosine[[100, 325, 550, 775]], [1.0, (1 + R2) / 2, 0.5, (1 - R2) / 2], rtol=1e-7)
    assert (cosine[1000:] == 0.0).all() and (np.diff(cosine[100:1000]) <= 0).all()


def test_bind_fills_the_optimizers_rate_into_a_schedule_without_one() -> None:
    assert bind(None, 0.3)(12345) == 0.3
    assert bind(StepDecay(step_size=2), 0.4)(2) == pytest.approx(0.04, rel=1e-15)
    assert bind(Cosine(total_steps=4), 2.0)(1) == pytest.approx(1 + R2, rel=1e-15)
    assert bind(Constant(0.5), 9.0)(0) == 0.5  # a schedule's own lr wins
