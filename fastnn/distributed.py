"""Data-parallel training over NCCL, one process per GPU: how a process joins the others.

Each process (as `torchrun`, `mpirun` or Slurm start them, on one machine or several) calls `init()` and
passes the group to `Trainer(..., distributed=group)`. Every rank builds the same Trainer (same model,
optimizer, seed, batch size: the seed makes the initial weights identical) and calls `fit` with the same
training set; each step's global batch is split by position among the ranks, each rank's graph all-reduces
the gradients (NCCL, captured in the epoch graph), and every rank applies the same update, so all ranks hold
the same weights and report the same history (sums over all ranks). Save checkpoints from one rank.

The communicator needs one NCCL unique id shared by all ranks. The id names a socket that the process which
made it listens on, so it must come from a rank that stays up (rank 0), not from a separate command:
- `uid=` passed in (bytes or its hex string), from a pipe, a queue or the user's own rendezvous;
- `id_file=` a path all ranks can read (a shared filesystem): rank 0 writes it, the others wait for it;
- neither, with NCCL_COMM_ID=host:port set for every rank: NCCL derives the id from that address.
NCCL is optional: `pip install "fastnn-cuda[multi-cu12]"` (or multi-cu13; from a checkout `pip install -e
".[multi-cu12]"`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError, DeviceUnavailable

__all__ = ["DEFAULT_TIMEOUT_S", "Group", "init", "share", "unique_id"]

#: Environment variables launchers set: (rank, world size, local rank), first match wins.
LAUNCHER_ENV = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),  # torchrun
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),  # Open MPI's mpirun
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),  # MPICH / Intel MPI
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),  # srun
)


def share(rows: int, rank: int, world: int) -> tuple[int, int]:
    """(offset, count) of `rank`'s part of a batch of `rows` rows split by position among `world` ranks.

    The parts are contiguous, in rank order, and differ in size by at most one row; a rank's part is empty when
    the batch has fewer rows than there are ranks (an epoch's short last batch)."""
    start = rows * rank // world
    return start, rows * (rank + 1) // world - start


def unique_id() -> str:
    """A fresh NCCL unique id as a hex string (for a pipe, a file or an environment variable). Call it in the
    process that will be rank 0: the id is only valid while that process lives."""
    from .cuda import nccl

    return nccl.unique_id().hex()


#: How long a rank waits for the others by default (init's timeout): PyTorch's default for NCCL.
DEFAULT_TIMEOUT_S = 600.0


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
        from .cuda import nccl

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


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be an integer, got {raw!r}") from None


def _from_launcher() -> tuple[int | None, int | None, int | None]:
    for rank_var, world_var, local_var in LAUNCHER_ENV:
        rank, world = _env_int(rank_var), _env_int(world_var)
        if rank is not None and world is not None:
            return rank, world, _env_int(local_var)
    return None, None, None


def _check_index(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value >= high):
        bound = f"in [{low}, {high})" if high is not None else f">= {low}"
        raise ConfigError(f"{name} must be an integer {bound}, got {value!r}")
    return value


def _parse_uid(uid: Any) -> bytes:
    from .cuda.nccl import UNIQUE_ID_BYTES

    if isinstance(uid, str):
        try:
            uid = bytes.fromhex(uid.strip())
        except ValueError:
            raise ConfigError(f"uid must be the hex string of an NCCL unique id, got {uid[:40]!r}...") from None
    if not isinstance(uid, (bytes, bytearray)) or len(uid) != UNIQUE_ID_BYTES:
        got = f"{len(uid)} bytes" if isinstance(uid, (bytes, bytearray)) else repr(uid)
        raise ConfigError(f"uid must be an NCCL unique id of {UNIQUE_ID_BYTES} bytes (or its hex string), got {got}")
    return bytes(uid)


def _exchange_file(path: Path, rank: int, timeout: float | None) -> bytes:
    """Rank 0 makes the id and writes it to `path` (atomically: a rename); the others wait for the file (at most
    `timeout` seconds; None: forever)."""
    from .cuda import nccl

    if rank == 0:
        uid = nccl.unique_id()
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(uid.hex())
        os.replace(tmp, path)
        return uid
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = ""
        if text:
            return _parse_uid(text)
        if deadline is not None and time.monotonic() > deadline:
            raise ConfigError(f"id_file {str(path)!r}: rank 0 did not write the NCCL id within {timeout:g} s")
        time.sleep(0.05)


def init(
    rank: int | None = None,
    world: int | None = None,
    *,
    uid: bytes | str | None = None,
    id_file: str | os.PathLike[str] | None = None,
    device: int | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_S,
) -> Group:
    """Join a data-parallel run: this process becomes `rank` of `world` on GPU `device`.

    rank, world and device default to the launcher's environment variables (torchrun's RANK, WORLD_SIZE and
    LOCAL_RANK; Open MPI's, MPICH's and Slurm's equivalents, see LAUNCHER_ENV); device then defaults to the local
    rank. Every rank must call it; it returns once all have joined (ncclCommInitRank).

    timeout: seconds a rank waits for the others: for rank 0's id_file, and in training for an epoch or a fit's
    agreement check to complete (see Group); past it the communicator is aborted and the wait raises rather than
    hanging on a rank that died or stopped. Set it above your longest epoch and your longest gap between one
    rank's fits and another's (a rank evaluating or saving alone); None waits forever.

    Raises:
        ConfigError: a missing or invalid rank, world, device or id (the message names it), before NCCL is used.
        DeviceUnavailable: NCCL is not installed (the message names the extra) or no usable GPU.
    """
    env_rank, env_world, env_local = _from_launcher()
    rank = env_rank if rank is None else rank
    world = env_world if world is None else world
    if rank is None or world is None:
        raise ConfigError("rank and world are needed: pass them, or start the processes with a launcher that sets "
                          "RANK and WORLD_SIZE (torchrun), OMPI_COMM_WORLD_* (mpirun) or SLURM_* (srun)")  # fmt: skip
    world = _check_index("world", world, 1)
    rank = _check_index("rank", rank, 0, world)
    if device is None:
        device = env_local if env_local is not None else 0
    if uid is not None and id_file is not None:
        raise ConfigError("pass uid or id_file, not both")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ConfigError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    timeout = None if timeout is None else float(timeout)
    uid_bytes = _parse_uid(uid) if uid is not None else None
    from .device import require_cuda

    require_cuda()
    from .cuda import driver, nccl

    count = driver.device_count()
    device = _check_index("device", device, 0, count)
    ok, reason = nccl.available()
    if not ok:
        raise DeviceUnavailable(f"fastnn.distributed needs NCCL: {reason}")
    if uid_bytes is None:
        if id_file is not None:
            uid_bytes = _exchange_file(Path(id_file), rank, timeout)
        elif world == 1 or os.environ.get("NCCL_COMM_ID"):
            uid_bytes = nccl.unique_id()  # alone, or every rank derives the same id from NCCL_COMM_ID
        else:
            raise ConfigError("an NCCL unique id is needed: pass uid= (made by rank 0 with unique_id()), id_file= "
                              "(a path every rank can read), or set NCCL_COMM_ID=host:port for every rank")  # fmt: skip
    dev = driver.get_device(device)
    dev.make_current()
    try:
        comm = nccl.Comm(world, uid_bytes, rank)
    except nccl.NcclError as exc:  # NCCL's own message, with which rank and GPU met it
        exc.args = (f"rank {rank} of {world} on GPU {device}: {exc.args[0]}",)
        raise
    if id_file is not None and rank == 0:  # every rank has joined: the id is spent, so no later run reads it
        Path(id_file).unlink(missing_ok=True)
    return Group(rank=rank, world=world, device=device, comm=comm, timeout=timeout)
