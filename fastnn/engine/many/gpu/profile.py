"""The many-model GPU engine's phase profile: each node of one training step (gather, forward per layer, loss,
weight and input gradients per layer, update) timed alone, between CUDA events or inside a graph, for the budget in
docs/design/many-models.md. Benchmarks call it (benchmarks/bench_many.py --profile); training never does."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from . import kernels

if TYPE_CHECKING:
    from .engine import ManyGpuEngine

__all__ = ["profile_step"]


def profile_step(eng: ManyGpuEngine, step: int = 0, repeats: int = 20, graphed: bool = False) -> dict[str, float]:
    """Median microseconds of each node of training step `step` of every model (each group's epoch-0 stream, each
    model's own lr), over `repeats` runs; the engine's state is put back afterwards. Needs set_train_data first.

    Each node is queued from Python between two events, so a node shorter than its launch from Python measures the
    launch (the GPU waits for it). graphed=True times device work only: each node captured `repeats` times back to back
    in one CUDA graph (as the epoch's graph runs it) and timed by fastnn.cuda.driver.time_captured, the mean a node."""
    if eng._train is None:
        raise RuntimeError("set_train_data must be called before profile_step")
    count = eng.count
    saved = eng.state.download(np.empty(eng.state.nbytes, dtype=np.uint8))
    active = np.ones(count, dtype=bool)
    lrs = [np.full(step + 1, opt.lr, dtype=np.float32) for opt in eng.config.optimizers]
    tables, steps = eng.prepare_epoch(active, np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64), lrs)
    step = min(step, steps - 1)
    fast = eng._fast_rows(tables, int(eng._train.tables.n[eng._train.group[0]]), steps)  # as the epoch's graph
    fold = eng._folding() and any(fast)
    nodes = kernels.step_nodes(eng._net(), tables, step, eng.config.drop_last, eng.hist.ptr, fast[step], fold)
    if graphed:
        try:
            return {name: 1e3 * eng.time_captured(partial(_copies, queue, repeats)) / repeats for name, queue in nodes}
        finally:
            eng.state.upload(saved)
    events = [eng.timing_event() for _ in range(len(nodes) + 1)]
    times = np.zeros((repeats, len(nodes)))
    try:
        for r in range(repeats):
            for i, (_, queue) in enumerate(nodes):
                events[i].record(eng.stream)
                queue()
            events[-1].record(eng.stream)
            eng.stream.synchronize()
            times[r] = [events[i].elapsed_ms(events[i + 1]) * 1e3 for i in range(len(nodes))]
    finally:
        for e in events:
            e.close()
        eng.state.upload(saved)  # (and the next epoch sets the weight scales of fold_sgd back to 1)
    return {name: float(t) for (name, _), t in zip(nodes, np.median(times, axis=0))}



def _copies(queue: Callable[[], None], repeats: int) -> None:
    for _ in range(repeats):
        queue()
