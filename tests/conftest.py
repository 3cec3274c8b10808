"""Shared test setup: GPU tests (marked `gpu`) skip where fastnn finds no usable GPU; the `engine` fixture is
the GPU engine matrix every GPU comparison runs on."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

from fastnn.engine import Tuning

_nccl_group = []  # the one-rank group, made once per session (a communicator per test would cost ~0.1 s each)


def _require_nccl() -> None:
    from fastnn.cuda import nccl

    ok, reason = nccl.available()
    if not ok:
        pytest.skip(f"NCCL is not installed: {reason}")


def _group_of_one() -> dict[str, Any]:
    """The graph engine in a data-parallel group of one rank (made once per session)."""
    _require_nccl()
    if not _nccl_group:
        from fastnn import distributed

        _nccl_group.append(distributed.init(0, 1, device=0))
    return {"engine": "graph", "distributed": _nccl_group[0]}


def _replicas(**tuning: Any) -> dict[str, Any]:
    """devices='s replica engine on GPUs 0 and 1 where there are two, else a replica of one on GPU 0."""
    _require_nccl()
    from fastnn.cuda import driver

    two = driver.device_count() >= 2
    return {"engine": "graph", "devices": [0, 1] if two else [0], "tuning": Tuning(one_gpu_replica=not two, **tuning)}


#: The GPU engine matrix: each entry's Trainer keyword arguments (a new engine joins with one entry). "fused" takes
#: native/fused_logreg.cu for the logistic regressions its plan serves (uint8 or float32 inputs, "mixed"/"fp16", up to
#: 16 classes and 128 rows a step), native/fused_mlp.cu for the MLPs its plan serves (hidden layers up to 128 wide,
#: batches up to 32, uint8, SGD) and native/fused.cu for the rest. "fused-lean" is engine="fused" on native/fused.cu
#: alone, held to its lean shared-memory layout (no fp16 weight copy, momentum holding the gradient), which it otherwise
#: takes only for models the standard one cannot hold. The grid engine is not an entry: its two kernels
#: (native/grid_fast.cu, native/grid_stream.cu) train only "mixed" ReLU classifiers of three equal hidden layers of
#: 128 units or more at up to 32 rows a step, and refuse every other model naming engine='graph' (the generic version
#: 1, grid.cu, 14-122x slower than the graph engine, left native/), so nearly every case here would be a refusal.
#: test_gpu_engines.test_the_grid_engine_serves_or_refuses_every_shape runs each case of test_every_shape_matches_numpy
#: on it (the refusal checked, the served case compared), and tests of its own compare its kernels with the NumPy
#: engine (test_grid_fast_kernel_matches_numpy and the ones after it). "graph-nccl" is the graph engine in a
#: data-parallel group of one rank: every step's gradients go through the NCCL all-reduces captured on the side
#: stream and the history through its epoch-end sum (an identity for one rank, so every tolerance stays), which is
#: what one GPU can check of the data-parallel path. "graph-replicas" is `devices=`'s engine (engine/replicas.py) on
#: GPUs 0 and 1 where there are two, else on GPU 0 alone (a replica of one: its threads, communicators and lock-step
#: epochs without a peer). "graph-sharded" is graph-replicas with the optimizer update sharded over the GPUs
#: (Tuning.sharded_update: reduce-scatters, per-layer updates and all-gathers, the state gathered at each epoch's
#: end).
GPU_ENGINES: dict[str, Callable[[], dict[str, Any]]] = {
    "graph": lambda: {"engine": "graph"},
    "fused": lambda: {"engine": "fused"},
    "fused-lean": lambda: {"engine": "fused",
                           "tuning": Tuning(fused_layouts=("lean",), fused_logreg=False, fused_mlp=False)},
    "graph-nccl": _group_of_one,
    "graph-replicas": _replicas,
    "graph-sharded": lambda: _replicas(sharded_update=True),
}


@pytest.fixture(autouse=True, scope="session")
def _decoded_datasets_in_a_folder_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Datasets the tests decode go to a folder of this test session, not the user's ~/.cache/fastnn/decoded
    (bounded, but a run of the suite should not fill a user's cache); a folder the user named is kept. The
    kernel cache stays where it is: the GPU tests would otherwise compile every kernel cold, for minutes."""
    from fastnn._decoded import CACHE_ENV

    with pytest.MonkeyPatch.context() as mp:
        if not os.environ.get(CACHE_ENV):
            mp.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("decoded")))
        yield


@pytest.fixture(params=list(GPU_ENGINES))
def engine(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The Trainer keyword arguments (engine=, and tuning=, distributed= or devices= where the entry needs them) of
    one entry of GPU_ENGINES: `Trainer(..., **engine)`."""
    return GPU_ENGINES[request.param]()


@pytest.fixture
def one_gemm_algorithm() -> Tuning:
    """A Tuning whose GEMM plans keep only cuBLASLt's first heuristic choice, so that two trainers run the same
    algorithms and can be compared bit for bit (autotuning by timing may pick differently from one trainer to the
    next): pass it as `tuning=` (dataclasses.replace it for other choices)."""
    return Tuning(autotune_algos=1)


def cuda_wheels() -> tuple[bool, str]:
    """Whether the CUDA wheels (cuda-bindings, cuda-pathfinder: extra cu12 or cu13) are installed, and if not why."""
    import importlib.util

    for name in ("cuda.bindings", "cuda.pathfinder"):
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError as e:  # the `cuda` namespace itself is missing
            found, why = False, str(e)
        else:
            why = f"No module named {name!r}"
        if not found:
            return False, f'needs the CUDA wheels ({why}): pip install -e ".[cu12]"'
    return True, ""


#: Seconds a `gpu` test may run before pytest-timeout fails it by name (pyproject.toml's `timeout`, 900, holds the
#: others: the slowest CPU tests, a Fashion-MNIST fit and a nested pytest run, took ~300 s on a busy 2-core machine):
#: the first GPU test of a session compiles its kernels with NVRTC (cold cache: minutes), and the multi-GPU ones
#: start processes. A test that needs more says so with its own `@pytest.mark.timeout(seconds)`.
GPU_TIMEOUT_S = 1800


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("gpu") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(GPU_TIMEOUT_S))
    binding_items = [item for item in items if "bindings" in item.keywords]
    if binding_items:
        installed, reason = cuda_wheels()
        if not installed:
            for item in binding_items:
                item.add_marker(pytest.mark.skip(reason=reason))
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    from fastnn._device import cuda_status

    usable, reason = cuda_status()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"no usable GPU: {reason}")
    for item in gpu_items:
        item.add_marker(skip)
