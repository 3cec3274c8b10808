"""Shared test setup: GPU tests (marked `gpu`) skip where fastnn finds no usable GPU."""

from __future__ import annotations

import pytest


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
