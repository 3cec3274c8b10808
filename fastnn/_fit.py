"""One `Trainer.fit` call as four named steps: check its arguments, plan the run, drive the epochs, commit each.

`check_fit` refuses bad arguments before any work (a refused call changes nothing); `plan_run` fixes the run's
shape (steps an epoch, the counters' limits, the learning-rate table's first chunk); `FitRun.drive` hands the engine
chunks of epochs; `FitRun.commit` records each epoch the engine reports (history, counters, progress, early
stopping, callbacks), idempotently, so an interrupt loses no finished epoch; `FitRun.finish` goes back to early
stopping's best epoch where it says so.
"""

from __future__ import annotations

import contextlib
import reprlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ._checks import integer
from ._control import (
    Callback,
    EarlyStopping,
    StopTraining,
    check_callbacks,
    check_early_stopping,
    check_validation_split,
    run_callbacks,
)
from ._errors import ConfigError, DataError
from ._gpu_arrays import CudaArray
from ._history import History
from ._inputs import eval_pair, held_out, inputs, targets
from ._progress import EpochReporter, check_progress, reporter
from ._state import MAX_EPOCH, MAX_STEP
from .engine.base import Engine, EngineConfig, EpochStats, steps_per_epoch
from .schedules import Schedule, lr_table

__all__ = ["LR_CHUNK_STEPS", "Counters", "FitArgs", "FitRun", "RunPlan", "check_fit", "plan_run", "take_part"]

#: `fit` builds the per-step learning-rate table (and trains) in chunks of whole epochs of at most this many
#: steps (one epoch when an epoch is longer): a fit of any length starts at once and holds a 4 MiB table.
LR_CHUNK_STEPS = 2**20


class Counters(Protocol):
    """What a fit advances: the trainer's epochs and steps done and its history (`Trainer` is one)."""

    epoch: int
    step: int
    history: History


@dataclass(frozen=True)
class FitArgs:
    """`fit`'s arguments, checked: the training rows (less the validation split's), the eval set, the controls."""

    x: np.ndarray | CudaArray
    y: np.ndarray
    epochs: int
    eval_set: tuple[Any, Any] | None
    eval_every: int
    show: bool
    fraction: float | None
    stopper: EarlyStopping | None
    hooks: list[Callback]


def check_fit(
    config: EngineConfig,
    gpu: bool,
    x: Any,
    y: Any,
    epochs: Any,
    eval_data: Any,
    eval_every: Any,
    progress: Any,
    validation_split: Any,
    early_stopping: Any,
    callbacks: Sequence[Callback] | None,
) -> FitArgs:
    """Every argument of `fit` checked, and the validation split taken, before any work (see `Trainer.fit`).

    Raises:
        DataError: x, y or eval_data are malformed, or the split needs x in host memory.
        ConfigError: a control argument is invalid, or two of them contradict each other.
    """
    x = inputs(config, x, "x", gpu)
    y = targets(config, y, x.shape[0], "y", gpu)
    epochs = integer("epochs", epochs, 0)
    eval_set = eval_pair(config, eval_data, gpu)
    eval_every = integer("eval_every", eval_every, 1)
    show = check_progress(progress)
    fraction = check_validation_split(validation_split)
    stopper = check_early_stopping(early_stopping)
    hooks = check_callbacks(callbacks)
    if stopper is not None and stopper.monitor == "eval_accuracy" and config.loss == "mse":
        raise ConfigError(
            "early_stopping monitors 'eval_accuracy', which a regression (loss='mse') does not have: "
            "use EarlyStopping(monitor='eval_loss')"
        )
    if fraction is not None and eval_set is not None:
        raise ConfigError(
            f"validation_split={fraction} and eval_data are both given: pass one of them "
            f"(validation_split holds out part of x as the eval data)"
        )
    if stopper is not None and eval_set is None and fraction is None:
        raise ConfigError(
            f"early_stopping={reprlib.repr(early_stopping)} needs validation data: pass eval_data or validation_split"
        )
    if fraction is not None:
        if isinstance(x, CudaArray):
            raise DataError(
                f"validation_split={fraction} needs x in host memory (it selects rows), got {x.describe()}: "
                f"split it yourself on the GPU and pass eval_data=(x_val, y_val)"
            )
        x, y, eval_set = held_out(config, x, y, fraction)
    return FitArgs(x, y, epochs, eval_set, eval_every, show, fraction, stopper, hooks)


