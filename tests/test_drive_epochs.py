"""The epoch loop every GPU engine shares (epochs.drive_epochs), driven with fake runs on the CPU: what is
reported after an interrupt or a failure, so that the trainer's counters match the weights."""

from __future__ import annotations

import pytest

from fastnn.engine.base import Engine, EpochStats
from fastnn.engine.epochs import EpochRuns, drive_epochs


class _Run:
    """An EpochRun whose epochs finish the moment they are queued; records what was asked of it."""

    def __init__(self, epochs: int) -> None:
        self.epochs, self.first_epoch = epochs, 10
        self.launched: list[int] = []
        self.drained = 0

    def launch(self, k: int) -> None:
        self.launched.append(k)

    def wait(self, k: int) -> None:
        assert k in self.launched

    def drain(self, queued: int) -> None:
        self.drained += 1

    def restore(self, queued: int) -> None:
        pass

    def diverged(self, k: int):
        return None

    def stats(self, k: int) -> EpochStats:
        return EpochStats(epoch=self.first_epoch + k, loss=1.0, accuracy=0.5, samples=1, seconds=0.0)


class _Engine:
    last_reported = None
    report = Engine.report


class _InterruptedLaunch(EpochRuns):
    """Ctrl-C lands while epoch 1 is being queued, after every GPU has queued it (as the replica engine's
    threaded launch reports it)."""

    def launch(self, k: int) -> None:
        super().launch(k)
        if k == 1:
            raise KeyboardInterrupt


def test_an_epoch_queued_when_ctrl_c_lands_is_trained_and_reported():
    runs = _InterruptedLaunch([_Run(3), _Run(3)])
    seen = []
    with pytest.raises(KeyboardInterrupt):
        drive_epochs(_Engine(), runs, lambda s: seen.append(s.epoch), stoppable=False)
    assert [r.launched for r in runs.runs] == [[0, 1], [0, 1]]
    assert seen == [10, 11]  # epoch 1 ran (it was queued everywhere), so it counts
    assert [r.drained for r in runs.runs] == [1, 1]


class _FailedWait(EpochRuns):
    """A GPU fails while the host waits for epoch 1: the group is stopped (failed), its queue cut short."""

    def wait(self, k: int) -> None:
        if k == 1:
            self.failed = True
            raise RuntimeError("GPU 1: an illegal memory access")
        super().wait(k)


def test_after_a_gpu_failure_nothing_is_drained_or_reported():
    runs = _FailedWait([_Run(4), _Run(4)])
    seen = []
    with pytest.raises(RuntimeError, match="illegal memory access"):
        drive_epochs(_Engine(), runs, lambda s: seen.append(s.epoch), stoppable=False)
    assert seen == [10]  # epochs 1..3 were queued but cut short: not counted
    assert [r.drained for r in runs.runs] == [0, 0]


def test_an_error_in_on_epoch_still_reports_the_queued_epochs():
    runs = EpochRuns([_Run(3)])
    seen = []

    def on_epoch(stats):
        seen.append(stats.epoch)
        if len(seen) == 1:
            raise ValueError("callback")

    with pytest.raises(ValueError, match="callback"):
        drive_epochs(_Engine(), runs, on_epoch, stoppable=False)
    assert seen == [10, 11, 12] and runs.queued == 3 and runs.runs[0].drained == 1


# ---- the replica engine's runs (threaded launch, polling wait) -------------------------------------------------


class _PolledRun(_Run):
    """A run whose epoch k finishes after `polls` queries; `error` makes its query raise instead."""

    def __init__(self, epochs: int, polls: int = 2, error: Exception | None = None) -> None:
        super().__init__(epochs)
        self.polls, self.error = polls, error

    def finished(self, k: int) -> bool:
        if self.error is not None:
            raise self.error
        self.polls -= 1
        return self.polls < 0


