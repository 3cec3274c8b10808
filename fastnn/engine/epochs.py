"""The epoch loop of the GPU engines: a fit's epochs queued ahead on the GPU, waited for in order and reported.

`EpochRun` is one GPU engine's fit (an engine as `EpochEngine` describes it, with a training context as
`EpochTrainContext` does): its captured epoch queued with timing events and the copies of its history
and divergence flag to pinned memory. `EpochRuns` drives one such run per GPU in step (one for the graph engine, one
per replica for `devices=`), and `drive_epochs` is the loop both engines share: INFLIGHT_EPOCHS queued ahead,
divergence restoring the last finite epoch, a Ctrl-C letting the queued epochs finish and counting them, and for a
process of a data-parallel run a stop on any rank stopping every rank after the same epoch.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np

from .._errors import StopTraining, TrainingDiverged
from ..cuda import nccl  # the module only: NCCL itself loads on first use (optional)
from .base import Engine, EpochStats, OnEpoch

__all__ = ["BAD_STATE_OFFSET", "EPOCH_STATE_DTYPE", "INFLIGHT_EPOCHS", "EpochEngine", "EpochEvalContext", "EpochRun",
           "EpochRuns", "EpochTrainContext", "drive_epochs", "hold_ctrl_c"]  # fmt: skip

INFLIGHT_EPOCHS = 3  # epochs queued ahead of the one the host waits for, so the GPU never idles

# EpochState of native/common.cuh
EPOCH_STATE_DTYPE = np.dtype(
    [("epoch", "<u4"), ("epoch_in_fit", "<u4"), ("step0", "<u8"), ("diverged", "<u4"), ("bad_state", "<u4"),
     ("lr", "<u8"), ("hist", "<u8")]
)  # fmt: skip
BAD_STATE_OFFSET = EPOCH_STATE_DTYPE.fields["bad_state"][1]  # copied to the host after every epoch


class EpochTrainContext(Protocol):
    """What the epoch loop uses of a GPU engine's resident training set: its captured epoch graph, the buffers the
    graph reads (lr table) and writes (history), and the pinned copies and events of each queued epoch."""

    steps: int  #: steps per epoch
    samples: int  #: samples per epoch (the history's sums divide by it)
    labels: bool  #: the loss's targets are labels: the history's second sum counts correct ones (else accuracies None)
    capacity: int  #: epochs the buffers below hold
    graph: Any  #: the captured epoch (driver.GraphExec), made by `prepare`
    events: list  #: (start, end, done) driver.Events, cycled over the queued epochs
    lr_table: Any  #: device: the learning rate of every step of the fit
    hist: Any  #: device: (loss sum, correct) float64 per epoch of the fit
    hist_host: Any  #: pinned: hist copied after each epoch
    eval_host: Any  #: pinned: (loss sum, correct) of each epoch's evaluation
    flags_host: Any  #: pinned: EpochState.bad_state after each epoch (uint32)

    def prepare(self, epochs: int, lrs: np.ndarray) -> None:
        """Size and fill the lr table and history for `epochs`; capture the epoch once."""

    def reserve(self, epochs: int) -> None:
        """Grow the lr table and history to hold `epochs` (allocation only)."""


class EpochEvalContext(Protocol):
    """What the epoch loop uses of an evaluation set's captured forward graph."""

    n: int  #: rows of the evaluation set

    def run(self, out_ptr: int) -> None:
        """Queue the evaluation; its (loss sum, correct) float64 pair lands at pinned `out_ptr`."""


class EpochEngine(Protocol):
    """What the epoch loop uses of a GPU engine (the graph engine and the engines built on it)."""

    dev: Any  #: its driver.Device
    stream: Any  #: its driver.Stream, where everything is queued
    epoch_state: Any  #: device: EpochState (EPOCH_STATE_DTYPE)

    @property
    def train_context(self) -> EpochTrainContext | None:
        """The resident training set (None before set_train_data)."""

    def eval_context(self, x: Any, y: Any) -> EpochEvalContext:
        """The evaluation graph for (x, y), uploaded."""

    def write_epoch_state(self, epoch: int, step0: int, lr: int = 0, hist: int = 0) -> None:
        """Start a fit's device counters, with where its lr table and history are."""

    def save_snapshot(self) -> None:
        """Queue a copy of the training state into the snapshot."""

    def restore_snapshot(self) -> None:
        """Put the training state back to the snapshot, and wait for it."""

    def check_usable(self) -> None:
        """Raise if the engine can no longer train (a data-parallel group that ended)."""

    def wait(self, event: Any) -> None:
        """Block until `event` completes (polling collectives where there are any)."""

    def sync(self) -> None:
        """Block until everything queued has run."""


