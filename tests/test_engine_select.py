"""Engine selection (`engine=` on a GPU) and its errors, tested without a GPU: the GPU modules are faked."""

from __future__ import annotations

import re
import sys
import types
import warnings

import numpy as np
import pytest
from _fake_engines import FakeGraph

from fastnn import MLP, Trainer
from fastnn._errors import ConfigError, DeviceUnavailable
from fastnn.engine import Tuning, select
from fastnn.engine.numpy_engine import NumpyEngine


@pytest.mark.parametrize("engine", ["bogus", "", None, 1, "FUSED"])
def test_unknown_engine_is_refused_naming_it(engine) -> None:
    with pytest.raises(ConfigError, match=r"engine must be one of .*got " + repr(engine).replace("(", r"\(")):
        Trainer(MLP([4, 2]), device="cpu", engine=engine)


@pytest.mark.parametrize("engine", ["fused", "grid", "graph"])
def test_gpu_engine_with_cpu_device_is_refused(engine: str) -> None:
    with pytest.raises(ConfigError, match=f"engine='{engine}' is a GPU engine but device='cpu'"):
        Trainer(MLP([4, 2]), device="cpu", engine=engine)


def test_cpu_trainer_reports_the_numpy_engine() -> None:
    t = Trainer(MLP([4, 2]), device="cpu")
    assert t.engine == "numpy" and "engine='numpy'" in repr(t)


@pytest.mark.parametrize(
    "engine,unsupported,faster,expect",
    [
        ("graph", None, True, "graph"),
        ("graph", "too wide", False, "graph"),
        ("fused", None, False, "fused"),  # forced: kept even where the rule says graph is faster
        ("auto", None, True, "fused"),
        ("auto", None, False, "graph"),
        ("auto", "needs 300000 bytes of shared memory", True, "graph"),
    ],
)
def test_choose_gpu_engine(engine: str, unsupported: str | None, faster: bool, expect: str) -> None:
    assert select.choose_gpu_engine(engine, unsupported, faster) == expect


def test_forced_fused_on_a_model_it_cannot_hold_names_the_limit() -> None:
    with pytest.raises(select.EngineRefused, match="engine='fused' cannot train this model: needs 300000 bytes"):
        select.choose_gpu_engine("fused", "needs 300000 bytes of shared memory per CTA", True)


@pytest.mark.parametrize(
    "engine,fused,grid,expect",
    [
        ("auto", (None, True), (None, True), "fused"),  # fused's rule first
        ("auto", (None, False), (None, True), "grid"),
        ("auto", ("too wide", True), (None, True), "grid"),
        ("auto", ("too wide", False), (None, False), "graph"),  # served, but its rule says graph
        ("auto", (None, False), ("no hidden layer", True), "graph"),
        ("grid", (None, True), (None, False), "grid"),  # forced: kept even where the rule says graph
        ("fused", (None, False), (None, True), "fused"),
    ],
)
def test_choose_gpu_engine_among_three(engine: str, fused: tuple, grid: tuple, expect: str) -> None:
    assert select.choose_gpu_engine(engine, *fused, *grid) == expect


def test_forced_grid_on_a_model_it_cannot_serve_names_the_limit() -> None:
    with pytest.raises(select.EngineRefused, match="engine='grid' cannot train this model: no hidden layer"):
        select.choose_gpu_engine("grid", None, True, "no hidden layer to spread; use engine='fused' or 'graph'")


# ---- the whole path with the GPU modules faked ------------------------------------------------------------


class _FakeFused(NumpyEngine):
    device = "cuda"
    name = "fused"
    built = 0
    limit = 100  # widest layer the fake holds

    @classmethod
    def unsupported_reason(cls, config, device) -> str | None:
        widest = max(config.model.sizes)
        return None if widest <= cls.limit else f"a layer of {widest} is wider than {cls.limit}"

    def __init__(self, config, state, ordinal: int = 0, graph_fallback: bool = False) -> None:
        type(self).built += 1
        self.ordinal = ordinal
        self.graph_fallback = graph_fallback  # what select passed: True only when engine="auto" chose it
        super().__init__(config, state)


