"""The grid engine (engine="grid"): a mid or wide network's whole epoch in one cooperative persistent kernel over
up to every SM (sm_90 and newer).

Modules: `engine` (`GridEngine`, the graph engine with another training context, and the measured rule
`prefer_grid` for engine="auto"), `plan` (pure arithmetic on shapes: what native/grid.cu is compiled with, or why a
model cannot be served). The engine is imported on first use, so `plan` needs NumPy only (tested on a CPU).
"""

from __future__ import annotations

from typing import Any

__all__ = ["GridEngine", "prefer_grid"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import engine

        return getattr(engine, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