def test_the_fake_runs_use_only_what_an_epoch_run_has():
    from fastnn.engine.epochs import EpochRun

    used = {n for n in vars(_PolledRun) | vars(_Run) if not n.startswith("_")} - {"epochs", "first_epoch"}
    assert used <= set(dir(EpochRun)), used - set(dir(EpochRun))


class _Group:
    @staticmethod
    def async_error():
        return None


class _Replicas:
    """What _ReplicaRuns uses of a ReplicaEngine: its thread pool, groups and abort."""

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(2)
        self.groups = [_Group(), _Group()]
        self.aborted: list[str] = []

    def _abort(self, why: str) -> None:
        self.aborted.append(why)


@pytest.mark.bindings
def test_replica_runs_launch_on_threads_and_poll_every_gpu():
    from fastnn.engine.replicas import _ReplicaRuns

    engine = _Replicas()
    runs = _ReplicaRuns(engine, [_PolledRun(2), _PolledRun(2, polls=5)])
    seen = []
    drive_epochs(_Engine(), runs, lambda s: seen.append(s.epoch), stoppable=False)
    assert seen == [10, 11] and [r.launched for r in runs.runs] == [[0, 1], [0, 1]] and engine.aborted == []


@pytest.mark.bindings
def test_a_failing_gpu_stops_the_replicas_without_draining():
    from fastnn.engine.replicas import _ReplicaRuns

    engine = _Replicas()
    runs = _ReplicaRuns(engine, [_PolledRun(3), _PolledRun(3, error=RuntimeError("GPU 1: illegal address"))])
    seen = []
    with pytest.raises(RuntimeError, match="illegal address"):
        drive_epochs(_Engine(), runs, lambda s: seen.append(s.epoch), stoppable=False)
    assert seen == [] and runs.failed and len(engine.aborted) == 1
    assert [r.drained for r in runs.runs] == [0, 0]


# ---- a process of a data-parallel run: every rank votes after every epoch of a stoppable fit ---------------------


class _Voting(EpochRuns):
    """One rank's runs with a stop vote; `others` is the lowest other rank stopping after each epoch (None: none);
    a Ctrl-C lands while the host waits for epoch `wait_interrupted_at`, or during vote `ctrl_c_in_vote`."""

    def __init__(self, epochs: int, others: list[int | None], wait_interrupted_at: int | None = None,
                 ctrl_c_in_vote: int | None = None) -> None:  # fmt: skip
        super().__init__([_Run(epochs)], stop_vote=self._vote)
        self.others, self.votes, self.wait_interrupted_at = others, [], wait_interrupted_at
        self.ctrl_c_in_vote = ctrl_c_in_vote

    def _vote(self, stopping: bool) -> int | None:
        k = len(self.votes)
        self.votes.append(stopping)
        if k == self.ctrl_c_in_vote:
            _ctrl_c()
        return 0 if stopping else self.others[k]  # this rank is rank 0: the lowest to stop when it does

    def wait(self, k: int) -> None:
        if k == self.wait_interrupted_at:
            raise KeyboardInterrupt
        super().wait(k)


def test_a_stop_on_another_rank_stops_this_one_after_the_same_epoch():
    from fastnn._control import StopTraining

    runs = _Voting(4, others=[None, 1, None, None])
    seen = []
    with pytest.raises(StopTraining, match="rank 1 stopped after epoch 12"):
        drive_epochs(_Engine(), runs, lambda s: seen.append(s.epoch), stoppable=True)
    assert seen == [10, 11] and runs.runs[0].launched == [0, 1] and runs.votes == [False, False]


