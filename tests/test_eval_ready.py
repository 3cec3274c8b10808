"""The fused and grid engines' first evaluation compiles nothing on the caller's thread (issue 41), on the CPU: the
CUDA driver, cuBLASLt and cuDNN faked (test_engine_modules.py's fakes), NVRTC's compile_native counted by thread.
What a fit of each engine compiles is known from its plan; the gather and loss kernels and the libraries' handles
that evaluation needs are made by graph/ready.py's thread, started when the engine is built."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fastnn import MLP, SGD
from fastnn._model import init_parameters
from fastnn.engine.base import EngineConfig

pytestmark = pytest.mark.bindings  # imports the graph engine (cuda-bindings); no GPU needed
graph = pytest.importorskip("fastnn.engine.graph.engine", reason="needs the CUDA wheels")
from test_engine_modules import fake_device  # noqa: E402

from fastnn._errors import DeviceUnavailable  # noqa: E402
from fastnn.cuda import cudnn, driver, nvrtc  # noqa: E402
from fastnn.engine.fused import FusedEngine  # noqa: E402
from fastnn.engine.graph import kernels, ready  # noqa: E402
from fastnn.engine.grid import GridEngine  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class _Function:
    def max_active_clusters(self, *args) -> int:
        return 1

    def max_active_blocks(self, *args) -> int:
        return 1

    def launch(self, *args, **kwargs) -> None:
        pass


class _Module:
    def __init__(self, cubin: bytes) -> None:
        self.cubin = cubin

    def function(self, name: str) -> _Function:
        return _Function()


@pytest.fixture
def compiles(monkeypatch):
    """[(file, thread name)] of every compile_native call, through the real kernels.module (a fresh process cache)."""
    fake_device(monkeypatch)
    calls: list[tuple[str, str]] = []

    def compile_native(filename, arch, options=()):
        calls.append((filename, threading.current_thread().name))
        return f"cubin of {filename}".encode()

    monkeypatch.setattr(nvrtc, "compile_native", compile_native)
    monkeypatch.setattr(driver, "Module", _Module)
    monkeypatch.setattr(kernels, "_modules", {})
    return calls


def _wait_for(condition, seconds: float = 30.0) -> None:
    """Poll `condition` until it holds; fail (not hang) after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the preparation thread"
        time.sleep(0.01)


def _config(cls) -> EngineConfig:
    grid = cls is GridEngine  # its kernels train three equal hidden layers at up to 32 rows a step
    model = MLP([784, 128, 128, 128, 10] if grid else [784, 10])
    return EngineConfig(model=model, optimizer=SGD(lr=0.1), batch_size=32 if grid else 128, precision="mixed")


def _fit_kernel(eng) -> object:
    """What a fit of uint8 rows compiles, from the engine's own plan (the kernel its training context builds)."""
    return eng.fused_kernel(np.uint8) if isinstance(eng, FusedEngine) else eng.grid_kernel(np.uint8)


@pytest.mark.parametrize("cls", [FusedEngine, GridEngine], ids=["fused", "grid"])
def test_the_first_evaluation_after_a_fit_compiles_nothing_on_the_callers_thread(compiles, cls, monkeypatch):
    warmed = []
    thread = lambda: threading.current_thread().name  # noqa: E731
    monkeypatch.setattr(graph.cublaslt, "warm_up", lambda lt, ws: warmed.append((lt, ws, thread())))
    eng = cls(_config(cls), init_parameters(_config(cls).model, 0))
    _, plan = _fit_kernel(eng)
    eng.load_step_libraries()  # what evaluate() and predict() call first (GraphEngine.eval_context)
    main = [f for f, thread in compiles if thread != ready.THREAD_NAME]
    background = [f for f, thread in compiles if thread == ready.THREAD_NAME]
    assert main == ["epoch.cu", plan.source]  # the engine's epoch-end kernels, the fit's own kernel: nothing else
    assert background == ["gather.cu", "loss.cu"]
    assert eng.gather_mod.cubin == b"cubin of gather.cu" and eng.loss_mod.cubin == b"cubin of loss.cu"
    assert eng.lt is not None and eng.workspace is not None and eng.dnn is not None
    assert warmed == [(eng.lt, eng.workspace, ready.THREAD_NAME)]  # cuBLASLt's first heuristic query, on the thread
    eng.load_step_libraries()
    assert len(compiles) == 4
    eng.close()


def test_the_graph_engine_makes_its_step_libraries_at_build_on_the_callers_thread(compiles):
    eng = graph.GraphEngine(_config(FusedEngine), init_parameters(_config(FusedEngine).model, 0))
    assert eng._prep is None
    assert compiles == [(f, threading.main_thread().name) for f in ("gather.cu", "loss.cu", "update.cu", "epoch.cu")]
    eng.close()


