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
- `id_file=` a path all ranks can read (a shared filesystem): rank 0 writes it, the others wait for it. Rank 0
  writes it 0600 through a temporary file beside it (created exclusively, never through a link) renamed over the
  path; the others read it only if it is a regular file owned by their user that no one else may write, so no
  other local user can read the id or hand the ranks one of theirs (which would let them join the run);
- neither, with NCCL_COMM_ID=host:port set for every rank: NCCL derives the id from that address.

NCCL is optional: in a fastnn checkout, `pip install -e ".[multi-cu12]"` (or multi-cu13).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path
from typing import Any

from . import _files
from ._cachedir import file_refusal
from ._errors import ConfigError, DeviceUnavailable
from .engine.group import Group, share

__all__ = ["DEFAULT_TIMEOUT_S", "Group", "init", "share", "unique_id"]

#: Environment variables launchers set: (rank, world size, local rank), first match wins.
LAUNCHER_ENV = (
    ("RANK", "WORLD_SIZE", "LOCAL_RANK"),  # torchrun
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),  # Open MPI's mpirun
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),  # MPICH / Intel MPI
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),  # srun
)


def unique_id() -> str:
    """A fresh NCCL unique id as a hex string (for a pipe, a file or an environment variable). Call it in the
    process that will be rank 0: the id is only valid while that process lives."""
    from .cuda import nccl

    return nccl.unique_id().hex()


#: How long a rank waits for the others by default (init's timeout): PyTorch's default for NCCL.
DEFAULT_TIMEOUT_S = 600.0


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be an integer, got {raw!r}") from None


def _from_launcher(rank: Any, world: Any, device: Any) -> tuple[Any, Any, Any]:
    """rank, world and device, each taken from the launcher's environment where not passed: the first launcher of
    LAUNCHER_ENV whose rank and world variables are both set. Only the variables used are parsed, so an explicit
    argument wins over a stray variable (RANK=node-a) instead of being refused because of it."""
    for rank_var, world_var, local_var in LAUNCHER_ENV:
        if rank_var in os.environ and world_var in os.environ:
            rank = _env_int(rank_var) if rank is None else rank
            world = _env_int(world_var) if world is None else world
            device = _env_int(local_var) if device is None else device
            break
    return rank, world, device


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
    """Rank 0 makes the id and writes it to `path`; the others wait for it (at most `timeout` seconds; None:
    forever) and read it. ConfigError naming id_file for a path that cannot be used or a file not to be trusted."""
    from .cuda import nccl

    if rank == 0:
        uid = nccl.unique_id()
        _write_id_file(path, uid)
        return uid
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        uid = _read_id_file(path)
        if uid is not None:
            return uid
        if deadline is not None and time.monotonic() > deadline:
            raise ConfigError(f"id_file {str(path)!r}: rank 0 did not write the NCCL id within {timeout:g} s")
        time.sleep(0.05)


def _path_error(path: Path, exc: OSError) -> ConfigError:
    """The ConfigError for an OSError met at id_file: 'ENOENT (No such file or directory)', the name to search."""
    return ConfigError(f"id_file {str(path)!r}: {_files.reason(exc)}")


def _check_folder(path: Path) -> None:
    """Refuse an id_file whose folder does not exist or that is itself a folder: no rank could ever use it."""
    try:
        if not path.parent.is_dir():
            problem = "is not a folder" if path.parent.exists() else "does not exist"
            raise ConfigError(f"id_file {str(path)!r}: its folder {str(path.parent)!r} {problem}")
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise ConfigError(f"id_file {str(path)!r} is a folder; pass the path of a file in it")
    except FileNotFoundError:
        pass
    except OSError as exc:  # a name too long, a folder this user may not search
        raise _path_error(path, exc) from exc


def _write_id_file(path: Path, uid: bytes) -> None:
    """Write `uid` (hex) to `path` for the other ranks through `_files.write_bytes`: a temporary file beside it,
    created exclusively and without following a link, mode 0600, then renamed over `path`. A name planted in a
    shared folder (a link to another file) is never written through, no rank reads a partial id, no other user can
    read it, and nothing is left behind when a step fails."""
    _check_folder(path)
    try:
        _files.write_bytes(path, uid.hex().encode(), mode=0o600)
    except OSError as exc:
        raise _path_error(path, exc) from exc


def _read_id_file(path: Path) -> bytes | None:
    """The NCCL id in `path`; None while there is none yet (no file, or an empty one). Only a regular file owned
    by this user and writable by no one else is read (checked before opening it and again on what was opened), at
    most an id's worth, never blocking: a FIFO or device there (/dev/zero) is refused, not read."""
    from .cuda.nccl import UNIQUE_ID_BYTES

    try:
        _check_trusted(path, os.lstat(path))  # a FIFO or a device is refused before an open could block on it
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    except (FileNotFoundError, NotADirectoryError):
        _check_folder(path)  # a missing folder will not appear: refused now rather than at the timeout
        return None
    except OSError as exc:  # unreadable; or replaced by a link since the lstat (ELOOP)
        raise _path_error(path, exc) from exc
    limit = 2 * UNIQUE_ID_BYTES + 2  # the id's hex string and a line break
    try:
        _check_trusted(path, os.fstat(fd))  # what was opened, not what was at the path a moment before
        data = b""
        while len(data) <= limit and (chunk := os.read(fd, limit + 1 - len(data))):
            data += chunk
    except OSError as exc:
        raise _path_error(path, exc) from exc
    finally:
        os.close(fd)
    if not data.strip():
        return None
    if len(data) > limit:
        raise ConfigError(f"id_file {str(path)!r} holds more than an NCCL id ({2 * UNIQUE_ID_BYTES} hex digits)")
    try:
        return _parse_uid(data.decode("ascii", errors="replace"))
    except ConfigError as exc:
        raise ConfigError(f"id_file {str(path)!r} does not hold an NCCL id: {exc}") from None


