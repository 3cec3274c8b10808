"""Data-parallel training (fastnn.distributed, fastnn/cuda/nccl.py): how a batch is split, how a process joins a
run and what it is told when it cannot, the NCCL bindings, and training over two GPUs against one GPU and NumPy.

Every GPU comparison of the engine suite also runs through the data-parallel path in a group of one rank (the
"graph-nccl" entry of conftest.GPU_ENGINES); the tests here add what needs more ranks than that.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import re
import traceback
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import fastnn
from fastnn import distributed
from fastnn._errors import ConfigError, DeviceUnavailable
from fastnn.engine import Tuning

# ---------------------------------------------------------------------------------------------------------------
# CPU
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("rows", [0, 1, 2, 3, 7, 32, 128, 129])
def test_shares_tile_the_batch_in_rank_order(rows, world):
    parts = [distributed.share(rows, r, world) for r in range(world)]
    pos = 0
    for offset, count in parts:  # contiguous, in rank order, covering the batch exactly once
        assert offset == pos and count >= 0
        pos += count
    assert pos == rows
    counts = [c for _, c in parts]
    assert max(counts) - min(counts) <= 1


def test_split_gradient_sums_to_the_whole_batch_gradient():
    """What the ranks' all-reduce computes: each rank's logits gradient is of the mean over the WHOLE batch, so
    the sum over ranks of its weight gradient is the one-GPU gradient (logistic regression, NumPy)."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((37, 5)), rng.standard_normal((3, 5))
    y = rng.integers(0, 3, 37)

    def grad(rows: slice, batch: int) -> np.ndarray:
        z = x[rows] @ w.T
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(p.shape[0]), y[rows]] -= 1.0
        return p.T @ x[rows] / batch

    whole = grad(slice(0, 37), 37)
    for world in (2, 3, 4):
        parts = [distributed.share(37, r, world) for r in range(world)]
        summed = sum(grad(slice(o, o + c), 37) for o, c in parts)
        np.testing.assert_allclose(summed, whole, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, "rank and world are needed"),
        ({"rank": 0, "world": 0}, "world must be an integer >= 1, got 0"),
        ({"rank": 2, "world": 2}, "rank must be an integer in [0, 2), got 2"),
        ({"rank": -1, "world": 2}, "rank must be an integer in [0, 2), got -1"),
        ({"rank": True, "world": 2}, "rank must be an integer in [0, 2), got True"),
        ({"rank": 0, "world": 2, "uid": "zz"}, "uid must be the hex string of an NCCL unique id"),
        ({"rank": 0, "world": 2, "uid": b"short"}, "uid must be an NCCL unique id of 128 bytes"),
        ({"rank": 0, "world": 2, "uid": "00" * 128, "id_file": "f"}, "pass uid or id_file, not both"),
        ({"rank": 0, "world": 2, "timeout": 0}, "timeout must be a positive number of seconds or None, got 0"),
        ({"rank": 0, "world": 2, "timeout": True}, "timeout must be a positive number of seconds or None, got True"),
        ({"rank": 0, "world": 2, "timeout": "60"}, "timeout must be a positive number of seconds or None, got '60'"),
    ],
)
def test_init_refuses_bad_arguments_before_any_work(monkeypatch, kwargs, message):
    for names in distributed.LAUNCHER_ENV:
        for name in names:
            monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError) as info:
        distributed.init(**kwargs)
    assert message in str(info.value)


def test_init_reads_the_launchers_environment(monkeypatch):
    for names in distributed.LAUNCHER_ENV:
        for name in names:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"rank must be an integer in \[0, 2\), got 3"):
        distributed.init()
    monkeypatch.setenv("RANK", "one")
    with pytest.raises(ConfigError, match="environment variable RANK must be an integer, got 'one'"):
        distributed.init()


class _Reached(Exception):
    """Raised by a stand-in for the first step after init's argument checks."""


