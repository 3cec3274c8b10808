"""`ManyGpuEngine`: K models of one MLP trained on one GPU, each epoch one CUDA graph of native/many.cu's kernels.

The device holds every model's parameters, optimizer state and gradients in blocks of one layout (`layout.py`),
the training set once (each mask group a table of its rows), and per pass the streams (a group at one epoch index)
with the model -> stream map, so a minibatch shared by models is gathered once. Each epoch: the tables and the
learning rates are uploaded, the state is snapshotted, the captured epoch replays, and a check kernel flags the
models whose state is not finite; `fastnn/_state.py` decides for each flagged model, and a diverged model alone goes
back to its snapshot. Everything is fp32 whatever the precision (docs/design/many-models.md).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable

import numpy as np

from ...._data import input_affine
from ...._errors import ConfigError, TrainingDiverged
from ...._loss import describe
from ...._optim import KIND_SGD
from ...._shuffle import split_u64
from ...._state import state_problem
from ....cuda import cublaslt, driver, nvrtc
from ...base import EpochStats
from ...graph.buffers import Owner
from ...numpy_engine import r2_score, softmax
from ..base import ManyConfig, ManyEngine, ManyEpoch
from ..plan import Streams, streams
from . import kernels, layout
from .layout import StreamTables, rows_at, stream_tables

__all__ = ["MAX_GPU_MODELS", "ManyGpuEngine"]

#: The most models one GPU engine trains: its kernels put the model in a grid dimension of at most 65,535 blocks.
MAX_GPU_MODELS = 65_535


class _DataSet:
    """A data set on the device: x as given (uint8 or float32), y as 32-bit words, and its groups' row tables."""

    def __init__(self, eng: ManyGpuEngine, x: np.ndarray, y: np.ndarray, rows: list[np.ndarray] | None) -> None:
        self.source = (x, y, rows)  # kept: the identity that says the set is already here
        self.group, groups = layout.row_groups(rows, eng.config.count, x.shape[0])
        self.groups = groups
        self.tables = layout.group_tables(groups)
        self.dtype = x.dtype
        self.n = x.shape[0]
        self._res = Owner()
        own = self._res.own
        try:
            words = np.ascontiguousarray(y).view(np.uint32).reshape(x.shape[0], -1)
            self.x = own(driver.DeviceBuffer(x.nbytes))
            self.y = own(driver.DeviceBuffer(words.nbytes))
            self.rows = own(driver.DeviceBuffer(self.tables.rows.nbytes))
            self.offsets = own(driver.DeviceBuffer(self.tables.offsets.nbytes))
            self.group_n = own(driver.DeviceBuffer(self.tables.n.nbytes))
            self.group_half = own(driver.DeviceBuffer(self.tables.half.nbytes))
            for buf, arr in ((self.x, x), (self.y, words), (self.rows, self.tables.rows),
                             (self.offsets, self.tables.offsets), (self.group_n, self.tables.n),
                             (self.group_half, self.tables.half)):  # fmt: skip
                buf.upload(np.ascontiguousarray(arr))
        except BaseException:
            self._res.release()
            raise

    def same(self, x: np.ndarray, y: np.ndarray, rows: list[np.ndarray] | None) -> bool:
        """Whether (x, y, rows) is the set already here: x the same array (as the GPU engines know a training set:
        by identity, docs/guide/data.md), y and the rows equal (each fit checks y into a new array, and masks into
        new row lists)."""
        sx, sy, srows = self.source
        if sx is not x or not (sy is y or (sy.shape == y.shape and np.array_equal(sy, y))):
            return False
        if srows is None or rows is None:
            return srows is rows
        return len(srows) == len(rows) and all(a is b or np.array_equal(a, b) for a, b in zip(srows, rows))

    def close(self) -> None:
        self._res.release()


