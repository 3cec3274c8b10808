"""Per-node timing of the graph engine's training step, so the next optimisation target is visible
(benchmarks/bench_kernels.py prints it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._errors import ConfigError
from ...cuda import driver
from .step import step_nodes

if TYPE_CHECKING:
    from .contexts import TrainContext
    from .resources import Resources

__all__ = ["profile_step"]


def profile_step(res: Resources, ctx: TrainContext | None, repeats: int = 1000) -> list[tuple[str, float]]:
    """Microseconds per node of the first training step, and of the whole step ("step").

    `ctx` is the engine's training context (None before a fit). Each node is captured `repeats` times into a
    graph of its own and the replay is timed with
    events, as inside the epoch graph (driver.time_captured, as the GEMM autotuner times). The nodes run for real
    (weights change): profile a throwaway trainer after one `fit`. One GPU only: a data-parallel step's nodes
    are collectives.
    """
    if res.group is not None:
        raise ConfigError("profile_step times one GPU's nodes; a data-parallel trainer's are collectives")
    if ctx is None or ctx.graph is None:
        raise RuntimeError("profile_step needs one fit first (it times the captured step's nodes)")
    res.dev.make_current()
    # Counters back to the fit's first epoch: the nodes index the lr table and history by them.
    res.write_epoch_state(0, 0, ctx.lr_table.ptr, ctx.hist.ptr)
    nodes = step_nodes(ctx, 0)
    nodes.append(("step", lambda: [queue() for _, queue in step_nodes(ctx, 0)]))
    out = []
    for name, queue in nodes:
        ms = driver.time_captured(res.stream, lambda q=queue: [q() for _ in range(repeats)])
        out.append((name, ms * 1000.0 / repeats))
    return out
