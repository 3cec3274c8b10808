"""Which native files each GPU engine compiles, on the CPU: the CUDA driver, cuBLASLt and cuDNN faked, kernels.module
recording the files asked for and the kernels launched. Issue 26: update.cu costs about a second of NVRTC on a cold
cache and only the graph step uses it; the fused and grid engines build, evaluate and end their epochs with the
small epoch.cu."""

from __future__ import annotations

import numpy as np
import pytest

from fastnn import MLP, SGD
from fastnn._errors import ConfigError
from fastnn._model import init_parameters
from fastnn.engine.base import EngineConfig

pytestmark = pytest.mark.bindings  # imports the graph engine (cuda-bindings); no GPU needed
graph = pytest.importorskip("fastnn.engine.graph.engine", reason="needs the CUDA wheels")
from fastnn.engine.fused import FusedEngine  # noqa: E402
from fastnn.engine.graph import kernels  # noqa: E402
from fastnn.engine.grid import GridEngine  # noqa: E402


class _Device:
    ordinal, name, arch, compute_capability = 0, "fake H100", "sm_90", (9, 0)
    sm_count, max_shared_memory_optin = 132, 227 * 1024

    def make_current(self) -> None:
        pass


class _Closable:
    """A stream, buffer or library handle: a pointer, and every method a no-op."""

    ptr = handle = 1 << 20

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _Module:
    def __init__(self, filename: str, launched: list) -> None:
        self.filename, self.launched = filename, launched

    def function(self, kernel: str):
        return _Function(self.filename, kernel, self.launched)


class _Function:
    def __init__(self, filename: str, kernel: str, launched: list) -> None:
        self.filename, self.kernel, self.launched = filename, kernel, launched

    def launch(self, *args, **kwargs) -> None:
        self.launched.append((self.filename, self.kernel))


def fake_device(monkeypatch) -> None:
    """The CUDA driver's device, streams and buffers, cuBLASLt's and cuDNN's handles: no-ops, no GPU."""
    from fastnn.cuda import cublaslt, cudnn, driver

    monkeypatch.setattr(driver, "get_device", lambda ordinal=0: _Device())
    for name in ("Stream", "DeviceBuffer", "PinnedBuffer"):
        monkeypatch.setattr(driver, name, _Closable)
    monkeypatch.setattr(driver, "memset_d32", lambda *args: None)
    monkeypatch.setattr(cublaslt, "Handle", _Closable)
    monkeypatch.setattr(cublaslt, "Workspace", _Closable)
    monkeypatch.setattr(cudnn, "Handle", _Closable)
    monkeypatch.setattr(cublaslt, "warm_up", lambda handle, workspace: None)


@pytest.fixture
def loads(monkeypatch):
    """(files kernels.module was asked for on the caller's thread, (file, kernel) launched), with no GPU behind
    either. The files the fused and grid engines' preparation thread (graph/ready.py) asks for are not in it."""
    import threading

    from fastnn.engine.graph.ready import THREAD_NAME

    fake_device(monkeypatch)
    files: list[str] = []
    launched: list[tuple[str, str]] = []

    def module(device, filename: str, options: tuple[str, ...] = ()) -> _Module:
        if threading.current_thread().name != THREAD_NAME:
            files.append(filename)
        return _Module(filename, launched)

    monkeypatch.setattr(kernels, "module", module)
    return files, launched


def _build(cls):
    grid = cls is GridEngine  # its kernels train three equal hidden layers at up to 32 rows a step
    model = MLP([784, 128, 128, 128, 10] if grid else [784, 10])
    cfg = EngineConfig(model=model, optimizer=SGD(lr=0.1), batch_size=32 if grid else 128, precision="mixed")
    return cls(cfg, init_parameters(model, 0))


@pytest.mark.parametrize("cls", [FusedEngine, GridEngine], ids=["fused", "grid"])
def test_the_persistent_engines_never_compile_update_cu(loads, cls):
    files, launched = loads
    eng = _build(cls)
    assert files == ["epoch.cu"] and eng.update_mod is None
    assert launched == [("epoch.cu", "cast_f32_f16")]  # "mixed": set_state writes the fp16 copy
    kernels.record_epoch_end(eng.resources)  # what their epoch graphs end with
    assert launched[1:] == [("epoch.cu", "check_state"), ("epoch.cu", "snapshot"), ("epoch.cu", "advance")]
    eng.load_step_libraries()  # their first evaluation or prediction: made on the preparation thread meanwhile
    assert files == ["epoch.cu"] and eng.gather_mod is not None and eng.loss_mod is not None