class _FakeGrid(_FakeFused):
    name = "grid"
    limit = 1000  # widest layer the fake serves, with at least one hidden layer

    @classmethod
    def unsupported_reason(cls, config, device) -> str | None:
        if len(config.model.sizes) < 3:
            return "no hidden layer to spread; use engine='fused' or 'graph'"
        return super().unsupported_reason(config, device)

    def __init__(self, config, state, ordinal: int = 0, graph_fallback: bool = False) -> None:
        super().__init__(config, state, ordinal)
        self.graph_fallback = graph_fallback  # what select passed: True only when engine="auto" chose grid


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):
    """A 'GPU' whose graph, fused and grid engines are NumPy engines; the fused one holds layers up to 100 wide
    and its rule prefers it below 64; the grid one serves models with a hidden layer up to 1000 wide and its rule
    prefers hidden layers of 200 and more."""
    _FakeFused.built = 0
    _FakeGrid.built = 0
    monkeypatch.setattr(select, "graph_engine_class", lambda: FakeGraph)
    fused = types.ModuleType("fastnn.engine.fused")
    fused.FusedEngine = _FakeFused
    fused.prefer_fused = lambda config, device: max(config.model.sizes[1:]) < 64
    fused.fast_kernel_serves = lambda config, device: True
    monkeypatch.setitem(sys.modules, "fastnn.engine.fused", fused)
    grid = types.ModuleType("fastnn.engine.grid")
    grid.GridEngine = _FakeGrid
    grid.prefer_grid = lambda config, device: min(config.model.sizes[1:-1], default=0) >= 200
    monkeypatch.setitem(sys.modules, "fastnn.engine.grid", grid)
    from fastnn.cuda import driver

    monkeypatch.setattr(driver, "get_device", lambda ordinal=0: object())
    monkeypatch.setattr(driver, "device_count", lambda: 2)
    return _FakeFused


@pytest.mark.bindings
@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_auto_takes_fused_where_it_holds_the_model_and_is_faster(fake_gpu, device: str) -> None:
    assert Trainer(MLP([20, 10]), device=device).engine == "fused"
    assert Trainer(MLP([20, 80, 10]), device=device).engine == "graph"  # held, but the rule says graph
    assert Trainer(MLP([200, 10]), device=device).engine == "graph"  # not held


