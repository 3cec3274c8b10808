"""The seam between `Trainer` and the engines: what an engine is given and what it must do.

`Trainer` validates everything and speaks the user's words; an engine receives clean arrays and a
frozen `EngineConfig`, owns the parameters while it lives, and trains whole epochs. The NumPy engine
(`numpy_engine.py`) is the definition of correct; the GPU engines (`graph/`, `fused/`) must match it.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import ConfigError
from .._loss import LOSSES as _LOSSES
from .._model import MLP
from .._optim import Optimizer
from .tuning import Tuning

__all__ = ["LOSSES", "PRECISIONS", "Engine", "EngineConfig", "EpochStats", "batch_slices", "steps_per_epoch"]

#: "mixed": fp16 operands, fp32 accumulation and master weights; "fp16": fp16 weights and compute;
#: "fp32": fp32 everywhere (no TF32). The NumPy engine computes in float32 whatever is asked.
PRECISIONS = ("mixed", "fp16", "fp32")

#: "cross_entropy": classification, softmax cross-entropy over integer labels; "mse": regression, the mean over
#: the samples and the k outputs of the squared error, on a linear output (float targets (N, k)); fastnn/_loss.py
#: describes each (and defines it in NumPy), native/loss.cuh computes it. No Huber loss for users yet: it needs a
#: threshold in the targets' units (one more setting to get wrong), and scikit-learn's MLPRegressor offers squared
#: error alone; scale the targets (or clip outliers) instead. Its arithmetic is defined (loss.cuh, _loss.py) for
#: when it is asked for.
LOSSES = tuple(_LOSSES)


@dataclass(frozen=True)
class EngineConfig:
    """Everything an engine needs to build itself; validated by `Trainer` before any engine sees it."""

    model: MLP
    optimizer: Optimizer
    batch_size: int
    precision: str = "mixed"
    seed: int = 0
    drop_last: bool = False
    normalize: tuple[Any, Any] | None = None  #: floats, or per-feature tuples (fastnn._data.check_normalize)
    data_placement: str = "auto"  #: GPU engines: where the training set lives (fastnn.engine.placement)
    tuning: Tuning = Tuning()  #: the engines' measured choices (fastnn.engine.tuning); not saved in checkpoints
    loss: str = "cross_entropy"  #: one of LOSSES (the NumPy engine's functions define each)


@dataclass
class EpochStats:
    """What one finished epoch reports. Loss and accuracy are means over the epoch's training samples,
    each sample scored in the forward pass of its own step (before that step's update); a regression
    (loss "mse") has no accuracy (None, in eval_accuracy too)."""

    epoch: int  #: absolute epoch index (0 for the trainer's first epoch ever; History numbers it 1)
    loss: float
    accuracy: float | None
    samples: int
    seconds: float  #: the epoch's own time (device events on the GPU)
    eval_loss: float | None = None
    eval_accuracy: float | None = None


def kernel_engine_limits(config: EngineConfig, device: Any, min_cc: int, needs: str) -> str | None:
    """The limits the persistent-kernel engines (fused, grid) share, as a reason naming the limit, or None: the
    training set in GPU memory, a scalar normalize (their kernels take two numbers), and a GPU of compute capability
    `min_cc` or newer (`needs`: what for)."""
    if config.data_placement == "host":
        return "it reads the training set from GPU memory (data_placement='host' needs engine='graph')"
    if config.normalize is not None and (np.ndim(config.normalize[0]) or np.ndim(config.normalize[1])):
        return "it takes normalize=(mean, std) as two numbers, not per-feature vectors"
    cc = device.compute_capability[0] * 10 + device.compute_capability[1]
    if cc < min_cc:
        version = f"{min_cc // 10}.{min_cc % 10}"
        return f"it needs {needs} (compute capability {version} or newer); {device.name} is {device.arch}"
    return None


def steps_per_epoch(n: int, batch_size: int, drop_last: bool) -> int:
    """Steps in one epoch over n samples: the last short batch counts unless drop_last."""
    return n // batch_size if drop_last else -(-n // batch_size)


def batch_slices(n: int, batch_size: int, drop_last: bool) -> list[tuple[int, int]]:
    """(start, stop) positions in the epoch's order of every step's batch."""
    return [(s * batch_size, min(n, (s + 1) * batch_size)) for s in range(steps_per_epoch(n, batch_size, drop_last))]


OnEpoch = Callable[[EpochStats], None]


class Engine(ABC):
    """A training engine. Parameters use torch's names and layout ("0.weight" is (out, in))."""

    #: "cpu" or "cuda"
    device: str
    #: which engine this is, as `Trainer.engine` reports it: "numpy", "graph", "fused" or "grid"
    name: str
    #: The stats of the last epoch reported by the running or last `fit_epochs` (None before its first).
    last_reported: EpochStats | None = None

    @abstractmethod
    def __init__(self, config: EngineConfig, state: dict[str, np.ndarray]) -> None:
        """Build for `config`, starting from `state` (parameters, and optimizer state if present)."""

    @abstractmethod
    def set_train_data(self, x: np.ndarray, y: np.ndarray) -> None:
        """Keep the training set: x (N, D) uint8 or float32; y (N,) int32 labels, or (N, k) float32 targets for
        loss "mse"; both already validated."""

    def set_sample_weight(self, weight: np.ndarray | None) -> None:
        """Per-row weights of the training set for the next `fit_epochs` (None: unweighted), validated, > 0 in
        sum. The NumPy engine's loss defines the weighted mean (numpy_engine.py) and the graph engine's step
        computes it (graph/engine.py); engines whose kernels compute only the unweighted mean refuse weights by name,
        before any work."""
        if weight is not None:
            raise ConfigError(
                f"sample_weight: the {self.name} engine's loss kernels compute the unweighted mean loss; train a "
                f"weighted fit with engine='graph' or 'auto' (the graph engine's weighted loss), on the CPU, or pass "
                f"equal weights"
            )

    @abstractmethod
    def fit_epochs(
        self,
        first_epoch: int,
        first_step: int,
        lrs: np.ndarray,
        eval_data: tuple[np.ndarray, np.ndarray] | None,
        eval_after: frozenset[int],
        on_epoch: OnEpoch,
        stoppable: bool = False,
        on_step: Callable[[], None] | None = None,
        end_epoch: int | None = None,
    ) -> None:
        """Train len(lrs) // steps_per_epoch epochs; lrs[i] is the rate of step first_step + i.

        Epoch k of this call has absolute index first_epoch + k (it keys the shuffle). After the
        epochs whose k is in `eval_after`, evaluate on eval_data and fill the stats' eval fields.
        Call `on_epoch` in order as each epoch's numbers are known (through `report`). If an epoch's
        loss or the state it leaves (`fastnn._state.state_problem`) is not finite, restore the
        parameters and optimizer state to the end of the last finite epoch and raise TrainingDiverged
        naming that epoch by its number, absolute index + 1 (on_epoch is not called for it).

        Interrupted (KeyboardInterrupt, an error in evaluation or in on_epoch), the state is the one
        after the last epoch reported: an epoch whose training finished is reported (without its eval
        numbers if its evaluation did not finish), one whose training did not is undone. An epoch is
        reported once `report` has set `last_reported` to its stats, whether or not on_epoch returns;
        the caller reconciles from `last_reported` if an interrupt lands before on_epoch could act.

        stoppable: on_epoch may raise to stop after the epoch it reports (fastnn.StopTraining), and
        no epoch after it may have trained then: the GPU engines queue no epoch ahead of the one reported
        (an idle gap of a host round trip per epoch instead of up to INFLIGHT_EPOCHS queued).
        on_step: called after every training step by engines that run steps from the host (the NumPy
        engine, for a progress bar); the GPU engines run an epoch as one graph and never call it.
        end_epoch: the absolute epoch index the whole `fit` ends at (it may span several calls); a process of a
        data-parallel run compares it across the ranks before training (None: this call's end).
        """

    @abstractmethod
    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        """(mean loss, accuracy) of the current parameters on validated x, y; for loss "mse", (mean squared
        error, R^2 averaged over the outputs as `numpy_engine.r2_score` defines it)."""

    @abstractmethod
    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """Softmax probabilities (N, classes) float32 for validated x."""

    @abstractmethod
    def predict_outputs(self, x: np.ndarray) -> np.ndarray:
        """The network's outputs (N, k) float32 for validated x: a regression's predictions (loss "mse")."""

    @abstractmethod
    def get_state(self) -> dict[str, np.ndarray]:
        """float32 copies: parameters by name, optimizer state as "opt.<state>.<param name>"."""

    @abstractmethod
    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Replace parameters (and optimizer state where given) with `state`'s arrays."""

    def report(self, stats: EpochStats, on_epoch: OnEpoch, quiet: bool = False) -> None:
        """Report one finished epoch: from `last_reported = stats` on it counts as reported, then on_epoch.

        quiet (reporting after an interrupt, which is re-raised afterwards): on_epoch's errors are dropped.
        """
        self.last_reported = stats
        if not quiet:
            on_epoch(stats)
            return
        with contextlib.suppress(Exception):
            on_epoch(stats)

    def close(self) -> None:  # noqa: B027 - engines without resources need nothing here
        """Release every resource the engine holds; the engine is unusable afterwards."""