def test_the_graph_engine_compiles_update_cu_at_build(loads):
    files, launched = loads
    eng = _build(graph.GraphEngine)
    assert sorted(files) == ["epoch.cu", "gather.cu", "loss.cu", "update.cu"]
    kernels.record_update(eng.resources, 0, 10)
    kernels.record_epoch_end(eng.resources)
    assert launched == [("epoch.cu", "cast_f32_f16"), ("update.cu", eng.spec.update_kernel),
                        ("epoch.cu", "check_state"), ("epoch.cu", "snapshot"), ("epoch.cu", "advance")]  # fmt: skip


def test_the_graph_update_gives_the_biases_their_own_decay(loads, monkeypatch):
    """bias_decay != weight_decay (fastnn.sklearn's 0): update.cu runs once per tensor, each with its decay (a bias's
    as optim.cuh's optim_bias, KernelParams.for_bias), the next batch's gather fused with the last launch; with
    bias_decay = weight_decay (None), one launch over every parameter, as before."""
    rec = []
    monkeypatch.setattr(_Function, "launch", lambda self, grid, block, args, stream=None: rec.append((self.kernel,
                                                                                                     args)))
    monkeypatch.setattr(kernels, "gather_args", lambda *a: ("u8", [], [], []))
    model = MLP([784, 32, 10])
    for bias_decay, gather in ((0.0, None), (0.0, (0,) * 8), (None, None)):
        cfg = EngineConfig(model=model, optimizer=SGD(lr=0.1, weight_decay=0.25, bias_decay=bias_decay),
                           batch_size=128, precision="fp32")  # fmt: skip
        res = graph.GraphEngine(cfg, init_parameters(model, 0)).resources
        rec.clear()
        kernels.record_update(res, 0, 10, gather)
        got = [(k, a[0].value - res.train_state.ptr, a[5].value, a[9].weight_decay) for k, a in rec]
        ends = (*res.layout.offsets[1:], res.layout.total)
        if bias_decay is None:
            assert got == [(res.spec.update_kernel, 0, res.layout.total, 0.25)]
            continue
        want = [(res.spec.update_kernel, 4 * lo, hi - lo, 0.0 if name.endswith(".bias") else 0.25)
                for name, lo, hi in zip(res.layout.names, res.layout.offsets, ends)]  # fmt: skip
        if gather is not None:
            want[-1] = (res.spec.update_gather_kernel("u8"), *want[-1][1:])
        assert got == want


def test_auto_grid_takes_the_graph_step_only_where_the_fast_kernel_cannot_serve_the_rows(loads):
    """engine="auto" chooses the grid engine before it sees the data (prefer_grid); float32 rows at h = 1024 do not fit
    grid_fast.cu, so that engine trains them with the graph step. A forced engine="grid" refuses them by name before
    anything is uploaded, and trains uint8 rows on grid_fast.cu."""
    model = MLP([784, 1024, 1024, 1024, 10])
    cfg = EngineConfig(model=model, optimizer=SGD(lr=0.1), batch_size=32, precision="mixed")
    forced = GridEngine(cfg, init_parameters(model, 0))
    auto = GridEngine(cfg, init_parameters(model, 0), graph_fallback=True)
    f32, u8 = np.dtype(np.float32), np.dtype(np.uint8)
    assert auto.runs_graph_step(f32) and not auto.runs_graph_step(u8)
    assert not forced.runs_graph_step(f32) and not forced.runs_graph_step(u8)
    with pytest.raises(ConfigError, match="engine='grid' cannot train float32 rows of this model: grid_fast.cu: it "
                                          "needs .* bytes of shared memory per CTA.*use engine='graph'"):  # fmt: skip
        forced.make_train_context(np.zeros((64, 784), np.float32), np.zeros(64, np.int32), None)
    # the streaming kernel (grid_stream.cu) serves uint8 rows only: float32 ones take the graph step too
    from fastnn.engine.grid.plan import grid_plan

    wide = MLP([784, 2048, 2048, 2048, 10])
    cfg = EngineConfig(model=wide, optimizer=SGD(lr=0.1), batch_size=32, precision="mixed")
    auto = GridEngine(cfg, init_parameters(wide, 0), graph_fallback=True)
    assert auto.runs_graph_step(f32) and not auto.runs_graph_step(u8)
    assert grid_plan(cfg, u8).source == "grid_stream.cu" and grid_plan(cfg, f32).endswith("use engine='graph'")


