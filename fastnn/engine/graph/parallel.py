"""The graph engine's data-parallel part (one rank of a `Group`): the gradient sums captured on a side stream,
the sharded update (Tuning.sharded_update), the history's sum over the ranks, and the exchanges outside any graph
that keep the ranks in step: the agreement checks before a fit and the stop vote after each epoch.

Each step trains on this rank's share of the batch; every layer's gradient is all-reduced (or reduce-scattered) on
the side stream as soon as its GEMM has made it, overlapping the rest of the backward pass.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np

from ..._errors import ConfigError
from ..._shuffle import split_u64
from ...cuda import deferring, driver, nccl
from ...cuda.driver import arg_i32, arg_ptr
from ..base import LOSSES, PRECISIONS
from ..epochs import hold_ctrl_c
from ..group import Group
from .buffers import itemsize
from .kernels import record_update
from .waiting import wait_for

if TYPE_CHECKING:
    from .resources import Resources

__all__ = ["DataParallel"]


class DataParallel:
    """One rank's collectives: its side stream, events and scratch buffers (owned by the engine, freed with it)."""

    def __init__(self, res: Resources, group: Group, own) -> None:
        self.res, self.group = res, group
        priority = res.dev.highest_stream_priority() if res.config.tuning.comm_high_priority else 0
        self.comm_stream = own(driver.Stream(res.dev, priority))
        self._fork, self._join = own(driver.Event()), own(driver.Event())
        self.hist_scratch = own(driver.DeviceBuffer(256))  # the epoch's (loss sum, correct) being summed
        self._agree = own(driver.DeviceBuffer(256))  # check_ranks_agree's MAX and MIN of each value

    # ------------------------------------------------------------------ captured in the epoch graph
    def record_grad_sum(self, layer: int) -> None:
        """Queue, on the side stream once the main stream has got this far, the sum over ranks of `layer`'s
        weight and bias gradients (one contiguous range of the flat gradient buffer, zero padding included): all of
        it (all-reduce), or with a sharded update this rank's part of it (reduce-scatter, in place)."""
        res = self.res
        start, stop = res.layout.layer_range(layer)
        size = itemsize(res.spec.grad)
        self._fork_side()
        if res.sharded:
            mine, count = res.layout.shard(layer, self.group.rank)
            g = res.grads.ptr
            nccl.reduce_scatter(self.group.comm, g + start * size, g + mine * size, count, res.spec.grad,
                                self.comm_stream)  # fmt: skip
        else:
            ptr = res.grads.ptr + start * size
            nccl.all_reduce(self.group.comm, ptr, ptr, stop - start, res.spec.grad, self.comm_stream)

    def _fork_side(self) -> None:
        """Make the side stream wait for everything queued on the main stream so far."""
        self._fork.record(self.res.stream)
        self.comm_stream.wait(self._fork)

    def record_shard_update(self, layer: int, step: int, steps: int, gather: tuple | None = None) -> None:
        """A sharded update's part for `layer`, on the side stream once the main stream is done with the layer's
        weights (its input-gradient GEMM): update this rank's part (its gradient sum is there), then all-gather the
        parts into every storage the layer's forward GEMM reads (the fp16 copy in "mixed", else the parameters; in
        "mixed" the output layer's also reads its bias from the fp32 master). The last layer updated also gathers
        the next batch (kernels.record_update's `gather`)."""
        res = self.res
        self._fork_side()
        record_update(res, step, steps, gather, part=res.layout.shard(layer, self.group.rank),
                      stream=self.comm_stream)  # fmt: skip
        for storage in dict.fromkeys(res.gemm_storage(t) for t in (res.spec.operand, res.out_type(layer))):
            self._gather_parts(layer, *storage, self.comm_stream)

    def _gather_parts(self, layer: int, base: int, t: type, stream) -> None:
        """Queue the in-place all-gather of `layer`'s parts of the flat buffer at `base` (elements of type t)."""
        start, _ = self.res.layout.layer_range(layer)
        mine, count = self.res.layout.shard(layer, self.group.rank)
        size = itemsize(t)
        nccl.all_gather(self.group.comm, base + mine * size, base + start * size, count, t, stream)

    def record_state_gather(self) -> None:
        """Queue, at the end of a sharded epoch, the all-gather of every layer's parts of what the steps left
        partial: the fp32 master weights ("mixed": the GEMMs' fp16 copy was gathered every step) and the optimizer
        state. Every rank then holds the whole training state, as without sharding."""
        res = self.res
        regions = [(res.train_state.ptr, res.spec.param)] if res.w16 is not None else []
        regions += [(res.train_state.ptr + res.param_bytes + i * res.opt_bytes, np.float32)
                    for i in range(len(res.opt_names))]  # fmt: skip
        for base, t in regions:
            for layer in range(len(res.config.model.layers)):
                self._gather_parts(layer, base, t, res.stream)

    def record_join(self) -> None:
        """Make the main stream wait for everything queued on the side stream: the all-reduces (before the update),
        or the sharded update's parts and all-gathers (before the next step)."""
        self._join.record(self.comm_stream)
        self.res.stream.wait(self._join)

    def record_history_all_reduce(self) -> None:
        """Queue the sum over ranks of this epoch's (loss sum, correct count): every rank then holds the global
        history, and takes the same divergence and snapshot decisions from it."""
        res = self.res
        state, scratch = arg_ptr(res.epoch_state.ptr), arg_ptr(self.hist_scratch.ptr)
        res.epoch_mod.function("history_stage").launch((1, 1, 1), (1, 1, 1), [state, scratch, arg_i32(1)],
                                                        res.stream)  # fmt: skip
        nccl.all_reduce(self.group.comm, self.hist_scratch.ptr, self.hist_scratch.ptr, 2, np.float64, res.stream)
        res.epoch_mod.function("history_stage").launch((1, 1, 1), (1, 1, 1), [state, scratch, arg_i32(0)],
                                                        res.stream)  # fmt: skip

    # ------------------------------------------------------------------ waiting
    def wait(self, event) -> None:
        """Block until `event` completes, polling the communicator (waiting.wait_for)."""
        wait_for(event, self.group)

    def sync(self) -> None:
        """Block until everything queued on the main stream has run, polling: queued collectives may wait for peers
        that never come."""
        self._join.record(self.res.stream)
        wait_for(self._join, self.group)

    def check_usable(self) -> None:
        """Refuse to train once the group's communicator has ended: the epoch graph went with it (nccl.Comm.hold)."""
        g = self.group
        if g.comm.closed:
            raise nccl.CommAborted(f"rank {g.rank} of {g.world} on GPU {g.device}: the communicator was closed or "
                                   "aborted; save or read the weights, then make a new group and Trainer")  # fmt: skip

    # ------------------------------------------------------------------ the ranks in step (outside any graph)
    # Frees deferred to the end: a collection on this thread could free another GPU's memory (cuMemFree waits for
    # that GPU), and that GPU may be waiting in a collective for this one's.
    @deferring
    def ranks_min_max(self, mine: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ranks' MIN and MAX of each of `mine` (float64, at most 16 values, exact integers below 2**53): one
        small MIN and one MAX all-reduce outside any graph, which every rank must issue at the same point."""
        g, k, stream = self.group, mine.size, self.res.stream
        with hold_ctrl_c():  # both or neither: a peer would wait for the second one forever
            self._agree.upload(np.concatenate([mine, mine]))
            nccl.all_reduce(g.comm, self._agree.ptr, self._agree.ptr, k, np.float64, stream, nccl.RedOp.MAX)
            low = self._agree.ptr + 8 * k
            nccl.all_reduce(g.comm, low, low, k, np.float64, stream, nccl.RedOp.MIN)
            self._join.record(stream)
        wait_for(self._join, g)
        out = np.empty(2 * k, dtype=np.float64)
        self._agree.download(out)
        return out[k:], out[:k]

    def check_ranks_agree(self, items: list[tuple[str, int]], any_of: tuple[int, ...] = ()) -> list[int]:
        """Refuse (ConfigError, on every rank) a data-parallel run whose ranks would issue different collectives
        or train differently: `items` are (what, this rank's value), compared across the ranks. `any_of` are
        values that may differ, compared with the items (one exchange); their MAX over the ranks is returned."""
        g = self.group
        mine = np.array([value for _, value in items] + list(any_of), dtype=np.float64)
        low, high = self.ranks_min_max(mine)
        bad = [f"{name} (this rank {mine[i]:.0f}; the ranks' values range from {low[i]:.0f} to {high[i]:.0f})"
               for i, (name, _) in enumerate(items) if low[i] != high[i]]  # fmt: skip
        if bad:
            raise ConfigError(f"rank {g.rank} of {g.world}: every rank must train the same model with the same "
                              f"arguments on the same data; they differ in " + "; ".join(bad))  # fmt: skip
        return [int(v) for v in high[len(items) :]]

    def check_data_agrees(self, n: int) -> None:
        """Before a fit's data is uploaded: the same training set size, batch size, model, seed, precision, update
        sharding, optimizer (its number of state buffers) and loss on every rank."""
        res, g = self.res, self.group
        cfg = res.config
        widths = sum(w * 1_000_003**i for i, w in enumerate(cfg.model.sizes)) % (1 << 52)  # exact in a float64
        seed_lo, seed_hi = split_u64(cfg.seed)
        self.check_ranks_agree([
            ("training set rows", n), ("batch_size", cfg.batch_size), ("drop_last", int(cfg.drop_last)),
            ("padded parameter count", res.layout.total), ("layers", len(cfg.model.layers)),
            ("layer widths (a checksum)", widths), ("seed (low 32 bits)", seed_lo),
            ("seed (high 32 bits)", seed_hi), ("precision", PRECISIONS.index(cfg.precision)), ("world", g.world),
            ("sharded update (Tuning.sharded_update)", int(res.sharded)),
            ("optimizer state buffers", len(res.opt_names)), ("loss", LOSSES.index(cfg.loss)),
        ])  # fmt: skip

    def check_call_agrees(self, steps: int, first_epoch: int, first_step: int, lrs: np.ndarray,
                          end_epoch: int | None, stoppable: bool) -> bool:  # fmt: skip
        """Before a call's epochs (of `steps` steps each): the same epoch and step counters (they key the shuffle),
        epoch the fit ends at, steps and learning rates of this call on every rank; otherwise one rank would wait in
        collectives the others never issue, or the replicas would drift apart. Returns whether any rank's fit is
        stoppable (has callbacks or early stopping): then every rank votes after every epoch (vote_stop), so that
        callbacks given to one rank only (a logger or checkpointer on rank 0) leave the ranks in step."""
        table = np.ascontiguousarray(lrs, dtype=np.float32)
        end = first_epoch + table.size // steps if end_epoch is None else end_epoch
        steps_lo, steps_hi = split_u64(first_step)
        (any_stoppable,) = self.check_ranks_agree([
            ("epochs done (trainer.epoch)", first_epoch), ("steps done (low 32 bits)", steps_lo),
            ("steps done (high 32 bits)", steps_hi), ("epochs after this fit (epochs done + epochs)", end),
            ("steps in this call", table.size),
            ("learning rates (a CRC of this call's schedule)", zlib.crc32(table.tobytes())),
        ], any_of=(int(stoppable),))  # fmt: skip
        return bool(any_stoppable)

    def vote_stop(self, stopping: bool) -> int | None:
        """After each epoch of a stoppable fit, every rank votes: the lowest rank that stops after this epoch (a
        callback, early stopping, an error, Ctrl-C), or None if none does. A stop on one rank then stops all of
        them after the same epoch instead of leaving the others waiting in the next epoch's collectives."""
        g = self.group
        low, _ = self.ranks_min_max(np.array([g.rank if stopping else g.world], dtype=np.float64))
        first = int(low[0])
        return first if first < g.world else None