_held: list[bool] | None = None  # the outermost hold_ctrl_c's record of a Ctrl-C (main thread only)


@contextlib.contextmanager
def hold_ctrl_c(reraise: bool = True) -> Iterator[list[bool]]:
    """Hold back Ctrl-C (SIGINT) while the block runs: what it queues must be queued whole (an epoch and the copies
    that count it; the collectives every rank must issue alike, which one rank must not stop halfway). A first
    Ctrl-C is recorded in the yielded list and, if `reraise`, raised as KeyboardInterrupt once the block is done
    (unless the block raises: its error wins); a second one raises at once. A hold inside another joins it. Only
    on the main thread with Python's own handler installed (signals reach no other thread); elsewhere nothing is
    held."""
    global _held
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    if _held is not None:
        yield _held
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.default_int_handler:
        yield []
        return
    hits: list[bool] = []

    def record(signum, frame) -> None:
        global _held
        if hits:  # pressed again: the user insists; Python's handler is back whatever line the press landed on
            _held = None
            signal.signal(signal.SIGINT, previous)
            raise KeyboardInterrupt
        hits.append(True)

    try:
        _held = hits
        signal.signal(signal.SIGINT, record)
        yield hits
    finally:
        _held = None
        signal.signal(signal.SIGINT, previous)
    if hits and reraise:
        raise KeyboardInterrupt