def test_auto_grid_falls_back_to_the_graph_step_where_the_fast_kernel_cannot_hold_the_set(loads, monkeypatch):
    """A grid engine engine="auto" chose makes the graph step's context (with its libraries and update.cu) where the
    grid context refuses the set (too large for GPU memory beside the kernel's scratch); engine="grid" raises."""
    from fastnn._errors import DataError
    from fastnn.engine.graph import engine as graph_engine
    from fastnn.engine.grid import engine as grid_engine

    files, _ = loads
    monkeypatch.setattr(grid_engine, "module", kernels.module)

    def refuse(*args):
        raise DataError("the grid kernel's global scratch does not fit")

    monkeypatch.setattr(grid_engine, "GridTrainContext", refuse)
    monkeypatch.setattr(graph_engine, "TrainContext", lambda res, x, y, key: ("graph step", res))
    model = MLP([784, 256, 256, 256, 10])
    cfg = EngineConfig(model=model, optimizer=SGD(lr=0.1), batch_size=32, precision="mixed")
    x, y = np.zeros((64, 784), np.uint8), np.zeros(64, np.int32)
    auto = GridEngine(cfg, init_parameters(model, 0), graph_fallback=True)
    assert auto.make_train_context(x, y, None) == ("graph step", auto.resources)
    assert "update.cu" in files and auto.update_mod is not None and auto.lt is not None
    with pytest.raises(DataError, match="scratch"):
        GridEngine(cfg, init_parameters(model, 0)).make_train_context(x, y, None)


def test_the_grid_engine_names_the_engine_whose_step_trains_each_set(loads, monkeypatch):
    """Trainer.engine is the engine's name: a grid engine engine="auto" chose says "grid" until a training set its
    kernels cannot serve arrives (float32 rows at h = 1024, or a set too large for GPU memory), "graph" while that
    set trains with the graph step, and "grid" again for a set its kernel trains. engine="grid" never says "graph"."""
    from fastnn._errors import DataError
    from fastnn.engine.graph import engine as graph_engine
    from fastnn.engine.grid import engine as grid_engine

    built: list[str] = []

    class Context:  # a training context of either kind, remembering the set it holds
        def __init__(self, eng, x, y, key) -> None:
            self.key, self.n, self.dtype = key, x.shape[0], x.dtype
            built.append(type(self).__name__)

        def release(self) -> None:
            pass

    class Grid(Context):
        pass

    class Graph(Context):
        pass

    monkeypatch.setattr(grid_engine, "module", kernels.module)  # the fixture's: update.cu for the graph step
    monkeypatch.setattr(grid_engine, "GridTrainContext", Grid)
    monkeypatch.setattr(graph_engine, "TrainContext", Graph)
    model = MLP([784, 1024, 1024, 1024, 10])
    cfg = EngineConfig(model=model, optimizer=SGD(lr=0.1), batch_size=32, precision="mixed")
    y = np.zeros(64, np.int32)
    auto = GridEngine(cfg, init_parameters(model, 0), graph_fallback=True)
    assert auto.name == "grid"  # before any data: the engine chosen for the model
    auto.set_train_data(np.zeros((64, 784), np.float32), y)
    assert auto.name == "graph" and built == ["Graph"]  # grid_fast.cu takes no float32 rows at h = 1024
    auto.set_train_data(np.zeros((64, 784), np.uint8), y)
    assert auto.name == "grid" and built == ["Graph", "Grid"]

    class TooLarge(Grid):
        def __init__(self, *args) -> None:
            raise DataError("the grid kernel's global scratch does not fit")

    monkeypatch.setattr(grid_engine, "GridTrainContext", TooLarge)
    auto.set_train_data(np.zeros((32, 784), np.uint8), y[:32])
    assert auto.name == "graph" and built[-1] == "Graph"
    monkeypatch.setattr(grid_engine, "GridTrainContext", Grid)
    forced = GridEngine(cfg, init_parameters(model, 0))
    forced.set_train_data(np.zeros((64, 784), np.uint8), y)
    assert forced.name == "grid"
    with pytest.raises(ConfigError, match="engine='grid' cannot train float32 rows"):
        forced.set_train_data(np.zeros((64, 784), np.float32), y)
    assert forced.name == "grid"
