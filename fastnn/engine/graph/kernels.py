"""fastnn's own kernels in the graph engine's step, queued on its stream with their arguments packed: the gather
(native/gather.cu), the loss (loss.cu), the update fused with the next batch's gather (update.cu), and the
epoch-end check, snapshot and advance every GPU engine records (epoch.cu). Each file is compiled (NVRTC,
disk-cached) and loaded once per process and GPU, when an engine is built (the gather and loss of the fused and
grid engines on a thread while their first fit trains: ready.py), never during capture. Of gather.cu, loss.cu and
update.cu only the kernels the engine's precision launches are compiled (gather_file, loss_file, update_file)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..._data import input_affine
from ..._optim import KernelParams
from ..._shuffle import feistel_bits, split_u64
from ...cuda import driver, nvrtc
from ...cuda.driver import arg_f32, arg_i32, arg_ptr, arg_struct, arg_u32, arg_u64
from .buffers import itemsize

if TYPE_CHECKING:
    from ..plan import PrecisionSpec
    from .resources import Resources

__all__ = [
    "GATHER_THREADS", "ResidentSet", "UPDATE_THREADS", "elementwise_blocks", "gather_args", "gather_file",
    "launch_elementwise", "loss_file", "module", "only", "persistent_epoch_args", "record_epoch_end", "record_gather",
    "record_loss", "record_mse", "record_update", "record_weight_gather", "record_weighted_loss", "record_zero_grads",
    "refresh_half_copy", "update_file", "weighted_files",
]  # fmt: skip

class ResidentSet(Protocol):
    """What the kernels' launches read of a training context (contexts.TrainContext is one): the record, the
    resident set's buffers, its rows and their type, and the steps of an epoch."""

    res: Resources
    x: driver.DeviceBuffer
    y: driver.DeviceBuffer
    n: int
    dtype: np.dtype
    steps: int


GATHER_THREADS = 256  # native/gather.cuh: a block per batch row (UPDATE_THREADS too: update.cu fuses both)
UPDATE_THREADS = 256  # the block of update.cu's and epoch.cu's grid-stride kernels

_modules_lock = threading.Lock()
_modules: dict[tuple[int, str, tuple[str, ...]], driver.Module] = {}  # (device, file, options) -> loaded module
_making: dict[tuple[int, str, tuple[str, ...]], threading.Event] = {}  # the keys a thread compiles now: set when done


def module(device: driver.Device, filename: str, options: tuple[str, ...] = ()) -> driver.Module:
    """native/<filename> compiled with NVRTC `options` (disk-cached) and loaded on `device`, once per process.

    Compiled outside the lock: a thread compiling one file (the evaluation's, prepared in the background: ready.py)
    does not hold up another thread's different file; a second caller of the same file waits for the first."""
    key = (device.ordinal, filename, tuple(options))
    while True:
        with _modules_lock:
            if key in _modules:
                return _modules[key]
            making = _making.get(key)
            if making is None:
                making = _making[key] = threading.Event()
                break
        making.wait()  # made meanwhile (or failed: then this caller tries, and meets the error itself)
    try:
        made = driver.Module(nvrtc.compile_native(filename, device.arch, tuple(options)))
        with _modules_lock:
            _modules[key] = made
        return made
    finally:
        with _modules_lock:
            del _making[key]
        making.set()


def only(names) -> tuple[str, ...]:
    """NVRTC options that compile only the kernels `names` of a file that lists its kernels (gather.cu, loss.cu): an
    engine launches one precision's, and NVRTC's time grows with the kernels it compiles (loss.cu: one of six costs
    about a sixth of all six)."""
    return ("-DONLY_LISTED", *(f"-DKERNEL_{n}" for n in sorted(names)))