class EpochRun:
    """One fit_epochs call on one engine: its captured epoch prepared, then epoch k queued, waited for, read.

    Epoch k of the call queues the epoch graph, timing events, the copies of its history and divergence flag to
    pinned memory and, after the epochs in `eval_after`, the evaluation graph; `drive_epochs` runs the calls of
    one engine or of several replicas in step (EpochRuns)."""

    def __init__(self, eng: EpochEngine, first_epoch: int, first_step: int, lrs: np.ndarray, eval_data,
                 eval_after: frozenset[int]) -> None:  # fmt: skip
        from ..cuda import driver  # here, not at the top: the loop itself is tested without the CUDA bindings

        ctx = eng.train_context
        if ctx is None:
            raise RuntimeError("set_train_data must come before fit_epochs")
        self.eng, self.ctx, self.first_epoch, self.eval_after = eng, ctx, first_epoch, eval_after
        self._copy_dtoh = driver.copy_dtoh
        self.epochs = len(lrs) // ctx.steps
        self.ev = None
        if self.epochs == 0:
            return
        eng.dev.make_current()
        ctx.prepare(self.epochs, lrs)
        eng.write_epoch_state(first_epoch, first_step, ctx.lr_table.ptr, ctx.hist.ptr)
        eng.save_snapshot()
        self.ev = eng.eval_context(*eval_data) if (eval_data is not None and eval_after) else None
        self.hist = ctx.hist_host.view(np.float64, (ctx.capacity, 2))
        self.ev_hist = ctx.eval_host.view(np.float64, (ctx.capacity, 2))
        self.bad_state = ctx.flags_host.view(np.uint32, (ctx.capacity,))

    def launch(self, k: int) -> None:
        """Queue epoch k (and its evaluation) behind the epochs already queued."""
        eng, ctx, copy_dtoh = self.eng, self.ctx, self._copy_dtoh
        eng.dev.make_current()
        start, end, _ = ctx.events[k % len(ctx.events)]
        start.record(eng.stream)
        if ctx.graph.closed:
            eng.check_usable()  # the group ended under this fit (another thread): its graph went with it
        ctx.graph.launch(eng.stream)
        end.record(eng.stream)
        copy_dtoh(ctx.hist_host.ptr + 16 * k, ctx.hist.ptr + 16 * k, 16, eng.stream)
        copy_dtoh(ctx.flags_host.ptr + 4 * k, eng.epoch_state.ptr + BAD_STATE_OFFSET, 4, eng.stream)
        if self.ev is not None and k in self.eval_after:
            self.ev.run(ctx.eval_host.ptr + 16 * k)
        self._done_event(k).record(eng.stream)

    def _done_event(self, k: int):
        return self.ctx.events[k % len(self.ctx.events)][2]

    def wait(self, k: int) -> None:
        """Block until epoch k's queued work is done (the queue still holds the epochs after it)."""
        self.eng.wait(self._done_event(k))

    def finished(self, k: int) -> bool:
        """Whether epoch k's queued work is done (without blocking)."""
        self.eng.dev.make_current()
        return self._done_event(k).query()

    def drain(self, queued: int) -> None:
        """Block until everything queued (epochs up to `queued`) has run: epoch by epoch, so that a group's timeout
        bounds each epoch's wait rather than all of them together, then the rest (EpochEngine.sync)."""
        self.eng.dev.make_current()
        for k in range(max(0, queued - len(self.ctx.events)), queued):
            self.wait(k)
        self.eng.sync()

    def diverged(self, k: int) -> TrainingDiverged | None:
        """The error to raise for epoch k (its events have completed) if its loss or the state it left is not
        finite; bad_state is sticky, but epochs are read in order and the first diverged one raises."""
        loss_sum = self.hist[k, 0]
        if math.isfinite(loss_sum) and not self.bad_state[k]:
            return None
        state = None if not math.isfinite(loss_sum) else "a weight or optimizer state value is inf or NaN"
        return TrainingDiverged(self.first_epoch + k + 1, float(loss_sum / self.ctx.samples), state)  # 1-based

    def restore(self, queued: int) -> None:
        """Put the training state back to the snapshot: the end of the last finite epoch (`queued` as drain)."""
        self.drain(queued)
        self.eng.restore_snapshot()

    def stats(self, k: int) -> EpochStats:
        """Epoch k's numbers (its events have completed)."""
        ctx = self.ctx
        start, end, _ = ctx.events[k % len(ctx.events)]
        loss_sum, correct = self.hist[k]
        stats = EpochStats(
            epoch=self.first_epoch + k,
            loss=float(loss_sum / ctx.samples),
            accuracy=float(correct / ctx.samples) if ctx.labels else None,
            samples=ctx.samples,
            seconds=start.elapsed_ms(end) / 1000.0,
        )
        if self.ev is not None and k in self.eval_after:
            stats.eval_loss = float(self.ev_hist[k, 0] / self.ev.n)
            stats.eval_accuracy = float(self.ev_hist[k, 1] / self.ev.n) if ctx.labels else None
        return stats


class EpochRuns:
    """The EpochRuns of one fit_epochs call, one per GPU, driven in step; the first is read and reported.

    One GPU (or one process of a distributed run) queues and waits from the calling thread; the replica engine
    overrides launch and wait. `queued` counts the epochs queued on every run; `failed` is set once the GPUs can
    no longer finish what is queued (communicators aborted): nothing is then drained or reported.

    stop_vote (a process of a data-parallel run, graph's DataParallel.vote_stop): called by every rank after every epoch
    of a stoppable fit with whether this rank stops after it; returns the lowest rank that does, or None."""

    def __init__(self, runs: list[EpochRun], stop_vote: Callable[[bool], int | None] | None = None) -> None:
        self.runs, self.lead = runs, runs[0]
        self.stop_vote = stop_vote
        self.queued = 0
        self.failed = False

    def launch(self, k: int) -> None:
        """Queue epoch k on every run: whole, and counted as queued, whenever a Ctrl-C lands (hold_ctrl_c)."""
        with hold_ctrl_c():
            for run in self.runs:
                run.launch(k)
            self.queued = k + 1

    def wait(self, k: int) -> None:
        """Block until epoch k is done on every run."""
        for run in self.runs:
            run.wait(k)

    def drain(self) -> None:
        for run in self.runs:
            run.drain(self.queued)

    def restore(self) -> None:
        for run in self.runs:
            run.restore(self.queued)