@pytest.mark.parametrize("how", ["StopTraining", "an error in a callback", "divergence"])
def test_a_rank_that_stops_votes_so_and_raises_its_own_error(how):
    from fastnn._control import StopTraining
    from fastnn._errors import TrainingDiverged

    runs = _Voting(4, others=[None] * 4)
    seen = []

    def on_epoch(stats):
        seen.append(stats.epoch)
        if len(seen) == 2 and how == "StopTraining":
            raise StopTraining("stopped after epoch 12")
        if len(seen) == 2 and how == "an error in a callback":
            raise ValueError("callback")

    error = {"StopTraining": StopTraining, "an error in a callback": ValueError, "divergence": TrainingDiverged}[how]
    if how == "divergence":
        runs.runs[0].diverged = lambda k: TrainingDiverged(11 + k, float("nan")) if k == 1 else None
    with pytest.raises(error):
        drive_epochs(_Engine(), runs, on_epoch, stoppable=True)
    assert runs.runs[0].launched == [0, 1] and runs.votes == [False, True]
    assert seen == ([10] if how == "divergence" else [10, 11])


def test_an_interrupt_while_waiting_reports_the_epoch_then_votes_to_stop():
    runs = _Voting(4, others=[None] * 4, wait_interrupted_at=1)
    seen = []
    with pytest.raises(KeyboardInterrupt):
        drive_epochs(_Engine(), runs, lambda s: seen.append(s.epoch), stoppable=True)
    assert seen == [10, 11] and runs.runs[0].drained == 1 and runs.votes == [False, True]


def test_ranks_vote_only_in_a_stoppable_fit():
    runs = _Voting(3, others=[1, 1, 1])
    drive_epochs(_Engine(), runs, lambda s: None, stoppable=False)
    assert runs.votes == [] and runs.runs[0].launched == [0, 1, 2]
    runs = _Voting(3, others=[None] * 3)
    drive_epochs(_Engine(), runs, lambda s: None, stoppable=True)
    assert runs.votes == [False, False, False]


def _ctrl_c() -> None:
    """Press Ctrl-C: SIGINT to this process, delivered to the main thread before the next bytecode."""
    import os
    import signal

    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(1000):  # the handler runs between bytecodes
        pass


def _need_python_sigint() -> None:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        pytest.skip("needs the main thread with Python's own SIGINT handler")


