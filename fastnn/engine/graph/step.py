"""One training step of the graph engine, top to bottom, and the epoch made of them (what is captured).

A step, all on one stream: gather (the shuffle computed on the device) -> per layer a cuBLASLt GEMM with bias and
activation fused in its epilogue -> cuDNN softmax -> the fused loss kernel (loss, accuracy, logits gradient, last
bias gradient) -> per layer, last to first, the weight-gradient GEMM (hidden bias gradient fused, BGRADB) and the
input-gradient GEMM (activation gradient fused) -> one update kernel over all parameters, which also gathers the
next step's batch. A weighted fit (Trainer.fit(sample_weight=...)) gathers the batch's weights before its loss
and launches the weighted loss kernel (native/loss.cu's wxent / wmse) instead; an unweighted one records exactly
the nodes it did before. A regression (loss "mse") has no softmax: its loss kernel reads the linear outputs and the
gathered targets. In a data-parallel run each layer's gradient is summed over the ranks on a side stream as soon
as its GEMM has made it (parallel.py). The epoch ends with the state check, snapshot and counter advance
(kernels.record_epoch_end), so replays need no host work between them.

Each operation is a named node ready to queue, so the profiler can time them one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Protocol

from . import kernels
from .plans import run

if TYPE_CHECKING:
    from ...cuda import cudnn, driver
    from .buffers import Layer
    from .resources import Resources

__all__ = ["Node", "StepContext", "forward_nodes", "record_epoch", "record_step", "step_nodes"]


class StepContext(kernels.ResidentSet, Protocol):
    """What a step reads of its training context (contexts.TrainContext is one), beyond the resident set: each
    step's rows on this rank, their offset in the batch and the whole batch's rows, the batch buffers, the layers'
    buffers and plans, and the softmax's probabilities and plans (None and empty for a regression)."""

    rows: list[int]
    offsets: list[int]
    batch_rows: list[int]
    x_batch: driver.DeviceBuffer
    y_batch: driver.DeviceBuffer
    layers: list[Layer]
    probs: driver.DeviceBuffer | None
    softmax: dict[int, cudnn.Softmax]
    #: A weighted fit's (TrainContext.use_weights): the set's weights, the batch's, and the modules of
    #: gather_weights and the weighted loss; None for an unweighted fit, whose nodes are the same as before.
    weights: driver.DeviceBuffer | None
    w_batch: driver.DeviceBuffer | None
    weight_mods: tuple[driver.Module, driver.Module] | None


#: One operation of a step: its name (profile_step reports it) and a call that queues it on the stream.
Node = tuple[str, Callable[[], None]]


def step_nodes(ctx: StepContext, s: int, autotune: bool = False) -> list[Node]:
    """The operations of step s in stream order, each named and ready to queue (profiling times each)."""
    res, spec = ctx.res, ctx.res.spec
    rows = ctx.rows[s]
    pos0 = s * res.config.batch_size + ctx.offsets[s]
    par = res.parallel
    n_layers = len(ctx.layers)
    names = res.layout.names
    nodes: list[Node] = []
    if rows == 0:  # a data-parallel rank with nothing of this (short) batch: zero gradients into the sums
        nodes.append(("zero_grads", partial(kernels.record_zero_grads, res)))
        for i in reversed(range(n_layers)):
            nodes.append((f"gradsum{i}", partial(par.record_grad_sum, i)))
            if res.sharded:
                nodes.append(_shard_update_node(ctx, s, i))
        return _end_step(ctx, s, nodes)

    # ---- forward: step 0 gathers its batch; every later step's batch is gathered by the previous step's update
    if s == 0:
        nodes.append(("gather", partial(kernels.record_gather, res, ctx.x, ctx.y, ctx.n, ctx.dtype, pos0, rows,
                                        ctx.x_batch, ctx.y_batch.ptr, True)))  # fmt: skip
    nodes += forward_nodes(res, ctx.layers, ctx.x_batch.ptr, rows, autotune)
    last = ctx.layers[-1]
    last_bias = res.grad_ptr(names[-1])
    if ctx.weight_mods is not None:  # a weighted fit: the batch's weights (its rows' order), then the weighted loss
        gather_mod, loss_mod = ctx.weight_mods
        nodes.append(("weights", partial(kernels.record_weight_gather, res, gather_mod, ctx.weights.ptr, ctx.n, pos0,
                                         rows, ctx.w_batch.ptr)))  # fmt: skip
        if res.loss.softmax:
            nodes.append(("softmax", partial(ctx.softmax[rows].forward, last.out.ptr, ctx.probs.ptr)))
        probs = ctx.probs.ptr if res.loss.softmax else 0
        nodes.append(("loss", partial(kernels.record_weighted_loss, res, loss_mod, last.out.ptr, probs,
                                      ctx.y_batch.ptr, ctx.w_batch.ptr, rows, last.dout.ptr, last_bias,
                                      res.epoch_state.ptr)))  # fmt: skip
    elif not res.loss.softmax:  # linear outputs: the squared error straight from them, against the gathered targets
        nodes.append(("loss", partial(kernels.record_mse, res, last.out.ptr, ctx.y_batch.ptr, rows, last.dout.ptr,
                                      last_bias, 0, 0, res.epoch_state.ptr, ctx.batch_rows[s])))  # fmt: skip
    else:
        nodes.append(("softmax", partial(ctx.softmax[rows].forward, last.out.ptr, ctx.probs.ptr)))
        nodes.append(("loss", partial(kernels.record_loss, res, last.out.ptr, ctx.probs.ptr, ctx.y_batch.ptr, rows,
                                      last.dout.ptr, last_bias, 0, res.epoch_state.ptr,
                                      ctx.batch_rows[s])))  # fmt: skip

    # ---- backward, last layer first
    for i in reversed(range(n_layers)):
        layer = ctx.layers[i]
        h_in = ctx.x_batch.ptr if i == 0 else ctx.layers[i - 1].out.ptr
        gw = res.grad_ptr(names[2 * i])
        gb = 0 if i == n_layers - 1 else res.grad_ptr(names[2 * i + 1])  # the last layer's: the loss kernel's
        nodes.append((f"wgrad{i}", partial(run, layer.dw[rows], autotune, res.stream, h_in, layer.dout.ptr, gw, gw,
                                           bias=gb)))  # fmt: skip
        if par is not None:  # this layer's gradient is complete: its sum overlaps the rest of the backward pass
            nodes.append((f"gradsum{i}", partial(par.record_grad_sum, i)))
        if i > 0:
            prev = ctx.layers[i - 1]
            w = res.param_ptr(names[2 * i], spec.operand)
            nodes.append((f"dgrad{i}", partial(run, layer.dx[rows], autotune, res.stream, w, layer.dout.ptr,
                                               prev.dout.ptr, prev.dout.ptr, aux=prev.aux.ptr)))  # fmt: skip
        if res.sharded:  # the layer's weights are read for the last time this step: its part can be updated
            nodes.append(_shard_update_node(ctx, s, i))

    # ---- update (with the next step's gather)
    return _end_step(ctx, s, nodes)


