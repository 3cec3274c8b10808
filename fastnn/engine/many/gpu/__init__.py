"""The many-model GPU engine: K models trained in one CUDA graph per epoch, with native/many.cu's kernels.

Modules, in reading order:
- `layout`: pure Python (testable on the CPU): each model's parameter block, the device tables of a data set's
  groups and of an epoch's streams, the per-model optimizer records, each step's rows;
- `kernels`: native/many.cu's kernels with their arguments packed (the Step record, one step's launches);
- `engine`: `ManyGpuEngine`, the buffers, the captured epoch, evaluation and the ManyEngine API.

The engine (and with it the CUDA bindings) is imported on first use of `ManyGpuEngine`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ManyGpuEngine"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from .engine import ManyGpuEngine

        return ManyGpuEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
