"""The interface of an engine training K models at once, and the configuration it is built from.

Model k is defined as a separate single-model fit: `ManyConfig.model_config(k)` is the `EngineConfig` of the
`Trainer` that fit would use (its optimizer, and `shuffle_seed` keying every epoch's order), and its rows are the
ones its mask selects. An engine reports per model; a model that diverges stops alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..._errors import TrainingDiverged
from ..._model import MLP
from ..._optim import Optimizer
from ..base import EngineConfig, EpochStats
from ..tuning import Tuning

__all__ = ["ManyConfig", "ManyEngine", "ManyEpoch"]


@dataclass(frozen=True)
class ManyConfig:
    """Everything a many-model engine needs; validated by `MultiTrainer` before any engine sees it."""

    model: MLP
    optimizers: tuple[Optimizer, ...]  #: one per model, all of one class
    batch_size: int
    precision: str = "mixed"
    shuffle_seed: int = 0  #: keys every epoch's order, as `Trainer(seed=...)` does
    drop_last: bool = False
    normalize: tuple[Any, Any] | None = None
    loss: str = "cross_entropy"
    tuning: Tuning = Tuning()  #: the engines' measured choices (fastnn.engine.tuning): how they run, not what

    @property
    def count(self) -> int:
        """K, the number of models."""
        return len(self.optimizers)

    def model_config(self, k: int) -> EngineConfig:
        """The single-model configuration whose fit model k equals."""
        return EngineConfig(model=self.model, optimizer=self.optimizers[k], batch_size=self.batch_size,
                            precision=self.precision, seed=self.shuffle_seed, drop_last=self.drop_last,
                            normalize=self.normalize, loss=self.loss, tuning=self.tuning)  # fmt: skip


@dataclass
class ManyEpoch:
    """One epoch of the models asked to train: for each model its stats, or None (not trained, or diverged), and
    the divergence that stopped it (its weights are those of its last finite epoch), or None."""

    stats: list[EpochStats | None]
    diverged: list[TrainingDiverged | None] = field(default_factory=list)


class ManyEngine(ABC):
    """Trains K models of one architecture. Parameters use torch's names and layout, per model."""

    device: str  #: "cpu" or "cuda"
    name: str  #: as `MultiTrainer.engine` reports it

    @abstractmethod
    def __init__(self, config: ManyConfig, states: list[dict[str, np.ndarray]]) -> None:
        """Build for `config`, model k starting from `states[k]` (parameters, and optimizer state if present)."""

    @abstractmethod
    def set_train_data(self, x: np.ndarray, y: np.ndarray, rows: list[np.ndarray] | None) -> None:
        """Keep the training set; model k trains on rows `rows[k]` (ascending int64 indices) of it, all when None."""

    @abstractmethod
    def fit_epoch(
        self,
        active: np.ndarray,
        epochs: np.ndarray,
        steps: np.ndarray,
        lrs: list[np.ndarray | None],
        eval_data: tuple[np.ndarray, np.ndarray] | None,
        eval_rows: list[np.ndarray] | None,
    ) -> ManyEpoch:
        """Train one epoch of every model k with `active[k]`: its epoch index `epochs[k]` (keys its order), its step
        counter `steps[k]` (steps done before), its learning rate of each step `lrs[k]` (float32, one per step of its
        epoch); then evaluate it on eval_data (its rows `eval_rows[k]` of it, all when None)."""

    @abstractmethod
    def evaluate(self, x: np.ndarray, y: np.ndarray, rows: list[np.ndarray] | None) -> list[tuple[float, float]]:
        """Each model's (loss, accuracy) on (x, y), or (mse, r2) for a regression; model k on rows `rows[k]`."""

    @abstractmethod
    def predict_outputs(self, x: np.ndarray) -> np.ndarray:
        """Each model's raw outputs (logits of a classifier), (K, N, outputs) float32."""

    @abstractmethod
    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """Each classifier's softmax probabilities, (K, N, classes) float32."""

    @abstractmethod
    def get_state(self, k: int) -> dict[str, np.ndarray]:
        """Model k's parameters and optimizer state as float32 copies, keyed as `Engine.get_state`."""

    @abstractmethod
    def set_state(self, k: int, state: dict[str, np.ndarray]) -> None:
        """Replace model k's state (any subset of get_state's keys)."""

    def close(self) -> None:  # noqa: B027 - engines without resources need nothing here
        """Release the engine's resources."""