def _check_trusted(path: Path, st: os.stat_result) -> None:
    """Refuse an id file that is not a regular file, or that another user owns or may write: its id could be
    someone else's, whose process would then join this run and receive every gradient."""
    if not stat.S_ISREG(st.st_mode):
        kind = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
                stat.S_IFLNK: "a symbolic link", stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a folder"}  # fmt: skip
        what = kind.get(stat.S_IFMT(st.st_mode), "not a regular file")
        raise ConfigError(f"id_file {str(path)!r} is {what}: refused, only a regular file written by rank 0 is read")
    if file_refusal(st) is not None:  # another user's, or writable by its group or others
        me = os.geteuid()
        raise ConfigError(
            f"id_file {str(path)!r} is owned by {_user(st.st_uid)} with mode {stat.S_IMODE(st.st_mode):04o}: refused, "
            f"the NCCL id is read only from a file of this user ({_user(me)}) that no one else may write (rank 0 "
            "writes it 0600); remove it, or pass a path in a folder of your own"
        )


def _user(uid: int) -> str:
    """'uid 1000 (alice)', or 'uid 1000' where the name is unknown."""
    try:
        import pwd

        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except (ImportError, KeyError):
        return f"uid {uid}"


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
    rank. An argument passed wins over its variable, and a variable not needed is not read. Every rank must call
    it; it returns once all have joined (ncclCommInitRankConfig).

    id_file: rank 0 writes the id there (mode 0600, through a temporary file beside it renamed over the path) and
    removes it once every rank has joined; the others wait for it and read it only if it is a regular file owned by
    their user and writable by no one else. A FIFO, a device or a link there, a foreign or group/other-writable
    file, a missing folder or a folder at the path are refused with a ConfigError naming id_file.

    timeout: seconds a rank waits for the others: for rank 0's id_file, for every rank to join the communicator
    (a wrong world size, or a peer that died before joining, raises CollectiveTimeout rather than hanging), and in
    training for an epoch or a fit's agreement check to complete (see Group); past it the communicator is aborted
    and the wait raises rather than hanging on a rank that died or stopped. Set it above your longest epoch and
    your longest gap between one rank's fits and another's (a rank evaluating or saving alone); None waits forever.

    Raises:
        ConfigError: a missing or invalid rank, world, device, id or id_file (the message names it), before NCCL is
            used; an id_file not to be trusted, or none written within timeout.
        DeviceUnavailable: NCCL is not installed (the message names the extra) or no usable GPU.
        fastnn.cuda.nccl.CollectiveTimeout: the other ranks did not join the communicator within timeout.
        fastnn.cuda.nccl.NcclError: NCCL refused the communicator (its message, naming the rank and GPU).
    """
    rank, world, device = _from_launcher(rank, world, device)
    if rank is None or world is None:
        raise ConfigError("rank and world are needed: pass them, or start the processes with a launcher that sets "
                          "RANK and WORLD_SIZE (torchrun), OMPI_COMM_WORLD_* (mpirun) or SLURM_* (srun)")  # fmt: skip
    world = _check_index("world", world, 1)
    rank = _check_index("rank", rank, 0, world)
    device = 0 if device is None else device
    if uid is not None and id_file is not None:
        raise ConfigError("pass uid or id_file, not both")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ConfigError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    timeout = None if timeout is None else float(timeout)
    uid_bytes = _parse_uid(uid) if uid is not None else None
    id_path = None
    if id_file is not None:
        try:
            id_path = Path(id_file)
        except TypeError:
            raise ConfigError(f"id_file must be a str or os.PathLike, got {id_file!r}") from None
        _check_folder(id_path)
    from ._device import require_cuda

    require_cuda()
    from .cuda import driver, nccl

    count = driver.device_count()
    device = _check_index("device", device, 0, count)
    ok, reason = nccl.available()
    if not ok:
        raise DeviceUnavailable(f"fastnn.distributed needs NCCL: {reason}")
    if uid_bytes is None:
        if id_path is not None:
            uid_bytes = _exchange_file(id_path, rank, timeout)
        elif world == 1 or os.environ.get("NCCL_COMM_ID"):
            uid_bytes = nccl.unique_id()  # alone, or every rank derives the same id from NCCL_COMM_ID
        else:
            raise ConfigError("an NCCL unique id is needed: pass uid= (made by rank 0 with unique_id()), id_file= "
                              "(a path every rank can read), or set NCCL_COMM_ID=host:port for every rank")  # fmt: skip
    dev = driver.get_device(device)
    dev.make_current()
    where = f"rank {rank} of {world} on GPU {device}"
    try:
        comm = nccl.Comm(world, uid_bytes, rank, timeout=timeout)
    except nccl.CollectiveTimeout:
        raise nccl.CollectiveTimeout(
            f"{where}: the other ranks did not join the communicator within {timeout:g} s (distributed.init's "
            f"timeout): check that every rank was started with world={world} and the same id, and that none has "
            "died or read a stale id_file left by an earlier run (an old id names a bootstrap that no longer exists: "
            "remove the file and start every rank again); the communicator was aborted"
        ) from None
    except nccl.NcclError as exc:  # NCCL's own message, with which rank and GPU met it
        exc.args = (f"{where}: {exc.args[0]}",)
        raise
    if id_path is not None and rank == 0:  # every rank has joined: the id is spent, so no later run reads it
        with contextlib.suppress(OSError):  # only tidying: a folder made read-only meanwhile loses nothing
            id_path.unlink(missing_ok=True)
    return Group(rank=rank, world=world, device=device, comm=comm, timeout=timeout)
