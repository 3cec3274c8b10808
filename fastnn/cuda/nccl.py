"""NCCL bindings (ctypes): unique ids, communicators and the collectives the data-parallel engine captures.

NCCL comes from NVIDIA's wheels (nvidia-nccl-cu12 / -cu13, the extras "multi-cu12" / "multi-cu13"), found by
cuda.pathfinder's "nccl" like every other library fastnn loads. ctypes rather than nccl4py: the few functions
needed here are plain C (no callbacks, one 128-byte struct passed by value, one config struct by pointer), the
other bindings already share the loading, range checks and error plumbing used below, and it adds no package of its
own. Status names come from ncclGetErrorString, and NCCL's description of the last failure (ncclGetLastError) is
added to the message. Nothing here creates NVLink multicast objects; NCCL's own use of them follows
NCCL_NVLS_ENABLE, left as set.

A communicator of ranks in separate processes is non-blocking (ncclConfig_t.blocking = 0): its creation, and
every later call on it, returns at once with ncclInProgress while NCCL works on a thread of its own, and Comm
polls ncclCommGetAsyncError until it is done, at most the communicator's timeout; so a peer that never comes (a
wrong world size, a rank that died before joining) ends in an abort and CollectiveTimeout instead of a call that
never returns. ncclInProgress is handled here and never leaves this module.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import threading
import time
from collections.abc import Callable
from enum import IntEnum
from typing import Any

import numpy as np

from .._errors import ConfigError
from . import _capture
from ._loader import CudaLibraryError, LibraryObject, argument_error, bind_library, stream_ptr

__all__ = [
    "UNIQUE_ID_BYTES",
    "Comm",
    "CollectiveTimeout",
    "CommAborted",
    "DataType",
    "NcclError",
    "RedOp",
    "Result",
    "all_gather",
    "all_reduce",
    "available",
    "reduce_scatter",
    "status_name",
    "unique_id",
    "version",
]

UNIQUE_ID_BYTES = 128  # NCCL_UNIQUE_ID_BYTES (nccl.h)


class Result(IntEnum):
    """ncclResult_t (nccl.h)."""

    SUCCESS = 0
    UNHANDLED_CUDA_ERROR = 1
    SYSTEM_ERROR = 2
    INTERNAL_ERROR = 3
    INVALID_ARGUMENT = 4
    INVALID_USAGE = 5
    REMOTE_ERROR = 6
    IN_PROGRESS = 7
    TIMEOUT = 8


class RedOp(IntEnum):
    """ncclRedOp_t (nccl.h): the built-in reductions."""

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


class DataType(IntEnum):
    """ncclDataType_t (nccl.h): the types fastnn reduces."""

    INT32 = 2
    FLOAT16 = 6
    FLOAT32 = 7
    FLOAT64 = 8


_DTYPES = {np.dtype(np.int32): DataType.INT32, np.dtype(np.float16): DataType.FLOAT16,
           np.dtype(np.float32): DataType.FLOAT32, np.dtype(np.float64): DataType.FLOAT64}  # fmt: skip


class _UniqueId(ctypes.Structure):
    # Bytes, not c_char: a c_char array would be filled as a NUL-terminated string and lose the id after its
    # first zero byte (the socket address family in it has one).
    _fields_ = [("internal", ctypes.c_ubyte * UNIQUE_ID_BYTES)]

    @classmethod
    def of(cls, raw: bytes) -> _UniqueId:
        uid = cls()
        ctypes.memmove(ctypes.addressof(uid), raw, UNIQUE_ID_BYTES)
        return uid

    def raw(self) -> bytes:
        return ctypes.string_at(ctypes.addressof(self), UNIQUE_ID_BYTES)


# ncclConfig_t and NCCL_CONFIG_INITIALIZER as the nccl.h of nvidia-nccl-cu12 2.32.3 declares them (struct
# ncclConfig_v23100). NCCL reads the first `size` bytes it knows of and keeps its defaults for the rest, and new
# fields are only ever appended, so an older library (2.19 on) reads the prefix it defines and a newer one the
# fields below; `version` is that header's NCCL_VERSION_CODE, saying which fields these bytes hold.
_CONFIG_VERSION = 23203  # NCCL_VERSION_CODE (2.32.3)
_API_MAGIC = 0xCAFEBEEF  # NCCL_API_MAGIC
_CONFIG_UNDEF_INT = -(2**31)  # NCCL_CONFIG_UNDEF_INT = INT_MIN; NCCL_CONFIG_UNDEF_PTR = NULL


class _Config(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("blocking", ctypes.c_int),
        ("cgaClusterSize", ctypes.c_int),
        ("minCTAs", ctypes.c_int),
        ("maxCTAs", ctypes.c_int),
        ("netName", ctypes.c_char_p),
        ("splitShare", ctypes.c_int),
        ("trafficClass", ctypes.c_int),
        ("commName", ctypes.c_char_p),
        ("collnetEnable", ctypes.c_int),
        ("CTAPolicy", ctypes.c_int),
        ("shrinkShare", ctypes.c_int),
        ("nvlsCTAs", ctypes.c_int),
        ("nChannelsPerNetPeer", ctypes.c_int),
        ("nvlinkCentricSched", ctypes.c_int),
        ("graphUsageMode", ctypes.c_int),
        ("numRmaCtx", ctypes.c_int),
        ("maxP2pPeers", ctypes.c_int),
        ("graphStreamOrdering", ctypes.c_int),
        ("launchOrderImplicit", ctypes.c_int),
        ("numRmaSig", ctypes.c_int),
        ("rmaEagerInit", ctypes.c_int),
        ("hostCftMode", ctypes.c_int),
        ("nvlsHostMode", ctypes.c_int),
    ]

    @classmethod
    def initializer(cls) -> _Config:
        """NCCL_CONFIG_INITIALIZER: size, magic and version set, every option undefined (NCCL's default)."""
        config = cls(size=ctypes.sizeof(cls), magic=_API_MAGIC, version=_CONFIG_VERSION)
        for name, ctype in cls._fields_[3:]:
            if ctype is ctypes.c_int:
                setattr(config, name, _CONFIG_UNDEF_INT)  # pointers stay NULL
        return config


class NcclError(CudaLibraryError):
    """An NCCL call failed; `.status_name` is NCCL's own description (ncclGetErrorString)."""


class CommAborted(RuntimeError):
    """A communicator was used, or waited on, after it was aborted (an error elsewhere ended the group)."""


class CollectiveTimeout(CommAborted):
    """A rank waited longer than its group's timeout for collectives the other ranks never joined; the
    communicator was aborted."""


_STATUS = object()  # marks functions returning ncclResult_t in _SIGNATURES
_p = ctypes.c_void_p
_SIGNATURES = {
    "ncclGetVersion": (_STATUS, [ctypes.POINTER(ctypes.c_int)]),
    "ncclGetUniqueId": (_STATUS, [ctypes.POINTER(_UniqueId)]),
    "ncclCommInitRankConfig": (
        _STATUS,
        [ctypes.POINTER(_p), ctypes.c_int, _UniqueId, ctypes.c_int, ctypes.POINTER(_Config)],
    ),
    "ncclCommInitAll": (_STATUS, [ctypes.POINTER(_p), ctypes.c_int, ctypes.POINTER(ctypes.c_int)]),
    "ncclCommDestroy": (_STATUS, [_p]),
    "ncclCommAbort": (_STATUS, [_p]),
    "ncclCommGetAsyncError": (_STATUS, [_p, ctypes.POINTER(ctypes.c_int)]),
    "ncclAllReduce": (_STATUS, [_p, _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _p, _p]),
    "ncclReduceScatter": (_STATUS, [_p, _p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _p, _p]),
    "ncclAllGather": (_STATUS, [_p, _p, ctypes.c_size_t, ctypes.c_int, _p, _p]),
    "ncclGetErrorString": (ctypes.c_char_p, [ctypes.c_int]),
    "ncclGetLastError": (ctypes.c_char_p, [_p]),
}


def status_name(status: int) -> str:
    """NCCL's description of `status` (ncclGetErrorString)."""
    name = _lib().ncclGetErrorString(int(status))
    return name.decode(errors="replace") if name else f"NCCL result {int(status)}"


def _error(status: int, what: str) -> NcclError:
    """The NcclError for `status` from `what`, with NCCL's description of the last failure (ncclGetLastError)."""
    error = NcclError(status, status_name(status), what)
    detail = _lib().ncclGetLastError(None)
    if detail:
        error.args = (f"{error.args[0]}: {detail.decode(errors='replace').strip()}",)
    return error


def _errcheck(result: int, func: Any, args: tuple) -> int:
    # ncclInProgress is not a failure: a non-blocking communicator's call goes on in the background (Comm._settle).
    if result not in (Result.SUCCESS, Result.IN_PROGRESS):
        raise _error(result, func.__name__)
    return result


@functools.cache
def _lib() -> ctypes.CDLL:
    """NCCL, bound; DeviceUnavailable (naming the extra to install) when it is missing."""
    return bind_library("nccl", "NCCL", None, _SIGNATURES, _STATUS, _errcheck)


def available() -> tuple[bool, str]:
    """(True, "NCCL 2.x.y") if NCCL loads, else (False, the reason and which extra to install). Never raises."""
    try:
        return True, f"NCCL {version()}"
    except Exception as exc:
        return False, str(exc)


def version() -> str:
    """The loaded NCCL's version, e.g. "2.23.4" (ncclGetVersion: X*10000 + Y*100 + Z from 2.9 on)."""
    v = ctypes.c_int()
    _lib().ncclGetVersion(ctypes.byref(v))
    code = v.value
    if code < 10000:  # before 2.9: X*1000 + Y*100 + Z
        return f"{code // 1000}.{code // 100 % 10}.{code % 100}"
    return f"{code // 10000}.{code // 100 % 100}.{code % 100}"


def unique_id() -> bytes:
    """A fresh NCCL unique id (128 bytes): made by one rank, shared with the others by the launcher."""
    uid = _UniqueId()
    _lib().ncclGetUniqueId(ctypes.byref(uid))
    return uid.raw()


class Comm(LibraryObject):
    """One rank's NCCL communicator on the current CUDA device (ncclCommInitRankConfig, non-blocking: it returns once
    every rank has joined, or raises CollectiveTimeout after `timeout` seconds without them, None: no limit).
    Destroyed by close(), a `with` block, or garbage collection.

    NCCL's destroy and abort wait until every graph that captured the communicator's collectives is destroyed
    (its persistent plans; with several ranks in a process, the last rank's destroy or abort waits for every
    rank's graphs). So the graphs are handed to `hold`, and every way of ending the communicator destroys them
    first: otherwise ending it while a trainer still holds its epoch graph (after an error, or a trainer left to
    the garbage collector) would never return. An abort runs NCCL's abort beside those destroys instead
    (_abort_beside): a peer that died leaves a collective kernel spinning that only the abort ends, and a destroy
    waits for it. A one-rank communicator makes no persistent plans, so one GPU cannot show this."""

    def __init__(self, world: int, uid: bytes, rank: int, timeout: float | None = None) -> None:
        if not isinstance(uid, (bytes, bytearray)) or len(uid) != UNIQUE_ID_BYTES:
            raise ConfigError(f"uid must be {UNIQUE_ID_BYTES} bytes from nccl.unique_id(), got {_describe(uid)}")
        lib = _lib()
        handle = _p()
        config = _Config.initializer()
        config.blocking = 0  # NCCL works on its own thread and this one polls: a peer that never comes can be given up
        try:
            lib.ncclCommInitRankConfig(ctypes.byref(handle), world, _UniqueId.of(bytes(uid)), rank,
                                       ctypes.byref(config))  # fmt: skip
        except ctypes.ArgumentError as exc:
            raise argument_error(exc, "ncclCommInitRankConfig") from None
        except NcclError:
            if handle.value:  # failed after NCCL made it (its thread's error, reported at once): free it
                with contextlib.suppress(NcclError):
                    lib.ncclCommAbort(handle)
            raise
        self._bind(int(handle.value), world, rank, blocking=False, timeout=timeout)
        self._settle("ncclCommInitRankConfig", "the other ranks did not join")

    def _bind(self, handle: int, world: int, rank: int, blocking: bool = True, timeout: float | None = None) -> None:
        self._graphs: list[Any] = []  # graph executables holding captured collectives of this communicator
        super().__init__(handle, functools.partial(_destroy_after, self._graphs, _lib().ncclCommDestroy))
        self.world, self.rank = int(world), int(rank)
        self.blocking, self.timeout = blocking, timeout
        # abort (any thread) against async_error (the thread waiting on this rank) and hold (a capturing thread)
        self._lock = threading.Lock()

    def _settle(self, what: str, late: str) -> None:
        """Wait until NCCL has finished the last call `what` on this communicator (non-blocking: it goes on in
        NCCL's thread), at most `timeout` seconds; past it abort the communicator and raise CollectiveTimeout
        ("what: late within ... s"). NCCL's failure meanwhile aborts it and raises NcclError; so does an
        interruption (Ctrl-C), since the call never finished."""
        if self.blocking:
            return
        start = time.monotonic()
        deadline = None if self.timeout is None else start + self.timeout
        # Spun for the first 2 ms: NCCL's thread queues a collective in tens of microseconds, and an epoch graph
        # captures thousands of them (a sleep's ~100 us each would add up). Then polled ever more slowly: a peer
        # joining may take seconds.
        pause = 0.0005
        try:
            while (status := self._state()) == Result.IN_PROGRESS:
                now = time.monotonic()
                if deadline is not None and now > deadline:
                    raise CollectiveTimeout(f"{what}: {late} within {self.timeout:g} s; the communicator was aborted")
                if now - start > 0.002:
                    time.sleep(pause)
                    pause = min(2 * pause, 0.005)
        except BaseException:
            self.abort()
            raise
        if status is None:
            raise self.ended_error()  # aborted by another thread meanwhile
        if status != Result.SUCCESS:
            error = _error(status, what)
            self.abort()
            raise error

    def _state(self) -> int | None:
        """ncclCommGetAsyncError's ncclResult_t (ncclInProgress while a call goes on); None once closed or aborted."""
        r = ctypes.c_int()
        with self._lock:
            if self.closed:
                return None
            _lib().ncclCommGetAsyncError(self.ptr, ctypes.byref(r))
        return r.value

    @classmethod
    def clique(cls, devices: list[int]) -> list[Comm]:
        """One communicator per GPU of `devices`, all in this process (ncclCommInitAll, one call: no rank can be
        left waiting for another): communicator i is rank i, on GPU devices[i]."""
        n = len(devices)
        lib = _lib()
        handles = (_p * n)()
        try:
            lib.ncclCommInitAll(handles, n, (ctypes.c_int * n)(*devices))
        except ctypes.ArgumentError as exc:
            raise argument_error(exc, "ncclCommInitAll") from None
        comms = []
        for rank, handle in enumerate(handles):
            comm = cls.__new__(cls)
            comm._bind(int(handle), n, rank)
            comms.append(comm)
        return comms

    def hold(self, graph: Any) -> None:
        """Destroy `graph` (a driver.GraphExec that captured this communicator's collectives) before the
        communicator, however it ends; at once, raising CommAborted, if it has already ended."""
        with self._lock:
            ended = self.closed
            if not ended:
                self._graphs[:] = [g for g in self._graphs if not g.closed]
                self._graphs.append(graph)
        if ended:
            graph.close()
            raise self.ended_error()

    def ended_error(self) -> CommAborted:
        """The error for using this communicator after it was closed or aborted."""
        return CommAborted(f"rank {self.rank} of {self.world}: the communicator was closed or aborted")

    def close(self) -> None:
        """Destroy it (ncclCommDestroy) after its graphs; idempotent."""
        ended = self._end()
        if ended is not None:
            _, release, args, _ = ended
            release(*args)  # what the finalizer would have run

    def abort(self) -> None:
        """Tear the communicator down without waiting for peers (ncclCommAbort): after an error, so that no rank
        hangs in a collective its peers will never join. Its graphs are destroyed while NCCL aborts, on a thread of
        its own (_abort_beside): the abort makes the spinning collectives return, which the destroys wait for."""
        if self._end() is not None:
            # Through _capture, like the graphs' own destroys: on a thread that defers them, NCCL's abort would
            # otherwise wait for graphs destroyed only after it returns.
            _capture.release(_abort_beside, self._graphs, _lib().ncclCommAbort, self.ptr)

    def _end(self) -> tuple | None:
        """Mark the communicator ended, under the lock (async_error no longer reads it, hold refuses): its
        finalizer detached, as (obj, func, args, kwargs); None if it had already ended. NCCL is called after,
        outside the lock: the last rank's destroy or abort waits for graphs that a capturing thread may be about
        to hold, which hold then destroys itself."""
        with self._lock:
            return self._finalizer.detach()

    def async_error(self) -> int | None:
        """The ncclResult_t of an asynchronous failure (a peer gone, a network error), or None (also once closed
        or aborted: `closed` tells)."""
        status = self._state()
        return None if status in (None, Result.SUCCESS, Result.IN_PROGRESS) else status


def _destroy_after(graphs: list[Any], end: Callable[[int], Any], ptr: int) -> None:
    """Destroy `graphs`, then end the communicator `ptr` with `end` (ncclCommDestroy or ncclCommAbort): NCCL's
    end waits until they are gone."""
    for graph in graphs:
        with contextlib.suppress(Exception):  # one graph's failure must not keep the communicator alive
            graph.close()
    graphs.clear()
    end(ptr)


#: How long an abort waits for NCCL's ncclCommAbort once the graphs are gone; past it the communicator is left to
#: the process's exit (a warning says so) rather than hanging the rank that is reporting the failure.
ABORT_JOIN_S = 60.0


def _abort_beside(graphs: list[Any], abort: Callable[[int], Any], ptr: int) -> None:
    """ncclCommAbort on a thread of its own while `graphs` are destroyed here. Neither order works on one thread
    (seen on 2 x H200, NCCL 2.28: a dead peer hung the surviving rank in the first graph destroy): a graph's
    destroy synchronizes the device, so it waits for the collective kernel spinning for the dead peer, which only
    the abort's flag ends; and NCCL's abort waits for the graphs holding its collectives to be destroyed."""
    aborting = threading.Thread(target=abort, args=(ptr,), name="fastnn-nccl-abort", daemon=True)
    aborting.start()
    for graph in graphs:
        with contextlib.suppress(Exception):  # one graph's failure must not keep the communicator alive
            graph.close()
    graphs.clear()
    aborting.join(ABORT_JOIN_S)
    if aborting.is_alive():
        import warnings

        warnings.warn(f"ncclCommAbort did not return within {ABORT_JOIN_S:g} s; the communicator is left to the "
                      "process's exit", RuntimeWarning, stacklevel=2)  # fmt: skip


def all_reduce(comm: Comm, send: int, recv: int, count: int, dtype: Any, stream: Any, op: RedOp = RedOp.SUM) -> None:
    """Queue recv = op over ranks of send (`count` elements of numpy `dtype`; in place when send == recv)."""
    dt = _checked(comm, dtype)
    _call(comm, "ncclAllReduce", send, recv, count, dt, int(op), comm.ptr, stream_ptr(stream))


def reduce_scatter(comm: Comm, send: int, recv: int, count: int, dtype: Any, stream: Any,
                   op: RedOp = RedOp.SUM) -> None:  # fmt: skip
    """Queue recv (`count` elements) = op over ranks of part `rank` of send (world * count elements); in place
    when recv == send + rank * count elements."""
    dt = _checked(comm, dtype)
    _call(comm, "ncclReduceScatter", send, recv, count, dt, int(op), comm.ptr, stream_ptr(stream))


def all_gather(comm: Comm, send: int, recv: int, count: int, dtype: Any, stream: Any) -> None:
    """Queue part r of recv (world * count elements) = rank r's send (`count` elements); in place when
    send == recv + rank * count elements."""
    dt = _checked(comm, dtype)
    _call(comm, "ncclAllGather", send, recv, count, dt, comm.ptr, stream_ptr(stream))


def _checked(comm: Comm, dtype: Any) -> int:
    """NCCL's data type for numpy `dtype`; refuses a type NCCL is not given here, and a communicator aborted by
    another thread (NCCL has freed it: a race narrower than a call remains)."""
    try:
        dt = _DTYPES[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise ConfigError(f"dtype must be one of {sorted(str(d) for d in _DTYPES)}, got {dtype!r}") from None
    if comm.closed:
        raise comm.ended_error()
    return int(dt)


def _call(comm: Comm, name: str, *args: Any) -> None:
    """Queue the collective `name` on `comm`; on a non-blocking communicator, wait until NCCL has queued it (its
    thread launches the kernels: the caller's next work on the stream, or the end of a capture, must come after)."""
    try:
        getattr(_lib(), name)(*args)
    except ctypes.ArgumentError as exc:
        raise argument_error(exc, name) from None
    comm._settle(name, "NCCL did not finish queuing it (connecting to the other ranks first)")


def _describe(value: Any) -> str:
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes"
    return repr(value)