@pytest.mark.parametrize(
    "stray",
    [{"RANK": "node-a", "WORLD_SIZE": "2"}, {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "auto"},
     {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": ""}],
)  # fmt: skip
def test_explicit_arguments_win_over_launcher_variables_which_are_not_parsed_unless_used(monkeypatch, stray):
    """A stray variable of a launcher (another job's, a shell's) must not break init(rank=0, world=1, device=0):
    the arguments passed win, and a variable that is not used is not parsed."""
    import fastnn._device

    for names in distributed.LAUNCHER_ENV:
        for name in names:
            monkeypatch.delenv(name, raising=False)
    for name, value in stray.items():
        monkeypatch.setenv(name, value)

    def reached():
        raise _Reached

    monkeypatch.setattr(fastnn._device, "require_cuda", reached)
    with pytest.raises(_Reached):
        distributed.init(rank=0, world=1, device=0)


@pytest.mark.bindings
def test_a_launcher_variable_is_parsed_only_for_the_argument_it_stands_for(monkeypatch):
    """rank and world passed, device not: LOCAL_RANK gives the device, RANK=node-a is not read; a LOCAL_RANK that is
    not an integer is then refused by name."""
    import fastnn._device
    from fastnn.cuda import driver

    for names in distributed.LAUNCHER_ENV:
        for name in names:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RANK", "node-a")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setattr(fastnn._device, "require_cuda", lambda: None)
    monkeypatch.setattr(driver, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"device must be an integer in \[0, 2\), got 3"):
        distributed.init(rank=0, world=1)  # GPU 3 from LOCAL_RANK, refused: this machine has 2
    monkeypatch.setenv("LOCAL_RANK", "")
    with pytest.raises(ConfigError, match="environment variable LOCAL_RANK must be an integer, got ''"):
        distributed.init(rank=0, world=1)


def _require_nccl():
    from fastnn.cuda import nccl

    ok, reason = nccl.available()
    if not ok:
        pytest.skip(f"NCCL is not installed here: {reason}")
    return nccl


def test_nccl_binding_loads_and_makes_unique_ids():
    nccl = _require_nccl()
    major, minor, _ = (int(p) for p in nccl.version().split("."))
    assert (major, minor) >= (2, 19)
    a, b = nccl.unique_id(), nccl.unique_id()
    assert len(a) == len(b) == nccl.UNIQUE_ID_BYTES and a != b
    assert a.count(0) > 0 and nccl._UniqueId.of(a).raw() == a  # every byte crosses into C, zeros included
    assert "invalid usage" in nccl.status_name(nccl.Result.INVALID_USAGE)
    with pytest.raises(ConfigError, match="uid must be 128 bytes"):
        nccl.Comm(1, b"x", 0)
    for collective in (nccl.all_reduce, nccl.reduce_scatter, nccl.all_gather):
        with pytest.raises(ConfigError, match="dtype must be one of"):
            collective(None, 0, 0, 1, np.int8, None)


@pytest.mark.bindings
def test_missing_nccl_names_the_extra_to_install(monkeypatch):
    import cuda.pathfinder

    from fastnn.cuda import _loader

    def missing(name):
        raise RuntimeError(f"no {name} here")

    monkeypatch.setattr(cuda.pathfinder, "load_nvidia_dynamic_lib", missing)
    with pytest.raises(DeviceUnavailable) as info:
        _loader._load.__wrapped__("nccl")
    assert 'pip install -e ".[multi-cu12]"' in str(info.value) and "multi-cu13" in str(info.value)


def test_trainer_refuses_distributed_where_it_cannot_run():
    model = fastnn.MLP([4, 3])
    with pytest.raises(ConfigError, match="distributed must be a fastnn.distributed.Group"):
        fastnn.Trainer(model, distributed=object())
    group = distributed.Group(rank=0, world=1, device=0, comm=None)  # never used: refused before any work
    with pytest.raises(ConfigError, match="device='cpu' cannot take distributed="):
        fastnn.Trainer(model, device="cpu", distributed=group)
    for name in ("fused", "grid"):
        with pytest.raises(ConfigError, match=f"engine='{name}' trains on one GPU"):
            fastnn.Trainer(model, device="cuda", engine=name, distributed=group)
    for devices in (2, [0], [1]):
        with pytest.raises(ConfigError, match=re.escape(f"devices={devices} with distributed=: a distributed run")):
            fastnn.Trainer(model, device="cuda", distributed=group, devices=devices)


def _nccl_header() -> str:
    """The nccl.h of the installed NCCL wheel."""
    try:
        import nvidia.nccl
    except ImportError:
        pytest.skip("no NCCL wheel installed")
    for folder in nvidia.nccl.__path__:
        header = os.path.join(folder, "include", "nccl.h")
        if os.path.exists(header):
            return header
    pytest.skip("the NCCL wheel has no include/nccl.h")


def test_config_struct_is_the_installed_headers_ncclConfig_t(tmp_path):
    """The binding's ncclConfig_t and NCCL_CONFIG_INITIALIZER against the header of the installed wheel, compiled:
    the fields both declare sit at the same offsets and start out with the same bytes (one list of fields is a
    prefix of the other: NCCL only appends), and with the header the binding follows, the sizes agree too."""
    import ctypes
    import shutil
    import subprocess

    from fastnn.cuda import nccl

    header = _nccl_header()
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    with open(header) as f:
        text = f.read()
    body = re.search(r"typedef struct ncclConfig_v\d+ \{(.*?)\} ncclConfig_t;", text, re.S).group(1)
    theirs = re.findall(r"(\w+)\s*;", re.sub(r"/\*.*?\*/", "", body, flags=re.S))
    ours = [name for name, _ in nccl._Config._fields_]
    common = min(len(theirs), len(ours))
    assert theirs[:common] == ours[:common], (theirs, ours)
    version = int(re.search(r"#define NCCL_VERSION_CODE (\d+)", text).group(1))
    (tmp_path / "cuda_runtime.h").write_text("typedef struct CUevent_st* cudaEvent_t;\n"
                                             "typedef struct CUstream_st* cudaStream_t;\n")  # fmt: skip
    (tmp_path / "cuda_fp16.h").write_text("")
    offsets = "".join(f'printf("%zu\\n", offsetof(ncclConfig_t, {name}));' for name in theirs[:common])
    (tmp_path / "probe.c").write_text(
        "#define CUDART_VERSION 0\n#include <stdio.h>\n#include <stddef.h>\n#include <nccl.h>\n"
        "int main(void) { ncclConfig_t c = NCCL_CONFIG_INITIALIZER; const unsigned char* p = (const void*)&c;\n"
        f'printf("%zu\\n", sizeof c); {offsets}\n'
        'for (size_t i = 0; i < sizeof c; i++) printf("%02x", p[i]); printf("\\n"); return 0; }\n'
    )
    include = os.path.dirname(header)
    probe = tmp_path / "probe"
    subprocess.run([compiler, f"-I{tmp_path}", f"-I{include}", "-o", str(probe), f"{probe}.c"], check=True,
                   capture_output=True)  # fmt: skip
    lines = subprocess.run([str(probe)], check=True, capture_output=True, text=True).stdout.split()
    size, their_offsets, their_bytes = int(lines[0]), [int(v) for v in lines[1:-1]], bytes.fromhex(lines[-1])
    assert their_offsets == [getattr(nccl._Config, name).offset for name in ours[:common]]
    config = nccl._Config.initializer()
    assert config.size == ctypes.sizeof(config) and config.version == nccl._CONFIG_VERSION
    last = getattr(nccl._Config, ours[common - 1])
    shared = last.offset + last.size
    assert bytes(config)[8:shared] == their_bytes[8:shared]  # past `size`, which is each one's own sizeof
    if version == nccl._CONFIG_VERSION:
        assert size == ctypes.sizeof(nccl._Config) and bytes(config) == their_bytes


class _FakeNccl:
    """A stand-in NCCL for nccl.Comm: ncclCommGetAsyncError reports `states` in turn (the last one from then on);
    the calls, the config passed and the communicators ended are recorded."""

    def __init__(self, states: list[int], handle: int = 7) -> None:
        self.states, self.handle = list(states), handle
        self.polls, self.events, self.config = 0, [], None

    def ncclCommInitRankConfig(self, comm, world, uid, rank, config):
        self.config = type(config._obj).from_buffer_copy(config._obj)
        comm._obj.value = self.handle
        return 7  # ncclInProgress: joined by NCCL's own thread

    def ncclCommGetAsyncError(self, ptr, state):
        self.polls += 1
        state._obj.value = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return 0

    def ncclAllReduce(self, *args):
        self.events.append("all_reduce")
        self.states = [7, 7, 0]  # queued by NCCL's thread, which finishes after two more polls
        return 7

    def ncclCommAbort(self, ptr):
        self.events.append(f"abort {ptr}")
        return 0

    def ncclCommDestroy(self, ptr):
        self.events.append(f"destroy {ptr}")
        return 0

    def ncclGetErrorString(self, status):
        return b"remote process exited or there was a network error"

    def ncclGetLastError(self, comm):
        return b"peer 1 closed the connection"


def test_a_communicator_whose_peers_never_come_times_out_and_is_aborted(monkeypatch):
    """Rank 0 alone in a world of two (a world-size typo, a peer that died before joining): the non-blocking
    creation is polled until the timeout, then aborted, and raises CollectiveTimeout instead of hanging."""
    import ctypes
    import time

    from fastnn.cuda import nccl

    fake = _FakeNccl([nccl.Result.IN_PROGRESS])
    monkeypatch.setattr(nccl, "_lib", lambda: fake)
    start = time.monotonic()
    with pytest.raises(nccl.CollectiveTimeout, match=r"ncclCommInitRankConfig: the other ranks did not join within "
                       r"0.2 s; the communicator was aborted"):  # fmt: skip
        nccl.Comm(2, bytes(128), 0, timeout=0.2)
    assert 0.2 <= time.monotonic() - start < 5 and fake.polls > 1
    assert fake.events == ["abort 7"]
    config = fake.config
    assert (config.size, config.magic, config.version) == (ctypes.sizeof(nccl._Config), 0xCAFEBEEF, 23203)
    assert config.blocking == 0 and config.minCTAs == -(2**31) and config.netName is None  # the rest: NCCL's own


def test_a_communicator_is_returned_once_every_rank_joined_and_its_calls_are_waited_for(monkeypatch):
    """Joined after a few polls: the communicator is returned, not aborted; a collective NCCL queues on its own
    thread returns only once it is queued (the stream's next work, or the capture's end, must come after it)."""
    from fastnn.cuda import nccl

    fake = _FakeNccl([nccl.Result.IN_PROGRESS] * 3 + [nccl.Result.SUCCESS])
    monkeypatch.setattr(nccl, "_lib", lambda: fake)
    comm = nccl.Comm(2, bytes(128), 0, timeout=5)
    assert fake.polls == 4 and not comm.closed and not comm.blocking and fake.events == []
    nccl.all_reduce(comm, 0, 0, 4, np.float32, None)
    assert fake.events == ["all_reduce"] and fake.states == [0] and fake.polls == 7
    comm.close()
    assert fake.events == ["all_reduce", "destroy 7"]


def test_a_communicator_nccl_fails_to_make_is_aborted_and_raises_its_error(monkeypatch):
    from fastnn.cuda import nccl

    fake = _FakeNccl([nccl.Result.IN_PROGRESS, nccl.Result.REMOTE_ERROR])
    monkeypatch.setattr(nccl, "_lib", lambda: fake)
    with pytest.raises(nccl.NcclError, match="ncclCommInitRankConfig failed: remote process exited .* peer 1 closed"):
        nccl.Comm(2, bytes(128), 0, timeout=5)
    assert fake.events == ["abort 7"]


@pytest.mark.bindings
def test_init_raises_collective_timeout_naming_rank_world_gpu_and_timeout(monkeypatch):
    """init's timeout bounds the communicator's creation too, through a stand-in NCCL that never sees the peer."""
    import fastnn._device
    from fastnn.cuda import driver, nccl

    fake = _FakeNccl([nccl.Result.IN_PROGRESS])
    monkeypatch.setattr(nccl, "_lib", lambda: fake)
    monkeypatch.setattr(nccl, "available", lambda: (True, "NCCL (stand-in)"))
    monkeypatch.setattr(fastnn._device, "require_cuda", lambda: None)
    monkeypatch.setattr(driver, "device_count", lambda: 1)
    monkeypatch.setattr(driver, "get_device", lambda ordinal: type("Dev", (), {"make_current": lambda self: None})())
    with pytest.raises(nccl.CollectiveTimeout, match=r"rank 0 of 2 on GPU 0: the other ranks did not join the "
                       r"communicator within 0.2 s \(distributed.init's timeout\): check that every rank was started "
                       r"with world=2 and the same id, and that none has died or read a stale id_file left by an "
                       r"earlier run \(an old id names a bootstrap that no longer exists"):  # fmt: skip
        distributed.init(0, 2, uid=bytes(128), device=0, timeout=0.2)
    assert fake.events == ["abort 7"]


class _HeldGraph:
    """A graph executable as nccl.Comm.hold sees it; records its destruction in `events`."""

    def __init__(self, name: str, events: list) -> None:
        self.name, self.events, self.closed = name, events, False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.events.append(f"close {self.name}")


def _fake_comm(monkeypatch, events: list):
    """A Comm over a stand-in NCCL that records ncclCommDestroy and ncclCommAbort in `events`."""
    from fastnn.cuda import nccl

    lib = type("Lib", (), {})()
    lib.ncclCommDestroy = lambda ptr: events.append(f"destroy {ptr}")
    lib.ncclCommAbort = lambda ptr: events.append(f"abort {ptr}")
    monkeypatch.setattr(nccl, "_lib", lambda: lib)

    def make(handle: int):
        comm = nccl.Comm.__new__(nccl.Comm)
        comm._bind(handle, 2, 0)
        return comm

    return nccl, make


def test_a_communicator_ends_only_after_the_graphs_holding_its_collectives(monkeypatch):
    """NCCL's destroy and abort wait until every graph that captured the communicator's collectives is gone
    (with two or more ranks; one rank makes no such graphs), so every way of ending it destroys them first:
    close, abort, and the garbage collector."""
    import gc

    events: list = []
    nccl, make = _fake_comm(monkeypatch, events)
    comm = make(1)
    closed_by_its_trainer, live = _HeldGraph("a", events), _HeldGraph("b", events)
    comm.hold(closed_by_its_trainer)
    closed_by_its_trainer.close()
    comm.hold(live)
    assert comm._graphs == [live]  # graphs already closed are let go
    comm.close()
    comm.close()
    assert events == ["close a", "close b", "destroy 1"]

    events.clear()
    comm = make(2)
    comm.hold(_HeldGraph("c", events))
    comm.abort()
    comm.abort()
    # The abort runs beside the graphs' destroys (test_an_abort_ends_a_collective_that_a_graph_destroy_waits_for)
    assert sorted(events) == ["abort 2", "close c"] and comm.closed and comm.async_error() is None
    late = _HeldGraph("d", events)
    with pytest.raises(nccl.CommAborted, match="rank 0 of 2: the communicator was closed or aborted"):
        comm.hold(late)  # captured after the abort: destroyed at once
    assert late.closed

    events.clear()
    comm = make(3)
    comm.hold(_HeldGraph("e", events))
    del comm  # a trainer and its group left to the garbage collector
    gc.collect()
    assert events == ["close e", "destroy 3"]


class _GraphWaitingForTheAbort(_HeldGraph):
    """A graph whose destroy waits for a collective kernel that only NCCL's abort ends: a peer that died leaves the
    kernel spinning, and a graph destroy synchronizes the device (seen on 2 x H200: the surviving rank hung here)."""

    def __init__(self, name: str, events: list, aborted) -> None:
        super().__init__(name, events)
        self.aborted = aborted

    def close(self) -> None:
        if not self.aborted.wait(5):
            self.events.append(f"close {self.name} hung")
        super().close()


def test_an_abort_ends_a_collective_that_a_graph_destroy_waits_for(monkeypatch):
    """A rank whose peer died aborts its communicator: NCCL's abort must run while the graphs are destroyed, not
    after them, since a destroy waits for the spinning collective and the abort waits for the destroys."""
    import threading

    events: list = []
    aborted = threading.Event()
    nccl, make = _fake_comm(monkeypatch, events)
    lib = nccl._lib()
    real_abort = lib.ncclCommAbort
    lib.ncclCommAbort = lambda ptr: (real_abort(ptr), aborted.set())
    comm = make(4)
    comm.hold(_GraphWaitingForTheAbort("spinning", events, aborted))
    comm.abort()
    assert sorted(events) == ["abort 4", "close spinning"] and comm.closed, events


@pytest.mark.parametrize("end", ["close", "abort"])
def test_a_graph_captured_while_its_communicator_ends_is_destroyed_by_its_capturer(monkeypatch, end):
    """The last rank's destroy or abort waits for every graph; one that a capturing thread finishes meanwhile is
    destroyed by that thread's hold, which must not wait for the end to return (NCCL is called outside the lock)."""
    import threading

    events: list = []
    nccl, make = _fake_comm(monkeypatch, events)
    late = _HeldGraph("late", events)
    refused = []

    def capturer() -> None:
        try:
            comm.hold(late)
        except nccl.CommAborted as exc:
            refused.append(exc)

    def nccl_end(ptr: int) -> None:  # NCCL waiting for the graph the other thread is holding
        thread = threading.Thread(target=capturer)
        thread.start()
        thread.join(10)
        events.append("ended" if not thread.is_alive() else "hold blocked")

    monkeypatch.setattr(nccl._lib(), "ncclCommDestroy" if end == "close" else "ncclCommAbort", nccl_end)
    comm = make(4)
    getattr(comm, end)()
    assert events == ["close late", "ended"] and late.closed and len(refused) == 1


class _WaitingGroup:
    """What graph.waiting.wait_for uses of a Group: a peer that never comes (no async error, the wait never ends)."""

    def __init__(self, timeout: float | None) -> None:
        from types import SimpleNamespace

        self.rank, self.world, self.device, self.timeout = 1, 2, 3, timeout
        self.comm = SimpleNamespace(closed=False)
        self.aborts = 0

    def async_error(self):
        return None

    def abort(self) -> None:
        self.aborts += 1
        self.comm.closed = True


class _Event:
    """An event that completes after `polls` queries (None: never)."""

    def __init__(self, polls: int | None) -> None:
        self.polls = polls

    def query(self) -> bool:
        if self.polls is None:
            return False
        self.polls -= 1
        return self.polls < 0


@pytest.mark.bindings
def test_a_rank_waiting_past_its_groups_timeout_aborts_and_raises():
    """A peer that died or stopped training leaves this rank's collective spinning, and NCCL need not report it:
    past the group's timeout the communicator is aborted and the wait raises, naming the rank, GPU and timeout."""
    import time

    from fastnn.cuda import nccl
    from fastnn.engine.graph.waiting import wait_for

    group = _WaitingGroup(timeout=0.05)
    start = time.monotonic()
    with pytest.raises(nccl.CollectiveTimeout, match=r"rank 1 of 2 on GPU 3: the other ranks did not join .* 0.05 s"):
        wait_for(_Event(None), group)
    assert group.aborts == 1 and 0.05 <= time.monotonic() - start < 5
    assert issubclass(nccl.CollectiveTimeout, nccl.CommAborted)  # drive_epochs drains nothing after it

    for timeout in (None, 30.0):  # waits that end in time are left alone
        group = _WaitingGroup(timeout)
        wait_for(_Event(20), group)
        assert group.aborts == 0


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------


def _gpu_count() -> int:
    from fastnn.cuda import driver

    return driver.device_count()


def _case():
    """Training set, model and settings: 2 hidden layers, momentum, a short last batch of 1 row (one rank of two
    has an empty share of it), uint8 inputs."""
    rng = np.random.default_rng(3)
    n, d, classes, batch = 4 * 64 + 1, 20, 5, 64
    x = rng.integers(0, 256, (n, d), dtype=np.uint8)
    y = (x[:, :classes].argmax(1)).astype(np.int64)
    kw = dict(batch_size=batch, seed=7, normalize=(0.5, 0.25))
    model = fastnn.MLP([d, 24, 16, classes])
    return x, y, model, kw


def _train(device: str, precision: str, group=None, epochs: int = 3, batch: int | None = None, devices=1,
           tuning: Tuning | None = None):  # fmt: skip
    x, y, model, kw = _case()
    if batch is not None:
        kw["batch_size"] = batch
    t = fastnn.Trainer(model, fastnn.SGD(lr=0.05, momentum=0.9), precision=precision, device=device,
                       engine="graph" if device == "cuda" else "auto", distributed=group, devices=devices,
                       tuning=tuning, **kw)  # fmt: skip
    try:
        h = t.fit(x, y, epochs=epochs)
        return t.state_dict(), np.array(h["train_loss"]), np.array(h["train_accuracy"])
    finally:
        t.close()


def _piped_id(rank: int, conn) -> str:
    """The NCCL id through pipes: rank 0 makes it and sends it up `conn`; the parent (_spawn) passes it down."""
    if rank == 0:
        uid = distributed.unique_id()
        conn.send(("uid", uid))
        return uid
    return conn.recv()


def _rank_main(rank: int, world: int, conn, precision: str, id_file: str | None, batch: int | None,
               sharded: bool = False) -> None:  # fmt: skip
    """One process of a data-parallel run on GPU `rank` (the id through pipes, or id_file), its update sharded or
    not (Tuning.sharded_update); results up `conn`."""
    try:
        if id_file is None:
            group = distributed.init(rank, world, uid=_piped_id(rank, conn), device=rank)
        else:
            group = distributed.init(rank, world, id_file=id_file, device=rank)
        with group:
            conn.send(("ok", _train("cuda", precision, group, batch=batch, tuning=Tuning(sharded_update=sharded))))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def _spawn(world: int, target, args_of_rank, relay_id: bool) -> list[tuple[str, object]]:
    """Start `world` processes target(rank, world, conn, *args_of_rank(rank)) (spawned: a fresh CUDA context
    each); with relay_id, pass rank 0's first message (the NCCL id) to the others. Each rank's (tag, answer)."""
    ctx = mp.get_context("spawn")
    ends, procs = [], []
    for rank in range(world):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=target, args=(rank, world, child, *args_of_rank(rank)), daemon=True)
        proc.start()
        ends.append(parent)
        procs.append(proc)
    try:
        results: list = [None] * world
        if relay_id:
            tag, payload = ends[0].recv() if ends[0].poll(120) else ("error", "rank 0 sent no id in 120 s")
            if tag != "uid":
                results[0] = (tag, payload)
            else:
                for end in ends[1:]:
                    end.send(payload)
        for rank, end in enumerate(ends):
            if results[rank] is None:
                results[rank] = end.recv() if end.poll(300) else ("error", f"rank {rank}: no answer in 300 s")
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    return results


def _run_ranks(world: int, precision: str, id_file: str | None = None, batch_of_rank=None,
               sharded: bool = False) -> list:  # fmt: skip
    """A data-parallel run of `world` processes; every rank's (state, losses, accuracies)."""
    batch = batch_of_rank or (lambda rank: None)
    results = _spawn(world, _rank_main, lambda rank: (precision, id_file, batch(rank), sharded),
                     relay_id=id_file is None)  # fmt: skip
    for tag, payload in results:
        assert tag == "ok", payload
    return [payload for _, payload in results]


def _count_all_reduces(monkeypatch) -> list[int]:
    """The element count of every nccl.all_reduce the test makes from here on, in order (each still runs)."""
    nccl = _require_nccl()
    calls: list[int] = []
    real = nccl.all_reduce
    monkeypatch.setattr(nccl, "all_reduce", lambda *a, **k: (calls.append(a[3]), real(*a, **k)))
    return calls


@contextlib.contextmanager
def _trainer_in_group_of_one(model, kw: dict, optimizer=None, tuning: Tuning | None = None):
    """An fp32 graph-engine Trainer in a data-parallel group of one rank on GPU 0, closed before its group."""
    with (
        distributed.init(0, 1, device=0) as group,
        fastnn.Trainer(model, optimizer or fastnn.SGD(lr=0.05), precision="fp32", device="cuda", engine="graph",
                       distributed=group, tuning=tuning, **kw) as t,
    ):  # fmt: skip
        yield t


def _assert_same_training(a, b, rtol: float, atol: float) -> None:
    (sa, la, aa), (sb, lb, ab) = a, b
    np.testing.assert_allclose(la, lb, rtol=rtol)
    np.testing.assert_allclose(aa, ab, atol=2.0 / 257)  # at most 2 of 257 samples flip
    for name in sa:
        np.testing.assert_allclose(sa[name], sb[name], rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.gpu
def test_one_rank_group_trains_exactly_like_one_gpu(monkeypatch, one_gemm_algorithm):
    """A group of one: the same captured graph plus all-reduces over one rank (identities), bit for bit."""
    calls = _count_all_reduces(monkeypatch)
    with distributed.init(0, 1, device=0) as group:
        one = _train("cuda", "fp32", group, tuning=one_gemm_algorithm)
    # The ranks' agreement checks (MAX and MIN of 12 values on the data, of 7 on the call), each layer's gradient
    # once per step (5 steps, and the autotuning run of step 0), and the history once; no stop votes (no callbacks).
    x, _, model, kw = _case()
    steps, layers = -(-len(x) // kw["batch_size"]), len(model.layers)
    assert calls[:4] == [13, 13, 7, 7] and len(calls) == 4 + (steps + 1) * layers + 1 and calls[-1] == 2, calls
    plain = _train("cuda", "fp32", tuning=one_gemm_algorithm)
    for name in plain[0]:
        np.testing.assert_array_equal(one[0][name], plain[0][name], err_msg=name)
    np.testing.assert_array_equal(one[1], plain[1])


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "mixed", "fp16"])
@pytest.mark.parametrize("optimizer", ["momentum", "adamw"])
def test_sharded_update_of_one_rank_trains_exactly_like_one_gpu(monkeypatch, one_gemm_algorithm, precision,
                                                                 optimizer):  # fmt: skip
    """Tuning.sharded_update over one rank: reduce-scatters, per-layer updates on the side stream and
    all-gathers in place (identities for one rank) give one GPU's weights and optimizer state bit for bit; the
    epoch graph holds a reduce-scatter and an all-gather per layer and step, and at its end an all-gather per layer
    of each partial region (the fp32 master in "mixed", each optimizer state)."""
    nccl = _require_nccl()
    opt = fastnn.SGD(lr=0.05, momentum=0.9) if optimizer == "momentum" else fastnn.AdamW(lr=0.01)
    x, y, model, kw = _case()
    calls = {"reduce_scatter": 0, "all_gather": 0}
    for name in calls:
        real = getattr(nccl, name)
        monkeypatch.setattr(nccl, name, lambda *a, _real=real, _name=name, **k: (calls.__setitem__(_name,
                                                                                 calls[_name] + 1), _real(*a, **k)))
    states = []
    for sharded in (True, False):
        tuning = dataclasses.replace(one_gemm_algorithm, sharded_update=sharded)
        with (
            distributed.init(0, 1, device=0) as group,
            fastnn.Trainer(model, opt, precision=precision, device="cuda", engine="graph", distributed=group,
                           tuning=tuning, **kw) as t,
        ):  # fmt: skip
            h = t.fit(x, y, epochs=3)
            assert t._engine.sharded is sharded
            states.append((t._engine.get_state(), np.array(h["train_loss"])))
    # Counted as queued: once while the epoch graph is captured (and the autotuning run of step 0 before it).
    steps, layers = -(-len(x) // kw["batch_size"]), len(model.layers)
    regions = (precision == "mixed") + (1 if optimizer == "momentum" else 2)
    assert calls["reduce_scatter"] == (steps + 1) * layers
    # "mixed" also gathers the output layer's fp32 master every step: its GEMM reads the fp32 bias.
    assert calls["all_gather"] == steps * (layers + (precision == "mixed")) + regions * layers
    (sharded_state, sharded_loss), (plain_state, plain_loss) = states
    assert sharded_state.keys() == plain_state.keys()
    for name in plain_state:
        np.testing.assert_array_equal(sharded_state[name], plain_state[name], err_msg=name)
    np.testing.assert_array_equal(sharded_loss, plain_loss)


@pytest.mark.gpu
def test_high_priority_all_reduces_train_the_same(monkeypatch, one_gemm_algorithm):
    """Tuning.comm_high_priority (the all-reduce stream at the highest priority, kept per graph node) changes
    when the collectives run, not what they compute: a group of one trains bit for bit like one GPU."""
    _require_nccl()
    with distributed.init(0, 1, device=0) as group:
        one = _train("cuda", "fp32", group, tuning=dataclasses.replace(one_gemm_algorithm, comm_high_priority=True))
    plain = _train("cuda", "fp32", tuning=one_gemm_algorithm)
    for name in plain[0]:
        np.testing.assert_array_equal(one[0][name], plain[0][name], err_msg=name)


@pytest.mark.gpu
def test_gemm_sm_carveout_leaves_sms_and_trains_like_numpy(monkeypatch):
    """Tuning.gemm_sm_carveout: a data-parallel engine's backward GEMMs target that many SMs fewer (its forward
    GEMMs, and any one-GPU engine's, every SM); the carved plans may pick other algorithms, so training matches the
    NumPy engine with the suite's tolerance rather than bit for bit."""
    _require_nccl()
    from fastnn.cuda import cublaslt as lt

    carve = Tuning(gemm_sm_carveout=16)
    x, y, model, kw = _case()
    target = lambda plan: plan._d.desc.get(lt.MatmulDescAttribute.SM_COUNT_TARGET)  # noqa: E731
    with _trainer_in_group_of_one(model, kw, fastnn.SGD(lr=0.05, momentum=0.9), tuning=carve) as t:
        h = t.fit(x, y, epochs=3)
        one = t.state_dict(), np.array(h["train_loss"]), np.array(h["train_accuracy"])
        eng = t._engine
        layers = eng.train_context.layers
        backward = [p for layer in layers for p in (*layer.dw.values(), *layer.dx.values())]
        assert backward and {target(p) for p in backward} == {eng.dev.sm_count - 16}
        assert {target(p) for layer in layers for p in layer.fwd.values()} == {0}
    with fastnn.Trainer(model, precision="fp32", device="cuda", engine="graph", tuning=carve, **kw) as plain:
        plain.fit(x[:64], y[:64], epochs=1)  # one GPU: no all-reduces beside its GEMMs, every SM
        assert {target(p) for layer in plain._engine.train_context.layers for p in layer.dw.values()} == {0}
    _assert_same_training(one, _train("cpu", "fp32"), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_id_file_is_removed_once_every_rank_has_joined(tmp_path):
    """A spent id left in a fixed path would be read by the next run's ranks before rank 0 replaced it."""
    _require_nccl()
    path = tmp_path / "nccl.id"
    with distributed.init(0, 1, id_file=path, device=0) as group:
        assert not path.exists()
        x, y, model, kw = _case()
        with fastnn.Trainer(model, device="cuda", distributed=group, **kw) as t:
            t.fit(x, y, epochs=1)
            with pytest.raises(ConfigError, match="a data-parallel trainer's are collectives"):
                t._engine.profile_step(1)


@pytest.mark.gpu
def test_ranks_that_disagree_are_refused_before_training(tmp_path):
    """Ranks with another batch size would issue mismatched collectives (a hang): every rank refuses by name."""
    _require_nccl()
    if _gpu_count() < 2:
        pytest.skip(f"needs 2 GPUs; this machine has {_gpu_count()}")
    with pytest.raises(AssertionError) as info:
        _run_ranks(2, "fp32", str(tmp_path / "nccl.id"), batch_of_rank=lambda rank: 64 + rank)
    assert "they differ in batch_size (this rank 6" in str(info.value)


@pytest.mark.gpu
@pytest.mark.parametrize("exchange, sharded", [("pipe", False), ("file", False), ("pipe", True)])
@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_two_processes_train_like_one_gpu_and_numpy(tmp_path, exchange, sharded, precision):
    """Two processes, one GPU each, the id passed through a pipe or a file, the update sharded or not: every rank
    ends with the weights and history of one-GPU training (up to summation order) and of the NumPy engine, with the
    engine suite's tolerances."""
    _require_nccl()
    if _gpu_count() < 2:
        pytest.skip(f"needs 2 GPUs; this machine has {_gpu_count()}")
    id_file = str(tmp_path / "nccl.id") if exchange == "file" else None
    ranks = _run_ranks(2, precision, id_file, sharded=sharded)
    one_gpu = _train("cuda", precision)
    cpu = _train("cpu", "fp32")
    tol = 1e-4 if precision == "fp32" else 2e-2
    for result in ranks:
        for name in ranks[0][0]:  # the ranks hold identical weights: the same sums, the same updates
            np.testing.assert_array_equal(result[0][name], ranks[0][0][name], err_msg=name)
        _assert_same_training(result, one_gpu, rtol=tol, atol=tol)
        _assert_same_training(result, cpu, rtol=tol, atol=tol)


@pytest.mark.gpu
def test_ranks_on_one_gpu_are_refused_with_nccls_message_naming_rank_and_gpu():
    """Two ranks on the same GPU: NCCL refuses the communicator; each rank's error names it, its GPU and NCCL's
    own words, and neither process hangs."""
    _require_nccl()
    for rank, (_, answer) in enumerate(_spawn(2, _same_gpu_rank, lambda rank: (), relay_id=True)):
        assert f"rank {rank} of 2 on GPU 0: ncclCommInitRankConfig failed" in answer, answer
        assert "Duplicate GPU" in answer, answer


@pytest.mark.gpu
def test_init_alone_in_a_world_of_two_raises_collective_timeout_instead_of_hanging():
    """Rank 0 with world=2 and no rank 1 (a world-size typo, a peer that died before joining) was still blocked 45 s
    into timeout=5 with a blocking ncclCommInitRank: the non-blocking creation is aborted at the timeout and raises,
    and NCCL makes communicators afterwards as before."""
    import time

    nccl = _require_nccl()
    start = time.monotonic()
    with pytest.raises(nccl.CollectiveTimeout, match=r"rank 0 of 2 on GPU 0: the other ranks did not join the "
                       r"communicator within 3 s"):  # fmt: skip
        distributed.init(0, 2, uid=distributed.unique_id(), device=0, timeout=3)
    waited = time.monotonic() - start
    assert 3 <= waited < 30, waited
    with distributed.init(0, 1, device=0, timeout=30) as group:
        assert not group.comm.closed and not group.comm.blocking


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_in_place_reduce_scatter_and_all_gather_on_every_gpu(dtype):
    """The sharded update's collectives, in place as the engine calls them: each rank's part of the sum, then every
    rank holding every part (on all GPUs here: two where there are two, else a group of one)."""
    from fastnn.cuda import driver

    nccl = _require_nccl()
    gpus = list(range(min(2, _gpu_count())))
    world, count = len(gpus), 384
    comms = nccl.Comm.clique(gpus)
    data = [np.arange(world * count, dtype=np.float32).astype(dtype) * (r + 1) for r in range(world)]
    bufs, streams = [], []
    try:
        for r, g in enumerate(gpus):
            dev = driver.get_device(g)
            dev.make_current()
            streams.append(driver.Stream(dev))
            bufs.append(driver.DeviceBuffer(data[r].nbytes))
            bufs[-1].upload(data[r])
        size = np.dtype(dtype).itemsize

        def on_rank(r: int, step) -> None:
            driver.get_device(gpus[r]).make_current()
            step(r)
            streams[r].synchronize()

        def run(step) -> None:
            with ThreadPoolExecutor(world) as pool:
                list(pool.map(lambda r: on_rank(r, step), range(world)))

        base = lambda r: bufs[r].ptr  # noqa: E731
        run(lambda r: nccl.reduce_scatter(comms[r], base(r), base(r) + r * count * size, count, dtype, streams[r]))
        total = sum(d.astype(np.float64) for d in data)
        for r, g in enumerate(gpus):
            driver.get_device(g).make_current()
            got = np.empty(world * count, dtype=dtype)
            bufs[r].download(got)
            part = slice(r * count, (r + 1) * count)
            np.testing.assert_array_equal(got[part], total[part].astype(dtype))  # one rounding of the exact sum
        run(lambda r: nccl.all_gather(comms[r], base(r) + r * count * size, base(r), count, dtype, streams[r]))
        for r, g in enumerate(gpus):
            driver.get_device(g).make_current()
            got = np.empty(world * count, dtype=dtype)
            bufs[r].download(got)
            np.testing.assert_array_equal(got, total.astype(dtype))
    finally:
        for obj in (*bufs, *streams, *comms):
            obj.close()


def _same_gpu_rank(rank: int, world: int, conn) -> None:
    try:
        with distributed.init(rank, world, uid=_piped_id(rank, conn), device=0):
            conn.send(("joined", "no error"))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))


# ---------------------------------------------------------------------------------------------------------------
# devices=: several GPUs of one process
# ---------------------------------------------------------------------------------------------------------------


def _need_gpus(n: int) -> None:
    _require_nccl()
    if _gpu_count() < n:
        pytest.skip(f"needs {n} GPUs; this machine has {_gpu_count()}")


@pytest.mark.gpu
@pytest.mark.parametrize("sharded", [False, True])
@pytest.mark.parametrize("precision", ["fp32", "mixed"])
def test_devices_train_like_one_gpu_and_numpy(precision, sharded, tmp_path, one_gemm_algorithm, monkeypatch):
    """devices=2, the update sharded or not: both replicas end with the same weights and optimizer state, those of
    one-GPU training (up to summation order) and of the NumPy engine; the checkpoint is one GPU's file (a one-GPU
    trainer loads it and predicts the same)."""
    _need_gpus(2)
    x, y, model, kw = _case()
    with fastnn.Trainer(model, fastnn.SGD(lr=0.05, momentum=0.9), precision=precision, device="cuda",
                        devices=[1, 0], tuning=dataclasses.replace(one_gemm_algorithm, sharded_update=sharded),
                        **kw) as t:  # fmt: skip
        assert t.engine == "graph"
        h = t.fit(x, y, epochs=3)
        both = t._engine.replicas
        assert [eng.dev.ordinal for eng in both] == [1, 0]
        for name, value in both[0].get_state().items():
            np.testing.assert_array_equal(both[1].get_state()[name], value, err_msg=name)
        result = (t.state_dict(), np.array(h["train_loss"]), np.array(h["train_accuracy"]))
        t.save(tmp_path / "two.npz")
        probs = t.predict_proba(x)
    tol = 1e-4 if precision == "fp32" else 2e-2
    _assert_same_training(result, _train("cuda", precision, tuning=one_gemm_algorithm), rtol=tol, atol=tol)
    _assert_same_training(result, _train("cpu", "fp32"), rtol=tol, atol=tol)
    with fastnn.Trainer.load(tmp_path / "two.npz", device="cuda", engine="graph") as one:
        np.testing.assert_array_equal(one.predict_proba(x), probs)



@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "mixed", "fp16"])
@pytest.mark.parametrize("optimizer", ["momentum", "adamw"])
def test_sharded_devices_train_exactly_like_unsharded(monkeypatch, one_gemm_algorithm, precision, optimizer):
    """devices=2 with the update sharded against without: over two ranks every sum is one a + b either way and the
    update is elementwise, so the weights, optimizer state and history agree bit for bit; a part left stale on one
    rank (a weight read from storage that no step gathers) would show here."""
    _need_gpus(2)
    opt = fastnn.SGD(lr=0.05, momentum=0.9) if optimizer == "momentum" else fastnn.AdamW(lr=0.01)
    x, y, model, kw = _case()
    runs = []
    for sharded in (True, False):
        tuning = dataclasses.replace(one_gemm_algorithm, sharded_update=sharded)
        with fastnn.Trainer(model, opt, precision=precision, device="cuda", devices=2, tuning=tuning, **kw) as t:
            h = t.fit(x, y, epochs=3)
            assert all(eng.sharded is sharded for eng in t._engine.replicas)
            states = [eng.get_state() for eng in t._engine.replicas]
            runs.append((states, np.array(h["train_loss"]), np.array(h["train_accuracy"])))
    (sharded_states, *sharded_hist), (plain_states, *plain_hist) = runs
    for states in (sharded_states, plain_states):  # the replicas hold the same state
        for name in states[0]:
            np.testing.assert_array_equal(states[1][name], states[0][name], err_msg=name)
    for name in plain_states[0]:
        np.testing.assert_array_equal(sharded_states[0][name], plain_states[0][name], err_msg=name)
    for a, b in zip(sharded_hist, plain_hist):
        np.testing.assert_array_equal(a, b)


