"""`Trainer(..., devices=N)`: data-parallel training on several GPUs of one process.

One graph engine per GPU (a replica), each a rank of one NCCL communicator clique (ncclCommInitAll): the same
per-rank epoch graph as a multi-process run (`fastnn.distributed`), with its per-layer gradient all-reduces captured
on a side stream. NCCL's collectives need every rank present, so whatever may issue one outside a graph (each
fit's agreement check, the autotuning run, the capture) runs on a thread per GPU at once, and so does each epoch's
graph launch (NCCL: a launch may wait for its peers'). The calling thread waits for the epochs in order and
reports the first run's history (all-reduced: every replica's). The replicas hold the same weights, so evaluation,
prediction and checkpoints read one of them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

import numpy as np

from .._errors import ConfigError, DeviceUnavailable
from .._gpu_arrays import CudaArray, check_on_device
from ..cuda import deferring, nccl
from .base import Engine, EngineConfig, OnEpoch
from .epochs import EpochRun, EpochRuns, drive_epochs
from .graph import GraphEngine
from .group import Group

__all__ = ["ReplicaEngine"]

T = TypeVar("T")
SETTLE_S = 10.0  # how long the other GPUs' calls may take to fail too after one failed, before the group is aborted


class ReplicaEngine(Engine):
    """The graph engine on several GPUs of this process: a replica per GPU, gradients summed by NCCL."""

    device = "cuda"
    name = "graph"

    def __init__(self, config: EngineConfig, state: dict[str, np.ndarray], devices: Sequence[int]) -> None:
        from ..cuda import driver

        self.devices = list(devices)
        self.groups: list[Group] = []
        self.replicas: list[GraphEngine] = []
        self._broken: str | None = None
        ok, reason = nccl.available()
        if not ok:
            raise DeviceUnavailable(f"devices={self.devices!r} needs NCCL: {reason}")
        self._pool = ThreadPoolExecutor(len(self.devices), thread_name_prefix="fastnn-gpu")
        try:
            try:
                # ncclCommInitAll ends by making the runtime's device current again: with no context current that is
                # GPU 0, which would get a context even when it is not one of `devices`.
                driver.get_device(self.devices[0]).make_current()
                comms = nccl.Comm.clique(self.devices)
            except nccl.NcclError as exc:  # NCCL's own message, with the GPUs it was asked for
                exc.args = (f"devices={self.devices!r}: {exc.args[0]}",)
                raise
            world = len(comms)
            self.groups = [Group(rank=r, world=world, device=d, comm=c) for r, (d, c) in enumerate(zip(devices, comms))]
            self.replicas = self._on_each(lambda group: GraphEngine(config, state, group=group), self.groups,
                                          undo=lambda eng: eng.close())  # fmt: skip
        except BaseException:
            self.close()
            raise

    @property
    def lead(self) -> GraphEngine:
        """The first replica: every replica holds the same weights, so reads come from it."""
        return self.replicas[0]

    def _on_each(self, fn: Callable[..., T], items, undo: Callable[[T], None] | None = None) -> list[T]:
        """fn(item) for every item at once, a thread each; the results in order. If one raises, its error is raised
        (see _raise_failed: the group is aborted unless every call failed) and `undo` is applied to the results
        made. A Ctrl-C (which only this thread receives) lets the calls finish first."""
        futures = [self._pool.submit(fn, item) for item in items]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException:
            wait(futures)
            self._raise_failed(futures, undo)
            raise
        self._raise_failed(futures, undo)
        return [f.result() for f in futures]

    def _raise_failed(self, futures: list, undo: Callable | None) -> None:
        """If a call of `futures` failed, raise its error once the others are done, undoing their results. The
        group is aborted (a peer may be waiting in a collective the failed one never joined, or have queued one)
        unless every call failed within SETTLE_S: the same refusal on every GPU (a training set too large for
        data_placement="device", say) leaves nobody waiting, and the trainer usable."""
        failed = [f for f in futures if f.done() and f.exception() is not None]
        if not failed:
            return
        error = failed[0].exception()
        done, running = wait(futures, timeout=SETTLE_S)
        if running or any(f.exception() is None for f in futures):
            self._abort(f"{type(error).__name__} on one GPU: {error}")
            wait(futures)
        if undo is not None:
            for f in futures:
                if f.exception() is None:
                    with contextlib.suppress(Exception):
                        undo(f.result())
        raise error

    def _abort(self, why: str) -> None:
        """Abort every communicator: training needs new ones (a new Trainer)."""
        if self._broken is None:
            self._broken = why
        for group in self.groups:
            with contextlib.suppress(Exception):
                group.abort()

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(f"this trainer's GPUs can no longer train together ({self._broken}): their NCCL "
                               "communicators were aborted; save or read its weights, then make a new Trainer")

    # ------------------------------------------------------------------ Engine API
    def _on_array_gpu(self, x: np.ndarray | CudaArray, name: str = "x") -> GraphEngine:
        """The replica that reads `x`: the one on its GPU for a GPU array (DataError naming the argument `name` if
        none is), else the lead."""
        if not isinstance(x, CudaArray):
            return self.lead
        return self.replicas[self.devices.index(check_on_device(x, self.devices, name))]

    def set_train_data(self, x: np.ndarray | CudaArray, y: np.ndarray) -> None:
        self._check_usable()
        # A GPU array is copied device to device by the replica on its GPU; the others get one host copy of it.
        reader = self._on_array_gpu(x)
        host = x.to_host() if isinstance(x, CudaArray) and len(self.replicas) > 1 else x
        self._on_each(lambda eng: eng.set_train_data(x if eng is reader else host, y), self.replicas)

    def fit_epochs(
        self, first_epoch, first_step, lrs, eval_data, eval_after, on_epoch: OnEpoch, stoppable=False, on_step=None,
        end_epoch=None,
    ) -> None:  # fmt: skip
        self._check_usable()
        self.last_reported = None
        # One replica evaluates (the weights are the same on all): the one on the GPU of a GPU array's eval data.
        # Its run comes first, the one drive_epochs reports.
        evaluator = self._on_array_gpu(eval_data[0], "eval_data") if eval_data is not None else self.lead
        order = [evaluator] + [eng for eng in self.replicas if eng is not evaluator]
        if self.lead.train_context is not None:  # every GPU's buffers first: then no collective waits on a failed one
            epochs = len(lrs) // self.lead.train_context.steps
            self._on_each(lambda eng: eng.train_context.reserve(epochs), order)
        runs = self._on_each(
            lambda eng: EpochRun(eng, first_epoch, first_step, lrs, eval_data if eng is evaluator else None,
                                 eval_after),
            order,
        )  # fmt: skip
        try:
            drive_epochs(self, _ReplicaRuns(self, runs), on_epoch, stoppable)
        except nccl.NcclError as exc:
            self._abort(str(exc))
            raise

    def evaluate(self, x: np.ndarray | CudaArray, y: np.ndarray) -> tuple[float, float]:
        return self._on_array_gpu(x).evaluate(x, y)

    def predict_proba(self, x: np.ndarray | CudaArray) -> np.ndarray:
        return self._on_array_gpu(x).predict_proba(x)

    def predict_outputs(self, x: np.ndarray | CudaArray) -> np.ndarray:
        return self._on_array_gpu(x).predict_outputs(x)

    def get_state(self) -> dict[str, np.ndarray]:
        return self.lead.get_state()

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        for i, eng in enumerate(self.replicas):
            try:
                eng.set_state(state)
            except BaseException as exc:
                if i > 0:  # the replicas now hold different weights: they must not train together
                    self._abort(f"{type(exc).__name__} setting the weights of GPU {eng.dev.ordinal}")
                raise

    def profile_step(self, repeats: int = 1000) -> list[tuple[str, float]]:
        raise ConfigError("profile_step times one GPU's nodes; a data-parallel trainer's are collectives")

    def close(self) -> None:
        try:
            for eng in reversed(self.replicas):
                with contextlib.suppress(Exception):  # one replica's failure must not keep the others' memory
                    eng.close()
            # At once, a thread each: destroying a communicator may wait for its peers' (ncclCommFinalize).
            ends = [g.abort if self._broken else g.close for g in self.groups]
            for future in [self._pool.submit(end) for end in ends]:
                with contextlib.suppress(Exception):
                    future.result()
        finally:
            self.replicas, self.groups = [], []
            self._pool.shutdown(wait=False)


class _ReplicaRuns(EpochRuns):
    """The replicas' runs of one fit: each GPU's epoch launched from a thread of its own (NCCL warns that a graph
    launch holding its collectives may block until the peers' launches are made: one thread launching GPU after
    GPU can deadlock); waiting polls every GPU and communicator, so a failure on any GPU stops all of them."""

    def __init__(self, engine: ReplicaEngine, runs: list[EpochRun]) -> None:
        super().__init__(runs)
        self.engine = engine

    def launch(self, k: int) -> None:
        # Releases deferred to the end of each launch: a collection on GPU B's thread could free GPU A's memory,
        # and cuMemFree waits for GPU A, whose queued collectives wait for this very launch of B's.
        futures = [self.engine._pool.submit(deferring(run.launch), k) for run in self.runs]
        try:
            wait(futures)
        except BaseException:  # Ctrl-C: the launches still finish, and epoch k counts as queued if they all did
            wait(futures)
            self._check(futures)
            self.queued = k + 1
            raise
        self._check(futures)
        self.queued = k + 1

    def _check(self, futures: list) -> None:
        for f in futures:
            if f.exception() is not None:
                self._fail(f.exception())

    def _fail(self, error: BaseException) -> None:
        """Stop every GPU (abort the communicators: the queued epochs are cut short) and raise `error`."""
        self.failed = True
        self.engine._abort(f"{type(error).__name__} during training: {error}")
        raise error

    def wait(self, k: int) -> None:
        pending = list(self.runs)
        try:
            while pending:
                pending = [run for run in pending if not run.finished(k)]
                for group in self.engine.groups:
                    error = group.async_error()
                    if error is not None:
                        raise error
                if pending:
                    time.sleep(0.0005)
        except Exception as exc:  # a GPU's error (a failed kernel, a collective): the others would wait forever
            self._fail(exc)
