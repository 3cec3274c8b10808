"""The exceptions fastnn raises: one base class, one subclass per kind of failure."""

from __future__ import annotations

__all__ = [
    "FastnnError",
    "ConfigError",
    "DataError",
    "DeviceUnavailable",
    "NotFittedError",
    "StopTraining",
    "TrainingDiverged",
]


class FastnnError(Exception):
    """Base class of every error fastnn raises on purpose."""


class ConfigError(FastnnError, ValueError):
    """A constructor or method argument is invalid; the message names the argument and the value."""


class DataError(FastnnError, ValueError):
    """Input arrays or data files are malformed; the message names the argument or file."""


class DeviceUnavailable(FastnnError, RuntimeError):
    """The requested device cannot be used; the message says why and how to fix it."""


class NotFittedError(FastnnError, RuntimeError):
    """`predict` or `predict_proba` was called on a trainer that has neither trained nor been given weights: it
    would answer from its random initial weights."""


class StopTraining(FastnnError):
    """Raised by a `fit` callback to stop training after the epoch it was called for (that epoch is kept).

    `fit` catches it and returns normally; returning True from a callback does the same. (Defined here, below
    the engines, whose epoch loop raises it on the ranks that another rank stopped.)
    """


class TrainingDiverged(FastnnError, ArithmeticError):
    """An epoch's loss, or the training state (weights, optimizer state) it ended with, is not finite; the
    trainer keeps the weights and optimizer state of the last finite epoch.

    `epoch` is the diverged epoch's number, counted from 1 as in `History` and progress lines: the trainer
    stays at the end of epoch `epoch - 1` (`trainer.epoch == epoch - 1`)."""

    def __init__(self, epoch: int, loss: float, state: str | None = None) -> None:
        what = f"loss is {loss}"
        if state is not None:
            what += f", but the state its last update left is not: {state}"
        super().__init__(
            f"training diverged in epoch {epoch}: {what}; "
            f"the trainer keeps the weights from the end of the last finite epoch (lower lr?)"
        )
        self.epoch = epoch
        self.loss = loss
        self.state = state  #: None when the loss diverged, else what in the training state is not finite
