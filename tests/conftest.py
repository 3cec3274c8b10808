"""Shared test setup: GPU tests (marked `gpu`) skip where fastnn finds no usable GPU; the `engine` fixture is
the GPU engine matrix every GPU comparison runs on."""

from __future__ import annotations

import pytest

#: The GPU engine matrix: "fused-lean" is engine="fused" held to its lean shared-memory layout (no fp16 weight
#: copy, momentum holding the gradient), which it otherwise takes only for models the standard one cannot hold.
GPU_ENGINES = ("graph", "fused", "fused-lean")


@pytest.fixture(params=GPU_ENGINES)
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The engine= to pass to Trainer for one entry of GPU_ENGINES."""
    if request.param == "fused-lean":
        from fastnn.engine import fused_plan

        monkeypatch.setattr(fused_plan, "LAYOUTS", ("lean",))
        return "fused"
    return request.param


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
