"""native/many.cu's kernels with their arguments packed, and one training step (or forward pass) queued on a
stream, top to bottom: gather, forward per layer, loss, per layer (last first) weight and input gradients, update.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....cuda import driver
from ....cuda.driver import arg_f32, arg_i32, arg_ptr, arg_struct, arg_u32, arg_u64

__all__ = [
    "KERNELS", "STEP_FIELDS", "Net", "StepTables", "record_check", "record_forward", "record_loss", "record_step",
    "step_arg",
]  # fmt: skip

#: Every kernel of native/many.cu this engine launches (a CPU test checks each is in the compiled module).
KERNELS = (
    "many_gather_u8", "many_gather_f32", "many_forward_none", "many_forward_relu", "many_forward_gelu", "many_xent",
    "many_mse", "many_wgrad", "many_dgrad_relu", "many_dgrad_gelu", "many_update", "many_check",
)  # fmt: skip
#: native/many.cu's Step, field for field: (name, type); pointers travel as u64.
STEP_FIELDS = (
    ("model_stream", "u64"), ("stream_group", "u64"), ("stream_epoch", "u64"), ("group_n", "u64"),
    ("group_half", "u64"), ("step", "i32"), ("batch", "i32"), ("drop_last", "i32"), ("shuffled", "i32"),
)  # fmt: skip
GATHER_THREADS = 256
LOSS_THREADS = 256
ELEMENTWISE_THREADS = 256
TILE = 16  # native/many.cu's TILE: the GEMMs' 16 x 16 blocks


@dataclass(frozen=True)
class StepTables:
    """What a pass over a data set reads: the resident set (x, y), the input's affine map, its groups' tables and
    the pass's streams (device addresses)."""

    x: int
    y: int
    x_u8: bool
    scale: float
    shift: float
    fscale: int  #: per-feature scale table or 0
    fshift: int
    rows: int
    group_offsets: int
    group_n: int
    group_half: int
    model_stream: int
    stream_group: int
    stream_epoch: int
    streams: int  #: S


def step_arg(t: StepTables, step: int, batch: int, drop_last: bool, shuffled: bool):
    """The Step record of `step`."""
    values = (t.model_stream, t.stream_group, t.stream_epoch, t.group_n, t.group_half, step, batch, int(drop_last),
              int(shuffled))  # fmt: skip
    return arg_struct([(name, kind, v) for (name, kind), v in zip(STEP_FIELDS, values)])


@dataclass
class Net:
    """What a step touches: the module, the stream, the model and its layout, the buffers' addresses."""

    mod: driver.Module
    stream: driver.Stream
    sm_count: int
    models: int
    batch: int
    sizes: tuple[int, ...]
    activation: str  #: "relu" or "gelu"
    regression: bool
    stride: int  #: floats per model block
    count: int  #: parameters per model (padding between tensors included)
    w_offsets: tuple[int, ...]
    b_offsets: tuple[int, ...]
    params: int  #: W (K x stride)
    s1: int  #: optimizer state 1 or 0
    s2: int  #: optimizer state 2 or 0
    grads: int
    z: tuple[int, ...]  #: per layer (K, batch, out): pre-activations (the last: the outputs)
    h: tuple[int, ...]  #: per hidden layer (K, batch, out): activations
    dz: tuple[int, ...]  #: per layer (K, batch, out): gradients of the pre-activations
    xb: int  #: (S, batch, d) fp32
    yb: int  #: (S, batch, y words)
    y_words: int
    seed: tuple[int, int]
    opt: int  #: OptimParams (K,)
    lr: int  #: float32 (K, lr_stride)
    lr_stride: int
    step0: int  #: uint64 (K,)