def gather_file(spec: PrecisionSpec) -> tuple[str, tuple[str, ...]]:
    """(file, options) of the gathers a `spec` engine launches: uint8 and float32 rows into its operand type."""
    return "gather.cu", only(f"gather_{src}_{spec.gather_kernel_suffix}" for src in ("u8", "f32"))


def loss_file(spec: PrecisionSpec, regression: bool) -> tuple[str, tuple[str, ...]]:
    """(file, options) of the one loss kernel a `spec` engine launches: cross-entropy, or a regression's mse."""
    return "loss.cu", only([spec.mse_kernel if regression else spec.loss_kernel])


def update_file(spec: PrecisionSpec) -> tuple[str, tuple[str, ...]]:
    """(file, options) of the updates a `spec` engine launches: alone, and fused with the next uint8 or float32
    batch's gather (three of update.cu's nine)."""
    names = [spec.update_kernel, *(spec.update_gather_kernel(src) for src in ("u8", "f32"))]
    return "update.cu", only(names)


def weighted_files(spec: PrecisionSpec, regression: bool) -> list[tuple[str, tuple[str, ...]]]:
    """(file, options) of what a weighted fit launches besides the step's kernels, compiled only when a fit is
    weighted: gather.cu's gather_weights and loss.cu's weighted loss (wxent, or a regression's wmse). The unweighted
    kernels and their compile options stay as they are."""
    return [("gather.cu", only(["gather_weights"])), ("loss.cu", only([weighted_loss_kernel(spec, regression)]))]


def weighted_loss_kernel(spec: PrecisionSpec, regression: bool) -> str:
    """native/loss.cu's weighted loss in the types of the unweighted one: "w" + its name."""
    return "w" + (spec.mse_kernel if regression else spec.loss_kernel)


