"""The fused engine (engine="fused"): a small network's whole epoch in one persistent cluster kernel, the weights
kept on chip (sm_90 and newer).

Modules: `engine` (`FusedEngine`, the graph engine with another training context, and the measured rule
`prefer_fused` for engine="auto", with `fast_kernel_serves`), `plan` (pure arithmetic on shapes: what
native/fused.cu is compiled with, or why a model cannot be held). The engine is imported on first use, so `plan`
needs NumPy only (tested on a CPU).
"""

from __future__ import annotations

from typing import Any

__all__ = ["FusedEngine", "fast_kernel_serves", "prefer_fused"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
