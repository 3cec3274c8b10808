"""Shared test setup: GPU tests (marked `gpu`) skip where fastnn finds no usable GPU; the `engine` fixture is
the GPU engine matrix every GPU comparison runs on."""

from __future__ import annotations

import pytest

#: The GPU engine matrix: "fused-lean" is engine="fused" held to its lean shared-memory layout (no fp16 weight
#: copy, momentum holding the gradient), which it otherwise takes only for models the standard one cannot hold.
#: "graph-nccl" is the graph engine in a data-parallel group of one rank: every step's gradients go through the
#: NCCL all-reduces captured on the side stream and the history through its epoch-end sum (an identity for one
#: rank, so every tolerance stays), which is what one GPU can check of the data-parallel path. "graph-replicas" is
#: `devices=`'s engine (engine/replicas.py) on GPUs 0 and 1 where there are two, else on GPU 0 alone (a replica of
#: one: its threads, communicators and lock-step epochs without a peer). "graph-sharded" is graph-replicas with the
#: optimizer update sharded over the GPUs (cuda_engine.SHARDED_UPDATE: reduce-scatters, per-layer updates and
#: all-gathers, the state gathered at each epoch's end).
GPU_ENGINES = ("graph", "fused", "fused-lean", "graph-nccl", "graph-replicas", "graph-sharded")

_nccl_group = []  # the one-rank group, made once per session (a communicator per test would cost ~0.1 s each)


@pytest.fixture(params=GPU_ENGINES)
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The engine= to pass to Trainer for one entry of GPU_ENGINES."""
    if request.param == "fused-lean":
        from fastnn.engine import fused_plan

        monkeypatch.setattr(fused_plan, "LAYOUTS", ("lean",))
        return "fused"
    if request.param == "graph-nccl":
        from fastnn import distributed, trainer
        from fastnn.cuda import nccl

        ok, reason = nccl.available()
        if not ok:
            pytest.skip(f"NCCL is not installed: {reason}")
        if not _nccl_group:
            _nccl_group.append(distributed.init(0, 1, device=0))
        real = trainer.create_engine

        def with_group(device, config, state, *, engine="auto", stacklevel=2, group=None, devices=1):
            if group is None and device != "cpu" and devices == 1:
                group = _nccl_group[0]
            return real(device, config, state, engine=engine, stacklevel=stacklevel + 1, group=group,
                        devices=devices)  # fmt: skip

        monkeypatch.setattr(trainer, "create_engine", with_group)
        return "graph"
    if request.param in ("graph-replicas", "graph-sharded"):
        from fastnn import trainer
        from fastnn.cuda import driver, nccl
        from fastnn.engine import cuda_engine
        from fastnn.engine.replicas import ReplicaEngine

        monkeypatch.setattr(cuda_engine, "SHARDED_UPDATE", request.param == "graph-sharded")

        ok, reason = nccl.available()
        if not ok:
            pytest.skip(f"NCCL is not installed: {reason}")
        ordinals = [0, 1] if driver.device_count() >= 2 else [0]
        real = trainer.create_engine

        def replicated(device, config, state, *, engine="auto", stacklevel=2, group=None, devices=1):
            if device == "cpu" or group is not None or devices != 1:
                return real(device, config, state, engine=engine, stacklevel=stacklevel + 1, group=group,
                            devices=devices)  # fmt: skip
            return ReplicaEngine(config, state, ordinals)

        monkeypatch.setattr(trainer, "create_engine", replicated)
        return "graph"
    return request.param


@pytest.fixture
def one_gemm_algorithm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every GEMM plan keeps only cuBLASLt's first heuristic choice, so that two trainers run the same algorithms
    and can be compared bit for bit (autotuning by timing may pick differently from one trainer to the next)."""
    from fastnn.engine import cuda_engine

    monkeypatch.setattr(cuda_engine, "AUTOTUNE_ALGOS", 1)


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    binding_items = [item for item in items if "bindings" in item.keywords]
    if binding_items:
        installed, reason = cuda_wheels()
        if not installed:
            for item in binding_items:
                item.add_marker(pytest.mark.skip(reason=reason))
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    from fastnn.device import cuda_status

    usable, reason = cuda_status()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"no usable GPU: {reason}")
    for item in gpu_items:
        item.add_marker(skip)