@pytest.mark.bindings
@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_a_regression_takes_the_gpu_engines_as_a_classifier_does(fake_gpu, device: str) -> None:
    """loss="mse" is trained by every GPU engine: the same choice as a classifier's, no fallback to the CPU and no
    warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Trainer(MLP([20, 10]), loss="mse", device=device).engine == "fused"
        assert Trainer(MLP([20, 80, 10]), loss="mse", device=device).engine == "graph"  # the rule says graph
        assert Trainer(MLP([20, 80, 10]), loss="mse", device=device, engine="fused").engine == "fused"
        assert Trainer(MLP([200, 1]), loss="mse", device=device).engine == "graph"  # too wide for the fused one


@pytest.mark.bindings
@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_auto_takes_grid_where_fused_does_not_and_its_rule_says_so(fake_gpu, device: str) -> None:
    auto = Trainer(MLP([20, 300, 10]), device=device)
    assert auto.engine == "grid" and auto._engine.graph_fallback  # too wide for fused; grid's rule
    assert Trainer(MLP([20, 300, 100, 10]), device=device).engine == "graph"  # served, but grid's rule says graph
    assert Trainer(MLP([20, 2000, 10]), device=device).engine == "graph"  # served by neither
    forced = Trainer(MLP([20, 50, 10]), device=device, engine="grid")
    assert forced.engine == "grid" and not forced._engine.graph_fallback  # forced: never the graph step


@pytest.mark.bindings
def test_auto_gives_grid_what_both_rules_take_unless_a_fast_fused_kernel_serves_it(fake_gpu, monkeypatch) -> None:
    """Where the fused and grid rules both hold (h = 128), the fused engine keeps the model only on a fast kernel
    (fused_logreg.cu, fused_mlp.cu); the generic fused.cu is ~3x slower than grid_fast.cu there."""
    monkeypatch.setattr(sys.modules["fastnn.engine.grid"], "prefer_grid", lambda config, device: True)
    fast = lambda config, device: config.model.sizes[1] == 40  # noqa: E731
    monkeypatch.setattr(sys.modules["fastnn.engine.fused"], "fast_kernel_serves", fast)
    fused_auto = Trainer(MLP([20, 40, 10]), device="cuda")
    assert fused_auto.engine == "fused"  # a fast fused kernel serves it
    assert fused_auto._engine.graph_fallback  # auto: a weighted fit trains with the graph step (issue 43)
    assert not Trainer(MLP([20, 40, 10]), device="cuda", engine="fused")._engine.graph_fallback  # forced: refuses
    auto = Trainer(MLP([20, 50, 10]), device="cuda")
    assert auto.engine == "grid" and auto._engine.graph_fallback  # fused.cu only: the grid engine
    assert Trainer(MLP([20, 50, 10]), device="cuda", engine="fused").engine == "fused"  # a forced choice is kept
    assert Trainer(MLP([20, 300, 10]), device="cuda").engine == "grid"  # too wide for fused: unchanged


@pytest.mark.bindings
def test_fast_kernel_serves_names_the_fused_kernels_auto_keeps() -> None:
    """fused.fast_kernel_serves: fused_logreg.cu or fused_mlp.cu for uint8 or float32 rows, not fused.cu only."""
    import types as _types

    from fastnn import SGD, AdamW
    from fastnn.engine.base import EngineConfig
    from fastnn.engine.fused import fast_kernel_serves
    from fastnn.engine.fused.plan import HOPPER_SMEM

    h100 = _types.SimpleNamespace(max_shared_memory_optin=HOPPER_SMEM)

    def cfg(sizes, optimizer=None, **kw):
        return EngineConfig(model=MLP(sizes), optimizer=optimizer or SGD(lr=0.1), batch_size=32, precision="mixed",
                            **kw)  # fmt: skip

    assert fast_kernel_serves(cfg([784, 10]), h100)  # fused_logreg.cu
    assert fast_kernel_serves(cfg([784, 128, 128, 128, 10]), h100)  # fused_mlp.cu
    assert fast_kernel_serves(cfg([784, 128, 128, 128, 10], SGD(lr=0.1, momentum=0.9)), h100)
    assert not fast_kernel_serves(cfg([784, 128, 128, 128, 10], AdamW(lr=1e-3)), h100)  # fused.cu only
    assert not fast_kernel_serves(cfg([784, 128, 128, 128, 10], normalize=(0.5, 0.25)), h100)  # a shift: fused.cu


@pytest.mark.bindings
def test_forced_grid_refusal_names_why_before_any_work(fake_gpu) -> None:
    with pytest.raises(ConfigError, match="engine='grid' cannot train this model: no hidden layer to spread"):
        Trainer(MLP([784, 10]), device="cuda", engine="grid")
    assert _FakeGrid.built == 0


@pytest.mark.bindings
def test_forced_engines(fake_gpu) -> None:
    assert Trainer(MLP([20, 80, 10]), device="cuda", engine="fused").engine == "fused"
    assert Trainer(MLP([20, 10]), device="cuda", engine="graph").engine == "graph"


@pytest.mark.bindings
def test_forced_fused_refusal_comes_before_any_work(fake_gpu) -> None:
    with pytest.raises(ConfigError, match="engine='fused' cannot train this model: a layer of 200 is wider than 100"):
        Trainer(MLP([200, 10]), device="cuda", engine="fused")
    assert fake_gpu.built == 0


@pytest.mark.bindings
def test_load_with_a_refused_engine_blames_the_engine_not_the_file(fake_gpu, tmp_path) -> None:
    path = tmp_path / "m.npz"
    t = Trainer(MLP([200, 10]), device="cpu")
    t.save(path)
    with pytest.raises(select.EngineRefused, match="wider than 100"):
        Trainer.load(path, device="cuda", engine="fused")
    assert Trainer.load(path, device="cuda", engine="graph").engine == "graph"
    with pytest.raises(ConfigError, match="engine='graph' is a GPU engine but device='cpu'"):
        Trainer.load(path, device="cpu", engine="graph")


@pytest.mark.parametrize("name", ["fused", "grid"])
def test_kernel_engine_modules_that_fail_to_import(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(select, "graph_engine_class", lambda: FakeGraph)
    monkeypatch.setitem(sys.modules, "fastnn.engine.fused", None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "fastnn.engine.grid", None)
    monkeypatch.setattr(select, "_warned", set())  # as in a fresh process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert Trainer(MLP([20, 10]), device="cuda").engine == "graph"  # auto: the graph engine, with a warning
        assert Trainer(MLP([20, 10]), device="cuda").engine == "graph"  # said once a process
    # An engine missing from the installation is a broken install, said by name, not a silent 2-4x slowdown.
    said = sorted(str(w.message) for w in caught)
    assert len(said) == 2 and all("installation is incomplete" in m for m in said), said
    assert "fastnn.engine.fused failed to import" in said[0] and "fastnn.engine.grid failed to import" in said[1]
    assert all(w.filename == __file__ for w in caught)  # at the caller's line
    with pytest.raises(select.EngineRefused, match=f"engine='{name}' is unavailable"):
        Trainer(MLP([20, 30, 10]), device="cuda", engine=name)


def test_auto_device_without_gpu_ignores_the_engine_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable():
        raise DeviceUnavailable("no usable GPU: test says so")

    monkeypatch.setattr(select, "graph_engine_class", unavailable)
    monkeypatch.setattr(select, "_warned", set())  # as in a fresh process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = Trainer(MLP([12, 4]), device="auto", engine="fused")
    assert t.engine == "numpy" and len(caught) == 1 and "CPU" in str(caught[0].message)
    t.fit(np.zeros((8, 12), dtype=np.float32), np.zeros(8, dtype=np.int64), epochs=1)
    assert t.epoch == 1


def test_the_cpu_fallback_warning_is_shown_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grid search makes a trainer per fit: the fallback is said at the first, not at all seven."""

    def unavailable():
        raise DeviceUnavailable("no usable GPU: test says so")

    monkeypatch.setattr(select, "graph_engine_class", unavailable)
    monkeypatch.setattr(select, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # what GridSearchCV's catch_warnings amounts to: no registry dedupes it
        trainers = [Trainer(MLP([12, 4]), device="auto") for _ in range(7)]
    assert [t.engine for t in trainers] == ["numpy"] * 7
    assert len(caught) == 1 and "training on the CPU" in str(caught[0].message)
    assert caught[0].filename == __file__  # pointing at the caller's line, as before


# ---- devices= ------------------------------------------------------------------------------------------------


@pytest.mark.bindings
@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (0, "devices must be a number of GPUs in [1, 1024] or a non-empty list of distinct GPU ordinals below 1024, "
            "got 0"),
        (10**12, "got 1000000000000"),
        ([0, 10**30], "got [0, 1000000000000000000000000000000]"),
        (True, "got True"),
        ("2", "got '2'"),
        ([], "got []"),
        ([0, -1], "got [0, -1]"),
        ([0, 1.0], "got [0, 1.0]"),
        ([1, 1], "devices lists a GPU twice: [1, 1]"),
    ],
)
def test_bad_devices_are_refused_by_name_before_any_work(fake_gpu, devices, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Trainer(MLP([20, 10]), device="cuda", devices=devices)
    assert fake_gpu.built == 0


@pytest.mark.bindings
def test_several_devices_refused_where_they_cannot_run(fake_gpu) -> None:
    with pytest.raises(ConfigError, match=re.escape("devices=2 names GPUs but device='cpu'")):
        Trainer(MLP([20, 10]), device="cpu", devices=2)
    for name in ("fused", "grid"):
        with pytest.raises(ConfigError, match=re.escape(f"engine='{name}' trains on one GPU (one persistent kernel): "
                                                        "devices=[0, 1] needs engine='graph' or 'auto'")):  # fmt: skip
            Trainer(MLP([20, 30, 10]), device="cuda", engine=name, devices=[0, 1])
    assert Trainer(MLP([20, 10]), device="cpu", devices=1).engine == "numpy"  # the default: nothing asked of a GPU


@pytest.mark.bindings
def test_devices_naming_a_missing_gpu_says_how_many_there_are(fake_gpu, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "fastnn.engine.replicas", None)  # building replicas would raise ImportError
    with pytest.raises(DeviceUnavailable, match=re.escape("devices=[0, 3]: this machine has 2 GPU(s), numbered "
                                                          "from 0; there is no GPU 3")):  # fmt: skip
        Trainer(MLP([20, 10]), device="cuda", devices=[0, 3])
    with pytest.raises(DeviceUnavailable, match="there is no GPU 2"):
        Trainer(MLP([20, 10]), device="cuda", devices=[2])
    assert fake_gpu.built == 0


@pytest.mark.bindings
def test_one_device_trains_on_that_gpu_with_any_engine(fake_gpu) -> None:
    assert Trainer(MLP([20, 10]), device="cuda", devices=[1])._engine.ordinal == 1
    t = Trainer(MLP([20, 10]), device="auto", devices=[1], engine="graph")
    assert (t.engine, t._engine.ordinal) == ("graph", 1)
    assert Trainer(MLP([20, 10]), device="cuda", devices=1)._engine.ordinal == 0


@pytest.mark.bindings
def test_several_devices_build_a_replica_engine_over_them(fake_gpu, fake_replicas) -> None:
    made = fake_replicas
    # MLP([20, 10]): one GPU would take the fused engine (test_auto_takes_fused...); several take the replicas
    assert Trainer(MLP([20, 10]), device="cuda", devices=2).engine == "replicas (fake)"
    Trainer(MLP([20, 10]), device="auto", devices=(1, 0))
    assert made == [[0, 1], [1, 0]] and fake_gpu.built == 0


@pytest.fixture
def fake_replicas(monkeypatch: pytest.MonkeyPatch) -> list:
    """The replica engine faked (a NumPy engine); the list records the devices of each one made."""
    made: list = []

    class FakeReplicas(FakeGraph):
        name = "replicas (fake)"

        def __init__(self, config, state, devices) -> None:
            made.append(devices)
            super().__init__(config, state)

    replicas = types.ModuleType("fastnn.engine.replicas")
    replicas.ReplicaEngine = FakeReplicas
    monkeypatch.setitem(sys.modules, "fastnn.engine.replicas", replicas)
    return made


@pytest.mark.bindings
def test_one_gpu_replica_tuning_builds_the_replica_engine_on_one_gpu(fake_gpu, fake_replicas) -> None:
    """Tuning.one_gpu_replica: devices= of one GPU gets the replica engine (what the GPU suite's "graph-replicas"
    entry runs on one GPU); engine="fused" and the CPU ignore it, and without it one GPU gets its own engine."""
    replica = Tuning(one_gpu_replica=True)
    assert Trainer(MLP([20, 10]), device="cuda", devices=[0], tuning=replica).engine == "replicas (fake)"
    assert Trainer(MLP([20, 80, 10]), device="cuda", engine="graph", tuning=replica).engine == "replicas (fake)"
    assert Trainer(MLP([20, 10]), device="cuda", engine="fused", tuning=replica).engine == "fused"
    assert Trainer(MLP([20, 10]), device="cpu", tuning=replica).engine == "numpy"
    assert Trainer(MLP([20, 80, 10]), device="cuda", devices=[0]).engine == "graph"
    assert fake_replicas == [[0], [0]]


@pytest.mark.bindings
@pytest.mark.parametrize("tuning", [Tuning(), None])
def test_tuning_reaches_the_engine_config(fake_gpu, tuning) -> None:
    t = Trainer(MLP([20, 10]), device="cuda", tuning=Tuning(autotune_algos=3) if tuning else None)
    assert t.config.tuning == (Tuning(autotune_algos=3) if tuning else Tuning())


@pytest.mark.bindings
@pytest.mark.parametrize(
    ("tuning", "message"),
    [
        ({"tuning": {"sharded_update": True}}, "tuning must be a fastnn.engine.Tuning or None, got dict"),
        ({"tuning": "fast"}, "tuning must be a fastnn.engine.Tuning or None, got str"),
    ],
)
def test_a_bad_tuning_is_refused_by_name_before_any_work(fake_gpu, tmp_path, tuning, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Trainer(MLP([20, 10]), device="cuda", **tuning)
    path = tmp_path / "m.npz"
    Trainer(MLP([20, 10]), device="cpu").save(path)
    with pytest.raises(ConfigError, match=re.escape(message)):  # the caller's argument, not the file's
        Trainer.load(path, device="cuda", **tuning)
    assert fake_gpu.built == 0


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"autotune_algos": 0}, "Tuning.autotune_algos must be an integer >= 1, got 0"),
        ({"autotune_algos": 2.0}, "Tuning.autotune_algos must be an integer >= 1, got 2.0"),
        ({"gemm_sm_carveout": -1}, "Tuning.gemm_sm_carveout must be an integer >= 0, got -1"),
        ({"sharded_update": 1}, "Tuning.sharded_update must be True or False, got 1"),
        ({"fused_layouts": ["lean"]}, "Tuning.fused_layouts must be a non-empty tuple of ('standard', 'lean'), got"),
        ({"fused_layouts": ()}, "Tuning.fused_layouts must be a non-empty tuple"),
        ({"fused_layouts": ("thin",)}, "got ('thin',)"),
        ({"many_loss_kernel": "fast"}, "Tuning.many_loss_kernel must be one of ('model', 'tiled'), got 'fast'"),
        ({"many_update_kernel": 4}, "Tuning.many_update_kernel must be one of ('scalar', 'vec4'), got 4"),
    ],
)
def test_a_bad_tuning_field_is_refused_naming_it(fields, message) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Tuning(**fields)


