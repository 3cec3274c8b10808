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
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

import numpy as np

from ..cuda import nccl
from ..errors import ConfigError, DataError, DeviceUnavailable
from ..gpu_arrays import CudaArray
from .base import Engine, EngineConfig, OnEpoch
from .cuda_engine import CudaEngine, EpochRun, drive_epochs

__all__ = ["ReplicaEngine"]

T = TypeVar("T")


class ReplicaEngine(Engine):
    """The graph engine on several GPUs of this process: a replica per GPU, gradients summed by NCCL."""

    device = "cuda"
    name = "graph"

    def __init__(self, config: EngineConfig, state: dict[str, np.ndarray], devices: Sequence[int]) -> None:
        from ..distributed import Group

        self.devices = list(devices)
        self.groups: list[Group] = []
        self.replicas: list[CudaEngine] = []
        self._broken: str | None = None
        ok, reason = nccl.available()
        if not ok:
            raise DeviceUnavailable(f"devices={self.devices!r} needs NCCL: {reason}")
        self._pool = ThreadPoolExecutor(len(self.devices), thread_name_prefix="fastnn-gpu")
        try:
            try:
                comms = nccl.Comm.clique(self.devices)
            except nccl.NcclError as exc:  # NCCL's own message, with the GPUs it was asked for
                exc.args = (f"devices={self.devices!r}: {exc.args[0]}",)
                raise
            world = len(comms)
            self.groups = [Group(rank=r, world=world, device=d, comm=c) for r, (d, c) in enumerate(zip(devices, comms))]
            self.replicas = self._on_each(lambda group: CudaEngine(config, state, group=group), self.groups)
        except BaseException:
            self.close()
            raise

    @property
    def lead(self) -> CudaEngine:
        """The first replica: every replica holds the same weights, so reads come from it."""
        return self.replicas[0]

    def _on_each(self, fn: Callable[..., T], items) -> list[T]:
        """fn(item) for every item at once, a thread each; the results in order. If one raises, every communicator
        is aborted (its peers may be waiting in a collective it will never join) and its error is raised."""
        futures = [self._pool.submit(fn, item) for item in items]
        try:
            wait(futures, return_when=FIRST_EXCEPTION)
        except BaseException as exc:  # Ctrl-C: a GPU may be waiting in a collective for one that stopped
            self._abort(f"{type(exc).__name__} while the GPUs prepared")
            wait(futures)
            raise
        failed = [f for f in futures if f.done() and f.exception() is not None]
        if failed:
            self._abort(f"{type(failed[0].exception()).__name__} on one GPU")
            wait(futures)
            raise failed[0].exception()
        return [f.result() for f in futures]

    def _launch(self, runs: list[EpochRun], k: int) -> None:
        """Queue epoch k on every GPU, each from a thread of its own: NCCL warns that a graph launch holding its
        collectives may block until the peers' launches are made, so one thread launching GPU after GPU can
        deadlock. Interrupted, the launches still finish (the caller then waits for what was queued)."""
        futures = [self._pool.submit(run.launch, k) for run in runs]
        try:
            wait(futures)
        except BaseException:
            wait(futures)
            raise
        failed = [f.exception() for f in futures if f.exception() is not None]
        if failed:
            self._abort(f"{type(failed[0]).__name__} launching an epoch")
            raise failed[0]

    def _abort(self, why: str) -> None:
        """Abort every communicator: training needs new ones (a new Trainer); reading the weights still works."""
        self._broken = why
        for group in self.groups:
            with contextlib.suppress(Exception):
                group.abort()

    def _check_usable(self) -> None:
        if self._broken is not None:
            raise RuntimeError(f"this trainer's GPUs can no longer train together ({self._broken}): their NCCL "
                               "communicators were aborted; save or read its weights, then make a new Trainer")

    # ------------------------------------------------------------------ Engine API
    def _on_array_gpu(self, x: np.ndarray | CudaArray) -> CudaEngine:
        """The replica that reads `x`: the one on its GPU for a GPU array (DataError if none is), else the lead."""
        if not isinstance(x, CudaArray):
            return self.lead
        from ..cuda import driver

        device = driver.pointer_device(x.ptr)
        for eng in self.replicas:
            if eng.dev.ordinal == device:
                return eng
        where = "host or unknown memory" if device is None else f"GPU {device}"
        raise DataError(f"x is {x.describe()} on {where}, but this trainer trains on GPUs {self.devices}")

    def set_train_data(self, x: np.ndarray | CudaArray, y: np.ndarray) -> None:
        self._check_usable()
        # A GPU array is copied device to device by the replica on its GPU; the others get one host copy of it.
        reader = self._on_array_gpu(x)
        host = x.to_host() if isinstance(x, CudaArray) and len(self.replicas) > 1 else x
        self._on_each(lambda eng: eng.set_train_data(x if eng is reader else host, y), self.replicas)

    def fit_epochs(
        self, first_epoch, first_step, lrs, eval_data, eval_after, on_epoch: OnEpoch, stoppable=False, on_step=None
    ) -> None:
        self._check_usable()
        self.last_reported = None
        # One replica evaluates (the weights are the same on all): the one on the GPU of a GPU array's eval data.
        # Its run comes first, the one drive_epochs reports.
        evaluator = self._on_array_gpu(eval_data[0]) if eval_data is not None else self.lead
        order = [evaluator] + [eng for eng in self.replicas if eng is not evaluator]
        runs = self._on_each(
            lambda eng: EpochRun(eng, first_epoch, first_step, lrs, eval_data if eng is evaluator else None,
                                 eval_after),
            order,
        )  # fmt: skip
        try:
            drive_epochs(self, runs, on_epoch, stoppable, launch=lambda k: self._launch(runs, k))
        except nccl.NcclError as exc:
            self._abort(str(exc))
            raise

    def evaluate(self, x: np.ndarray | CudaArray, y: np.ndarray) -> tuple[float, float]:
        return self._on_array_gpu(x).evaluate(x, y)

    def predict_proba(self, x: np.ndarray | CudaArray) -> np.ndarray:
        return self._on_array_gpu(x).predict_proba(x)

    def get_state(self) -> dict[str, np.ndarray]:
        return self.lead.get_state()

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        for eng in self.replicas:
            eng.set_state(state)

    def profile_step(self, repeats: int = 1000) -> list[tuple[str, float]]:
        raise ConfigError("profile_step times one GPU's nodes; a data-parallel trainer's are collectives")

    def close(self) -> None:
        try:
            for eng in reversed(self.replicas):
                eng.close()
            # At once, a thread each: destroying a communicator may wait for its peers' (ncclCommFinalize).
            ends = [g.abort if self._broken else g.close for g in self.groups]
            for future in [self._pool.submit(end) for end in ends]:
                with contextlib.suppress(Exception):
                    future.result()
        finally:
            self.replicas, self.groups = [], []
            self._pool.shutdown(wait=False)