def test_a_step_that_failed_on_the_thread_raises_on_the_callers(compiles, monkeypatch):
    """The thread swallows the failure; the evaluation makes the handle again and meets it with its own type."""
    made_on: list[str] = []

    def no_cudnn(*args, **kwargs):
        made_on.append(threading.current_thread().name)
        raise DeviceUnavailable("cannot create a cuDNN handle: no GPU")

    monkeypatch.setattr(cudnn, "Handle", no_cudnn)
    eng = FusedEngine(_config(FusedEngine), init_parameters(_config(FusedEngine).model, 0))
    with pytest.raises(DeviceUnavailable, match="cuDNN handle"):
        eng.load_step_libraries()
    assert made_on == [ready.THREAD_NAME, threading.main_thread().name]
    assert eng.gather_mod is not None and eng.dnn is None  # what the thread made is kept
    eng.close()


def test_closing_skips_what_the_thread_has_not_begun_and_releases_what_it_made(compiles, monkeypatch):
    gate, closed = threading.Event(), []

    class Handle:
        def __init__(self, *args) -> None:
            gate.wait(10)  # the step under way when the engine closes

        def close(self) -> None:
            closed.append(type(self).__name__)

    monkeypatch.setattr(graph.cublaslt, "Handle", Handle)
    eng = FusedEngine(_config(FusedEngine), init_parameters(_config(FusedEngine).model, 0))
    _wait_for(lambda: len(compiles) >= 3)  # epoch.cu, then the thread's gather.cu and loss.cu
    prep = eng._prep
    threading.Timer(0.2, gate.set).start()
    eng.close()
    assert not prep.running and closed == ["Handle"]  # waited for the handle under way, then released it
    assert eng.workspace is None and eng.dnn is None  # never begun


def test_module_compiles_a_file_once_and_other_files_meanwhile(compiles, monkeypatch):
    """kernels.module compiles outside its lock: a second caller of the same file waits for the first; a caller of
    another file is not held up by it (the preparation thread's loss.cu beside the fit's own kernel)."""
    gate = threading.Event()
    real = nvrtc.compile_native

    def slow(filename, arch, options=()):
        if filename == "a.cu":
            gate.wait(10)
        return real(filename, arch, options)

    monkeypatch.setattr(nvrtc, "compile_native", slow)
    dev = driver.get_device(0)
    got: dict[str, object] = {}
    first = threading.Thread(target=lambda: got.setdefault("first", kernels.module(dev, "a.cu")))
    second = threading.Thread(target=lambda: got.setdefault("second", kernels.module(dev, "a.cu")))
    first.start()
    _wait_for(lambda: compiles)
    second.start()
    assert kernels.module(dev, "b.cu").cubin == b"cubin of b.cu"  # while a.cu compiles
    gate.set()
    first.join(10), second.join(10)
    assert got["first"] is got["second"] and [f for f, _ in compiles] == ["a.cu", "b.cu"]


def test_a_failed_compile_is_tried_again_by_the_next_caller(compiles, monkeypatch):
    real, failures = nvrtc.compile_native, [RuntimeError("NVRTC failed")]

    def flaky(filename, arch, options=()):
        if failures:
            raise failures.pop()
        return real(filename, arch, options)

    monkeypatch.setattr(nvrtc, "compile_native", flaky)
    dev = driver.get_device(0)
    with pytest.raises(RuntimeError, match="NVRTC failed"):
        kernels.module(dev, "a.cu")
    assert kernels.module(dev, "a.cu").cubin == b"cubin of a.cu"
    assert kernels._making == {}


def test_preparation_runs_its_steps_in_order_and_stops_at_a_failure():
    order: list[str] = []

    def step(name: str, fail: bool = False):
        def make(made):
            order.append((name, sorted(made)))
            if fail:
                raise OSError(name)
            return name.upper()

        return make

    steps = [("a", step("a")), ("a2", step("a2")), ("b", step("b", fail=True)), ("c", step("c"))]
    prep = ready.Preparation(steps, lambda: None)
    assert prep.take() == {"a": "A", "a2": "A2"}
    assert order == [("a", []), ("a2", ["a"]), ("b", ["a", "a2"])]  # each sees what the earlier ones made
    assert prep.take() == {}  # taken once


def test_the_interpreter_exits_without_running_the_steps_not_begun(tmp_path):
    """At exit the step under way ends (joined before the interpreter tears down); the later ones never begin."""
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from fastnn.engine.graph.ready import Preparation

        out = Path({str(tmp_path)!r})
        def first(made):
            time.sleep(0.5)
            (out / "first").write_text("done")
        def second(made):
            (out / "second").write_text("begun")
            time.sleep(60)
        keep = Preparation([("first", first), ("second", second)], lambda: None)
        time.sleep(0.1)
    """)
    started = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert time.perf_counter() - started < 30
    assert (tmp_path / "first").read_text() == "done" and not (tmp_path / "second").exists()