def _replicas_on(ordinals: list[int], tuning: Tuning | None = None) -> dict:
    """Trainer arguments for the replica engine over `ordinals`, also over a list of one (which devices= alone gives
    to the plain engine: Tuning.one_gpu_replica)."""
    return {"devices": ordinals, "tuning": dataclasses.replace(tuning or Tuning(), one_gpu_replica=True)}


@pytest.mark.gpu
def test_one_replica_trains_exactly_like_one_gpu(monkeypatch, one_gemm_algorithm):
    """The replica engine over one GPU (its threads, communicator and lock-step epochs): bit for bit one GPU's."""
    _require_nccl()
    one = _train("cuda", "fp32", **_replicas_on([0], one_gemm_algorithm))
    plain = _train("cuda", "fp32", tuning=one_gemm_algorithm)
    for name in plain[0]:
        np.testing.assert_array_equal(one[0][name], plain[0][name], err_msg=name)
    np.testing.assert_array_equal(one[1], plain[1])


@pytest.mark.gpu
@pytest.mark.parametrize("end", ["close", "abort"])
def test_a_group_ended_under_an_open_trainer_takes_its_epoch_graph(end):
    """Ending a group whose trainer still holds its epoch graph destroys the graph first (NCCL would wait for it
    forever with two ranks; see nccl.Comm); later fits are refused by name, and the weights are still there."""
    nccl = _require_nccl()
    x, y, model, kw = _case()
    group = distributed.init(0, 1, uid=distributed.unique_id(), device=0)
    t = fastnn.Trainer(model, fastnn.SGD(lr=0.05, momentum=0.9), precision="fp32", device="cuda", engine="graph",
                       distributed=group, **kw)  # fmt: skip
    try:
        t.fit(x, y, epochs=1)
        graph = t._engine.train_context.graph
        assert group.comm._graphs == [graph] and not graph.closed
        before = t.state_dict()
        getattr(group, end)()
        assert graph.closed
        with pytest.raises(nccl.CommAborted, match="rank 0 of 1 on GPU 0: the communicator was closed or aborted"):
            t.fit(x, y, epochs=1)
        assert t.epoch == 1
        for name, value in t.state_dict().items():
            np.testing.assert_array_equal(value, before[name], err_msg=name)
    finally:
        t.close()
        group.close()