def test_ctrl_c_is_held_back_until_the_block_is_done():
    """hold_ctrl_c: a first Ctrl-C is recorded and raised after the block (or left to the caller), a second raises
    at once, holds nest, and the previous handler is back afterwards."""
    import signal

    from fastnn.engine import epochs
    from fastnn.engine.epochs import hold_ctrl_c

    _need_python_sigint()
    done = []
    with pytest.raises(KeyboardInterrupt), hold_ctrl_c():
        _ctrl_c()
        done.append("finished")
    assert done == ["finished"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler

    with hold_ctrl_c(reraise=False) as hits:
        with hold_ctrl_c():  # joins the outer hold: nothing raised on leaving it
            _ctrl_c()
        done.append("inner left")
    assert hits == [True] and done[-1] == "inner left"

    with pytest.raises(KeyboardInterrupt), hold_ctrl_c(reraise=False):
        _ctrl_c()
        _ctrl_c()  # pressed again: the user insists
        done.append("not reached")
    assert done[-1] == "inner left" and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert epochs._held is None  # the next hold holds again

    with pytest.raises(ValueError), hold_ctrl_c():  # the block's own error wins over a held press
        _ctrl_c()
        raise ValueError("block")


class _CtrlCInLaunch(_Run):
    def launch(self, k: int) -> None:
        super().launch(k)
        if k == 1:
            _ctrl_c()  # after the epoch's graph launch, before its done event: it must still count


def test_an_epoch_whose_launch_is_interrupted_is_queued_whole_and_counted():
    _need_python_sigint()
    runs = EpochRuns([_CtrlCInLaunch(3)])
    seen = []
    with pytest.raises(KeyboardInterrupt):
        drive_epochs(_Engine(), runs, lambda s: seen.append(s.epoch), stoppable=False)
    assert runs.queued == 2 and seen == [10, 11] and runs.runs[0].drained == 1


def test_ctrl_c_during_a_vote_that_goes_on_stops_after_the_next_epoch():
    """The vote said go on (the others queue the next epoch): this rank trains it too, then votes to stop."""
    _need_python_sigint()
    runs = _Voting(4, others=[None] * 4, ctrl_c_in_vote=0)
    seen = []
    with pytest.raises(KeyboardInterrupt):
        drive_epochs(_Engine(), runs, lambda s: seen.append(s.epoch), stoppable=True)
    assert runs.votes == [False, True] and runs.runs[0].launched == [0, 1] and seen == [10, 11]


def test_ctrl_c_during_a_vote_where_another_rank_stops_stops_here():
    _need_python_sigint()
    runs = _Voting(4, others=[1, None, None, None], ctrl_c_in_vote=0)
    with pytest.raises(KeyboardInterrupt):
        drive_epochs(_Engine(), runs, lambda s: None, stoppable=True)
    assert runs.votes == [False] and runs.runs[0].launched == [0]


def test_ctrl_c_during_the_last_vote_of_a_call_raises_after_it():
    _need_python_sigint()
    runs = _Voting(2, others=[None] * 2, ctrl_c_in_vote=1)
    with pytest.raises(KeyboardInterrupt):
        drive_epochs(_Engine(), runs, lambda s: None, stoppable=True)
    assert runs.votes == [False, False] and runs.runs[0].launched == [0, 1]


class _CtrlCBeforeLaunch(_Voting):
    """Ctrl-C lands after the vote on epoch 0 went on, before epoch 1 is queued (outside any hold)."""

    def launch(self, k: int) -> None:
        if k == 1 and not self.pressed:
            self.pressed = True
            raise KeyboardInterrupt
        super().launch(k)


def test_ctrl_c_between_a_vote_that_went_on_and_the_next_launch_still_queues_that_epoch():
    """The others queue epoch 1 after the vote: this rank queues it too, reports it, then votes to stop."""
    runs = _CtrlCBeforeLaunch(4, others=[None] * 4)
    runs.pressed = False
    seen = []
    with pytest.raises(KeyboardInterrupt):
        drive_epochs(_Engine(), runs, lambda s: seen.append(s.epoch), stoppable=True)
    assert runs.votes == [False, True] and runs.runs[0].launched == [0, 1] and seen == [10, 11]


def test_a_stop_asked_after_a_held_ctrl_c_raises_the_ctrl_c():
    """fit swallows StopTraining: a Ctrl-C held during the previous vote must not turn into a quiet stop."""
    from fastnn._control import StopTraining

    _need_python_sigint()
    runs = _Voting(4, others=[None] * 4, ctrl_c_in_vote=0)

    def on_epoch(stats):
        if stats.epoch == 11:
            raise StopTraining("a callback")

    with pytest.raises(KeyboardInterrupt):
        drive_epochs(_Engine(), runs, on_epoch, stoppable=True)
    assert runs.votes == [False, True] and runs.runs[0].launched == [0, 1]


def test_the_gpu_engines_provide_what_the_epoch_loop_uses():
    """The graph engine (and so the fused one) and its contexts have every method of the protocols EpochRun drives
    them through (epochs.EpochEngine, EpochTrainContext, EpochEvalContext): no private attribute is reached into."""
    pytest.importorskip("cuda.bindings")
    from fastnn.engine.epochs import EpochEngine, EpochEvalContext, EpochTrainContext
    from fastnn.engine.fused import FusedEngine
    from fastnn.engine.fused.engine import FusedTrainContext
    from fastnn.engine.graph import GraphEngine
    from fastnn.engine.graph.contexts import EvalContext, TrainContext

    pairs = [(EpochEngine, GraphEngine), (EpochEngine, FusedEngine), (EpochTrainContext, TrainContext),
             (EpochTrainContext, FusedTrainContext), (EpochEvalContext, EvalContext)]  # fmt: skip
    for protocol, cls in pairs:
        methods = [n for n, v in vars(protocol).items()
                   if not n.startswith("_") and (callable(v) or isinstance(v, property))]  # fmt: skip
        assert methods, protocol
        for name in methods:
            assert callable(getattr(cls, name, None)) or isinstance(getattr(cls, name, None), property), (cls, name)