@pytest.mark.bindings
def test_load_with_bad_devices_blames_the_argument_not_the_file(fake_gpu, tmp_path) -> None:
    path = tmp_path / "m.npz"
    Trainer(MLP([20, 10]), device="cpu").save(path)
    with pytest.raises(ConfigError, match="devices must be a number of GPUs"):
        Trainer.load(path, device="cuda", devices=0)
    with pytest.raises(DeviceUnavailable, match="there is no GPU 5"):
        Trainer.load(path, device="cuda", devices=[5])


@pytest.mark.bindings
def test_the_grid_rule_is_data_and_takes_only_what_the_fast_kernel_serves() -> None:
    """prefer_grid reads tuning.GRID_RULE and takes a model only where a fast kernel (grid_fast.cu, or grid_stream.cu
    above 1024) serves it (for uint8 or float32 rows)."""
    from fastnn import SGD, AdamW
    from fastnn.engine.base import EngineConfig
    from fastnn.engine.grid import prefer_grid
    from fastnn.engine.tuning import GridRule

    def cfg(sizes, batch=32, precision="mixed", optimizer=None):
        return EngineConfig(model=MLP(sizes), optimizer=optimizer or SGD(lr=0.1), batch_size=batch,
                            precision=precision)  # fmt: skip

    bench = cfg([784, 256, 256, 256, 10])
    assert prefer_grid(bench, None)
    assert prefer_grid(cfg([784, 640, 640, 640, 10]), None)
    assert prefer_grid(cfg([784, 512, 512, 512, 10], batch=8, optimizer=SGD(lr=0.1, momentum=0.9)), None)
    # the fast kernel serves 768 and 1024 for uint8 rows but not for float32 ones (fp16 rows: > 227 KB): auto takes
    # grid, and float32 rows then train with the graph step (GridEngine.graph_fallback, tests/test_engine_modules.py)
    assert prefer_grid(cfg([784, 1024, 1024, 1024, 10]), None)
    assert prefer_grid(cfg([784, 768, 768, 768, 10], optimizer=SGD(lr=0.1, momentum=0.9)), None)
    # grid_fast.cu trains AdamW 1.19-1.23x faster than the graph engine (tuning.py); a rule without it leaves it there
    assert prefer_grid(cfg([784, 256, 256, 256, 10], optimizer=AdamW(lr=1e-3)), None)
    assert not prefer_grid(cfg([784, 256, 256, 256, 10], optimizer=AdamW(lr=1e-3)), None,
                           GridRule(min_hidden=128, max_hidden=1024, max_batch=32, precisions=("mixed",)))  # fmt: skip
    assert not prefer_grid(cfg([784, 256, 256, 256, 10], batch=64), None)
    assert not prefer_grid(cfg([784, 256, 256, 256, 10], precision="fp32"), None)
    assert not prefer_grid(cfg([784, 256, 256, 10]), None)  # two hidden layers: refused
    # grid_stream.cu (plain SGD, uint8) ran 2.21x / 1.80x the graph engine at h = 2048 / 4096 (tuning.py)
    assert prefer_grid(cfg([784, 2048, 2048, 2048, 10]), None)
    assert prefer_grid(cfg([784, 4096, 4096, 4096, 10], batch=20, optimizer=SGD(lr=0.1, weight_decay=1e-4)), None)
    # grid_stream.cu trains momentum 1.85x / 1.47x faster than the graph engine at 2048 / 4096 (tuning.py): the rule
    # gives it momentum (GridRule.stream_states = 1); a rule of plain SGD only leaves it with the graph engine
    momentum = cfg([784, 4096, 4096, 4096, 10], optimizer=SGD(lr=0.1, momentum=0.9, nesterov=True))
    assert prefer_grid(momentum, None) and prefer_grid(cfg([784, 1280, 1280, 1280, 10]), None)
    assert not prefer_grid(momentum, None, GridRule(128, 4096, 32, ("mixed",)))
    assert not prefer_grid(cfg([784, 2048, 2048, 2048, 10], optimizer=AdamW(lr=1e-3)), None)
    assert not prefer_grid(cfg([784, 4096, 4096, 4096, 10], batch=64), None)
    # grid_stream.cu at 8192 (64 units a CTA): 1.55x the graph engine with plain SGD; momentum spills there (refused)
    assert prefer_grid(cfg([784, 8192, 8192, 8192, 10]), None)
    assert not prefer_grid(cfg([784, 8192, 8192, 8192, 10], optimizer=SGD(lr=0.1, momentum=0.9)), None)
    assert not prefer_grid(cfg([784, 8192, 8192, 8192, 10]), None, GridRule(128, 8192, 32, ("mixed",)))
    # wider than the kernels' 8192: refused by the plan even under a rule that reaches further
    wide_rule = GridRule(128, 16384, 32, ("mixed",), stream_units=(16, 32, 64))
    assert not prefer_grid(cfg([784, 8704, 8704, 8704, 10]), None, wide_rule)
    assert not prefer_grid(cfg([784, 2048, 2048, 2048, 10]), None, GridRule(128, 1024, 32, ("mixed",)))
    # a rule of 16 units a CTA only: 2048 on 132 SMs (128 CTAs of 16) but not on 114 (64 CTAs of 32)
    rule16 = GridRule(128, 2048, 32, ("mixed",), stream_units=(16,))
    assert prefer_grid(cfg([784, 2048, 2048, 2048, 10]), None, rule16)
    assert not prefer_grid(cfg([784, 2048, 2048, 2048, 10]), types.SimpleNamespace(sm_count=114,
                           max_shared_memory_optin=232448), rule16)  # fmt: skip
    # every streaming plan measured ran on 80 CTAs or more (tuning.py): 1152 (18 CTAs of 64) stays with the graph
    # engine, 1280 (80 of 16) is taken; a rule without the floor takes 1152 too
    assert not prefer_grid(cfg([784, 1152, 1152, 1152, 10]), None)
    assert prefer_grid(cfg([784, 1152, 1152, 1152, 10]), None, GridRule(128, 8192, 32, ("mixed",),
                       stream_units=(16, 32, 64)))  # fmt: skip
    # on 114 SMs (an H100 PCIe) 4096 takes 64 CTAs of 64 units, fewer than any measured plan's: the graph engine;
    # a rule without the 80-CTA floor takes it, one without 64 units does not
    pcie = types.SimpleNamespace(sm_count=114, max_shared_memory_optin=232448)
    assert not prefer_grid(cfg([784, 4096, 4096, 4096, 10]), pcie)
    assert prefer_grid(cfg([784, 4096, 4096, 4096, 10]), pcie, GridRule(128, 4096, 32, ("mixed",),
                       stream_units=(16, 32, 64)))  # fmt: skip
    assert not prefer_grid(cfg([784, 4096, 4096, 4096, 10]), pcie, GridRule(128, 4096, 32, ("mixed",)))
    assert not prefer_grid(bench, None, GridRule(min_hidden=192, max_hidden=2048, max_batch=64, precisions=()))
    rule = GridRule(min_hidden=192, max_hidden=2048, max_batch=64, precisions=("mixed",))
    assert prefer_grid(bench, None, rule)
    assert not prefer_grid(cfg([784, 128, 128, 128, 10]), None, rule)  # below the range
    assert not prefer_grid(cfg([784, 128, 256, 10]), None, rule)
    assert not prefer_grid(cfg([784, 4096, 10]), None, rule)
    assert not prefer_grid(cfg([784, 10]), None, rule)  # no hidden layer
