"""The graph engine's contexts: a resident training set with its buffers, plans and captured epoch graph, and an
evaluation set with its captured forward graph. `epochs.EpochRun` drives a training context through the
`epochs.EpochTrainContext` protocol; the fused engine's context is a subclass (fused/engine.py)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from ..._errors import DataError
from ...cuda import deferring, driver
from ..base import steps_per_epoch
from ..epochs import INFLIGHT_EPOCHS
from ..group import share
from ..placement import choose_placement
from . import kernels, plans, step
from .buffers import Layer, Owner, itemsize

if TYPE_CHECKING:
    from .resources import Resources
    from .upload import DataKey

__all__ = ["EVAL_ROWS", "EvalContext", "TrainContext"]

EVAL_ROWS = 4096  # rows per forward GEMM when evaluating: large batches, few nodes


class TrainContext(Owner):
    """One resident training set with its batch buffers, plans and the captured epoch graph."""

    def __init__(self, res: Resources, x: np.ndarray, y: np.ndarray, key: DataKey) -> None:
        super().__init__()
        self.res = res
        cfg = res.config
        self.n, self.dtype = x.shape[0], x.dtype
        self.labels = res.loss.labels
        B = cfg.batch_size
        self.steps = steps_per_epoch(self.n, B, cfg.drop_last)
        self.samples = self.steps * B if cfg.drop_last else self.n
        self.batch_rows = [min(B, self.n - s * B) for s in range(self.steps)]  # every step's whole batch
        # This rank's part of each batch, by position (all of it on one GPU): offsets into the batch, row counts.
        g = res.group
        parts = [share(r, g.rank, g.world) if g is not None else (0, r) for r in self.batch_rows]
        self.offsets = [o for o, _ in parts]
        self.rows = [m for _, m in parts]
        self.graph = None
        self.capacity = 0
        self.weights = self.w_batch = self.weight_mods = self._weight_mods = None  # a weighted fit's: use_weights
        try:
            buf = lambda nbytes: self.own(driver.DeviceBuffer(max(int(nbytes), 256)))  # noqa: E731
            self.placement = choose_placement(cfg.data_placement, x.nbytes, res.dev.mem_info()[0])
            if self.placement == "host":  # the gather reads rows over the bus: same kernels, same order
                self.x = self.own(driver.MappedHostBuffer(max(int(x.nbytes), 256), res.dev))
            else:
                self.x = buf(x.nbytes)
            self.y = buf(self.n * 4 * res.y_words)
            self.load(x, y, key)
            self.build(buf)
            self.events = [
                (self.own(driver.Event(timing=True)), self.own(driver.Event(timing=True)), self.own(driver.Event()))
                for _ in range(INFLIGHT_EPOCHS + 1)
            ]
        except BaseException:
            self.release()
            raise

    def build(self, buf: Callable) -> None:
        """The graph engine's batch buffers, layer buffers and plans for this set's shapes."""
        res, spec, cfg = self.res, self.res.spec, self.res.config
        R = max(self.rows, default=0) or 1
        self.x_batch = buf(R * cfg.model.in_features * itemsize(spec.operand))
        self.y_batch = buf(R * 4 * res.y_words)  # the batch's labels, or a regression's (R, k) targets
        last = len(cfg.model.layers) - 1
        self.layers = [
            Layer(
                out=buf(R * d_out * itemsize(spec.logits if i == last else spec.operand)),
                dout=buf(R * d_out * itemsize(spec.operand)),
                aux=buf(plans.aux_bytes(res, d_out, R)) if i < last else None,
            )
            for i, (_, d_out) in enumerate(cfg.model.layers)
        ]
        self.probs = None if not res.loss.softmax else buf(R * cfg.model.classes * itemsize(spec.logits))
        self.softmax = {}  # a regression's outputs are linear: no softmax
        for rows in sorted(set(self.rows) - {0}):  # 0: a data-parallel rank's empty share (no GEMMs)
            plans.forward_plans(res, self.layers, rows, training=True, own=self.own)
            plans.backward_plans(res, self.layers, rows, own=self.own)
            if res.loss.softmax:
                self.softmax[rows] = self.own(plans.softmax(res, rows))

    def use_weights(self, weight: np.ndarray | None) -> None:
        """The next fit's row weights (None: unweighted), before its capture: uploaded scaled by n / sum(w), so the
        history's sum of w * loss over the epoch's n rows is the NumPy engine's weighted mean (native/loss.cu's
        wxent says how); the captured epoch is dropped where the fit changes between weighted and unweighted, so
        an unweighted fit replays exactly the graph it always did. Its kernels are compiled here, never in capture."""
        res = self.res
        if weight is not None:
            if self.weights is None:
                R = max(self.rows, default=0) or 1
                files = kernels.weighted_files(res.spec, not res.loss.softmax)
                mods = tuple(kernels.module(res.dev, *f) for f in files)
                self.weights = self.own(driver.DeviceBuffer(max(4 * self.n, 256)))
                self.w_batch = self.own(driver.DeviceBuffer(max(4 * R, 256)))
                self._weight_mods = mods
            w = np.asarray(weight, dtype=np.float64)
            res.upload(self.weights, np.ascontiguousarray(w * (self.n / w.sum()), dtype=np.float32))
        mods = self._weight_mods if weight is not None else None
        if mods is not self.weight_mods and self.graph is not None:
            res.stream.synchronize()  # a queued replay may still run the old graph
            self.drop(self.graph)
            self.graph = None
        self.weight_mods = mods

    def require_resident(self, engine: str) -> None:
        """For an engine whose kernel reads the training set from GPU memory: refuse a set placed in host memory.

        Raises:
            DataError: data_placement="auto" found the set too large for GPU memory.
        """
        if self.placement == "host":
            raise DataError(
                f"the training set ({self.x.nbytes:,} bytes) does not fit in GPU memory, and the {engine} engine reads "
                f"it from there: pass engine='graph', which reads it from host memory (data_placement='host')"
            )

    def load(self, x: np.ndarray, y: np.ndarray, key: DataKey) -> None:
        self.res.upload(self.x, x)
        self.res.upload(self.y, y)
        self.key = key

    def prepare(self, epochs: int, lrs: np.ndarray) -> None:
        """Size and fill the per-step lr table and the per-epoch history for `epochs`; capture once.

        The graph finds both through EpochState, so growing them for a longer fit needs no re-capture.
        """
        res = self.res
        self.reserve(epochs)
        res.stream.synchronize()
        self.lr_table.upload(np.ascontiguousarray(lrs, dtype=np.float32))
        if self.graph is None:
            self.graph = self.own(self.capture_epoch())
            if res.group is not None:  # its collectives keep NCCL from ending the communicator until it is gone
                res.group.comm.hold(self.graph)
                # The communicator keeps it until it ends; a context collected before that frees it with itself.
                weakref.finalize(self, self.graph.close).atexit = False  # the process's end frees it anyway
        self.hist.memset(0, res.stream)

    def reserve(self, epochs: int) -> None:
        """Grow the lr table and history buffers to hold `epochs` (allocation only: the replica engine makes every
        GPU's before any GPU issues a collective, so an out-of-memory leaves no peer waiting in one)."""
        res = self.res
        res.dev.make_current()
        if epochs > self.capacity:
            res.stream.synchronize()
            cap = max(epochs, 2 * self.capacity, 8)
            new = {}
            try:  # all five first: a failed allocation leaves the old ones in place
                new["lr_table"] = driver.DeviceBuffer(cap * self.steps * 4)
                new["hist"] = driver.DeviceBuffer(cap * 16)
                new["hist_host"] = driver.PinnedBuffer(cap * 16)
                new["eval_host"] = driver.PinnedBuffer(cap * 16)
                new["flags_host"] = driver.PinnedBuffer(cap * 4)  # EpochState.bad_state after each epoch
            except BaseException:
                for b in new.values():
                    b.close()
                raise
            for name, b in new.items():
                if hasattr(self, name):
                    self.drop(getattr(self, name))
                setattr(self, name, self.own(b))
            self.capacity = cap

    @deferring  # the autotuning step's all-reduces: see parallel.DataParallel.ranks_min_max
    def capture_epoch(self):
        """Autotune each full-batch plan in step order on real data (no update), then capture the epoch."""
        res = self.res
        res.write_epoch_state(0, 0, self.lr_table.ptr, self.hist.ptr)
        self.hist.memset(0, res.stream)
        step.record_step(self, 0, autotune=True, update=False)
        return res.capture(self.record_epoch)

    def record_epoch(self) -> None:
        """Queue the epoch (captured once by capture_epoch)."""
        step.record_epoch(self)


class EvalContext(Owner):
    """A captured forward-only graph over one evaluation set, in chunks of EVAL_ROWS rows."""

    def __init__(self, res: Resources, x: np.ndarray, y: np.ndarray | None) -> None:
        super().__init__()
        self.res = res
        spec, model = res.spec, res.config.model
        self.n, self.dtype = x.shape[0], x.dtype
        self.rows = [min(EVAL_ROWS, self.n - s) for s in range(0, self.n, EVAL_ROWS)]
        try:
            buf = lambda nbytes: self.own(driver.DeviceBuffer(max(int(nbytes), 256)))  # noqa: E731
            self.x = buf(x.nbytes)
            self.y = buf(self.n * 4 * res.y_words)
            # (loss sum, correct count), then for a regression each output's sum of squared errors (R^2's numerator)
            self.acc = buf(16 + (0 if res.loss.labels else 8 * model.classes))
            R = max(self.rows)
            self.x_batch = buf(R * model.in_features * itemsize(spec.operand))
            # Every row's softmax probabilities, or a regression's outputs (predict reads them).
            self.probs = buf(self.n * model.classes * itemsize(spec.logits))
            last = len(model.layers) - 1
            self.layers = [
                Layer(out=buf(R * d_out * itemsize(spec.logits if i == last else spec.operand)))
                for i, (_, d_out) in enumerate(model.layers)
            ]
            self.softmax = {}
            for rows in set(self.rows):
                plans.forward_plans(res, self.layers, rows, training=False, own=self.own)
                if res.loss.softmax:
                    self.softmax[rows] = self.own(plans.softmax(res, rows))
            self.load(x, y)
            self.graph = self.own(res.capture(self._record))
        except BaseException:
            self.release()
            raise

    def load(self, x: np.ndarray, y: np.ndarray | None) -> None:
        res = self.res
        res.upload(self.x, x)
        if y is None:  # predicting: the loss kernels read zeros
            y = np.zeros(self.n, dtype=np.int32) if res.loss.labels else np.zeros((self.n, res.y_words), np.float32)
        res.upload(self.y, y)

    def _record(self) -> None:
        res = self.res
        classes = res.config.model.classes
        for start, rows in zip(range(0, self.n, EVAL_ROWS), self.rows):
            kernels.record_gather(res, self.x, self.y, self.n, self.dtype, start, rows, self.x_batch, 0, False)
            for _, queue in step.forward_nodes(res, self.layers, self.x_batch.ptr, rows):
                queue()
            out = self.layers[-1].out.ptr
            probs = self.probs.ptr + start * classes * itemsize(res.spec.logits)
            if not res.loss.softmax:  # the outputs themselves are the predictions
                driver.copy_dtod(probs, out, rows * classes * itemsize(res.spec.logits), res.stream)
                kernels.record_mse(res, out, self.y.ptr + 4 * classes * start, rows, 0, 0, self.acc.ptr,
                                   self.acc.ptr + 16, 0)  # fmt: skip
                continue
            self.softmax[rows].forward(out, probs)
            kernels.record_loss(res, out, probs, self.y.ptr + 4 * start, rows, 0, 0, self.acc.ptr, 0)

    def run(self, out_ptr: int, sse_ptr: int = 0) -> None:
        """Queue: zero the sums, replay the forward graph, copy (loss sum, correct) to pinned `out_ptr`; for a
        regression with sse_ptr, each output's sum of squared errors (k float64) to pinned `sse_ptr` too."""
        res = self.res
        self.acc.memset(0, res.stream)
        self.graph.launch(res.stream)
        driver.copy_dtoh(out_ptr, self.acc.ptr, 16, res.stream)
        if sse_ptr:
            driver.copy_dtoh(sse_ptr, self.acc.ptr + 16, 8 * res.config.model.classes, res.stream)