@pytest.mark.gpu
def test_a_trainer_collected_while_its_group_lives_frees_its_epoch_graph():
    """The communicator keeps its graphs until it ends (to destroy them first); a trainer collected before that
    must not leave its epoch graph, and with two ranks NCCL's plans, alive until then."""
    import gc

    _require_nccl()
    x, y, model, kw = _case()
    with distributed.init(0, 1, uid=distributed.unique_id(), device=0) as group:
        t = fastnn.Trainer(model, fastnn.SGD(lr=0.05), precision="fp32", device="cuda", engine="graph",
                           distributed=group, **kw)  # fmt: skip
        t.fit(x, y, epochs=1)
        graph = t._engine.train_context.graph
        assert group.comm._graphs == [graph]
        del t
        gc.collect()
        assert graph.closed and not group.comm.closed


def _rank_ends_group_first(rank: int, world: int, conn, end: str) -> None:
    """One rank of a run that ends its group (`end`: close or abort) while its trainer still holds the epoch graph,
    which NCCL waits for; a later fit must be refused. Its refusal up `conn`."""
    from fastnn.cuda import nccl

    try:
        group = distributed.init(rank, world, uid=_piped_id(rank, conn), device=rank)
        x, y, model, kw = _case()
        t = fastnn.Trainer(model, fastnn.SGD(lr=0.05, momentum=0.9), precision="fp32", device="cuda",
                           engine="graph", distributed=group, **kw)  # fmt: skip
        t.fit(x, y, epochs=1)
        getattr(group, end)()
        try:
            t.fit(x, y, epochs=1)
            conn.send(("error", f"rank {rank}: a fit after the group's {end} was not refused"))
        except nccl.CommAborted as exc:
            t.state_dict()
            t.close()
            conn.send(("ok", str(exc)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


@pytest.mark.gpu
@pytest.mark.parametrize("end", ["close", "abort"])
def test_two_processes_end_their_groups_under_open_trainers(end):
    """With two ranks each epoch graph holds NCCL persistent plans, and ncclCommDestroy and ncclCommAbort wait until
    they are destroyed: ending the group first must still return (a spawned pair: a hang fails after 300 s)."""
    _need_gpus(2)
    results = _spawn(2, _rank_ends_group_first, lambda rank: (end,), relay_id=True)
    for rank, (tag, payload) in enumerate(results):
        assert tag == "ok", payload
        assert f"rank {rank} of 2 on GPU {rank}: the communicator was closed or aborted" in payload


@pytest.mark.gpu
def test_a_fit_of_no_epochs_still_takes_part_in_the_ranks_checks(monkeypatch):
    """A rank asked for epochs=0 runs the data and call checks the others run before training (12 and 7 values,
    a MAX and a MIN each), so that they are refused by name instead of waiting for it; it trains nothing."""
    calls = _count_all_reduces(monkeypatch)
    x, y, model, kw = _case()
    with _trainer_in_group_of_one(model, kw) as t:
        before = t.state_dict()
        assert len(t.fit(x, y, epochs=0)) == 0 and t.epoch == 0
        assert calls == [13, 13, 7, 7], calls
        for name, value in t.state_dict().items():
            np.testing.assert_array_equal(value, before[name], err_msg=name)
    with fastnn.Trainer(model, device="cuda", engine="graph", **kw) as alone:  # one GPU: no checks, no upload
        alone.fit(x, y, epochs=0)
        assert alone._engine.train_context is None


@pytest.mark.gpu
def test_a_stoppable_fit_votes_after_every_epoch(monkeypatch):
    """With callbacks, every rank votes after every epoch whether it stops (a MIN and a MAX of one value, outside
    the graph): a group of one stops where its callback does, having voted once per epoch trained."""
    calls = _count_all_reduces(monkeypatch)
    x, y, model, kw = _case()
    with _trainer_in_group_of_one(model, kw) as t:
        h = t.fit(x, y, epochs=4, callbacks=[lambda record: record["epoch"] == 2])
        assert len(h) == 2 and t.epoch == 2
    assert calls.count(1) == 2 * 2, calls  # the only one-value all-reduces: two votes of two each


def _rank_with_callbacks(rank: int, world: int, conn, case: str) -> None:
    """One rank of a run whose ranks stop or fit differently (`case`): "stop" (rank 1's callback stops after epoch
    2 of 4; rank 0 has none), "epochs" (rank r asks for 3 + r epochs, in calls of one epoch each, then both for 2)
    or "no epochs" (rank r asks for 2 * r epochs, then both for 2). Its (epochs done, epochs of each fit or the
    refusal, weights) up `conn`."""
    try:
        if case == "epochs":
            fastnn._fit.LR_CHUNK_STEPS = 5  # one epoch per fit_epochs call: the totals must be compared first
        with distributed.init(rank, world, uid=_piped_id(rank, conn), device=rank) as group:
            x, y, model, kw = _case()
            with fastnn.Trainer(model, fastnn.SGD(lr=0.05, momentum=0.9), precision="fp32", device="cuda",
                                engine="graph", distributed=group, **kw) as t:  # fmt: skip
                if case == "stop":
                    stop = [lambda record: record["epoch"] == 2] if rank == 1 else None
                    h = t.fit(x, y, epochs=4, callbacks=stop)
                    answer = [len(h)]
                else:
                    try:
                        t.fit(x, y, epochs=3 + rank if case == "epochs" else 2 * rank)
                        answer = ["not refused"]
                    except ConfigError as exc:
                        answer = [str(exc), t.epoch, len(t.fit(x, y, epochs=2))]
                conn.send(("ok", (t.epoch, answer, t.state_dict())))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


@pytest.mark.gpu
def test_a_stop_on_one_rank_stops_every_rank_after_the_same_epoch():
    """A callback given to one rank only, which stops it, would leave the other waiting in the next epoch's
    collectives: every rank votes after every epoch (any rank's callbacks make the fit stoppable on all), and both
    stop after epoch 2 with identical weights."""
    _need_gpus(2)
    results = _spawn(2, _rank_with_callbacks, lambda rank: ("stop",), relay_id=True)
    for tag, payload in results:
        assert tag == "ok", payload
    (e0, a0, w0), (e1, a1, w1) = (payload for _, payload in results)
    assert (e0, a0, e1, a1) == (2, [2], 2, [2])
    for name in w0:
        np.testing.assert_array_equal(w0[name], w1[name], err_msg=name)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["epochs", "no epochs"])
def test_ranks_asking_for_different_epochs_are_refused_before_any_epoch(case):
    """Each call's epoch and step counters, the epoch its fit ends at, its steps and learning rates are compared
    first: ranks asking for 3 and 4 epochs (in calls of one epoch), or for 0 and 2, are refused by name on both
    before any epoch, and can go on with a fit they agree on."""
    _need_gpus(2)
    results = _spawn(2, _rank_with_callbacks, lambda rank: (case,), relay_id=True)
    for rank, (tag, payload) in enumerate(results):
        assert tag == "ok", payload
        epochs, (message, refused_at, then), _ = payload
        assert f"rank {rank} of 2: every rank must train the same model" in message, message
        assert "epochs after this fit (epochs done + epochs) (this rank" in message, message
        assert (refused_at, then, epochs) == (0, 2, 2), payload


def _rank_loses_its_peer(rank: int, world: int, conn, when: str) -> None:
    """Rank 1 dies (os._exit: nothing closed) after a first fit, `when` = "between fits", or 0.5 s into the second,
    "during a fit" (thousands of short epochs); rank 0, with a 5 s timeout, must raise instead of waiting for it
    forever. Rank 0's (error type, message, seconds waited, epochs done, weights unchanged by the second fit)."""
    import os
    import threading
    import time

    from fastnn.cuda import nccl

    try:
        group = distributed.init(rank, world, uid=_piped_id(rank, conn), device=rank, timeout=5)
        x, y, model, kw = _case()
        t = fastnn.Trainer(model, fastnn.SGD(lr=0.05), precision="fp32", device="cuda", engine="graph",
                           distributed=group, **kw)  # fmt: skip
        t.fit(x, y, epochs=1)
        if rank == 1:
            conn.send(("ok", "gone"))
            conn.close()
            if when == "between fits":
                os._exit(0)
            threading.Timer(0.5, os._exit, (0,)).start()
        before, start = t.state_dict(), time.monotonic()
        try:
            t.fit(x, y, epochs=100_000)
            conn.send(("error", f"rank {rank}: the fit whose peer is gone returned"))
            return
        except (nccl.NcclError, nccl.CommAborted) as exc:
            waited = time.monotonic() - start
            after = t.state_dict()
            same = all(np.array_equal(after[name], before[name]) for name in before)
            t.close()
            group.close()
            conn.send(("ok", (type(exc).__name__, str(exc), waited, t.epoch, same)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


@pytest.mark.gpu
@pytest.mark.parametrize("when", ["between fits", "during a fit"])
def test_a_rank_whose_peer_died_raises_instead_of_hanging(when):
    """A dead peer on the same machine leaves a collective spinning, and NCCL need not report it: past the group's
    timeout the rank aborts its communicator and raises (or raises NCCL's own error first), its weights readable:
    unchanged if no epoch of the fit ran, else partway through."""
    _need_gpus(2)
    (tag0, payload), (tag1, gone) = _spawn(2, _rank_loses_its_peer, lambda rank: (when,), relay_id=True)
    assert (tag0, tag1, gone) == ("ok", "ok", "gone"), (payload, gone)
    kind, message, waited, epochs, same = payload
    assert kind in ("CollectiveTimeout", "NcclError"), message
    assert "rank 0 of 2 on GPU 0" in message and waited < 120, payload
    if when == "between fits":
        assert epochs == 1 and same, payload  # refused in the fit's first agreement check
    else:
        assert 1 < epochs < 100_001 and not same, payload


def _drop_unclosed_replicas(rank: int, world: int, conn) -> None:
    """A devices=2 trainer left to the garbage collector after a fit: its communicators' finalizers must destroy
    the epoch graphs before NCCL waits for them."""
    import gc
    import weakref

    try:
        x, y, model, kw = _case()
        t = fastnn.Trainer(model, fastnn.SGD(lr=0.05), precision="fp32", device="cuda", devices=2, **kw)
        t.fit(x, y, epochs=1)
        comms = [weakref.ref(group.comm) for group in t._engine.groups]
        graphs = [weakref.ref(replica.train_context.graph) for replica in t._engine.replicas]
        del t
        gc.collect()
        alive = [ref() is not None for ref in comms + graphs]
        conn.send(("ok", None) if not any(alive) else ("error", f"still alive (communicators, graphs): {alive}"))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


@pytest.mark.gpu
def test_a_dropped_two_gpu_trainer_is_collected():
    _need_gpus(2)
    ((tag, payload),) = _spawn(1, _drop_unclosed_replicas, lambda rank: (), relay_id=False)
    assert tag == "ok", payload


def _failing_set_train_data(monkeypatch, ordinals: list[int]) -> None:
    """GraphEngine.set_train_data raises on the GPUs in `ordinals` (after its agreement check: the others go on)."""
    from fastnn.engine.graph import GraphEngine

    real = GraphEngine.set_train_data

    def failing(self, *args):
        if self.dev.ordinal in ordinals:
            raise DeviceUnavailable(f"simulated failure on GPU {self.dev.ordinal}")
        return real(self, *args)

    monkeypatch.setattr(GraphEngine, "set_train_data", failing)


@pytest.mark.gpu
def test_a_failure_on_every_gpu_leaves_the_trainer_usable(monkeypatch):
    """The same refusal on every GPU leaves no replica waiting for another: nothing is aborted."""
    _require_nccl()
    ordinals = [0, 1] if _gpu_count() >= 2 else [0]
    x, y, model, kw = _case()
    with fastnn.Trainer(model, fastnn.SGD(lr=0.05), precision="fp32", device="cuda", **_replicas_on(ordinals),
                        **kw) as t:  # fmt: skip
        t.fit(x, y, epochs=1)
        with monkeypatch.context() as m:
            _failing_set_train_data(m, ordinals)
            with pytest.raises(DeviceUnavailable, match="simulated failure on GPU"):
                t.fit(x.copy(), y, epochs=1)
        t.fit(x, y, epochs=1)
        assert t.epoch == 2


@pytest.mark.gpu
def test_a_failure_on_one_gpu_aborts_the_group_and_keeps_the_weights(monkeypatch, tmp_path):
    """GPU 1 fails while GPU 0 goes on (and could wait in a collective for it): the communicators are aborted,
    the error is GPU 1's, later fits are refused by name, and the weights of the last finished fit can still be
    read and saved."""
    _need_gpus(2)
    x, y, model, kw = _case()
    t = fastnn.Trainer(model, fastnn.SGD(lr=0.05), precision="fp32", device="cuda", **_replicas_on([0, 1]), **kw)
    try:
        t.fit(x, y, epochs=1)
        before = t.state_dict()
        with monkeypatch.context() as m:
            _failing_set_train_data(m, [1])
            with pytest.raises(DeviceUnavailable, match="simulated failure on GPU 1"):
                t.fit(x.copy(), y, epochs=1)  # a new array: uploaded again, after the ranks' agreement check
        with pytest.raises(RuntimeError, match="can no longer train together"):
            t.fit(x, y, epochs=1)
        assert t.epoch == 1
        for name, value in t.state_dict().items():
            np.testing.assert_array_equal(value, before[name], err_msg=name)
        t.save(tmp_path / "kept.npz")
    finally:
        t.close()