class ManyGpuEngine(ManyEngine):
    """device="cuda": K models in one CUDA graph per epoch (fp32 kernels of native/many.cu)."""

    device = "cuda"
    name = "gpu"

    def __init__(self, config: ManyConfig, states: list[dict[str, np.ndarray]], ordinal: int = 0) -> None:
        if config.count > MAX_GPU_MODELS:
            raise ConfigError(f"models={config.count:,}: the GPU engine trains at most {MAX_GPU_MODELS:,} models at "
                              f"once (a CUDA grid dimension holds the model); split them over several MultiTrainers")
        self.config = config
        model = config.model
        self.count = config.count
        self.regression = not describe(config.loss).labels  # float targets: no accuracy, R^2 (fastnn/_loss.py)
        self.layout = layout.model_layout(model, config.count)
        self.y_words = model.classes if self.regression else 1
        names = set()
        for opt in config.optimizers:
            names.update(opt.state_names)
        #: The optimizer state arrays on the device, in optim.cuh's order (s1, s2): those any model keeps.
        self.state_arrays = tuple(n for n in ("momentum", "exp_avg", "exp_avg_sq") if n in names)
        self._res = Owner()
        self._graphs: dict[tuple[int, int], driver.GraphExec] = {}
        self._train: _DataSet | None = None
        self._eval: _DataSet | None = None
        self._xb_streams = 0
        self._lr_steps = 0
        #: Layer 0 of all models as one cuBLASLt GEMM in epochs of one stream (forward, and weight gradient with
        #: BGRADB); False: the per-model kernels everywhere. Turned off for good if cuBLASLt refuses the plans.
        self.fast_layer0 = True
        self._lt: cublaslt.Handle | None = None
        self._workspace: cublaslt.Workspace | None = None
        self._fast: dict[str, dict[int, cublaslt.Matmul]] = {"forward": {}, "wgrad": {}, "forward_raw": {},
                                                             "wgrad_acc": {}}  # fmt: skip
        #: Opt-in (benchmarks/bench_many.py --fold): where layer 0 is one GEMM and every model takes plain SGD (no
        #: momentum), fold layer 0's update into its weight-gradient GEMM (native/many.cu's many_fold_sgd): the
        #: weights are read and written once a step and no gradient is stored. Same math, other roundings.
        self.fold_sgd = False
        own = self._res.own
        try:
            self.dev = driver.get_device(ordinal)
            self.dev.make_current()
            self.stream = own(driver.Stream(self.dev))
            self.mod = own(driver.Module(nvrtc.compile_native("many.cu", self.dev.arch), self.dev))
            for name in kernels.KERNELS:  # looked up now: never during a capture
                self.mod.function(name)
            k, batch, lay = self.count, config.batch_size, self.layout
            self.array_bytes = lay.total * 4  # one state array: parameters, gradients, or one optimizer state
            self.state = own(driver.DeviceBuffer(self.array_bytes * (1 + len(self.state_arrays))))
            self.snapshot = own(driver.DeviceBuffer(self.state.nbytes))
            self.grads = own(driver.DeviceBuffer(self.array_bytes))
            self.state.memset(0)
            self.grads.memset(0)
            self.starts = own(driver.DeviceBuffer(8 * len(lay.starts)))
            self.starts.upload(np.array(lay.starts, dtype=np.uint64))
            self.block_sizes = own(driver.DeviceBuffer(4 * len(lay.sizes)))
            self.block_sizes.upload(np.array(lay.sizes, dtype=np.uint32))
            widths = model.sizes[1:]
            self.z = [own(driver.DeviceBuffer(k * batch * w * 4)) for w in widths]
            self.dz = [own(driver.DeviceBuffer(k * batch * w * 4)) for w in widths]
            self.hist = own(driver.DeviceBuffer(k * 16))
            self.eval_hist = own(driver.DeviceBuffer(k * 16))
            self.sse = own(driver.DeviceBuffer(k * model.classes * 8))
            self.bad = own(driver.DeviceBuffer(k * 4))
            self.wscale = own(driver.DeviceBuffer(k * 4))  # layer 0's weight scales under fold_sgd
            self.opt = own(driver.DeviceBuffer(k * layout.optim_records(config.optimizers).itemsize))
            self.opt.upload(layout.optim_records(config.optimizers))
            self.step0 = own(driver.DeviceBuffer(k * 8))
            self.model_stream = own(driver.DeviceBuffer(k * 4))
            self.stream_group = own(driver.DeviceBuffer(k * 4))  # at most one stream a model
            self.stream_epoch = own(driver.DeviceBuffer(k * 4))
            self.xb = self.yb = self.lr = None
            self.feature_affine: dict[np.dtype, driver.DeviceBuffer] = {}
            norm = config.normalize
            if norm is not None and np.ndim(norm[0]) + np.ndim(norm[1]):
                for dt in (np.dtype(np.uint8), np.dtype(np.float32)):
                    scale, shift = input_affine(dt, norm)
                    table = np.concatenate([np.broadcast_to(v, (model.in_features,)) for v in (scale, shift)])
                    self.feature_affine[dt] = own(driver.DeviceBuffer(table.size * 4))
                    self.feature_affine[dt].upload(table.astype(np.float32))
            self._ensure(1, 1)
            for j, s in enumerate(states):
                self.set_state(j, s)
        except BaseException:
            self._res.release()
            raise

    # ---- buffers ------------------------------------------------------------------------------------------------

    def _ensure(self, n_streams: int, steps: int) -> None:
        """Room for n_streams batches and a (K, steps) lr table; a new buffer drops the captured graphs (they hold
        the old addresses)."""
        cfg = self.config
        if n_streams > self._xb_streams:
            self._drop_graphs()
            for buf in (self.xb, self.yb):
                if buf is not None:
                    self._res.drop(buf)
            self.xb = self._res.own(driver.DeviceBuffer(n_streams * cfg.batch_size * cfg.model.in_features * 4))
            self.yb = self._res.own(driver.DeviceBuffer(n_streams * cfg.batch_size * self.y_words * 4))
            self._xb_streams = n_streams
        if steps > self._lr_steps:
            self._drop_graphs()
            if self.lr is not None:
                self._res.drop(self.lr)
            self.lr = self._res.own(driver.DeviceBuffer(self.count * steps * 4))
            self._lr_steps = steps

    def _drop_graphs(self) -> None:
        for g in self._graphs.values():
            g.close()
        self._graphs.clear()

    def _net(self) -> kernels.Net:
        cfg, lay = self.config, self.layout
        arrays = [self.state.ptr + i * self.array_bytes for i in range(1 + len(self.state_arrays))]
        s1 = arrays[1] if len(arrays) > 1 else 0  # optim.cuh's s1: momentum, or AdamW's exp_avg
        s2 = arrays[2] if len(arrays) > 2 else 0  # exp_avg_sq
        return kernels.Net(
            mod=self.mod, stream=self.stream, sm_count=self.dev.sm_count, models=self.count, batch=cfg.batch_size,
            sizes=cfg.model.sizes, activation=cfg.model.activation, regression=self.regression,
            w_offsets=tuple(lay.starts[0:-1:2]), b_offsets=tuple(lay.starts[1:-1:2]), starts=self.starts.ptr,
            block_sizes=self.block_sizes.ptr, per_model_sizes=lay.sizes, tensors=len(lay.sizes), total=lay.total,
            params=arrays[0], s1=s1, s2=s2, grads=self.grads.ptr, z=tuple(b.ptr for b in self.z),
            dz=tuple(b.ptr for b in self.dz), xb=self.xb.ptr, yb=self.yb.ptr, y_words=self.y_words,
            seed=split_u64(cfg.shuffle_seed), opt=self.opt.ptr, lr=self.lr.ptr, lr_stride=self._lr_steps,
            step0=self.step0.ptr, fast=self._fast, wscale=self.wscale.ptr, loss_tile=self._loss_tile(),
            update_kernel=kernels.UPDATE_KERNELS[cfg.tuning.many_update_kernel],
        )  # fmt: skip

    def _loss_tile(self) -> int:
        """Models a block of many_xent_tiled where Tuning.many_loss_kernel asks for it (a classifier), else 0."""
        if self.regression or self.config.tuning.many_loss_kernel != "tiled":
            return 0
        return kernels.xent_tile(self.count, self.config.model.classes, self.dev.sm_count)

    def _folding(self) -> bool:
        """Whether epochs of one stream fold layer 0's update into its GEMM: fold_sgd, and plain SGD for all."""
        return self.fold_sgd and all(
            (p := o.kernel_params()).kind == KIND_SGD and p.momentum == 0 for o in self.config.optimizers
        )  # through kernel_params, as every GPU engine knows the optimizers (no class names)

    def _fast_rows(self, tables: kernels.StepTables, group_n: int, steps: int, drop_last: bool | None = None
                   ) -> list[int]:  # fmt: skip
        """Rows of each step for layer 0's cuBLASLt GEMMs (all 0: the per-model kernels), their plans made now
        (before any capture): a pass of one stream only, while `fast_layer0` holds. drop_last: the pass's (None:
        training's; evaluation and prediction keep every row)."""
        if tables.streams != 1 or not self.fast_layer0:
            return [0] * steps
        cfg = self.config
        last = cfg.drop_last if drop_last is None else drop_last
        rows = [layout.rows_at(group_n, s, cfg.batch_size, last) for s in range(steps)]
        try:
            for r in set(rows) - {0}:
                self._fast_plans(r)
        except cublaslt.CublasError as exc:  # no algorithm for these shapes here: the kernels serve
            self._no_fast_layer0(exc)
            return [0] * steps
        return rows

    def _fast_plans(self, rows: int) -> None:
        """The cuBLASLt plans of layer 0 for `rows` rows: Z (rows, K * out) = X W0^T + b0 (column-major: Z^T =
        W0cat X^T, W0cat read transposed), and dW0cat = X^T dZ read as D (in, K * out) with db0 = dZ's column
        sums (BGRADB). fp32 data; TF32 tensor cores unless precision="fp32"."""
        if rows in self._fast["forward"] and (rows in self._fast["forward_raw"] or not self._folding()):
            return
        lt = cublaslt
        if self._lt is None:
            self._lt = self._res.own(lt.Handle(self.dev))
            self._workspace = self._res.own(lt.Workspace(32 << 20, self.dev))
        d, out = self.config.model.sizes[0], self.config.model.sizes[1]  # layer 0: (K * out, d) weights
        m = self.count * out
        tf32 = self.config.precision != "fp32"
        compute = lt.ComputeType.COMPUTE_32F_FAST_TF32 if tf32 else lt.ComputeType.COMPUTE_32F
        f32 = lt.DataType.R_32F
        fwd = lt.Matmul(self._lt, m, rows, d, transa=True, transb=False, ab_type=f32, cd_type=f32, compute=compute,
                        lda=d, ldb=d, ldc=m, epilogue=lt.Epilogue.BIAS, workspace=self._workspace)  # fmt: skip
        self._res.own(fwd)
        wgrad = lt.Matmul(self._lt, d, m, rows, transa=False, transb=True, ab_type=f32, cd_type=f32, compute=compute,
                          lda=d, ldb=m, ldc=d, epilogue=lt.Epilogue.BGRADB, workspace=self._workspace)  # fmt: skip
        self._res.own(wgrad)
        self._fast["forward"][rows] = fwd
        self._fast["wgrad"][rows] = wgrad
        if self._folding():  # X V^T without the bias (many_scale_bias adds it), and V += -(dZ')^T X in place
            self._fast["forward_raw"][rows] = self._res.own(lt.Matmul(
                self._lt, m, rows, d, transa=True, transb=False, ab_type=f32, cd_type=f32, compute=compute, lda=d,
                ldb=d, ldc=m, workspace=self._workspace))  # fmt: skip
            self._fast["wgrad_acc"][rows] = self._res.own(lt.Matmul(
                self._lt, d, m, rows, transa=False, transb=True, ab_type=f32, cd_type=f32, compute=compute, lda=d,
                ldb=m, ldc=d, workspace=self._workspace))  # fmt: skip
        if self.config.tuning.many_autotune:
            self._autotune_fast(rows)

    def _autotune_fast(self, rows: int) -> None:
        """Time cuBLASLt's heuristic candidates of layer 0's plans for `rows` rows and keep the fastest
        (Tuning.many_autotune), on the engine's buffers: activations and gradients as scratch, and the folded
        update's accumulating GEMM onto the gradient array, never onto the weights."""
        w_off, b_off = self.layout.starts[0], self.layout.starts[1]
        w0, b0 = self.state.ptr + 4 * w_off, self.state.ptr + 4 * b_off
        g0, gb0 = self.grads.ptr + 4 * w_off, self.grads.ptr + 4 * b_off
        xb, z0, dz0, fast = self.xb.ptr, self.z[0].ptr, self.dz[0].ptr, self._fast
        fast["forward"][rows].autotune(w0, xb, 0, z0, self.stream, bias=b0)
        fast["wgrad"][rows].autotune(xb, dz0, 0, g0, self.stream, bias=gb0)
        if rows in fast["forward_raw"]:
            fast["forward_raw"][rows].autotune(w0, xb, 0, z0, self.stream)
            fast["wgrad_acc"][rows].autotune(xb, dz0, g0, g0, self.stream, alpha=-1.0, beta=1.0)

    def _tables(self, data: _DataSet, n_streams: int) -> kernels.StepTables:
        scale, shift = input_affine(data.dtype, self.config.normalize)
        table = self.feature_affine.get(np.dtype(data.dtype))
        if table is not None:
            scale, shift, fscale, fshift = 1.0, 0.0, table.ptr, table.ptr + 4 * self.config.model.in_features
        else:
            fscale = fshift = 0
        return kernels.StepTables(
            x=data.x.ptr, y=data.y.ptr, x_u8=data.dtype == np.uint8, scale=float(scale), shift=float(shift),
            fscale=fscale, fshift=fshift, rows=data.rows.ptr, group_offsets=data.offsets.ptr, group_n=data.group_n.ptr,
            group_half=data.group_half.ptr, model_stream=self.model_stream.ptr, stream_group=self.stream_group.ptr,
            stream_epoch=self.stream_epoch.ptr, streams=n_streams,
        )  # fmt: skip

    def _upload_streams(self, st: StreamTables) -> None:
        self.model_stream.upload(st.model_stream)
        self.stream_group.upload(st.stream_group)
        self.stream_epoch.upload(st.stream_epoch)

    # ---- training -------------------------------------------------------------------------------------------------

    def set_train_data(self, x: np.ndarray, y: np.ndarray, rows: list[np.ndarray] | None) -> None:
        self.dev.make_current()  # engines are entered from any thread (a search's worker)
        if self._train is not None and self._train.same(x, y, rows):
            return
        self._drop_graphs()
        if self._train is not None:
            self._train.close()
            self._train = None
        self._train = _DataSet(self, x, y, rows)

    def prepare_epoch(self, active: np.ndarray, epochs: np.ndarray, steps: np.ndarray,
                      lrs: list[np.ndarray | None]) -> tuple[kernels.StepTables, int]:  # fmt: skip
        """Upload an epoch's streams, learning rates and step counters, and zero its sums; (tables, steps)."""
        cfg, data = self.config, self._train
        if data is None:
            raise RuntimeError("set_train_data must be called before fit_epoch")
        st = stream_tables(streams(data.group, epochs, active), data.tables, cfg.batch_size, cfg.drop_last)
        n_streams, n_steps = max(1, st.count), max(1, st.steps)
        self._ensure(n_streams, n_steps)
        self._upload_streams(st)
        self.lr.upload(layout.lr_rows(lrs, active, self._lr_steps))  # type: ignore[union-attr]
        self.step0.upload(np.asarray(steps, dtype=np.uint64))
        self.hist.memset(0)
        self.bad.memset(0)
        self.wscale.upload(np.ones(self.count, dtype=np.float32))
        return self._tables(data, n_streams), n_steps

    def timing_event(self) -> driver.Event:
        """A CUDA event that records time, on this engine's device."""
        return driver.Event(timing=True, device=self.dev)

    def time_captured(self, record: Callable[[], None]) -> float:
        """Milliseconds of one replay of what `record()` queues on the engine's stream, captured in a graph."""
        self.dev.make_current()
        return driver.time_captured(self.stream, record)

    def profile_step(self, step: int = 0, repeats: int = 20, graphed: bool = False) -> dict[str, float]:
        """Microseconds of each node of one training step (`profile.profile_step`; graphed: device time only)."""
        from .profile import profile_step

        return profile_step(self, step, repeats, graphed)

    def _epoch_graph(self, tables: kernels.StepTables, steps: int, group_n: int) -> driver.GraphExec:
        """The captured epoch for these tables: from the cache, or recorded now (with the per-model kernels if
        cuBLASLt fails to record layer 0's GEMMs)."""
        fast = self._fast_rows(tables, group_n, steps)
        try:
            return self._captured_epoch(tables, steps, fast)
        except cublaslt.CublasError as exc:
            if not any(fast):
                raise
            self._no_fast_layer0(exc)
            return self._captured_epoch(tables, steps, [0] * steps)

    def _captured_epoch(self, tables: kernels.StepTables, steps: int, fast: list[int]) -> driver.GraphExec:
        fold = self._folding() and any(fast)
        key = (tables.streams, steps, tuple(fast), fold)
        graph = self._graphs.get(key)
        if graph is None:
            # The tables' contents change from epoch to epoch; their addresses, which the graph holds, do not.
            net = self._net()
            self.stream.begin_capture()
            try:
                for s in range(steps):
                    kernels.record_step(net, tables, s, self.config.drop_last, self.hist.ptr, fast[s], fold)
                if fold:  # the weights themselves again, before the check, the snapshot's restore, evaluation
                    kernels.record_unscale(net)
            except BaseException:
                with contextlib.suppress(Exception):  # the recording's error is the one to report
                    self.stream.end_capture().close()
                raise
            captured = self.stream.end_capture()
            try:
                graph = self._graphs[key] = captured.instantiate()
            finally:
                captured.close()
        return graph

    def _no_fast_layer0(self, exc: Exception) -> None:
        """cuBLASLt refused layer 0's GEMMs: go on with the per-model kernels, saying so once."""
        self.fast_layer0 = False
        warnings.warn(f"the many-model GPU engine's layer-0 GEMM failed ({exc}); it trains with its per-model "
                      f"kernels instead (slower, same results)", RuntimeWarning, stacklevel=4)  # fmt: skip

    def fit_epoch(
        self,
        active: np.ndarray,
        epochs: np.ndarray,
        steps: np.ndarray,
        lrs: list[np.ndarray | None],
        eval_data: tuple[np.ndarray, np.ndarray] | None,
        eval_rows: list[np.ndarray] | None,
    ) -> ManyEpoch:
        if self._train is None:
            raise RuntimeError("set_train_data must be called before fit_epoch")
        self.dev.make_current()
        cfg, k_all, data = self.config, self.count, self._train
        tables, n_steps = self.prepare_epoch(active, epochs, steps, lrs)
        first = int(np.flatnonzero(active)[0]) if active.any() else 0
        graph = self._epoch_graph(tables, n_steps, int(data.tables.n[data.group[first]]))
        start, end = self.timing_event(), self.timing_event()
        try:
            driver.copy_dtod(self.snapshot.ptr, self.state.ptr, self.state.nbytes, self.stream)
            start.record(self.stream)
            graph.launch(self.stream)
            end.record(self.stream)
            kernels.record_check(self._net(), cfg.precision in ("mixed", "fp16"), self.bad.ptr)
            self.stream.synchronize()
            seconds = start.elapsed_ms(end) / 1e3
        finally:
            start.close()
            end.close()
        hist = self.hist.download(np.empty((k_all, 2), dtype=np.float64))
        bad = self.bad.download(np.empty(k_all, dtype=np.uint32))
        out = ManyEpoch(stats=[None] * k_all, diverged=[None] * k_all)
        trained = np.zeros(k_all, dtype=bool)
        for k in np.flatnonzero(active):
            k = int(k)
            seen = layout.samples(int(data.tables.n[data.group[k]]), n_steps, cfg.batch_size, cfg.drop_last)
            loss = hist[k, 0] / seen
            problem = None
            if math.isfinite(loss) and bad[k]:
                problem = state_problem(self.get_state(k), cfg.precision)
            if not math.isfinite(loss) or problem is not None:
                self._restore(k)
                out.diverged[k] = TrainingDiverged(int(epochs[k]) + 1, loss, problem)
                continue
            accuracy = None if self.regression else hist[k, 1] / seen
            out.stats[k] = EpochStats(epoch=int(epochs[k]), loss=float(loss), accuracy=accuracy, samples=seen,
                                      seconds=seconds)  # fmt: skip
            trained[k] = True
        if eval_data is not None and trained.any():
            results = self._evaluate(self._eval_set(*eval_data, eval_rows), trained)
            for k in np.flatnonzero(trained):
                e_loss, e_score = results[int(k)]
                stats = out.stats[int(k)]
                stats.eval_loss = e_loss  # type: ignore[union-attr]
                stats.eval_accuracy = None if self.regression else e_score  # type: ignore[union-attr]
        return out

    def _restore(self, k: int) -> None:
        """Model k's parameters and optimizer state back to the epoch's snapshot."""
        for i in range(1 + len(self.state_arrays)):
            for name, size in zip(self.layout.names, self.layout.sizes):
                at = i * self.array_bytes + 4 * self.layout.at(name, k)
                driver.copy_dtod(self.state.ptr + at, self.snapshot.ptr + at, 4 * size, self.stream)
        self.stream.synchronize()

    # ---- evaluation and prediction ----------------------------------------------------------------------------

    def _eval_set(self, x: np.ndarray, y: np.ndarray, rows: list[np.ndarray] | None) -> _DataSet:
        if self._eval is None or not self._eval.same(x, y, rows):
            if self._eval is not None:
                self._eval.close()
                self._eval = None
            self._eval = _DataSet(self, x, y, rows)
        return self._eval

    def _pass_tables(self, data: _DataSet, models: np.ndarray) -> tuple[kernels.StepTables, list[int]]:
        """Upload a pass in order over `data` for the models in `models` (each group one stream); (tables, each
        step's rows for layer 0's one GEMM, 0 where the kernels serve: see _fast_rows)."""
        groups = np.arange(len(data.groups), dtype=np.int64)
        plan = Streams(group=groups, epoch=np.zeros_like(groups), of_model=np.where(models, data.group, -1))
        st = stream_tables(plan, data.tables, self.config.batch_size, False)
        self._ensure(st.count, 1)
        self._upload_streams(st)
        tables = self._tables(data, st.count)
        return tables, self._fast_rows(tables, int(data.tables.n[0]), st.steps, drop_last=False)

    def _evaluate(self, data: _DataSet, models: np.ndarray) -> list[tuple[float, float]]:
        """(loss, accuracy) or (mse, r2) of each model in `models` on its rows of `data` (others: NaN)."""
        tables, fast = self._pass_tables(data, models)
        net = self._net()
        self.eval_hist.memset(0)
        self.sse.memset(0)
        try:
            for s in range(len(fast)):
                kernels.record_forward(net, tables, s, False, False, fast[s])
                kernels.record_loss(net, tables, s, False, False, self.eval_hist.ptr, 0,
                                    self.sse.ptr if self.regression else 0)  # fmt: skip
        except cublaslt.CublasError as exc:
            if not any(fast):
                raise
            self._no_fast_layer0(exc)
            return self._evaluate(data, models)  # the pass again, with the kernels
        self.stream.synchronize()
        hist = self.eval_hist.download(np.empty((self.count, 2), dtype=np.float64))
        c = self.config.model.classes
        sse = self.sse.download(np.empty((self.count, c), dtype=np.float64)) if self.regression else None
        y = data.source[1]
        out: list[tuple[float, float]] = []
        for k in range(self.count):
            if not models[k]:
                out.append((math.nan, math.nan))
                continue
            rows = data.groups[data.group[k]]
            if self.regression:
                out.append((float(sse[k].sum() / (rows.size * c)), r2_score(sse[k], y[rows])))  # type: ignore[index]
            else:
                out.append((float(hist[k, 0] / rows.size), float(hist[k, 1] / rows.size)))
        return out

    def evaluate(self, x: np.ndarray, y: np.ndarray, rows: list[np.ndarray] | None) -> list[tuple[float, float]]:
        self.dev.make_current()  # engines are entered from any thread (a search's worker)
        data = _DataSet(self, x, y, rows)
        try:
            return self._evaluate(data, np.ones(self.count, dtype=bool))
        finally:
            data.close()

    def predict_outputs(self, x: np.ndarray) -> np.ndarray:
        self.dev.make_current()  # engines are entered from any thread (a search's worker)
        c, batch = self.config.model.classes, self.config.batch_size
        y = np.zeros((x.shape[0], self.y_words), dtype=np.uint32)
        data = _DataSet(self, x, y, None)
        try:
            tables, fast = self._pass_tables(data, np.ones(self.count, dtype=bool))
            net = self._net()
            out = np.empty((self.count, x.shape[0], c), dtype=np.float32)
            chunk = np.empty((batch, self.count, c), dtype=np.float32)  # (batch, K, outputs): the activations' layout
            for s in range(len(fast)):
                try:
                    kernels.record_forward(net, tables, s, False, False, fast[s])
                except cublaslt.CublasError as exc:
                    if not fast[s]:
                        raise
                    self._no_fast_layer0(exc)
                    fast = [0] * len(fast)
                    kernels.record_forward(net, tables, s, False, False, 0)
                self.stream.synchronize()
                self.z[-1].download(chunk)
                rows = rows_at(x.shape[0], s, batch, False)
                out[:, s * batch : s * batch + rows] = chunk[:rows].transpose(1, 0, 2)
            return out
        finally:
            data.close()

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        logits = self.predict_outputs(x).astype(np.float64)
        k, n, c = logits.shape
        with np.errstate(over="ignore", invalid="ignore"):
            return softmax(logits.reshape(k * n, c)).reshape(k, n, c).astype(np.float32)

    # ---- state ------------------------------------------------------------------------------------------------

    def get_state(self, k: int) -> dict[str, np.ndarray]:
        self.dev.make_current()  # engines are entered from any thread (a search's worker)
        lay, opt = self.layout, self.config.optimizers[k]
        arrays = [(0, "")] + [(1 + i, f"opt.{n}.") for i, n in enumerate(self.state_arrays) if n in opt.state_names]
        state: dict[str, np.ndarray] = {}
        for array, prefix in arrays:
            for name, shape, size in zip(lay.names, lay.shapes, lay.sizes):
                value = np.empty(size, dtype=np.float32)
                self.state.download(value, offset=array * self.array_bytes + 4 * lay.at(name, k))
                state[prefix + name] = value.reshape(shape)
        return state

    def set_state(self, k: int, state: dict[str, np.ndarray]) -> None:
        self.dev.make_current()  # engines are entered from any thread (a search's worker)
        for key, value in state.items():
            array, name = 0, key
            if key.startswith("opt."):
                s, name = key[4:].split(".", 1)
                if s not in self.state_arrays:
                    continue
                array = 1 + self.state_arrays.index(s)
            at = array * self.array_bytes + 4 * self.layout.at(name, k)
            self.state.upload(np.ascontiguousarray(value, dtype=np.float32).reshape(-1), offset=at)

    def close(self) -> None:
        self.dev.make_current()
        self._drop_graphs()
        for data in (self._train, self._eval):
            if data is not None:
                data.close()
        self._train = self._eval = None
        self._res.release()
