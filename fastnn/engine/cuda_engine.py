"""The GPU engine: every step of an epoch recorded once into a CUDA graph, then replayed.

One training step, all on one stream: gather (NVRTC kernel, the shuffle computed on the device) ->
per layer a cuBLASLt GEMM with bias and activation fused in its epilogue -> cuDNN softmax -> the
fused loss kernel (loss, accuracy, logits gradient) -> per layer the weight-gradient GEMM (bias
gradient fused, BGRADB) and the input-gradient GEMM (activation and bias gradients fused) -> one
fused update kernel over all parameters. The epoch graph ends with a snapshot of the training state
(while the loss stays finite) and a counter advance, so replays need no host work between them and
a divergence falls back to the last finite epoch. Everything that can fail or query (plans,
heuristics, autotuning, kernel loading) happens before capture.

Row-major (rows, d) arrays are used as column-major (d, rows) matrices throughout, so a layer's
forward is Z^T = W @ H^T with W in torch's (out, in) layout read as transposed.
"""

from __future__ import annotations

import contextlib
import threading
import time
import weakref
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..cuda import _capture, nccl  # nccl: the module only, NCCL itself loads on first use (optional)
from ..cuda.driver import arg_f32, arg_i32, arg_ptr, arg_struct, arg_u32, arg_u64
from ..data import input_affine
from ..distributed import share
from ..errors import ConfigError
from ..gpu_arrays import CudaArray, check_on_device
from ..shuffle import feistel_bits, split_u64
from .base import PRECISIONS, Engine, EngineConfig, OnEpoch, steps_per_epoch
from .epochs import EPOCH_STATE_DTYPE, INFLIGHT_EPOCHS, EpochRun, EpochRuns, drive_epochs, hold_ctrl_c
from .placement import choose_placement
from .plan import ParamLayout, PrecisionSpec, gelu_aux_ld, param_layout, precision_spec, relu_aux_ld

__all__ = ["CudaEngine"]

GATHER_THREADS = 256  # native/gather.cuh: a block per batch row (UPDATE_THREADS too: update.cu fuses both)
UPDATE_THREADS = 256
EVAL_ROWS = 4096  # rows per forward GEMM when evaluating: large batches, few nodes
#: Where hidden layers' bias gradients come from: "wgrad" (a BGRADB epilogue on the weight-gradient
#: GEMM) or "kernel" (a column-sum kernel node). benchmarks/bench_kernels.py --hidden-bgrad compares them.
HIDDEN_BIAS_GRAD = "wgrad"
#: Whether a data-parallel engine's all-reduces run at the device's highest stream priority (so their kernels take
#: SMs as a GEMM's blocks retire instead of queuing behind the next GEMM's); benchmarks/bench_scaling.py
#: --comm-priority compares.
COMM_HIGH_PRIORITY = False
#: SMs that a data-parallel engine's backward GEMMs leave free (cuBLASLt's SM_COUNT_TARGET) for the all-reduces that
#: run beside them: NCCL's blocks otherwise wait for a GEMM's persistent grid to finish. 0: every SM.
#: benchmarks/bench_scaling.py --carveout compares.
GEMM_SM_CARVEOUT = 0
#: Whether a data-parallel engine shards the optimizer update (as ZeRO stage 1): each layer's gradient is
#: reduce-scattered instead of all-reduced, each rank updates its part of the layer and all-gathers the part the
#: GEMMs read, and each epoch ends by all-gathering the master weights and optimizer state, so the host finds the
#: whole state on every rank, as without sharding. The update, which does not shrink with a rank's share of the
#: batch, then shrinks with the world size. benchmarks/bench_scaling.py --sharded compares.
SHARDED_UPDATE = False
AUTOTUNE_ALGOS = 16  # heuristic candidates each plan keeps; autotune times them on the real shapes
WORKSPACE_BYTES = 32 << 20  # cuBLASLt workspace: room for split-K on skinny shapes (Hopper)

_modules_lock = threading.Lock()
_modules: dict[tuple[int, str], object] = {}  # (device, file) -> driver.Module: loaded once per process


def _module(device, filename: str):
    """native/<filename> compiled (NVRTC, disk-cached) and loaded on `device`, once per process."""
    from ..cuda import driver, nvrtc

    key = (device.ordinal, filename)
    with _modules_lock:
        if key not in _modules:
            _modules[key] = driver.Module(nvrtc.compile_native(filename, device.arch))
        return _modules[key]