def elementwise_blocks(res: Resources, n: int) -> int:
    return max(1, min(-(-n // UPDATE_THREADS), res.dev.sm_count * 8))


def launch_elementwise(res: Resources, mod: driver.Module, kernel: str, n: int, args: list, stream=None) -> None:
    """Queue `mod`'s grid-stride `kernel` over n elements on `stream` (default the engine's)."""
    blocks = elementwise_blocks(res, n)
    mod.function(kernel).launch((blocks, 1, 1), (UPDATE_THREADS, 1, 1), args,
                                stream if stream is not None else res.stream)  # fmt: skip


def refresh_half_copy(res: Resources) -> None:
    """Queue the fp16 copy of the fp32 master weights ("mixed": what the GEMMs read)."""
    if res.w16 is not None:
        n = res.layout.total
        args = [arg_ptr(res.train_state.ptr), arg_ptr(res.w16.ptr), arg_u64(n)]
        launch_elementwise(res, res.epoch_mod, "cast_f32_f16", n, args)


def record_gather(res: Resources, x_dev, y_dev, n: int, x_dtype: np.dtype, pos0: int, rows: int, out, out_y: int,
                  shuffled: bool) -> None:  # fmt: skip
    """Queue the gather of positions pos0..pos0+rows (shuffled by the epoch's order, or in order)."""
    src, data, affine, dest = gather_args(res, x_dev, y_dev, n, x_dtype, out, out_y)
    state = [arg_ptr(res.epoch_state.ptr if shuffled else 0)]
    res.gather_mod.function(f"gather_{src}_{res.spec.gather_kernel_suffix}").launch(
        (rows, 1, 1), (GATHER_THREADS, 1, 1), data + state + [arg_i32(pos0)] + affine + dest, res.stream
    )


def gather_args(res: Resources, x_dev, y_dev, n: int, x_dtype: np.dtype, out,
                out_y: int) -> tuple[str, list, list, list]:  # fmt: skip
    """gather.cuh's arguments in groups: source tag, (x .. half_bits), (scale, shift), (out, out_y). y is copied as
    res.y_words 32-bit words per sample: an int32 label, or a regression's float32 targets."""
    seed_lo, seed_hi = split_u64(res.config.seed)
    scale, shift = input_affine(x_dtype, res.config.normalize)
    data = [
        arg_ptr(x_dev.ptr), arg_ptr(y_dev.ptr), arg_i32(res.y_words), arg_i32(res.config.model.in_features),
        arg_u32(n), arg_u32(seed_lo), arg_u32(seed_hi), arg_u32(feistel_bits(n) // 2),
    ]  # fmt: skip
    src = "u8" if x_dtype == np.uint8 else "f32"
    table = res.feature_affine.get(np.dtype(x_dtype))
    if table is None:
        affine = [arg_f32(scale), arg_f32(shift), arg_ptr(0), arg_ptr(0)]
    else:  # per feature: d scales then d shifts
        d = res.config.model.in_features
        affine = [arg_f32(1.0), arg_f32(0.0), arg_ptr(table.ptr), arg_ptr(table.ptr + 4 * d)]
    return src, data, affine, [arg_ptr(out.ptr), arg_ptr(out_y)]


def record_loss(res: Resources, logits: int, probs: int, labels: int, rows: int, dlogits: int, dbias: int, acc: int,
                state: int, batch_rows: int | None = None) -> None:  # fmt: skip
    """Queue the one-block loss kernel (loss and correct sums into acc; gradients when dlogits != 0). The
    gradient is of the mean over `batch_rows` (default `rows`): a data-parallel rank's part of a larger batch."""
    res.loss_mod.function(res.spec.loss_kernel).launch(
        (1, 1, 1),
        (_loss_threads(res, rows), 1, 1),
        [arg_ptr(logits), arg_ptr(probs), arg_ptr(labels), arg_i32(rows), arg_i32(res.config.model.classes),
         arg_f32(1.0 / (batch_rows or rows)), arg_ptr(dlogits), arg_ptr(dbias), arg_ptr(acc), arg_ptr(state)],
        res.stream,
    )  # fmt: skip


def record_mse(res: Resources, outputs: int, targets: int, rows: int, dout: int, dbias: int, acc: int, sse: int,
               state: int, batch_rows: int | None = None) -> None:  # fmt: skip
    """Queue a regression's one-block loss kernel (loss "mse", native/loss.cu's mse): the loss sum into acc (or the
    epoch's history slot), each output's sum of squared errors into sse when sse != 0 (evaluation), gradients when
    dout != 0. The gradient is of the mean over `batch_rows` (default `rows`) rows and the k outputs, the NumPy
    engine's 2 * (out - y) / (rows * k): a data-parallel rank's part of a larger batch is scaled by the whole."""
    k = res.config.model.classes
    res.loss_mod.function(res.spec.mse_kernel).launch(
        (1, 1, 1),
        (_loss_threads(res, rows), 1, 1),
        [arg_ptr(outputs), arg_ptr(targets), arg_i32(rows), arg_i32(k), arg_f32(2.0 / ((batch_rows or rows) * k)),
         arg_ptr(dout), arg_ptr(dbias), arg_ptr(acc), arg_ptr(sse), arg_ptr(state)],
        res.stream,
    )  # fmt: skip


def record_weight_gather(res: Resources, mod: driver.Module, weights: int, n: int, pos0: int, rows: int,
                         out_w: int) -> None:  # fmt: skip
    """Queue gather_weights (native/gather.cu): the weights of batch positions pos0..pos0+rows into out_w, in the
    epoch's shuffled order (read at replay), the order the batch's rows and labels were gathered in."""
    seed_lo, seed_hi = split_u64(res.config.seed)
    args = [arg_ptr(weights), arg_u32(n), arg_u32(seed_lo), arg_u32(seed_hi), arg_u32(feistel_bits(n) // 2),
            arg_ptr(res.epoch_state.ptr), arg_i32(pos0), arg_i32(rows), arg_ptr(out_w)]  # fmt: skip
    mod.function("gather_weights").launch((-(-rows // GATHER_THREADS), 1, 1), (GATHER_THREADS, 1, 1), args,
                                          res.stream)  # fmt: skip


def record_weighted_loss(res: Resources, mod: driver.Module, outputs: int, probs: int, targets: int, weights: int,
                         rows: int, dout: int, dbias: int, state: int) -> None:  # fmt: skip
    """Queue the weighted one-block loss (native/loss.cu's wxent, or wmse for a regression: probs unused): the sum
    of w_r * loss_r (and the correct count) into the epoch's history, and the gradient of the batch's weighted mean
    sum(w * loss) / sum(w) (fastnn/_loss.py's `weighted`). One GPU only: the batch's weights are all here."""
    regression = not res.loss.softmax
    k = res.config.model.classes
    head = [arg_ptr(outputs), arg_ptr(targets)] if regression else [arg_ptr(outputs), arg_ptr(probs), arg_ptr(targets)]
    mod.function(weighted_loss_kernel(res.spec, regression)).launch(
        (1, 1, 1),
        (_loss_threads(res, rows), 1, 1),
        head + [arg_ptr(weights), arg_i32(rows), arg_i32(k), arg_ptr(dout), arg_ptr(dbias), arg_ptr(0),
                arg_ptr(state)],
        res.stream,
    )  # fmt: skip


def _loss_threads(res: Resources, rows: int) -> int:
    """The loss kernels' block: a thread per row, and at least a warp per output for the column sums."""
    return min(1024, max(-(-rows // 32) * 32, 32 * res.config.model.classes))


def record_update(res: Resources, step: int, steps: int, gather: tuple | None = None,
                  part: tuple[int, int] | None = None, stream=None) -> None:  # fmt: skip
    """Queue step `step`'s update of every parameter, or of the `part` = (first, count) elements of the flat
    buffers (a sharded update), on `stream` (default the main one); with `gather` = (x_dev, y_dev, n, x_dtype,
    pos0, rows, out, out_y), the same kernel gathers the next step's batch (native/update.cu's UPDATE_GATHER)."""
    first, n = part if part is not None else (0, res.layout.total)
    stream = stream if stream is not None else res.stream
    params = res.config.optimizer.kernel_params()
    # Biases that decay otherwise than the weights (bias_decay: fastnn.sklearn's 0) take a launch per tensor, each
    # with its own decay (optim.cuh's optim_bias as KernelParams.for_bias); the gather goes with the last launch.
    runs = [(first, n, False)] if params.bias_decay == params.weight_decay else res.layout.tensor_runs(first, n)
    for i, (first, n, is_bias) in enumerate(runs):
        args = _update_args(res, first, n, step, steps, params.for_bias() if is_bias else params)
        if gather is None or i + 1 < len(runs):
            launch_elementwise(res, res.update_mod, res.spec.update_kernel, n, args, stream)
    if gather is None:
        return
    x_dev, y_dev, n_data, x_dtype, pos0, rows, out, out_y = gather
    src, data, affine, dest = gather_args(res, x_dev, y_dev, n_data, x_dtype, out, out_y)
    blocks = rows + elementwise_blocks(res, n)
    res.update_mod.function(res.spec.update_gather_kernel(src)).launch(
        (blocks, 1, 1), (UPDATE_THREADS, 1, 1), args + data + [arg_i32(pos0), arg_i32(rows)] + affine + dest,
        stream,
    )  # fmt: skip


def _update_args(res: Resources, first: int, n: int, step: int, steps: int, params: KernelParams) -> list:
    """update.cu's arguments (before a gather's) for the n elements from `first` of the flat buffers, with `params`."""
    n_state = len(res.opt_names)
    s1 = res.train_state.ptr + res.param_bytes + 4 * first if n_state >= 1 else 0
    s2 = res.train_state.ptr + res.param_bytes + res.opt_bytes + 4 * first if n_state >= 2 else 0
    w = res.train_state.ptr + first * itemsize(res.spec.param)
    g = res.grads.ptr + first * itemsize(res.spec.grad)
    w16 = res.w16.ptr + 2 * first if res.w16 is not None else 0
    return [
        arg_ptr(w), arg_ptr(g), arg_ptr(s1), arg_ptr(s2), arg_ptr(w16), arg_u64(n),
        arg_ptr(res.epoch_state.ptr), arg_i32(step), arg_i32(steps), arg_struct(params.c_fields()),
    ]  # fmt: skip


def record_zero_grads(res: Resources) -> None:
    """Queue zeroed gradients: a rank whose share of a step is empty still joins that step's all-reduces."""
    res.grads.memset(0, res.stream)


def record_epoch_end(res: Resources) -> None:
    """Queue the epoch-end nodes: check the state the epoch left (native/epoch.cu's check_state, whose
    verdict EpochState.bad_state holds), snapshot it while the loss and state stay finite, advance."""
    if res.parallel is not None:
        res.parallel.record_history_all_reduce()
        if res.sharded:
            res.parallel.record_state_gather()
    words = res.state_bytes // 4
    state = arg_ptr(res.epoch_state.ptr)
    pwords = res.param_bytes // 4
    if res.spec.param == np.float16:  # "fp16": fp16 parameters, then the fp32 optimizer state
        f32, n32, f16, n16 = res.train_state.ptr + res.param_bytes, words - pwords, res.train_state.ptr, pwords
    else:  # fp32 parameters and optimizer state, and for "mixed" the fp16 copy the GEMMs read
        f32, n32 = res.train_state.ptr, words
        f16, n16 = (res.w16.ptr, res.layout.total // 2) if res.w16 is not None else (0, 0)
    check = [arg_ptr(f32), arg_u64(n32), arg_ptr(f16), arg_u64(n16), state]
    launch_elementwise(res, res.epoch_mod, "check_state", max(n32, n16), check)
    args = [arg_ptr(res.train_state.ptr), arg_ptr(res.snapshot.ptr), arg_u64(words), state]
    launch_elementwise(res, res.epoch_mod, "snapshot", words, args)
    res.epoch_mod.function("advance").launch((1, 1, 1), (1, 1, 1), [arg_ptr(res.epoch_state.ptr)], res.stream)


def persistent_epoch_args(ctx: ResidentSet) -> list:
    """The arguments the persistent-kernel engines' epoch kernels (native/fused.cu, fused_logreg.cu, fused_mlp.cu,
    grid.cu, grid_fast.cu, grid_stream.cu) take first, in order: the training state (parameters, optimizer states 1
    and 2 or null, the fp16 copy or null), the resident training set, the shuffle's key, the epoch state, the steps
    and batch, the input's affine map and the optimizer."""
    res = ctx.res
    cfg = res.config
    n_state = len(res.opt_names)
    s1 = res.train_state.ptr + res.param_bytes if n_state >= 1 else 0
    s2 = res.train_state.ptr + res.param_bytes + res.opt_bytes if n_state >= 2 else 0
    scale, shift = input_affine(ctx.dtype, cfg.normalize)
    seed_lo, seed_hi = split_u64(cfg.seed)
    return [
        arg_ptr(res.train_state.ptr), arg_ptr(s1), arg_ptr(s2), arg_ptr(res.w16.ptr if res.w16 is not None else 0),
        arg_ptr(ctx.x.ptr), arg_ptr(ctx.y.ptr), arg_u32(ctx.n),
        arg_u32(seed_lo), arg_u32(seed_hi), arg_u32(feistel_bits(ctx.n) // 2),
        arg_ptr(res.epoch_state.ptr), arg_i32(ctx.steps), arg_i32(cfg.batch_size), arg_f32(scale),
        arg_f32(shift), arg_struct(cfg.optimizer.kernel_params().c_fields()),
    ]  # fmt: skip
