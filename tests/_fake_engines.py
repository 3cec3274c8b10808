"""A GPU engine faked by the NumPy engine, for tests of engine choice and a GPU trainer's start without a GPU, and
of the rule by which the GPU engines keep the training set they uploaded."""

from __future__ import annotations

from fastnn.engine.numpy_engine import NumpyEngine


class FakeGraph(NumpyEngine):
    """Poses as the graph engine on GPU `ordinal`; trains with NumPy."""

    device = "cuda"
    name = "graph"

    def __init__(self, config, state, ordinal: int = 0) -> None:
        self.ordinal = ordinal
        super().__init__(config, state)


class FakeUploadingGraph(FakeGraph):
    """FakeGraph that keeps the training set as the GPU engines do: it trains on its own copy (the "upload"), made
    again only when graph/upload.py's DataKey says the data differs from the last set's (needs cuda-bindings)."""

    uploads = 0  # uploads made by every instance since the test reset it

    def set_train_data(self, x, y) -> None:
        from fastnn.engine.graph.upload import data_key

        key = data_key(x, y)
        if getattr(self, "_key", None) == key:
            return  # "already resident"
        self._key = key
        type(self).uploads += 1
        super().set_train_data(x.copy(), y.copy())