def _round256(n: int) -> int:
    return -(-int(n) // 256) * 256


def _size(t: type) -> int:
    return np.dtype(t).itemsize


class _Owner:
    """Holds objects with close() and releases them in reverse order of creation."""

    def __init__(self) -> None:
        self._owned: list = []

    def own(self, obj):
        self._owned.append(obj)
        return obj

    def drop(self, obj) -> None:
        """Release one owned object now."""
        self._owned.remove(obj)
        obj.close()

    def release(self) -> None:
        while self._owned:
            self._owned.pop().close()


@dataclass
class _Layer:
    """Device buffers and plans of one linear layer (plans keyed by batch rows)."""

    out: object  # Z (rows, d_out): post-activation for hidden layers, logits for the last
    dout: object | None = None  # dL/d(pre-activation) (rows, d_out); training only
    aux: object | None = None  # ReLU bit-mask or GELU pre-activation of hidden layers; training only
    fwd: dict = field(default_factory=dict)
    dw: dict = field(default_factory=dict)
    dx: dict = field(default_factory=dict)


class CudaEngine(Engine):
    """`device="cuda"`: trains with one CUDA graph per epoch; the NumPy engine's math on the GPU."""

    device = "cuda"
    name = "graph"
    #: The training context class: the resident set, its buffers and the captured epoch (fused_engine overrides).
    _train_context: type[_TrainContext]

    def __init__(self, config: EngineConfig, state: dict[str, np.ndarray], ordinal: int = 0, group=None) -> None:
        from ..cuda import cublaslt, cudnn, driver

        self._drv, self._lt, self._dnn = driver, cublaslt, cudnn
        self.config = config
        #: fastnn.distributed.Group of a data-parallel run (None: one GPU). Each step trains on this rank's share
        #: of the batch; every layer's gradient is all-reduced on a side stream as soon as its GEMM has made it.
        self.group = group
        if group is not None:
            ordinal = group.device
        #: Each rank updates its part of every layer (SHARDED_UPDATE); the layout splits every layer evenly.
        self.sharded = group is not None and SHARDED_UPDATE
        self.spec: PrecisionSpec = precision_spec(config.precision)
        self.layout: ParamLayout = param_layout(config.model, group.world if self.sharded else 1)
        self._res = _Owner()
        self._train: _TrainContext | None = None
        self._eval: _EvalContext | None = None
        self._closed = False
        self._state_set = False
        own = self._res.own
        try:
            self.dev = driver.get_device(ordinal)
            self.dev.make_current()
            self.stream = own(driver.Stream(self.dev))
            self.lt = own(cublaslt.Handle())
            self.workspace = own(cublaslt.Workspace(WORKSPACE_BYTES))
            self.dnn = own(cudnn.Handle(self.stream))
            self._gather_mod = _module(self.dev, "gather.cu")
            self._loss_mod = _module(self.dev, "loss.cu")
            self._update_mod = _module(self.dev, "update.cu")
            self._opt_names = config.optimizer.state_names
            total = self.layout.total
            # Training state: [params | optimizer state 1 | state 2]; one copy of it is the snapshot.
            self._pbytes = _round256(total * _size(self.spec.param))
            self._sbytes = _round256(total * 4)
            self._state_bytes = self._pbytes + len(self._opt_names) * self._sbytes
            self.train_state = own(driver.DeviceBuffer(self._state_bytes))
            self.snapshot = own(driver.DeviceBuffer(self._state_bytes))
            self.w16 = own(driver.DeviceBuffer(total * 2)) if self.spec.half_copy else None
            self.grads = own(driver.DeviceBuffer(total * _size(self.spec.grad)))
            self.grads.memset(0)  # the padding between tensors is read by the update, never written
            self.epoch_state = own(driver.DeviceBuffer(256))
            self.eval_out = own(driver.PinnedBuffer(16))
            if group is not None:
                priority = self.dev.highest_stream_priority() if COMM_HIGH_PRIORITY else 0
                self.comm_stream = own(driver.Stream(self.dev, priority))
                self._fork, self._join = own(driver.Event()), own(driver.Event())
                self.hist_scratch = own(driver.DeviceBuffer(256))  # the epoch's (loss sum, correct) being summed
                self._agree = own(driver.DeviceBuffer(256))  # _check_ranks_agree's MAX and MIN of each value
            # A per-feature normalize: (scale[d], shift[d]) per input dtype, read by the gather (built before any
            # capture: nothing is allocated or uploaded while a graph records).
            self._feature_affine: dict[np.dtype, object] = {}
            if config.normalize is not None and np.ndim(config.normalize[0]) + np.ndim(config.normalize[1]):
                for dt in (np.dtype(np.uint8), np.dtype(np.float32)):
                    scale, shift = input_affine(dt, config.normalize)
                    table = np.concatenate([np.broadcast_to(v, (config.model.in_features,)) for v in (scale, shift)])
                    self._feature_affine[dt] = own(driver.DeviceBuffer(table.size * 4))
                    self.upload(self._feature_affine[dt], table.astype(np.float32))
            self.set_state(state)
        except BaseException:
            self._res.release()
            raise

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.dev.make_current()
            if self.group is not None and not self.group.comm.closed:
                # Polled, at most the group's timeout: a queued collective may wait for a peer that is gone. Ended
                # meanwhile (timed out, aborted by another thread, NCCL's error), its collectives return.
                try:
                    self.sync()
                except (nccl.CommAborted, nccl.NcclError):
                    pass
                except BaseException:  # Ctrl-C: the buffers are freed next, so the collectives must end first
                    self.group.abort()
                    raise
            self.stream.synchronize()
        finally:
            for ctx in (self._eval, self._train):
                if ctx is not None:
                    ctx.release()
            self._train = self._eval = None
            self._res.release()

    # ------------------------------------------------------------------ parameters
    def param_ptr(self, name: str, gemm_type: type) -> int:
        """Address of parameter `name` in the storage whose type matches a GEMM of `gemm_type`."""
        off, _ = self.layout.slot(name)
        base, t = self._gemm_storage(gemm_type)
        return base + off * _size(t)

    def _gemm_storage(self, gemm_type: type) -> tuple[int, type]:
        """(flat buffer, element type) of the parameters a GEMM of `gemm_type` reads: the parameters themselves,
        or in "mixed" for fp16 GEMMs the fp16 copy of the fp32 master."""
        if gemm_type == self.spec.param:
            return self.train_state.ptr, self.spec.param
        return self.w16.ptr, np.float16

    def out_type(self, layer: int) -> type:
        """Type of `layer`'s forward output, and of the bias its GEMM reads: the logits' type on the last layer."""
        return self.spec.logits if layer == len(self.config.model.layers) - 1 else self.spec.operand

    def grad_ptr(self, name: str) -> int:
        off, _ = self.layout.slot(name)
        return self.grads.ptr + off * _size(self.spec.grad)

    def get_state(self) -> dict[str, np.ndarray]:
        self.dev.make_current()
        self.stream.synchronize()
        raw = np.empty(self._state_bytes, dtype=np.uint8)
        self.train_state.download(raw)
        total = self.layout.total
        out = self.layout.unpack(raw[: total * _size(self.spec.param)].view(self.spec.param))
        for i, name in enumerate(self._opt_names):
            start = self._pbytes + i * self._sbytes
            out.update(self.layout.unpack(raw[start : start + total * 4].view(np.float32), f"opt.{name}."))
        return out

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Replace the parameters, and the optimizer state where `state` holds all of it; the rest is kept
        (zero before the first call), as the NumPy engine does."""
        self.dev.make_current()
        self.stream.synchronize()
        raw = np.zeros(self._state_bytes, dtype=np.uint8)
        if self._state_set:
            self.train_state.download(raw)
        params = self.layout.pack(state, self.spec.param).view(np.uint8)
        raw[: params.size] = params
        for i, name in enumerate(self._opt_names):
            prefix = f"opt.{name}."
            if all(prefix + n in state for n in self.layout.names):
                flat = self.layout.pack({n: state[prefix + n] for n in self.layout.names}, np.float32)
                start = self._pbytes + i * self._sbytes
                raw[start : start + flat.nbytes] = flat.view(np.uint8)
        self.train_state.upload(raw)
        self._state_set = True
        self._refresh_half_copy()
        self.stream.synchronize()

    def _refresh_half_copy(self) -> None:
        if self.w16 is not None:
            n = self.layout.total
            args = [arg_ptr(self.train_state.ptr), arg_ptr(self.w16.ptr), arg_u64(n)]
            self._launch_elementwise("cast_f32_f16", n, args)

    # ------------------------------------------------------------------ building blocks
    def _elementwise_blocks(self, n: int) -> int:
        return max(1, min(-(-n // UPDATE_THREADS), self.dev.sm_count * 8))

    def _launch_elementwise(self, kernel: str, n: int, args: list, stream=None) -> None:
        blocks = self._elementwise_blocks(n)
        self._update_mod.function(kernel).launch((blocks, 1, 1), (UPDATE_THREADS, 1, 1), args,
                                                 stream if stream is not None else self.stream)  # fmt: skip

    def matmul(self, m, n, k, transa, transb, ab, cd, epilogue, lda, ldb, ldc, aux_ld=None, beside_comm=False):
        """A cuBLASLt plan for column-major D (m, n) in this precision's compute type; beside_comm: it may run
        while all-reduces do (a backward GEMM of a data-parallel engine), so it leaves GEMM_SM_CARVEOUT SMs."""
        lt = self._lt
        carve = GEMM_SM_CARVEOUT if (beside_comm and self.group is not None) else 0
        return lt.Matmul(
            self.lt, m, n, k, transa=transa, transb=transb,
            ab_type=lt.DataType.R_16F if ab == np.float16 else lt.DataType.R_32F,
            cd_type=lt.DataType.R_16F if cd == np.float16 else lt.DataType.R_32F,
            compute=lt.ComputeType.COMPUTE_16F if self.spec.compute_16f else lt.ComputeType.COMPUTE_32F,
            lda=lda, ldb=ldb, ldc=ldc, epilogue=epilogue, aux_ld=aux_ld, workspace=self.workspace,
            max_algos=AUTOTUNE_ALGOS, sm_count_target=min(max(1, self.dev.sm_count - carve), self.dev.sm_count)
            if carve else 0,
        )  # fmt: skip

    def softmax(self, rows: int):
        return self._dnn.Softmax(self.dnn, rows, self.config.model.classes, _dnn_type(self.spec.logits))

    def forward_plans(self, layers: list[_Layer], rows: int, training: bool, own: Callable) -> None:
        """Forward plans for `rows`: bias + activation fused (keeping aux when training); bias on the last."""
        E = self._lt.Epilogue
        relu = self.config.model.activation == "relu"
        act = (E.RELU_AUX_BIAS if relu else E.GELU_AUX_BIAS) if training else (E.RELU_BIAS if relu else E.GELU_BIAS)
        last = len(layers) - 1
        for i, ((d_in, d_out), layer) in enumerate(zip(self.config.model.layers, layers)):
            out_t = self.out_type(i)
            aux_ld = self.aux_ld(d_out) if (training and i < last) else None
            layer.fwd[rows] = own(self.matmul(
                d_out, rows, d_in, True, False, self.spec.operand, out_t,
                act if i < last else E.BIAS, d_in, d_in, d_out, aux_ld,
            ))  # fmt: skip

    def aux_ld(self, rows: int) -> int:
        return relu_aux_ld(rows) if self.config.model.activation == "relu" else gelu_aux_ld(rows)

    def aux_bytes(self, d_out: int, batch: int) -> int:
        if self.config.model.activation == "relu":
            return relu_aux_ld(d_out) // 8 * batch
        return gelu_aux_ld(d_out) * batch * _size(self.spec.operand)

    def record_gather(self, x_dev, y_dev, n: int, x_dtype: np.dtype, pos0: int, rows: int, out, out_y: int,
                      shuffled: bool) -> None:  # fmt: skip
        """Queue the gather of positions pos0..pos0+rows (shuffled by the epoch's order, or in order)."""
        src, data, affine, dest = self._gather_args(x_dev, y_dev, n, x_dtype, out, out_y)
        state = [arg_ptr(self.epoch_state.ptr if shuffled else 0)]
        self._gather_mod.function(f"gather_{src}_{self.spec.gather_kernel_suffix}").launch(
            (rows, 1, 1), (GATHER_THREADS, 1, 1), data + state + [arg_i32(pos0)] + affine + dest, self.stream
        )

    def _gather_args(self, x_dev, y_dev, n: int, x_dtype: np.dtype, out, out_y: int) -> tuple[str, list, list, list]:
        """gather.cuh's arguments in groups: source tag, (x .. half_bits), (scale, shift), (out, out_y)."""
        seed_lo, seed_hi = split_u64(self.config.seed)
        scale, shift = input_affine(x_dtype, self.config.normalize)
        data = [
            arg_ptr(x_dev.ptr), arg_ptr(y_dev.ptr), arg_i32(self.config.model.in_features), arg_u32(n),
            arg_u32(seed_lo), arg_u32(seed_hi), arg_u32(feistel_bits(n) // 2),
        ]  # fmt: skip
        src = "u8" if x_dtype == np.uint8 else "f32"
        table = self._feature_affine.get(np.dtype(x_dtype))
        if table is None:
            affine = [arg_f32(scale), arg_f32(shift), arg_ptr(0), arg_ptr(0)]
        else:  # per feature: d scales then d shifts
            d = self.config.model.in_features
            affine = [arg_f32(1.0), arg_f32(0.0), arg_ptr(table.ptr), arg_ptr(table.ptr + 4 * d)]
        return src, data, affine, [arg_ptr(out.ptr), arg_ptr(out_y)]

    def forward_nodes(self, layers: list[_Layer], x_ptr: int, rows: int, autotune: bool = False) -> list:
        """(name, queue) of each layer's forward GEMM for `rows` rows of input at x_ptr."""
        names = self.layout.names
        nodes, h = [], x_ptr
        for i, layer in enumerate(layers):
            w = self.param_ptr(names[2 * i], self.spec.operand)
            b = self.param_ptr(names[2 * i + 1], self.out_type(i))
            aux = layer.aux.ptr if layer.aux is not None else 0
            run = partial(
                _run, layer.fwd[rows], autotune, self.stream, w, h, layer.out.ptr, layer.out.ptr, bias=b, aux=aux
            )
            nodes.append((f"forward{i}", run))
            h = layer.out.ptr
        return nodes

    def record_loss(self, logits: int, probs: int, labels: int, rows: int, dlogits: int, dbias: int, acc: int,
                    state: int, batch_rows: int | None = None) -> None:  # fmt: skip
        """Queue the one-block loss kernel (loss and correct sums into acc; gradients when dlogits != 0). The
        gradient is of the mean over `batch_rows` (default `rows`): a data-parallel rank's part of a larger batch."""
        # A thread per row, and at least a warp per class for the bias-gradient column sums.
        threads = min(1024, max(-(-rows // 32) * 32, 32 * self.config.model.classes))
        self._loss_mod.function(self.spec.loss_kernel).launch(
            (1, 1, 1),
            (threads, 1, 1),
            [arg_ptr(logits), arg_ptr(probs), arg_ptr(labels), arg_i32(rows), arg_i32(self.config.model.classes),
             arg_f32(1.0 / (batch_rows or rows)), arg_ptr(dlogits), arg_ptr(dbias), arg_ptr(acc), arg_ptr(state)],
            self.stream,
        )  # fmt: skip

    def record_update(self, step: int, steps: int, gather: tuple | None = None, part: tuple[int, int] | None = None,
                      stream=None) -> None:  # fmt: skip
        """Queue step `step`'s update of every parameter, or of the `part` = (first, count) elements of the flat
        buffers (a sharded update), on `stream` (default the main one); with `gather` = (x_dev, y_dev, n, x_dtype,
        pos0, rows, out, out_y), the same kernel gathers the next step's batch (native/update.cu's UPDATE_GATHER)."""
        first, n = part if part is not None else (0, self.layout.total)
        stream = stream if stream is not None else self.stream
        n_state = len(self._opt_names)
        s1 = self.train_state.ptr + self._pbytes + 4 * first if n_state >= 1 else 0
        s2 = self.train_state.ptr + self._pbytes + self._sbytes + 4 * first if n_state >= 2 else 0
        w = self.train_state.ptr + first * _size(self.spec.param)
        g = self.grads.ptr + first * _size(self.spec.grad)
        w16 = self.w16.ptr + 2 * first if self.w16 is not None else 0
        args = [
            arg_ptr(w), arg_ptr(g), arg_ptr(s1), arg_ptr(s2), arg_ptr(w16), arg_u64(n),
            arg_ptr(self.epoch_state.ptr), arg_i32(step), arg_i32(steps),
            arg_struct(self.config.optimizer.kernel_params().c_fields()),
        ]  # fmt: skip
        if gather is None:
            self._launch_elementwise(self.spec.update_kernel, n, args, stream)
            return
        x_dev, y_dev, n_data, x_dtype, pos0, rows, out, out_y = gather
        src, data, affine, dest = self._gather_args(x_dev, y_dev, n_data, x_dtype, out, out_y)
        blocks = rows + self._elementwise_blocks(n)
        self._update_mod.function(self.spec.update_gather_kernel(src)).launch(
            (blocks, 1, 1), (UPDATE_THREADS, 1, 1), args + data + [arg_i32(pos0), arg_i32(rows)] + affine + dest,
            stream,
        )  # fmt: skip

    def record_grad_sum(self, layer: int) -> None:
        """Queue, on the side stream once the main stream has got this far, the sum over ranks of `layer`'s
        weight and bias gradients (one contiguous range of the flat gradient buffer, zero padding included): all of
        it (all-reduce), or with a sharded update this rank's part of it (reduce-scatter, in place)."""
        start, stop = self.layout.layer_range(layer)
        size = _size(self.spec.grad)
        self._fork_side()
        if self.sharded:
            mine, count = self.layout.shard(layer, self.group.rank)
            g = self.grads.ptr
            nccl.reduce_scatter(self.group.comm, g + start * size, g + mine * size, count, self.spec.grad,
                                self.comm_stream)  # fmt: skip
        else:
            ptr = self.grads.ptr + start * size
            nccl.all_reduce(self.group.comm, ptr, ptr, stop - start, self.spec.grad, self.comm_stream)

    def _fork_side(self) -> None:
        """Make the side stream wait for everything queued on the main stream so far."""
        self._fork.record(self.stream)
        self.comm_stream.wait(self._fork)

    def record_shard_update(self, layer: int, step: int, steps: int, gather: tuple | None = None) -> None:
        """A sharded update's part for `layer`, on the side stream once the main stream is done with the layer's
        weights (its input-gradient GEMM): update this rank's part (its gradient sum is there), then all-gather the
        parts into every storage the layer's forward GEMM reads (the fp16 copy in "mixed", else the parameters; in
        "mixed" the output layer's also reads its bias from the fp32 master). The last layer updated also gathers
        the next batch (record_update's `gather`)."""
        self._fork_side()
        self.record_update(step, steps, gather, part=self.layout.shard(layer, self.group.rank), stream=self.comm_stream)
        for storage in dict.fromkeys(self._gemm_storage(t) for t in (self.spec.operand, self.out_type(layer))):
            self._gather_parts(layer, *storage, self.comm_stream)

    def _gather_parts(self, layer: int, base: int, t: type, stream) -> None:
        """Queue the in-place all-gather of `layer`'s parts of the flat buffer at `base` (elements of type t)."""
        start, _ = self.layout.layer_range(layer)
        mine, count = self.layout.shard(layer, self.group.rank)
        size = _size(t)
        nccl.all_gather(self.group.comm, base + mine * size, base + start * size, count, t, stream)

    def record_state_gather(self) -> None:
        """Queue, at the end of a sharded epoch, the all-gather of every layer's parts of what the steps left
        partial: the fp32 master weights ("mixed": the GEMMs' fp16 copy was gathered every step) and the optimizer
        state. Every rank then holds the whole training state, as without sharding."""
        regions = [(self.train_state.ptr, self.spec.param)] if self.w16 is not None else []
        regions += [(self.train_state.ptr + self._pbytes + i * self._sbytes, np.float32)
                    for i in range(len(self._opt_names))]  # fmt: skip
        for base, t in regions:
            for layer in range(len(self.config.model.layers)):
                self._gather_parts(layer, base, t, self.stream)

    def _wait(self, event) -> None:
        """Block until `event` (the end of an epoch's queued work) completes; see _wait_comm for a group."""
        if self.group is None:
            event.synchronize()
        else:
            self._wait_comm(event)

    def sync(self) -> None:
        """Block until everything queued on the stream has run; for a group through _wait_comm, since queued
        collectives may wait for peers that never come."""
        if self.group is None:
            self.stream.synchronize()
        else:
            self._join.record(self.stream)
            self._wait_comm(self._join)

    def _wait_comm(self, event) -> None:
        """Poll until `event` completes, so that a failed or vanished peer (NCCL's asynchronous error) aborts the
        communicator and raises rather than leaving this rank spinning in a collective. Past the group's timeout
        the peers are taken for gone (a rank that died or stopped early, which NCCL need not report: a dead peer
        on this machine leaves the collective spinning) and the communicator is aborted too."""
        g = self.group
        deadline = None if g.timeout is None else time.monotonic() + g.timeout
        while not event.query():
            error = g.async_error()
            if error is None and deadline is not None and time.monotonic() > deadline:
                error = nccl.CollectiveTimeout(
                    f"rank {g.rank} of {g.world} on GPU {g.device}: the other ranks did not join this rank's "
                    f"collectives within {g.timeout:g} s (distributed.init's timeout): one may have died, stopped "
                    "training or be busy elsewhere; the communicator was aborted"
                )
            if error is not None:
                g.abort()
                raise error
            if g.comm.closed:
                break  # aborted by another thread (an error on another GPU of this process): its kernels end
            time.sleep(0.0005)
        if g.comm.closed:  # the work waited for may have ended with its collectives cut short
            raise nccl.CommAborted(f"rank {g.rank} of {g.world} on GPU {g.device}: the communicator was aborted "
                                   "(an error on another GPU) while this rank waited for a collective")  # fmt: skip

    # Frees deferred to the end: a collection on this thread could free another GPU's memory (cuMemFree waits for
    # that GPU), and that GPU may be waiting in a collective for this one's.
    @_capture.deferring
    def _ranks_min_max(self, mine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ranks' MIN and MAX of each of `mine` (float64, at most 16 values, exact integers below 2**53): one
        small MIN and one MAX all-reduce outside any graph, which every rank must issue at the same point."""
        g, k = self.group, mine.size
        with hold_ctrl_c():  # both or neither: a peer would wait for the second one forever
            self._agree.upload(np.concatenate([mine, mine]))
            nccl.all_reduce(g.comm, self._agree.ptr, self._agree.ptr, k, np.float64, self.stream, nccl.RedOp.MAX)
            low = self._agree.ptr + 8 * k
            nccl.all_reduce(g.comm, low, low, k, np.float64, self.stream, nccl.RedOp.MIN)
            self._join.record(self.stream)
        self._wait_comm(self._join)
        out = np.empty(2 * k, dtype=np.float64)
        self._agree.download(out)
        return out[k:], out[:k]

    def _check_ranks_agree(self, items: list[tuple[str, int]], any_of: tuple[int, ...] = ()) -> list[int]:
        """Refuse (ConfigError, on every rank) a data-parallel run whose ranks would issue different collectives
        or train differently: `items` are (what, this rank's value), compared across the ranks. `any_of` are
        values that may differ, compared with the items (one exchange); their MAX over the ranks is returned."""
        g = self.group
        mine = np.array([value for _, value in items] + list(any_of), dtype=np.float64)
        low, high = self._ranks_min_max(mine)
        bad = [f"{name} (this rank {mine[i]:.0f}; the ranks' values range from {low[i]:.0f} to {high[i]:.0f})"
               for i, (name, _) in enumerate(items) if low[i] != high[i]]  # fmt: skip
        if bad:
            raise ConfigError(f"rank {g.rank} of {g.world}: every rank must train the same model with the same "
                              f"arguments on the same data; they differ in " + "; ".join(bad))  # fmt: skip
        return [int(v) for v in high[len(items) :]]

    def _check_data_agrees(self, n: int) -> None:
        """Before a fit's data is uploaded: the same training set size, batch size, model, seed, precision, update
        sharding and optimizer (its number of state buffers) on every rank."""
        cfg, g = self.config, self.group
        widths = sum(w * 1_000_003**i for i, w in enumerate(cfg.model.sizes)) % (1 << 52)  # exact in a float64
        seed_lo, seed_hi = split_u64(cfg.seed)
        self._check_ranks_agree([
            ("training set rows", n), ("batch_size", cfg.batch_size), ("drop_last", int(cfg.drop_last)),
            ("padded parameter count", self.layout.total), ("layers", len(cfg.model.layers)),
            ("layer widths (a checksum)", widths), ("seed (low 32 bits)", seed_lo),
            ("seed (high 32 bits)", seed_hi), ("precision", PRECISIONS.index(cfg.precision)), ("world", g.world),
            ("sharded update (cuda_engine.SHARDED_UPDATE)", int(self.sharded)),
            ("optimizer state buffers", len(self._opt_names)),
        ])  # fmt: skip

    def _check_call_agrees(self, first_epoch: int, first_step: int, lrs: np.ndarray, end_epoch: int | None,
                           stoppable: bool) -> bool:  # fmt: skip
        """Before a call's epochs: the same epoch and step counters (they key the shuffle), epoch the fit ends at,
        steps and learning rates of this call on every rank; otherwise one rank would wait in collectives the
        others never issue, or the replicas would drift apart. Returns whether any rank's fit is stoppable (has
        callbacks or early stopping): then every rank votes after every epoch (_vote_stop), so that callbacks
        given to one rank only (a logger or checkpointer on rank 0) leave the ranks in step."""
        table = np.ascontiguousarray(lrs, dtype=np.float32)
        end = first_epoch + table.size // self._train.steps if end_epoch is None else end_epoch
        steps_lo, steps_hi = split_u64(first_step)
        (any_stoppable,) = self._check_ranks_agree([
            ("epochs done (trainer.epoch)", first_epoch), ("steps done (low 32 bits)", steps_lo),
            ("steps done (high 32 bits)", steps_hi), ("epochs after this fit (epochs done + epochs)", end),
            ("steps in this call", table.size),
            ("learning rates (a CRC of this call's schedule)", zlib.crc32(table.tobytes())),
        ], any_of=(int(stoppable),))  # fmt: skip
        return bool(any_stoppable)

    def _vote_stop(self, stopping: bool) -> int | None:
        """After each epoch of a stoppable fit, every rank votes: the lowest rank that stops after this epoch (a
        callback, early stopping, an error, Ctrl-C), or None if none does. A stop on one rank then stops all of
        them after the same epoch instead of leaving the others waiting in the next epoch's collectives."""
        g = self.group
        low, _ = self._ranks_min_max(np.array([g.rank if stopping else g.world], dtype=np.float64))
        first = int(low[0])
        return first if first < g.world else None

    def record_join(self) -> None:
        """Make the main stream wait for everything queued on the side stream: the all-reduces (before the update),
        or the sharded update's parts and all-gathers (before the next step)."""
        self._join.record(self.comm_stream)
        self.stream.wait(self._join)

    def record_zero_grads(self) -> None:
        """Queue zeroed gradients: a rank whose share of a step is empty still joins that step's all-reduces."""
        self.grads.memset(0, self.stream)

    def record_history_all_reduce(self) -> None:
        """Queue the sum over ranks of this epoch's (loss sum, correct count): every rank then holds the global
        history, and takes the same divergence and snapshot decisions from it."""
        state, scratch = arg_ptr(self.epoch_state.ptr), arg_ptr(self.hist_scratch.ptr)
        self._update_mod.function("history_stage").launch((1, 1, 1), (1, 1, 1), [state, scratch, arg_i32(1)],
                                                          self.stream)  # fmt: skip
        nccl.all_reduce(self.group.comm, self.hist_scratch.ptr, self.hist_scratch.ptr, 2, np.float64, self.stream)
        self._update_mod.function("history_stage").launch((1, 1, 1), (1, 1, 1), [state, scratch, arg_i32(0)],
                                                          self.stream)  # fmt: skip

    def record_colsum(self, m: int, rows: int, cols: int, out: int) -> None:
        """Queue out[j] = sum over rows of the row-major (rows, cols) matrix m: a bias gradient."""
        self._loss_mod.function(f"colsum_{_tag(self.spec.grad)}").launch(
            (-(-cols // 128), 1, 1), (128, 1, 1), [arg_ptr(m), arg_i32(rows), arg_i32(cols), arg_ptr(out)], self.stream
        )

    def record_epoch_end(self) -> None:
        """Queue the epoch-end nodes: check the state the epoch left (native/update.cu's check_state, whose
        verdict EpochState.bad_state holds), snapshot it while the loss and state stay finite, advance."""
        if self.group is not None:
            self.record_history_all_reduce()
        if self.sharded:
            self.record_state_gather()
        words = self._state_bytes // 4
        state = arg_ptr(self.epoch_state.ptr)
        pwords = self._pbytes // 4
        if self.spec.param == np.float16:  # "fp16": fp16 parameters, then the fp32 optimizer state
            f32, n32, f16, n16 = self.train_state.ptr + self._pbytes, words - pwords, self.train_state.ptr, pwords
        else:  # fp32 parameters and optimizer state, and for "mixed" the fp16 copy the GEMMs read
            f32, n32 = self.train_state.ptr, words
            f16, n16 = (self.w16.ptr, self.layout.total // 2) if self.w16 is not None else (0, 0)
        check = [arg_ptr(f32), arg_u64(n32), arg_ptr(f16), arg_u64(n16), state]
        self._launch_elementwise("check_state", max(n32, n16), check)
        args = [arg_ptr(self.train_state.ptr), arg_ptr(self.snapshot.ptr), arg_u64(words), state]
        self._launch_elementwise("snapshot", words, args)
        self._update_mod.function("advance").launch((1, 1, 1), (1, 1, 1), [arg_ptr(self.epoch_state.ptr)], self.stream)

    def write_epoch_state(self, epoch: int, step0: int, lr: int = 0, hist: int = 0) -> None:
        """Start a fit's device state: epoch counters, step count, and where its lr table and history are."""
        st = np.zeros(1, dtype=EPOCH_STATE_DTYPE)
        st["epoch"], st["step0"], st["lr"], st["hist"] = epoch, step0, lr, hist
        self.epoch_state.upload(st.view(np.uint8))

    def upload(self, dst, array: np.ndarray | CudaArray) -> None:
        """Host -> device through a pinned staging buffer in chunks (pageable copies are slower); an array already
        in this GPU's memory is copied device to device once every stream of the device is done with it."""
        if isinstance(array, CudaArray):
            check_on_device(array, self.dev.ordinal, "x")
            self.dev.synchronize()  # the producer (torch, CuPy, JAX: any stream) has finished writing it
            if isinstance(dst, self._drv.MappedHostBuffer):
                self._drv.copy_dtoh(dst.host_ptr, array.ptr, array.nbytes, self.stream)
            else:
                self._drv.copy_dtod(dst.ptr, array.ptr, array.nbytes, self.stream)
            self.stream.synchronize()  # fastnn holds no reference to it once fit/evaluate/predict return
            return
        if isinstance(dst, self._drv.MappedHostBuffer):  # host memory the GPU reads: a plain host copy
            self.stream.synchronize()  # no queued epoch may still be reading the old rows
            raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            dst.view(np.uint8, (raw.size,))[:] = raw
            return
        raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        chunk = max(1, min(raw.size, 8 << 20))
        staging = self._drv.PinnedBuffer(chunk)
        try:
            view = staging.view(np.uint8, (chunk,))
            for start in range(0, raw.size, chunk):
                part = raw[start : start + chunk]
                view[: part.size] = part
                self._drv.copy_htod(dst.ptr + start, staging.ptr, part.size, self.stream)
                self.stream.synchronize()  # the staging buffer is refilled for the next chunk
        finally:
            staging.close()

    def capture(self, record) -> object:
        """Record `record()` on the stream into a graph and instantiate it."""
        self.sync()  # a group's autotuning step queued all-reduces
        self.stream.begin_capture()
        try:
            record()
        except BaseException:
            with contextlib.suppress(Exception):  # the recording's error is the one to report
                self.stream.end_capture().close()
            raise
        graph = self.stream.end_capture()
        try:
            return graph.instantiate(node_priority=self.group is not None and COMM_HIGH_PRIORITY)
        finally:
            graph.close()

    # ------------------------------------------------------------------ Engine API
    def _check_group(self) -> None:
        """Refuse to train once the group's communicator has ended: the epoch graph went with it (nccl.Comm.hold)."""
        g = self.group
        if g is not None and g.comm.closed:
            raise nccl.CommAborted(f"rank {g.rank} of {g.world} on GPU {g.device}: the communicator was closed or "
                                   "aborted; save or read the weights, then make a new group and Trainer")  # fmt: skip

    def set_train_data(self, x: np.ndarray, y: np.ndarray) -> None:
        self._check_group()
        self.dev.make_current()
        if self.group is not None:
            self._check_data_agrees(x.shape[0])
        key = _data_key(x, y)
        ctx = self._train
        if ctx is not None and ctx.key == key:
            return  # the very same arrays: already resident
        if ctx is not None and (ctx.n, ctx.dtype) == (x.shape[0], x.dtype):
            ctx.load(x, y, key)  # same shape: new values into the same buffers, the graph stays valid
            return
        if ctx is not None:
            self.stream.synchronize()  # queued work may still read its buffers
            ctx.release()
        self._train = None
        self._train = self._train_context(self, x, y, key)

    def fit_epochs(
        self, first_epoch, first_step, lrs, eval_data, eval_after, on_epoch: OnEpoch, stoppable=False, on_step=None,
        end_epoch=None,
    ) -> None:  # fmt: skip
        self.last_reported = None
        if self.group is not None:
            if self._train is None:
                raise RuntimeError("set_train_data must come before fit_epochs")
            self.dev.make_current()
            stoppable = self._check_call_agrees(first_epoch, first_step, lrs, end_epoch, stoppable)
        run = EpochRun(self, first_epoch, first_step, lrs, eval_data, eval_after)
        vote = self._vote_stop if self.group is not None else None
        drive_epochs(self, EpochRuns([run], stop_vote=vote), on_epoch, stoppable)

    def profile_step(self, repeats: int = 1000) -> list[tuple[str, float]]:
        """Microseconds per node of the first training step, and of the whole step ("step").

        Each node is captured `repeats` times into a graph of its own and the replay is timed with
        events, as inside the epoch graph. The nodes run for real (weights change): profile a
        throwaway trainer after one `fit`. One GPU only: a data-parallel step's nodes are collectives.
        """
        if self.group is not None:
            raise ConfigError("profile_step times one GPU's nodes; a data-parallel trainer's are collectives")
        ctx = self._train
        if ctx is None or ctx.graph is None:
            raise RuntimeError("profile_step needs one fit first (it times the captured step's nodes)")
        self.dev.make_current()
        # Counters back to the fit's first epoch: the nodes index the lr table and history by them.
        self.write_epoch_state(0, 0, ctx.lr_table.ptr, ctx.hist.ptr)
        nodes = ctx.step_nodes(0)
        nodes.append(("step", lambda: [queue() for _, queue in ctx.step_nodes(0)]))
        start, end = self._drv.Event(timing=True), self._drv.Event(timing=True)
        out = []
        try:
            for name, queue in nodes:
                graph = self.capture(lambda q=queue: [q() for _ in range(repeats)])
                try:
                    graph.launch(self.stream)  # warm-up: the first replay uploads the graph
                    start.record(self.stream)
                    graph.launch(self.stream)
                    end.record(self.stream)
                    end.synchronize()
                    out.append((name, start.elapsed_ms(end) * 1000.0 / repeats))
                finally:
                    graph.close()
        finally:
            start.close()
            end.close()
        return out

    def _eval_context(self, x: np.ndarray, y: np.ndarray | None) -> _EvalContext:
        """The forward graph for x's shape, with x and y uploaded afresh: evaluation data is small, and
        uploading it on every call (once per `fit`, not per epoch) means an array changed in place is seen."""
        ctx = self._eval
        if ctx is not None and (ctx.n, ctx.dtype) == (x.shape[0], x.dtype):
            ctx.load(x, y)
            return ctx
        if ctx is not None:
            self.stream.synchronize()
            ctx.release()
        self._eval = None
        self._eval = _EvalContext(self, x, y)
        return self._eval

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        self.dev.make_current()
        ctx = self._eval_context(x, y)
        ctx.run(self.eval_out.ptr)
        self.stream.synchronize()
        loss_sum, correct = self.eval_out.view(np.float64, (2,))
        return float(loss_sum / ctx.n), float(correct / ctx.n)

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        self.dev.make_current()
        ctx = self._eval_context(x, None)
        ctx.run(self.eval_out.ptr)
        self.stream.synchronize()
        out = np.empty((ctx.n, self.config.model.classes), dtype=self.spec.logits)
        ctx.probs.download(out)
        return out.astype(np.float32)


class _TrainContext(_Owner):
    """One resident training set with its batch buffers, plans and the captured epoch graph."""

    def __init__(self, eng: CudaEngine, x: np.ndarray, y: np.ndarray, key) -> None:
        super().__init__()
        self.eng = eng
        drv, cfg = eng._drv, eng.config
        self.n, self.dtype = x.shape[0], x.dtype
        B = cfg.batch_size
        self.steps = steps_per_epoch(self.n, B, cfg.drop_last)
        self.samples = self.steps * B if cfg.drop_last else self.n
        self.batch_rows = [min(B, self.n - s * B) for s in range(self.steps)]  # every step's whole batch
        # This rank's part of each batch, by position (all of it on one GPU): offsets into the batch, row counts.
        g = eng.group
        parts = [share(r, g.rank, g.world) if g is not None else (0, r) for r in self.batch_rows]
        self.offsets = [o for o, _ in parts]
        self.rows = [m for _, m in parts]
        self.graph = None
        self.capacity = 0
        try:
            buf = lambda nbytes: self.own(drv.DeviceBuffer(max(int(nbytes), 256)))  # noqa: E731
            self.placement = choose_placement(cfg.data_placement, x.nbytes, eng.dev.mem_info()[0])
            if self.placement == "host":  # the gather reads rows over the bus: same kernels, same order
                self.x = self.own(drv.MappedHostBuffer(max(int(x.nbytes), 256), eng.dev))
            else:
                self.x = buf(x.nbytes)
            self.y = buf(self.n * 4)
            self.load(x, y, key)
            self._build(buf)
            self.events = [
                (self.own(drv.Event(timing=True)), self.own(drv.Event(timing=True)), self.own(drv.Event()))
                for _ in range(INFLIGHT_EPOCHS + 1)
            ]
        except BaseException:
            self.release()
            raise

    def _build(self, buf: Callable) -> None:
        """The graph engine's batch buffers, layer buffers and plans for this set's shapes."""
        eng, spec, cfg = self.eng, self.eng.spec, self.eng.config
        R = max(self.rows, default=0) or 1
        self.x_batch = buf(R * cfg.model.in_features * _size(spec.operand))
        self.y_batch = buf(R * 4)
        last = len(cfg.model.layers) - 1
        self.layers = [
            _Layer(
                out=buf(R * d_out * _size(spec.logits if i == last else spec.operand)),
                dout=buf(R * d_out * _size(spec.operand)),
                aux=buf(eng.aux_bytes(d_out, R)) if i < last else None,
            )
            for i, (_, d_out) in enumerate(cfg.model.layers)
        ]
        self.probs = buf(R * cfg.model.classes * _size(spec.logits))
        self._build_plans()

    def load(self, x: np.ndarray, y: np.ndarray, key) -> None:
        self.eng.upload(self.x, x)
        self.eng.upload(self.y, y)
        self.key = key

    def _build_plans(self) -> None:
        # Bias gradients, chosen by measurement (benchmarks/bench_kernels.py, H200): the last layer's
        # comes from the loss kernel (a BGRADB epilogue on logistic regression's skinny wgrad cost 9 us
        # against ~1 us in the kernel); hidden layers' from BGRADB on their wgrad GEMM (within 0.1 us of
        # no epilogue there), not DRELU_BGRAD on the dgrad GEMM (~8 us against ~3 us for DRELU alone).
        eng, spec = self.eng, self.eng.spec
        E = eng._lt.Epilogue
        bwd_act = E.DRELU if eng.config.model.activation == "relu" else E.DGELU
        last = len(eng.config.model.layers) - 1
        self.softmax = {}
        for rows in sorted(set(self.rows) - {0}):  # 0: a data-parallel rank's empty share (no GEMMs)
            eng.forward_plans(self.layers, rows, training=True, own=self.own)
            for i, (d_in, d_out) in enumerate(eng.config.model.layers):
                layer = self.layers[i]
                # dW^T (d_in, d_out) = H^T @ dZ; hidden layers' bias gradient (column sums of dZ) as BGRADB.
                layer.dw[rows] = self.own(eng.matmul(
                    d_in, d_out, rows, False, True, spec.operand, spec.grad,
                    E.BGRADB if (i < last and HIDDEN_BIAS_GRAD == "wgrad") else E.DEFAULT, d_in, d_out, d_in,
                    beside_comm=True,
                ))  # fmt: skip
                if i > 0:
                    # dH^T (d_in, rows) = W^T @ dZ^T, times the previous activation's gradient (its aux).
                    layer.dx[rows] = self.own(eng.matmul(
                        d_in, rows, d_out, False, False, spec.operand, spec.operand,
                        bwd_act, d_in, d_out, d_in, eng.aux_ld(d_in), beside_comm=True,
                    ))  # fmt: skip
            self.softmax[rows] = self.own(eng.softmax(rows))

    def prepare(self, epochs: int, lrs: np.ndarray) -> None:
        """Size and fill the per-step lr table and the per-epoch history for `epochs`; capture once.

        The graph finds both through EpochState, so growing them for a longer fit needs no re-capture.
        """
        eng = self.eng
        self.reserve(epochs)
        eng.stream.synchronize()
        self.lr_table.upload(np.ascontiguousarray(lrs, dtype=np.float32))
        if self.graph is None:
            self.graph = self.own(self._capture_epoch())
            if eng.group is not None:  # its collectives keep NCCL from ending the communicator until it is gone
                eng.group.comm.hold(self.graph)
                # The communicator keeps it until it ends; a context collected before that frees it with itself.
                weakref.finalize(self, self.graph.close).atexit = False  # the process's end frees it anyway
        self.hist.memset(0, eng.stream)

    def reserve(self, epochs: int) -> None:
        """Grow the lr table and history buffers to hold `epochs` (allocation only: the replica engine makes every
        GPU's before any GPU issues a collective, so an out-of-memory leaves no peer waiting in one)."""
        eng, drv = self.eng, self.eng._drv
        eng.dev.make_current()
        if epochs > self.capacity:
            eng.stream.synchronize()
            cap = max(epochs, 2 * self.capacity, 8)
            new = {}
            try:  # all five first: a failed allocation leaves the old ones in place
                new["lr_table"] = drv.DeviceBuffer(cap * self.steps * 4)
                new["hist"] = drv.DeviceBuffer(cap * 16)
                new["hist_host"] = drv.PinnedBuffer(cap * 16)
                new["eval_host"] = drv.PinnedBuffer(cap * 16)
                new["flags_host"] = drv.PinnedBuffer(cap * 4)  # EpochState.bad_state after each epoch
            except BaseException:
                for buf in new.values():
                    buf.close()
                raise
            for name, buf in new.items():
                if hasattr(self, name):
                    self.drop(getattr(self, name))
                setattr(self, name, self.own(buf))
            self.capacity = cap

    @_capture.deferring  # the autotuning step's all-reduces: see _check_ranks_agree
    def _capture_epoch(self):
        """Autotune each full-batch plan in step order on real data (no update), then capture the epoch."""
        eng = self.eng
        eng.write_epoch_state(0, 0, self.lr_table.ptr, self.hist.ptr)
        self.hist.memset(0, eng.stream)
        self._record_step(0, autotune=True, update=False)
        return eng.capture(self._record_epoch)

    def _record_epoch(self) -> None:
        for s in range(self.steps):
            self._record_step(s)
        self.eng.record_epoch_end()

    def _record_step(self, s: int, autotune: bool = False, update: bool = True) -> None:
        for name, queue in self.step_nodes(s, autotune):
            if update or name != "update":
                queue()

    def step_nodes(self, s: int, autotune: bool = False) -> list[tuple[str, Callable[[], None]]]:
        """The operations of step s in stream order, each named and ready to queue (profiling times each)."""
        eng, spec = self.eng, self.eng.spec
        rows = self.rows[s]
        pos0 = s * eng.config.batch_size + self.offsets[s]
        parallel = eng.group is not None
        n_layers = len(self.layers)
        # Step 0 gathers its batch; every later step's batch is gathered by the previous step's update kernel.
        nodes = []
        if rows == 0:  # a data-parallel rank with nothing of this (short) batch: zero gradients into the sums
            nodes.append(("zero_grads", eng.record_zero_grads))
            for i in reversed(range(n_layers)):
                nodes.append((f"gradsum{i}", partial(eng.record_grad_sum, i)))
                if eng.sharded:
                    nodes.append(self._shard_update_node(s, i))
            return self._end_step(s, nodes)
        if s == 0:
            nodes.append(("gather", partial(eng.record_gather, self.x, self.y, self.n, self.dtype, pos0, rows,
                                            self.x_batch, self.y_batch.ptr, True)))  # fmt: skip
        nodes += eng.forward_nodes(self.layers, self.x_batch.ptr, rows, autotune)
        last = self.layers[-1]
        nodes.append(("softmax", partial(self.softmax[rows].forward, last.out.ptr, self.probs.ptr)))
        names = eng.layout.names
        last_bias = eng.grad_ptr(names[-1])
        nodes.append(("loss", partial(eng.record_loss, last.out.ptr, self.probs.ptr, self.y_batch.ptr, rows,
                                      last.dout.ptr, last_bias, 0, eng.epoch_state.ptr,
                                      self.batch_rows[s])))  # fmt: skip
        for i in reversed(range(n_layers)):
            layer = self.layers[i]
            h_in = self.x_batch.ptr if i == 0 else self.layers[i - 1].out.ptr
            gw = eng.grad_ptr(names[2 * i])
            gb = 0 if i == len(self.layers) - 1 else eng.grad_ptr(names[2 * i + 1])
            if gb and HIDDEN_BIAS_GRAD == "kernel":
                nodes.append(
                    (f"bgrad{i}", partial(eng.record_colsum, layer.dout.ptr, rows, eng.config.model.sizes[i + 1], gb))
                )
                gb = 0
            nodes.append((f"wgrad{i}", partial(_run, layer.dw[rows], autotune, eng.stream, h_in, layer.dout.ptr,
                                               gw, gw, bias=gb)))  # fmt: skip
            if parallel:  # this layer's gradient is complete: its sum overlaps the rest of the backward pass
                nodes.append((f"gradsum{i}", partial(eng.record_grad_sum, i)))
            if i > 0:
                prev = self.layers[i - 1]
                w = eng.param_ptr(names[2 * i], spec.operand)
                nodes.append((f"dgrad{i}", partial(_run, layer.dx[rows], autotune, eng.stream, w, layer.dout.ptr,
                                                   prev.dout.ptr, prev.dout.ptr, aux=prev.aux.ptr)))  # fmt: skip
            if eng.sharded:  # the layer's weights are read for the last time this step: its part can be updated
                nodes.append(self._shard_update_node(s, i))
        return self._end_step(s, nodes)

    def _shard_update_node(self, s: int, layer: int) -> tuple:
        """Step s's sharded update of `layer`'s part; the last layer updated (the first) also gathers the next
        batch."""
        gather = self._gather_next(s) if layer == 0 else None
        return ("update", partial(self.eng.record_shard_update, layer, s, self.steps, gather))

    def _end_step(self, s: int, nodes: list) -> list:
        """`nodes` followed by the step's end: the join with the side stream, then (unless sharded: done there)
        the update."""
        eng = self.eng
        if eng.group is not None:
            nodes.append(("join", eng.record_join))
        if not eng.sharded:
            nodes.append(("update", partial(eng.record_update, s, self.steps, self._gather_next(s))))
        return nodes

    def _gather_next(self, s: int) -> tuple | None:
        """record_update's `gather` for the batch after step s (this rank's part of it), None after the last."""
        if s + 1 >= self.steps:
            return None
        pos0 = (s + 1) * self.eng.config.batch_size + self.offsets[s + 1]
        return (self.x, self.y, self.n, self.dtype, pos0, self.rows[s + 1], self.x_batch, self.y_batch.ptr)


class _EvalContext(_Owner):
    """A captured forward-only graph over one evaluation set, in chunks of EVAL_ROWS rows."""

    def __init__(self, eng: CudaEngine, x: np.ndarray, y: np.ndarray | None) -> None:
        super().__init__()
        self.eng = eng
        drv, spec, model = eng._drv, eng.spec, eng.config.model
        self.n, self.dtype = x.shape[0], x.dtype
        self.rows = [min(EVAL_ROWS, self.n - s) for s in range(0, self.n, EVAL_ROWS)]
        try:
            buf = lambda nbytes: self.own(drv.DeviceBuffer(max(int(nbytes), 256)))  # noqa: E731
            self.x = buf(x.nbytes)
            self.y = buf(self.n * 4)
            self.acc = buf(16)
            R = max(self.rows)
            self.x_batch = buf(R * model.in_features * _size(spec.operand))
            self.probs = buf(self.n * model.classes * _size(spec.logits))
            last = len(model.layers) - 1
            self.layers = [
                _Layer(out=buf(R * d_out * _size(spec.logits if i == last else spec.operand)))
                for i, (_, d_out) in enumerate(model.layers)
            ]
            self.softmax = {}
            for rows in set(self.rows):
                eng.forward_plans(self.layers, rows, training=False, own=self.own)
                self.softmax[rows] = self.own(eng.softmax(rows))
            self.load(x, y)
            self.graph = self.own(eng.capture(self._record))
        except BaseException:
            self.release()
            raise

    def load(self, x: np.ndarray, y: np.ndarray | None) -> None:
        self.eng.upload(self.x, x)
        self.eng.upload(self.y, y if y is not None else np.zeros(self.n, dtype=np.int32))

    def _record(self) -> None:
        eng = self.eng
        classes = eng.config.model.classes
        for start, rows in zip(range(0, self.n, EVAL_ROWS), self.rows):
            eng.record_gather(self.x, self.y, self.n, self.dtype, start, rows, self.x_batch, 0, False)
            for _, queue in eng.forward_nodes(self.layers, self.x_batch.ptr, rows):
                queue()
            probs = self.probs.ptr + start * classes * _size(eng.spec.logits)
            self.softmax[rows].forward(self.layers[-1].out.ptr, probs)
            eng.record_loss(self.layers[-1].out.ptr, probs, self.y.ptr + 4 * start, rows, 0, 0, self.acc.ptr, 0)

    def run(self, out_ptr: int) -> None:
        """Queue: zero the sums, replay the forward graph, copy (loss sum, correct) to pinned `out_ptr`."""
        eng = self.eng
        self.acc.memset(0, eng.stream)
        self.graph.launch(eng.stream)
        eng._drv.copy_dtoh(out_ptr, self.acc.ptr, 16, eng.stream)


def _run(plan, autotune: bool, stream, a: int, b: int, c: int, d: int, bias: int = 0, aux: int = 0) -> None:
    if autotune:
        plan.autotune(a, b, c, d, stream, bias=bias, aux=aux)
    plan(a, b, c, d, stream, bias=bias, aux=aux)


class _DataKey:
    """Identity of the host data last uploaded: the same x array (held, so its id cannot be reused) and
    equal labels (`Trainer` converts labels to int32 on every call, so they are compared by value) are
    not uploaded again. An x changed in place since is not noticed: pass a new array."""

    def __init__(self, x: np.ndarray, y: np.ndarray | None) -> None:
        self.x, self.y = x, None if y is None else y.copy()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _DataKey) or other.x is not self.x:
            return False
        if self.y is None or other.y is None:
            return self.y is other.y
        return self.y.shape == other.y.shape and bool(np.array_equal(self.y, other.y))


def _data_key(x: np.ndarray | CudaArray, y: np.ndarray | None) -> _DataKey:
    # A GPU array is copied again on every call (device to device: cheap) and never held by the engine.
    return _DataKey(object() if isinstance(x, CudaArray) else x, y)


def _tag(t: type) -> str:
    return "f16" if t == np.float16 else "f32"


def _dnn_type(t: type) -> str:
    return "fp16" if t == np.float16 else "fp32"


CudaEngine._train_context = _TrainContext
