"""A GPU engine faked by the NumPy engine, for tests of engine choice and a GPU trainer's start without a GPU."""

from __future__ import annotations

from fastnn.engine.numpy_engine import NumpyEngine


class FakeGraph(NumpyEngine):
    """Poses as the graph engine on GPU `ordinal`; trains with NumPy."""

    device = "cuda"
    name = "graph"

    def __init__(self, config, state, ordinal: int = 0) -> None:
        self.ordinal = ordinal
        super().__init__(config, state)