@dataclass(frozen=True)
class RunPlan:
    """The run of one fit: its checked arguments, where the counters start, steps an epoch, epochs per lr table,
    and the first table (built while planning, so a schedule failing at its first steps fails before any work)."""

    args: FitArgs
    epoch0: int
    step0: int
    hist0: int
    steps: int
    chunk: int
    first_lrs: np.ndarray

    def chunks(self) -> Iterator[tuple[int, int]]:
        """(first epoch of the call, epochs) of each chunk of at most `chunk` epochs."""
        for first in range(0, self.args.epochs, self.chunk):
            yield first, min(self.chunk, self.args.epochs - first)

    def eval_after(self, first: int, n: int) -> frozenset[int]:
        """Which epochs of the chunk (0-based within it) evaluate: every eval_every-th of the call, and its last."""
        a = self.args
        if a.eval_set is None:
            return frozenset()
        return frozenset(k - first for k in range(first, first + n) if (k + 1) % a.eval_every == 0 or k == a.epochs - 1)


def plan_run(args: FitArgs, config: EngineConfig, counters: Counters, schedule: Schedule) -> RunPlan:
    """The run `args` asks for, from where `counters` stand.

    Raises:
        DataError: an epoch would have no steps.
        ConfigError: the epoch or step counter would pass its limit, or the schedule fails on the first chunk.
    """
    x, epochs = args.x, args.epochs
    spe = steps_per_epoch(x.shape[0], config.batch_size, config.drop_last)
    if spe == 0:
        raise DataError(
            f"x has {x.shape[0]} rows{' for training' if args.fraction else ''}, fewer than "
            f"batch_size={config.batch_size} with drop_last=True: an epoch would have no steps"
        )
    if counters.epoch + epochs > MAX_EPOCH:
        raise ConfigError(
            f"epochs must be an integer in [0, {MAX_EPOCH - counters.epoch}], got {epochs}: this trainer has done "
            f"{counters.epoch} epochs and counts at most 2**32 (the GPU's epoch counter and the shuffle key are 32-bit)"
        )
    if counters.step + epochs * spe > MAX_STEP:
        raise ConfigError(f"epochs={epochs} of {spe} steps take the step counter ({counters.step}) past 2**63 - 1")
    chunk = max(1, LR_CHUNK_STEPS // spe)  # epochs per lr table: at most LR_CHUNK_STEPS steps, or one epoch
    lrs = lr_table(schedule, counters.step, min(chunk, epochs) * spe)
    return RunPlan(args, counters.epoch, counters.step, len(counters.history), spe, chunk, lrs)


def take_part(plan: RunPlan, engine: Engine) -> None:
    """A fit of no epochs in a data-parallel group: the other ranks compare their fit with this one before training,
    so this rank takes part (training nothing) and a rank asking for other epochs is refused by name rather than
    left waiting."""
    engine.set_train_data(plan.args.x, plan.args.y)
    engine.fit_epochs(plan.epoch0, plan.step0, plan.first_lrs, None, frozenset(), lambda stats: None,
                      end_epoch=plan.epoch0)  # fmt: skip


def _record(stats: EpochStats) -> dict[str, Any]:
    """The history record of an epoch the engine reports."""
    return {
        "epoch": stats.epoch + 1,  # people's number: stats.epoch is the 0-based index keying the shuffle
        "train_loss": float(stats.loss),
        "train_accuracy": None if stats.accuracy is None else float(stats.accuracy),
        "eval_loss": None if stats.eval_loss is None else float(stats.eval_loss),
        "eval_accuracy": None if stats.eval_accuracy is None else float(stats.eval_accuracy),
        "seconds": float(stats.seconds),
    }


class FitRun:
    """The epochs of one fit: `drive` trains them, `commit` records each, `finish` settles the call's history."""

    def __init__(self, plan: RunPlan, engine: Engine, counters: Counters, schedule: Schedule) -> None:
        self.plan, self.engine, self.counters, self.schedule = plan, engine, counters, schedule
        self.history = History()  # this call's records
        self.handled = 0  # epochs of this call shown and judged: each once, even when commit runs again
        self.best: dict[str, np.ndarray] | None = None  # the state at early stopping's best epoch so far
        a = plan.args
        if a.stopper is not None:
            a.stopper.reset()
        self.display: EpochReporter | None = None
        if a.show:
            self.display = reporter(plan.epoch0 + 1, plan.epoch0 + a.epochs, plan.steps, engine.device == "cpu")

    def drive(self) -> None:
        """Train the call's epochs, a chunk of whole epochs (one lr table) per engine call, until done or stopped."""
        plan, a, engine, display = self.plan, self.plan.args, self.engine, self.display
        engine.set_train_data(a.x, a.y)
        on_step = display.step if display is not None and display.per_step else None
        stoppable = a.stopper is not None or bool(a.hooks)
        try:
            for first, n in plan.chunks():
                lrs = plan.first_lrs if not first else lr_table(self.schedule, self.counters.step, n * plan.steps)
                engine.fit_epochs(self.counters.epoch, self.counters.step, lrs, a.eval_set, plan.eval_after(first, n),
                                  self.commit, stoppable=stoppable, on_step=on_step,
                                  end_epoch=plan.epoch0 + a.epochs)  # fmt: skip
        except StopTraining:
            pass  # commit recorded the epoch that asked to stop; the engine trained none after it
        except BaseException:
            # An interrupt may land after the engine counted an epoch as reported and before commit recorded it.
            done = engine.last_reported
            if done is not None and done.epoch >= plan.epoch0:
                with contextlib.suppress(Exception):  # the interrupt is the error to report
                    self.commit(done)
            raise
        finally:
            if display is not None:
                display.close()

    def commit(self, stats: EpochStats) -> None:
        """Record epoch stats.epoch, idempotently: run again after an interrupt, it completes what is missing.
        Then show it and run early stopping and the callbacks (once per epoch); StopTraining stops."""
        plan, counters = self.plan, self.counters
        k = stats.epoch - plan.epoch0
        record = _record(stats)
        if len(self.history) == k:
            self.history.append(record)
        if len(counters.history) == plan.hist0 + k:
            counters.history.append(record)
        counters.epoch = stats.epoch + 1
        counters.step = plan.step0 + (k + 1) * plan.steps
        if self.handled > k:
            return
        self.handled = k + 1
        if self.display is not None:
            self.display.epoch(record)
        stop, stopper = False, plan.args.stopper
        if stopper is not None:
            improved, stop = stopper.update(record)
            if improved and stopper.restore_best:
                self.best = self.engine.get_state()  # only when it improves: a host copy of the state
        if run_callbacks(plan.args.hooks, record) or stop:
            raise StopTraining(f"stopped after epoch {record['epoch']}")

    def finish(self) -> History:
        """This call's history, after going back to early stopping's best epoch where it asks to (and saying so)."""
        stopper = self.plan.args.stopper
        rewound = stopper is not None and self.best is not None and stopper.best_epoch < self.counters.epoch
        if rewound:
            self._rewind(stopper, self.best)
        if self.display is not None and stopper is not None and stopper.summary(rewound) is not None:
            self.display.note(stopper.summary(rewound))
        return self.history

    def _rewind(self, stopper: EarlyStopping, state: dict[str, np.ndarray]) -> None:
        """Go back to the end of early stopping's best epoch: state, counters and history."""
        plan, counters = self.plan, self.counters
        keep = stopper.best_epoch - plan.epoch0  # epochs of this call up to and including the best
        self.engine.set_state(state)
        stopper.discarded = list(self.history[keep:])
        counters.history = counters.history[: plan.hist0 + keep]
        counters.epoch, counters.step = plan.epoch0 + keep, plan.step0 + keep * plan.steps
        self.history = self.history[:keep]
