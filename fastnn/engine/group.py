"""A data-parallel group as the engines see it: this process's rank, the world size, its GPU and communicator, and
how each batch is shared among the ranks.

`fastnn.distributed.init` makes a Group (one process per GPU), the replica engine one per GPU of its process; the
graph engine trains this rank's share of every batch and sums the gradients over the group's communicator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Group", "share"]


def share(rows: int, rank: int, world: int) -> tuple[int, int]:
    """(offset, count) of `rank`'s part of a batch of `rows` rows split by position among `world` ranks.

    The parts are contiguous, in rank order, and differ in size by at most one row; a rank's part is empty when
    the batch has fewer rows than there are ranks (an epoch's short last batch)."""
    start = rows * rank // world
    return start, rows * (rank + 1) // world - start


@dataclass
class Group:
    """This process's place in a data-parallel run: its rank, the world size, its GPU and NCCL communicator.

    timeout: the longest a rank waits for work holding collectives (an epoch, a fit's agreement check) before it
    concludes that the other ranks will not join them, aborts the communicator and raises
    `fastnn.cuda.nccl.CollectiveTimeout`; None waits forever."""

    rank: int
    world: int
    device: int
    comm: Any = field(repr=False)
    timeout: float | None = None

    def close(self) -> None:
        """Destroy the communicator (after every Trainer using it is closed)."""
        self.comm.close()

    def abort(self) -> None:
        """Tear the communicator down without waiting for the other ranks (after an error on this one)."""
        self.comm.abort()

    def async_error(self) -> Exception | None:
        """NCCL's asynchronous failure of this rank (a peer gone, a network error) as the error to raise, naming the
        rank and GPU; None while there is none."""
        from ..cuda import nccl

        status = self.comm.async_error()
        if status is None:
            return None
        where = f"rank {self.rank} of {self.world} on GPU {self.device}: a collective"
        return nccl.NcclError(status, nccl.status_name(status), where)

    def __enter__(self) -> Group:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.abort()