def drive_epochs(engine: Engine, runs: EpochRuns, on_epoch: OnEpoch, stoppable: bool) -> None:
    """Train the epochs of `runs`, reported through `engine`, keeping INFLIGHT_EPOCHS queued ahead of the one
    waited for (one if `stoppable`: nothing may train past the epoch reported). Divergence restores every run's
    state and raises. With a stop vote, a stoppable fit's ranks vote after every epoch: one that stops (raising
    from on_epoch) votes so and raises its own error, the others raise StopTraining naming it."""
    lead = runs.lead
    epochs = lead.epochs

    def report(k: int) -> None:
        """Epoch k's numbers (its events have completed): divergence check, then on_epoch."""
        error = lead.diverged(k)
        if error is not None:
            runs.restore()
            raise error
        engine.report(lead.stats(k), on_epoch)

    def reported() -> int:
        """Epochs of this call reported so far: one counts from the moment `report` marks it."""
        last = engine.last_reported
        return 0 if last is None else last.epoch - lead.first_epoch + 1

    voting = stoppable and runs.stop_vote is not None
    voted = 0  # epochs of this call this rank has voted on (voting)
    went_on = False  # the last vote went on: every rank queues the epoch after it
    held = False  # a Ctrl-C held back during a vote that went on: this rank stops after the next epoch

    def vote(k: int, stopping: bool) -> int | None:
        """This rank's vote after epoch k, Ctrl-C held back meanwhile: the vote's collectives are issued whole."""
        nonlocal voted, went_on, held
        with hold_ctrl_c(reraise=False) as hits:
            voted = k + 1
            rank = runs.stop_vote(stopping)
            went_on = rank is None
        held = held or bool(hits)
        return rank

    def report_and_vote(k: int) -> None:
        """report(k), then every rank's vote on stopping after epoch k (nothing is queued past it)."""
        try:
            report(k)
        except BaseException as exc:
            vote(k, True)  # the others stop after this epoch too; this rank raises its own error
            if held and isinstance(exc, StopTraining):
                raise KeyboardInterrupt from None  # the Ctrl-C held earlier, not a stop fit would swallow
            raise
        stopping = held  # Ctrl-C pressed during the last vote, which went on: this rank stops now
        rank = vote(k, stopping)
        if stopping or (held and rank is not None):  # pressed during this vote, and every rank stops here anyway
            raise KeyboardInterrupt
        if rank is not None:
            raise StopTraining(f"rank {rank} stopped after epoch {lead.first_epoch + k + 1}")
        # Pressed during this vote, which went on: the others queue the next epoch, so this rank does too.

    inflight = 1 if stoppable else INFLIGHT_EPOCHS
    try:
        while reported() < epochs:
            while runs.queued < epochs and runs.queued - reported() < inflight:
                runs.launch(runs.queued)
            k = reported()
            runs.wait(k)
            if voting:
                report_and_vote(k)
            else:
                report(k)
        if held:  # pressed during the last epoch's vote, which went on: the others go on to the next call
            raise KeyboardInterrupt
    except (TrainingDiverged, nccl.NcclError, nccl.CommAborted):
        raise  # a peer failed, the communicator is aborted and the queued epochs will never finish
    except BaseException:
        if runs.failed:
            raise  # the GPUs were stopped: the queued epochs will never finish
        # Interrupted (Ctrl-C while waiting, or an error reporting an epoch) with epochs still queued:
        # let them finish and report every one not yet reported (an epoch whose report was interrupted
        # before it counted included), so the trainer's counters match the weights they made.
        if voting and went_on and voted == runs.queued < epochs:
            # Interrupted after a vote that went on, before queuing the next epoch: the others queue it, so this
            # rank does too (then reports it and votes to stop after it, below).
            with contextlib.suppress(Exception):
                runs.launch(runs.queued)
        runs.drain()
        for k in range(reported(), runs.queued):
            try:
                report(k)
            except TrainingDiverged:
                break  # the weights went back to the last finite epoch, already reported
            except Exception:  # on_epoch failed after the epoch counted: report the next
                continue
        if voting and voted < runs.queued:  # interrupted waiting for an epoch: the others stop after it too
            with contextlib.suppress(Exception):  # the interrupt is the error to report
                vote(runs.queued - 1, True)
        raise