def forward_nodes(res: Resources, layers: list[Layer], x_ptr: int, rows: int, autotune: bool = False) -> list[Node]:
    """(name, queue) of each layer's forward GEMM for `rows` rows of input at x_ptr."""
    names = res.layout.names
    nodes, h = [], x_ptr
    for i, layer in enumerate(layers):
        w = res.param_ptr(names[2 * i], res.spec.operand)
        b = res.param_ptr(names[2 * i + 1], res.out_type(i))
        aux = layer.aux.ptr if layer.aux is not None else 0
        queue = partial(run, layer.fwd[rows], autotune, res.stream, w, h, layer.out.ptr, layer.out.ptr, bias=b,
                        aux=aux)  # fmt: skip
        nodes.append((f"forward{i}", queue))
        h = layer.out.ptr
    return nodes


def _shard_update_node(ctx: StepContext, s: int, layer: int) -> Node:
    """Step s's sharded update of `layer`'s part; the last layer updated (the first) also gathers the next
    batch."""
    gather = _gather_next(ctx, s) if layer == 0 else None
    return ("update", partial(ctx.res.parallel.record_shard_update, layer, s, ctx.steps, gather))


def _end_step(ctx: StepContext, s: int, nodes: list[Node]) -> list[Node]:
    """`nodes` followed by the step's end: the join with the side stream, then (unless sharded: done there)
    the update."""
    res = ctx.res
    if res.parallel is not None:
        nodes.append(("join", res.parallel.record_join))
    if not res.sharded:
        nodes.append(("update", partial(kernels.record_update, res, s, ctx.steps, _gather_next(ctx, s))))
    return nodes


def _gather_next(ctx: StepContext, s: int) -> tuple | None:
    """record_update's `gather` for the batch after step s (this rank's part of it), None after the last."""
    if s + 1 >= ctx.steps:
        return None
    pos0 = (s + 1) * ctx.res.config.batch_size + ctx.offsets[s + 1]
    return (ctx.x, ctx.y, ctx.n, ctx.dtype, pos0, ctx.rows[s + 1], ctx.x_batch, ctx.y_batch.ptr)


def record_step(ctx: StepContext, s: int, autotune: bool = False, update: bool = True) -> None:
    """Queue step s (autotune: each GEMM plan times its candidates first; update=False: no update node)."""
    for name, queue in step_nodes(ctx, s, autotune):
        if update or name != "update":
            queue()


def record_epoch(ctx: StepContext) -> None:
    """Queue every step of the epoch, then the epoch's end."""
    for s in range(ctx.steps):
        record_step(ctx, s)
    kernels.record_epoch_end(ctx.res)
