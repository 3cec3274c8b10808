"""The NumPy engine for K models, the definition of correct: model k is trained by the single-model NumPy engine
(`fastnn.engine.numpy_engine`) on its own rows, from its own state, with its own optimizer and the shared
shuffle seed, which is what a separate `Trainer(device="cpu")` fit does. Init, shuffle, loss and update are the
single-model engine's, not copies; models that share rows share one copy of them.
"""

from __future__ import annotations

import numpy as np

from ..._errors import TrainingDiverged
from ..base import EpochStats
from ..numpy_engine import NumpyEngine
from .base import ManyConfig, ManyEngine, ManyEpoch

__all__ = ["ManyNumpyEngine"]


class ManyNumpyEngine(ManyEngine):
    """K single-model NumPy engines, trained one after another each epoch."""

    device = "cpu"
    name = "numpy"

    def __init__(self, config: ManyConfig, states: list[dict[str, np.ndarray]], dtype: type = np.float32) -> None:
        self.config = config
        self._engines = [NumpyEngine(config.model_config(k), states[k], dtype) for k in range(config.count)]
        self._train: list[tuple[np.ndarray, np.ndarray]] = []

    def set_train_data(self, x: np.ndarray, y: np.ndarray, rows: list[np.ndarray] | None) -> None:
        self._train = _subsets(x, y, rows, self.config.count)

    def fit_epoch(
        self,
        active: np.ndarray,
        epochs: np.ndarray,
        steps: np.ndarray,
        lrs: list[np.ndarray | None],
        eval_data: tuple[np.ndarray, np.ndarray] | None,
        eval_rows: list[np.ndarray] | None,
    ) -> ManyEpoch:
        if not self._train:
            raise RuntimeError("set_train_data must be called before fit_epoch")
        count = self.config.count
        evals = _subsets(*eval_data, eval_rows, count) if eval_data is not None else None
        out = ManyEpoch(stats=[None] * count, diverged=[None] * count)
        for k in np.flatnonzero(active):
            k = int(k)
            engine, table = self._engines[k], lrs[k]
            if table is None:
                raise ValueError(f"model {k} is active but has no learning-rate table")
            got: list[EpochStats] = []
            engine.set_train_data(*self._train[k])
            try:
                engine.fit_epochs(int(epochs[k]), int(steps[k]), table, None if evals is None else evals[k],
                                  frozenset({0}) if evals is not None else frozenset(), got.append)  # fmt: skip
            except TrainingDiverged as exc:
                out.diverged[k] = exc
                continue
            out.stats[k] = got[-1]
        return out

    def evaluate(self, x: np.ndarray, y: np.ndarray, rows: list[np.ndarray] | None) -> list[tuple[float, float]]:
        return [e.evaluate(*xy) for e, xy in zip(self._engines, _subsets(x, y, rows, self.config.count))]

    def predict_outputs(self, x: np.ndarray) -> np.ndarray:
        return np.stack([e.predict_outputs(x) for e in self._engines])

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        return np.stack([e.predict_proba(x) for e in self._engines])

    def get_state(self, k: int) -> dict[str, np.ndarray]:
        return self._engines[k].get_state()

    def set_state(self, k: int, state: dict[str, np.ndarray]) -> None:
        self._engines[k].set_state(state)


def _subsets(x: np.ndarray, y: np.ndarray, rows: list[np.ndarray] | None, count: int) -> list[tuple[np.ndarray, ...]]:
    """(x[rows[k]], y[rows[k]]) for each model, one copy per distinct row set; (x, y) itself when rows is None."""
    if rows is None:
        return [(x, y)] * count
    copies: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    out = []
    for r in rows:
        key = id(r)  # MultiTrainer hands models of one mask group the same array
        if key not in copies:
            copies[key] = (x[r], y[r])
        out.append(copies[key])
    return out
