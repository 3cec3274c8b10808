"""A GPU this process cannot use is no GPU: device="auto" trains on the CPU with a warning where the driver cannot
open a context (issue 36, hole 9), faked on the CPU through cuda-bindings' functions; an estimator fitted with an
engine this GPU cannot run unpickles with the engine chosen here (hole 10), on a faked older GPU."""

from __future__ import annotations

import pickle
import sys
import types
import warnings

import numpy as np
import pytest

pytestmark = pytest.mark.bindings  # cuda-bindings' enums and functions, faked; no GPU needed
cu = pytest.importorskip("cuda.bindings.driver", reason='needs the CUDA wheels: pip install -e ".[cu12]"')

from _fake_engines import FakeGraph  # noqa: E402

import fastnn._device  # noqa: E402
from fastnn import MLP, DeviceUnavailable, Trainer  # noqa: E402
from fastnn.cuda import driver  # noqa: E402
from fastnn.cuda._loader import CudaDriverError  # noqa: E402
from fastnn.engine import select  # noqa: E402

SUCCESS = cu.CUresult.CUDA_SUCCESS


@pytest.fixture(params=["CUDA_ERROR_DEVICE_UNAVAILABLE", "CUDA_ERROR_OUT_OF_MEMORY"])
def gpu_without_context(request, monkeypatch: pytest.MonkeyPatch) -> str:
    """One visible, probed-usable GPU whose primary context the driver refuses with the given status (another job
    holds it in exclusive-process mode; its memory is full)."""
    status = getattr(cu.CUresult, request.param)
    monkeypatch.setattr(fastnn._device, "cuda_status", lambda: (True, "Fake GPU"))
    monkeypatch.setattr(driver, "_initialized", True)
    monkeypatch.setattr(driver, "_devices", {})
    monkeypatch.setattr(driver, "_primary_contexts", {})
    monkeypatch.setattr(cu, "cuDeviceGetCount", lambda: (SUCCESS, 1))
    monkeypatch.setattr(cu, "cuDeviceGet", lambda ordinal: (SUCCESS, ordinal))
    monkeypatch.setattr(cu, "cuGetErrorName", lambda err: (SUCCESS, request.param.encode()))
    monkeypatch.setattr(cu, "cuDevicePrimaryCtxRetain", lambda dev: (status, None))
    monkeypatch.setattr(select, "_warned", set())
    return request.param


def test_a_context_the_driver_refuses_is_device_unavailable_naming_the_status(gpu_without_context) -> None:
    with pytest.raises(DeviceUnavailable, match=f"cannot open a CUDA context on GPU 0: .*{gpu_without_context}") as e:
        driver.get_device(0)
    info = e
    assert isinstance(info.value.__cause__, CudaDriverError)
    assert driver._devices == {} and driver._primary_contexts == {}  # nothing cached: a later call tries again


@pytest.mark.parametrize("engine", ["auto", "graph"])
def test_device_auto_trains_on_the_cpu_with_a_warning(gpu_without_context, engine: str) -> None:
    x = np.random.default_rng(0).normal(size=(32, 6)).astype(np.float32)
    y = np.arange(32) % 3
    with pytest.warns(RuntimeWarning, match=f"device='auto': .*{gpu_without_context}.*training on the CPU"):
        t = Trainer(MLP([6, 8, 3]), device="auto", engine=engine, batch_size=8)
    assert (t.device, t.engine) == ("cpu", "numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        t.fit(x, y, epochs=2)
    assert t.epoch == 2


def test_device_cuda_is_refused_as_unavailable_not_a_raw_driver_error(gpu_without_context) -> None:
    with pytest.raises(DeviceUnavailable, match="cannot open a CUDA context"):
        Trainer(MLP([6, 8, 3]), device="cuda", engine="graph")


class _OnlyOnHopper(FakeGraph):
    """A persistent-kernel engine that this (fake, pre-Hopper) GPU cannot run."""

    @classmethod
    def unsupported_reason(cls, config, device) -> str | None:
        return "it needs compute capability 9.0 (Hopper) or newer; this GPU is sm_80"


@pytest.fixture
def pre_hopper_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 'GPU' whose graph engine is the NumPy engine and whose fused and grid engines refuse every model."""
    monkeypatch.setattr(select, "graph_engine_class", lambda: FakeGraph)
    for name, cls in (("fused", "FusedEngine"), ("grid", "GridEngine")):
        module = types.ModuleType(f"fastnn.engine.{name}")
        setattr(module, cls, _OnlyOnHopper)
        setattr(module, f"prefer_{name}", lambda config, device: True)
        module.fast_kernel_serves = lambda config, device: True
        monkeypatch.setitem(sys.modules, f"fastnn.engine.{name}", module)
    monkeypatch.setattr(driver, "get_device", lambda ordinal=0: object())
    monkeypatch.setattr(driver, "device_count", lambda: 1)


@pytest.mark.parametrize("engine", ["grid", "fused"])
def test_an_estimator_fitted_with_a_kernel_engine_unpickles_on_an_older_gpu(pre_hopper_gpu, engine: str) -> None:
    """A saved model loads wherever fastnn runs: the engine is chosen again there, with a warning (it raised
    EngineRefused inside pickle.loads)."""
    pytest.importorskip("sklearn")
    from fastnn.sklearn import MLPClassifier

    x = np.random.default_rng(1).normal(size=(40, 6)).astype(np.float32)
    y = np.arange(40) % 3
    est = MLPClassifier((8,), device="cpu", max_iter=3, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(x, y)
    est.set_params(device="cuda", engine=engine)  # as if fitted on an H100 with this engine
    with pytest.warns(RuntimeWarning, match=f"engine='{engine}' cannot train this model.*Hopper.*chosen here"):
        back = pickle.loads(pickle.dumps(est))
    assert (back.trainer_.device, back.trainer_.engine, back.engine) == ("cuda", "graph", engine)
    np.testing.assert_array_equal(back.predict_proba(x), est.predict_proba(x))
    back.partial_fit(x, y)  # and trains on where it landed
    assert back.trainer_.engine == "graph" and back.n_iter_ == est.n_iter_ + 1
