"""Waiting for a data-parallel rank's queued work: polled, with the group's timeout, never a blocking synchronize.

A blocking wait on work holding collectives would leave this rank spinning forever in one whose peer failed or
vanished; polling lets NCCL's asynchronous error, or the group's timeout, abort the communicator and raise.
"""

from __future__ import annotations

import time

from ...cuda import nccl
from ..group import Group

__all__ = ["wait_for"]


def wait_for(event, group: Group) -> None:
    """Poll until `event` completes, so that a failed or vanished peer (NCCL's asynchronous error) aborts the
    communicator and raises rather than leaving this rank spinning in a collective. Past the group's timeout
    the peers are taken for gone (a rank that died or stopped early, which NCCL need not report: a dead peer
    on this machine leaves the collective spinning) and the communicator is aborted too."""
    g = group
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