def _grid2(cols: int, rows: int, models: int) -> tuple[int, int, int]:
    return (-(-cols // TILE), -(-rows // TILE), models)


def record_forward(net: Net, t: StepTables, step: int, shuffled: bool, drop_last: bool) -> None:
    """Queue the gather of `step` and every layer's forward."""
    st = step_arg(t, step, net.batch, drop_last, shuffled)
    d = net.sizes[0]
    src = "u8" if t.x_u8 else "f32"
    net.mod.function(f"many_gather_{src}").launch(
        (net.batch, t.streams, 1), (GATHER_THREADS, 1, 1),
        [arg_ptr(t.x), arg_ptr(t.y), arg_i32(net.y_words), arg_i32(d), arg_ptr(t.rows), arg_ptr(t.group_offsets), st,
         arg_u32(net.seed[0]), arg_u32(net.seed[1]), arg_f32(t.scale), arg_f32(t.shift), arg_ptr(t.fscale),
         arg_ptr(t.fshift), arg_ptr(net.xb), arg_ptr(net.yb)],
        net.stream,
    )  # fmt: skip
    last = len(net.sizes) - 2
    for i, (fan_in, fan_out) in enumerate(zip(net.sizes[:-1], net.sizes[1:])):
        act = "none" if i == last else net.activation
        net.mod.function(f"many_forward_{act}").launch(
            _grid2(fan_out, net.batch, net.models), (TILE, TILE, 1),
            [arg_ptr(net.xb), arg_ptr(0 if i == 0 else net.h[i - 1]), arg_i32(fan_in), arg_i32(fan_out),
             arg_ptr(net.params), arg_u64(net.stride), arg_u64(net.w_offsets[i]), arg_u64(net.b_offsets[i]),
             arg_ptr(net.z[i]), arg_ptr(0 if i == last else net.h[i]), st],
            net.stream,
        )  # fmt: skip


def record_loss(net: Net, t: StepTables, step: int, drop_last: bool, shuffled: bool, hist: int, dz: int,
                sse: int = 0) -> None:  # fmt: skip
    """Queue the loss of every model's rows at `step`: sums into hist (K x 2 doubles), gradients into dz if given."""
    st = step_arg(t, step, net.batch, drop_last, shuffled)
    c = net.sizes[-1]
    if net.regression:
        net.mod.function("many_mse").launch(
            (net.models, 1, 1), (LOSS_THREADS, 1, 1),
            [arg_ptr(net.z[-1]), arg_ptr(net.yb), arg_i32(c), arg_ptr(dz), arg_ptr(hist), arg_ptr(sse), st],
            net.stream,
        )  # fmt: skip
    else:
        net.mod.function("many_xent").launch(
            (net.models, 1, 1), (LOSS_THREADS, 1, 1),
            [arg_ptr(net.z[-1]), arg_ptr(net.yb), arg_i32(c), arg_ptr(dz), arg_ptr(hist), st], net.stream,
        )  # fmt: skip


def record_step(net: Net, t: StepTables, step: int, drop_last: bool, hist: int) -> None:
    """Queue training step `step` of every model whose stream has rows at it."""
    record_forward(net, t, step, True, drop_last)
    record_loss(net, t, step, drop_last, True, hist, net.dz[-1])
    st = step_arg(t, step, net.batch, drop_last, True)
    for i in reversed(range(len(net.sizes) - 1)):
        fan_in, fan_out = net.sizes[i], net.sizes[i + 1]
        net.mod.function("many_wgrad").launch(
            _grid2(fan_in + 1, fan_out, net.models), (TILE, TILE, 1),
            [arg_ptr(net.xb), arg_ptr(0 if i == 0 else net.h[i - 1]), arg_i32(fan_in), arg_i32(fan_out),
             arg_ptr(net.dz[i]), arg_ptr(net.grads), arg_u64(net.stride), arg_u64(net.w_offsets[i]),
             arg_u64(net.b_offsets[i]), st],
            net.stream,
        )  # fmt: skip
        if i > 0:
            net.mod.function(f"many_dgrad_{net.activation}").launch(
                _grid2(fan_in, net.batch, net.models), (TILE, TILE, 1),
                [arg_ptr(net.dz[i]), arg_i32(fan_in), arg_i32(fan_out), arg_ptr(net.params), arg_u64(net.stride),
                 arg_u64(net.w_offsets[i]), arg_ptr(net.z[i - 1]), arg_ptr(net.dz[i - 1]), st],
                net.stream,
            )  # fmt: skip
    total = net.models * net.stride
    net.mod.function("many_update").launch(
        (elementwise_blocks(net, total), 1, 1), (ELEMENTWISE_THREADS, 1, 1),
        [arg_ptr(net.params), arg_ptr(net.grads), arg_ptr(net.s1), arg_ptr(net.s2), arg_u64(net.stride),
         arg_u64(net.count), arg_i32(net.models), arg_ptr(net.opt), arg_ptr(net.lr), arg_i32(net.lr_stride),
         arg_ptr(net.step0), st],
        net.stream,
    )  # fmt: skip


def record_check(net: Net, half: bool, bad: int) -> None:
    """Queue the per-model check of the state (bits into bad (K,) uint32, zeroed by the caller)."""
    total = net.models * net.stride
    net.mod.function("many_check").launch(
        (elementwise_blocks(net, total), 1, 1), (ELEMENTWISE_THREADS, 1, 1),
        [arg_ptr(net.params), arg_ptr(net.s1), arg_ptr(net.s2), arg_u64(net.stride), arg_u64(net.count),
         arg_i32(net.models), arg_i32(int(half)), arg_ptr(bad)],
        net.stream,
    )  # fmt: skip


def elementwise_blocks(net: Net, n: int) -> int:
    return max(1, min(-(-n // ELEMENTWISE_THREADS), net.sm_count * 8))

