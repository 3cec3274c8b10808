"""native/many.cu's kernels with their arguments packed, and one training step (or forward pass) queued on a
stream, top to bottom: gather, forward per layer, loss, per layer (last first) weight and input gradients, update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from ....cuda import driver
from ....cuda.driver import arg_f32, arg_i32, arg_ptr, arg_struct, arg_u32, arg_u64
from .layout import XENT_TILE_FLOATS, XENT_TILE_MODELS, xent_tile  # the tile's rule is CUDA-free (layout.py)

__all__ = [
    "KERNELS", "LOSS_KERNELS", "STEP_FIELDS", "UPDATE_KERNELS", "XENT_TILE_FLOATS", "XENT_TILE_MODELS", "Net", "Node",
    "StepTables", "forward_nodes",
    "loss_node", "record_check", "record_forward", "record_loss", "record_step", "step_arg", "step_nodes", "xent_tile",
]  # fmt: skip

#: One operation of a step: its name (the profile reports it) and a call that queues it on the stream.
Node = tuple[str, Callable[[], None]]

#: Every kernel of native/many.cu this engine launches (a CPU test checks each is in the compiled module).
KERNELS = (
    "many_gather_u8", "many_gather_f32", "many_forward_x", "many_forward_relu", "many_forward_gelu", "many_xent",
    "many_mse", "many_wgrad_x", "many_wgrad_relu", "many_wgrad_gelu", "many_dgrad_relu", "many_dgrad_gelu",
    "many_update", "many_check", "many_scale_bias", "many_fold_sgd", "many_unscale", "many_xent_tiled",
    "many_update_vec",
)  # fmt: skip
#: Tuning.many_loss_kernel -> the cross-entropy kernel it names (fastnn/engine/tuning.py's MANY_LOSS_KERNELS).
LOSS_KERNELS = {"model": "many_xent", "tiled": "many_xent_tiled"}
#: Tuning.many_update_kernel -> the update kernel it names (MANY_UPDATE_KERNELS).
UPDATE_KERNELS = {"scalar": "many_update", "vec4": "many_update_vec"}
#: native/many.cu's Step, field for field: (name, type); pointers travel as u64.
STEP_FIELDS = (
    ("model_stream", "u64"), ("stream_group", "u64"), ("stream_epoch", "u64"), ("group_n", "u64"),
    ("group_half", "u64"), ("step", "i32"), ("batch", "i32"), ("drop_last", "i32"), ("shuffled", "i32"),
)  # fmt: skip
GATHER_THREADS = 256
LOSS_THREADS = 256  #: native/many.cu's LOSS_SLOTS: many_xent_tiled adds its sums in many_xent's slots and order
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
    """What a step touches: the module, the stream, the model, the state's layout and the buffers' addresses."""

    mod: driver.Module
    stream: driver.Stream
    sm_count: int
    models: int
    batch: int
    sizes: tuple[int, ...]
    activation: str  #: "relu" or "gelu"
    regression: bool
    w_offsets: tuple[int, ...]  #: floats: each layer's weight block in the state arrays (layout.ModelLayout)
    b_offsets: tuple[int, ...]
    starts: int  #: uint64 (tensors + 1,): the blocks' starts, then the total
    block_sizes: int  #: uint32 (tensors,): floats of one model's tensor
    per_model_sizes: tuple[int, ...]  #: the same on the host
    tensors: int
    total: int  #: floats of one state array
    params: int
    s1: int  #: optimizer state 1 or 0
    s2: int  #: optimizer state 2 or 0
    grads: int
    z: tuple[int, ...]  #: per layer (batch, K, out): pre-activations (the last: the outputs)
    dz: tuple[int, ...]  #: per layer (batch, K, out): gradients of the pre-activations
    xb: int  #: (S, batch, d) fp32
    yb: int  #: (S, batch, y words)
    y_words: int
    seed: tuple[int, int]
    opt: int  #: OptimParams (K,)
    lr: int  #: float32 (K, lr_stride)
    lr_stride: int
    step0: int  #: uint64 (K,)
    #: Layer 0 of every model as one cuBLASLt GEMM (a pass of one stream): {"forward": {rows: plan}, "wgrad": ...};
    #: with fold_sgd also "forward_raw" (no bias) and "wgrad_acc" (accumulating into the weights)
    fast: dict | None = None
    wscale: int = 0  #: float32 (K,): layer 0's weight scale of each model under fold_sgd
    #: Models a block of many_xent_tiled (`xent_tile`); 0: many_xent, a block a model (Tuning.many_loss_kernel)
    loss_tile: int = 0
    update_kernel: str = "many_update"  #: UPDATE_KERNELS[Tuning.many_update_kernel]


def _grid2(cols: int, rows: int, models: int) -> tuple[int, int, int]:
    return (-(-cols // TILE), -(-rows // TILE), models)


def _gather_node(net: Net, t: StepTables, step: int, shuffled: bool, drop_last: bool) -> Node:
    st = step_arg(t, step, net.batch, drop_last, shuffled)
    src = "u8" if t.x_u8 else "f32"
    args = [arg_ptr(t.x), arg_ptr(t.y), arg_i32(net.y_words), arg_i32(net.sizes[0]), arg_ptr(t.rows),
            arg_ptr(t.group_offsets), st, arg_u32(net.seed[0]), arg_u32(net.seed[1]), arg_f32(t.scale),
            arg_f32(t.shift), arg_ptr(t.fscale), arg_ptr(t.fshift), arg_ptr(net.xb), arg_ptr(net.yb)]  # fmt: skip
    return "gather", partial(net.mod.function(f"many_gather_{src}").launch, (net.batch, t.streams, 1),
                             (GATHER_THREADS, 1, 1), args, net.stream)  # fmt: skip


def forward_nodes(net: Net, t: StepTables, step: int, shuffled: bool, drop_last: bool, fast_rows: int = 0,
                  fold: bool = False) -> list[Node]:  # fmt: skip
    """The gather of `step` and every layer's forward, named and ready to queue. fast_rows > 0 (one stream with that
    many rows at this step): layer 0 of all models is one cuBLASLt GEMM, Z (rows, K * out) = X W0^T + b0; with
    `fold` (fold_sgd) the GEMM makes X V^T and many_scale_bias the rest (native/many.cu)."""
    st = step_arg(t, step, net.batch, drop_last, shuffled)
    nodes = [_gather_node(net, t, step, shuffled, drop_last)]
    for i, (fan_in, fan_out) in enumerate(zip(net.sizes[:-1], net.sizes[1:])):
        if i == 0 and fast_rows and fold:
            plan = net.fast["forward_raw"][fast_rows]  # type: ignore[index]
            nodes.append(("forward0", partial(plan, 4 * net.w_offsets[0] + net.params, net.xb, 0, net.z[0],
                                              net.stream)))  # fmt: skip
            args = [arg_ptr(net.z[0]), arg_ptr(net.params), arg_u64(net.b_offsets[0]), arg_i32(fan_out),
                    arg_i32(net.models), arg_ptr(net.wscale), st]  # fmt: skip
            nodes.append(("scale_bias0", partial(net.mod.function("many_scale_bias").launch,
                                                 (-(-net.models * fan_out // ELEMENTWISE_THREADS), net.batch, 1),
                                                 (ELEMENTWISE_THREADS, 1, 1), args, net.stream)))  # fmt: skip
            continue
        if i == 0 and fast_rows:
            plan = net.fast["forward"][fast_rows]  # type: ignore[index]
            nodes.append(("forward0", partial(plan, 4 * net.w_offsets[0] + net.params, net.xb, 0, net.z[0],
                                              net.stream, bias=4 * net.b_offsets[0] + net.params)))  # fmt: skip
            continue
        act = "x" if i == 0 else net.activation
        args = [arg_ptr(net.xb), arg_ptr(0 if i == 0 else net.z[i - 1]), arg_i32(fan_in), arg_i32(fan_out),
                arg_i32(net.models), arg_ptr(net.params), arg_u64(net.w_offsets[i]), arg_u64(net.b_offsets[i]),
                arg_ptr(net.z[i]), st]  # fmt: skip
        nodes.append((f"forward{i}", partial(net.mod.function(f"many_forward_{act}").launch,
                                             _grid2(fan_out, net.batch, net.models), (TILE, TILE, 1), args,
                                             net.stream)))  # fmt: skip
    return nodes


def loss_node(net: Net, t: StepTables, step: int, drop_last: bool, shuffled: bool, hist: int, dz: int,
              sse: int = 0) -> Node:  # fmt: skip
    """The loss of every model's rows at `step`: sums into hist (K x 2 doubles), gradients into dz if given."""
    st = step_arg(t, step, net.batch, drop_last, shuffled)
    c, k = arg_i32(net.sizes[-1]), arg_i32(net.models)
    if net.regression:
        name, args = "many_mse", [arg_ptr(net.z[-1]), arg_ptr(net.yb), c, k, arg_ptr(dz), arg_ptr(hist),
                                  arg_ptr(sse), st]  # fmt: skip
    elif net.loss_tile:  # a block a tile of loss_tile models (native/many.cu's many_xent_tiled): the same bits
        args = [arg_ptr(net.z[-1]), arg_ptr(net.yb), c, k, arg_i32(net.loss_tile), arg_ptr(dz), arg_ptr(hist), st]
        return "loss", partial(net.mod.function("many_xent_tiled").launch, (-(-net.models // net.loss_tile), 1, 1),
                               (LOSS_THREADS, 1, 1), args, net.stream)  # fmt: skip
    else:
        name, args = "many_xent", [arg_ptr(net.z[-1]), arg_ptr(net.yb), c, k, arg_ptr(dz), arg_ptr(hist), st]
    return "loss", partial(net.mod.function(name).launch, (net.models, 1, 1), (LOSS_THREADS, 1, 1), args, net.stream)


def step_nodes(net: Net, t: StepTables, step: int, drop_last: bool, hist: int, fast_rows: int = 0,
               fold: bool = False) -> list[Node]:  # fmt: skip
    """Training step `step` of every model whose stream has rows at it, top to bottom: gather, forward per layer,
    loss, per layer (last first) weight and input gradients, update. Named, so the profile can time each.
    fast_rows > 0: layer 0's forward and weight gradient as one cuBLASLt GEMM each (see forward_nodes); with `fold`
    layer 0's SGD update is folded into its weight-gradient GEMM (many_fold_sgd, then the GEMM accumulates)."""
    nodes = forward_nodes(net, t, step, True, drop_last, fast_rows, fold)
    nodes.append(loss_node(net, t, step, drop_last, True, hist, net.dz[-1]))
    st = step_arg(t, step, net.batch, drop_last, True)
    for i in reversed(range(len(net.sizes) - 1)):
        fan_in, fan_out = net.sizes[i], net.sizes[i + 1]
        if i == 0 and fast_rows and fold:  # bias update and dZ scaled, then V -= dZ'^T X in place (beta = 1)
            args = [arg_ptr(net.dz[0]), arg_i32(fan_out), arg_i32(net.models), arg_ptr(net.params),
                    arg_u64(net.b_offsets[0]), arg_ptr(net.wscale), arg_ptr(net.opt), arg_ptr(net.lr),
                    arg_i32(net.lr_stride), st]  # fmt: skip
            nodes.append(("fold0", partial(net.mod.function("many_fold_sgd").launch, (net.models, 1, 1),
                                           (LOSS_THREADS, 1, 1), args, net.stream)))  # fmt: skip
            v = 4 * net.w_offsets[0] + net.params
            plan = net.fast["wgrad_acc"][fast_rows]  # type: ignore[index]
            nodes.append(("wgrad0", partial(plan, net.xb, net.dz[0], v, v, net.stream, alpha=-1.0, beta=1.0)))
        elif i == 0 and fast_rows:  # dW0 (K * out, in) = dZ^T X and db0 = dZ's column sums (BGRADB)
            plan = net.fast["wgrad"][fast_rows]  # type: ignore[index]
            nodes.append(("wgrad0", partial(plan, net.xb, net.dz[0], 0, 4 * net.w_offsets[0] + net.grads, net.stream,
                                            bias=4 * net.b_offsets[0] + net.grads)))  # fmt: skip
        else:
            act = "x" if i == 0 else net.activation
            args = [arg_ptr(net.xb), arg_ptr(0 if i == 0 else net.z[i - 1]), arg_i32(fan_in), arg_i32(fan_out),
                    arg_i32(net.models), arg_ptr(net.dz[i]), arg_ptr(net.grads), arg_u64(net.w_offsets[i]),
                    arg_u64(net.b_offsets[i]), st]  # fmt: skip
            nodes.append((f"wgrad{i}", partial(net.mod.function(f"many_wgrad_{act}").launch,
                                               _grid2(fan_in + 1, fan_out, net.models), (TILE, TILE, 1), args,
                                               net.stream)))  # fmt: skip
        if i > 0:
            args = [arg_ptr(net.dz[i]), arg_i32(fan_in), arg_i32(fan_out), arg_i32(net.models), arg_ptr(net.params),
                    arg_u64(net.w_offsets[i]), arg_ptr(net.z[i - 1]), arg_ptr(net.dz[i - 1]), st]  # fmt: skip
            nodes.append((f"dgrad{i}", partial(net.mod.function(f"many_dgrad_{net.activation}").launch,
                                               _grid2(fan_in, net.batch, net.models), (TILE, TILE, 1), args,
                                               net.stream)))  # fmt: skip
    args = [arg_ptr(net.params), arg_ptr(net.grads), arg_ptr(net.s1), arg_ptr(net.s2), arg_ptr(net.starts),
            arg_ptr(net.block_sizes), arg_i32(net.tensors), arg_u32(0b11 if fast_rows and fold else 0),
            arg_ptr(net.opt), arg_ptr(net.lr), arg_i32(net.lr_stride), arg_ptr(net.step0), st]  # fmt: skip
    nodes.append(("update", partial(net.mod.function(net.update_kernel).launch, per_model_grid(net),
                                    (ELEMENTWISE_THREADS, 1, 1), args, net.stream)))  # fmt: skip
    return nodes


def record_forward(net: Net, t: StepTables, step: int, shuffled: bool, drop_last: bool, fast_rows: int = 0) -> None:
    """Queue the gather of `step` and every layer's forward (layer 0 as one GEMM where fast_rows > 0)."""
    for _, queue in forward_nodes(net, t, step, shuffled, drop_last, fast_rows):
        queue()


def record_loss(net: Net, t: StepTables, step: int, drop_last: bool, shuffled: bool, hist: int, dz: int,
                sse: int = 0) -> None:  # fmt: skip
    """Queue `loss_node`."""
    loss_node(net, t, step, drop_last, shuffled, hist, dz, sse)[1]()


def record_step(net: Net, t: StepTables, step: int, drop_last: bool, hist: int, fast_rows: int = 0,
                fold: bool = False) -> None:  # fmt: skip
    """Queue training step `step` (`step_nodes`)."""
    for _, queue in step_nodes(net, t, step, drop_last, hist, fast_rows, fold):
        queue()


def record_unscale(net: Net) -> None:
    """Queue the fold of layer 0's weight scales back into its weights (the end of a fold_sgd epoch)."""
    size = net.per_model_sizes[0]
    blocks = max(1, min(-(-size // (4 * ELEMENTWISE_THREADS)), -(-net.sm_count * 8 // net.models)))
    net.mod.function("many_unscale").launch(
        (blocks, net.models, 1), (ELEMENTWISE_THREADS, 1, 1),
        [arg_ptr(net.params), arg_u64(net.w_offsets[0]), arg_u64(size), arg_ptr(net.wscale)], net.stream,
    )  # fmt: skip


def record_check(net: Net, half: bool, bad: int) -> None:
    """Queue the per-model check of the state (bits into bad (K,) uint32, zeroed by the caller)."""
    net.mod.function("many_check").launch(
        per_model_grid(net), (ELEMENTWISE_THREADS, 1, 1),
        [arg_ptr(net.params), arg_ptr(net.s1), arg_ptr(net.s2), arg_ptr(net.starts), arg_ptr(net.block_sizes),
         arg_i32(net.tensors), arg_i32(int(half)), arg_ptr(bad)],
        net.stream,
    )  # fmt: skip


def per_model_grid(net: Net) -> tuple[int, int, int]:
    """many_update's (many_update_vec's) and many_check's grid: (x, K), x blocks of ELEMENTWISE_THREADS over a
    model's largest tensor (4 elements a thread), and at most as many as keep every SM busy 8 times over in all."""
    largest = max(net.per_model_sizes)
    want = -(-largest // (4 * ELEMENTWISE_THREADS))
    return (max(1, min(want, -(-net.sm_count * 8 // net.models))), net.models, 1)

