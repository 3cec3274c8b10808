"""A GPU trainer's CUDA start on a thread (engine/warmup.py), tested without a GPU: the probe and the driver faked.

What must hold: the thread runs while the trainer draws its weights, only for a GPU trainer; the engine's errors
are the ones it raised without the thread (type and message); no thread outlives the constructor; concurrent
probes wait for one another."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest
from _fake_engines import FakeGraph

import fastnn
import fastnn._device
from fastnn import MLP, Trainer
from fastnn._errors import DeviceUnavailable
from fastnn.engine import select, warmup


class _FakeFused(FakeGraph):
    name = "fused"

    def __init__(self, *args, graph_fallback: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.graph_fallback = graph_fallback  # FusedEngine's: engine="auto" lets the graph step take a weighted fit

    @classmethod
    def unsupported_reason(cls, config, device) -> str | None:
        return None


def _warmup_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == warmup.THREAD_NAME]


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch):
    """A usable 'GPU' whose engines are NumPy engines; get_device records the thread of each call and returns
    what `calls.result` says (a device, or an exception to raise)."""
    calls = types.SimpleNamespace(threads=[], ordinals=[], result=object(), started=threading.Event())

    def get_device(ordinal: int = 0):
        calls.threads.append(threading.current_thread().name)
        calls.ordinals.append(ordinal)
        calls.started.set()
        if threading.current_thread().name == warmup.THREAD_NAME:
            time.sleep(0.3)  # a context takes time: a constructor that did not join would leave the thread alive
        if isinstance(calls.result, BaseException):
            raise calls.result
        return calls.result

    monkeypatch.setattr(fastnn._device, "cuda_status", lambda: (True, "Fake GPU"))
    monkeypatch.setattr(select, "graph_engine_class", lambda: FakeGraph)
    fused = types.ModuleType("fastnn.engine.fused")
    fused.FusedEngine = _FakeFused
    fused.prefer_fused = lambda config, device: True
    monkeypatch.setitem(sys.modules, "fastnn.engine.fused", fused)
    from fastnn.cuda import driver

    monkeypatch.setattr(driver, "get_device", get_device)
    monkeypatch.setattr(driver, "device_count", lambda: 2)
    return calls


def test_warm_ordinal_is_the_gpu_a_trainer_makes_first():
    group = types.SimpleNamespace(device=3)
    assert warmup.warm_ordinal("cpu", 1, None) is None
    assert warmup.warm_ordinal("cuda", 1, None) == 0 and warmup.warm_ordinal("auto", 1, None) == 0
    assert warmup.warm_ordinal("cuda", [2], None) == 2 and warmup.warm_ordinal("cuda", (5,), None) == 5
    assert warmup.warm_ordinal("cuda", [0, 1], None) is None and warmup.warm_ordinal("cuda", 2, None) is None
    assert warmup.warm_ordinal("cuda", 1, group) == 3


def test_a_cpu_trainer_starts_no_thread(monkeypatch):
    started = []
    monkeypatch.setattr(warmup, "_warm", lambda ordinal: started.append(ordinal))
    Trainer(MLP([4, 2]), device="cpu")
    assert started == []


@pytest.mark.bindings
@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_the_context_is_made_on_the_thread_while_the_weights_are_drawn(fake_gpu, monkeypatch, device):
    """The drawing waits until the fake context has been asked for by the warm-up thread: without the thread
    running meanwhile it would time out. The engine's own call comes after, on the caller's thread."""
    import fastnn._trainer as trainer_module

    real_init = trainer_module.init_parameters
    overlapped = []

    def slow_init(model, seed):
        overlapped.append(fake_gpu.started.wait(timeout=30))
        return real_init(model, seed)

    monkeypatch.setattr(trainer_module, "init_parameters", slow_init)
    t = Trainer(MLP([20, 10]), device=device, devices=[1])
    assert overlapped == [True]
    assert fake_gpu.threads[0] == warmup.THREAD_NAME and fake_gpu.ordinals[0] == 1
    assert fake_gpu.threads[-1] == threading.current_thread().name  # the engine's own call: the cached device
    assert t.engine == "fused" and _warmup_threads() == []


@pytest.mark.bindings
@pytest.mark.parametrize("error", [DeviceUnavailable("no CUDA device is visible (check nvidia-smi)"),
                                   fastnn.ConfigError("device ordinal 0 is out of range: 0 device(s) visible")])
def test_an_error_of_the_thread_is_raised_by_the_engine_as_without_it(fake_gpu, monkeypatch, error):
    """The thread swallows its failure; the engine's own get_device meets it again: the same type and message as
    with no warm-up at all, and no thread is left."""
    fake_gpu.result = error
    with pytest.raises(type(error)) as with_thread:
        Trainer(MLP([20, 10]), device="cuda")
    assert fake_gpu.threads == [warmup.THREAD_NAME, threading.current_thread().name]
    assert _warmup_threads() == []
    monkeypatch.setattr(warmup, "warm_ordinal", lambda *args: None)
    with pytest.raises(type(error)) as without:
        Trainer(MLP([20, 10]), device="cuda")
    assert str(with_thread.value) == str(without.value) == str(error)


@pytest.mark.bindings
def test_an_interrupted_constructor_waits_for_the_thread(fake_gpu, monkeypatch):
    import fastnn._trainer as trainer_module

    def interrupted(model, seed):
        raise KeyboardInterrupt

    monkeypatch.setattr(trainer_module, "init_parameters", interrupted)
    with pytest.raises(KeyboardInterrupt):
        Trainer(MLP([20, 10]), device="cuda")
    assert _warmup_threads() == []
    assert fake_gpu.threads == [warmup.THREAD_NAME]  # it ran to its end; the engine was never built


def test_the_thread_raises_nothing_of_its_own(monkeypatch):
    """A probe that raises (it never should) stays inside the thread: no 'Exception in thread' report."""
    reported = []
    monkeypatch.setattr(threading, "excepthook", lambda args: reported.append(args))

    def broken():
        raise RuntimeError("probe broke")

    monkeypatch.setattr(fastnn._device, "cuda_status", broken)
    with warmup.overlapped("cuda"):
        pass
    assert reported == [] and _warmup_threads() == []


def test_a_second_prober_waits_for_the_first(monkeypatch):
    """cuda_status is serialised: the engine's call during the thread's probe waits for its answer instead of
    probing (cuInit, loading libraries) a second time."""
    probes = []
    inside, release = threading.Event(), threading.Event()

    def slow_probe():
        probes.append(threading.current_thread().name)
        inside.set()
        release.wait(timeout=30)
        return True, "Fake GPU"

    monkeypatch.setattr(fastnn._device, "_probe", slow_probe)
    fastnn._device.cuda_status.cache_clear()
    try:
        results = []
        first = threading.Thread(target=lambda: results.append(fastnn._device.cuda_status()), name="first")
        first.start()
        assert inside.wait(timeout=30)
        second = threading.Thread(target=lambda: results.append(fastnn._device.cuda_status()), name="second")
        second.start()
        release.set()
        first.join()
        second.join()
        assert probes == ["first"] and results == [(True, "Fake GPU")] * 2
    finally:
        fastnn._device.cuda_status.cache_clear()


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["graph", "fused"])
def test_on_a_gpu_the_thread_makes_the_device_the_engine_trains_on(monkeypatch, engine):
    """The real driver: the warm-up thread asks for device 0 first, the engine gets the same cached Device, one
    epoch trains, and no thread is left."""
    import numpy as np

    from fastnn.cuda import driver

    real = driver.get_device
    seen = []

    def spy(ordinal: int = 0):
        entry = [threading.current_thread().name, None]
        seen.append(entry)  # in call order, before the driver's lock decides who makes the device
        entry[1] = real(ordinal)
        return entry[1]

    monkeypatch.setattr(driver, "get_device", spy)
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (256, 784), dtype=np.uint8), rng.integers(0, 10, 256)
    with Trainer(MLP([784, 32, 10]), device="cuda", engine=engine, batch_size=32) as t:
        assert _warmup_threads() == []
        hist = t.fit(x, y, epochs=1, progress=False)
    assert seen[0][0] == warmup.THREAD_NAME and all(d is seen[0][1] for _, d in seen)
    assert np.isfinite(hist["train_loss"][0])
