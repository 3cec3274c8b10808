"""One group of a search's fits trained as one `MultiTrainer`: each model follows its own `fit`'s rules (its rate
rule between epochs, through `MultiTrainer.set_lr`; scikit-learn's tol / n_iter_no_change on the training loss,
LogisticRegression's exact objective at each plateau, or max_iter), and its outputs on the rows it is scored on
are taken at the epoch it stopped after."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from ..engine.base import steps_per_epoch
from ._base import Plateau, Rate, at_plateau
from ._logistic import objective
from ._plan import Group

__all__ = ["GroupResult", "ModelResult", "train_group"]

#: Outputs are computed in chunks of rows whose widest layer holds at most this many floats over all models (a
#: bound on the memory inference takes: 256 MiB).
_FORWARD_FLOATS = 2**26


@dataclasses.dataclass
class ModelResult:
    """What scoring needs of one trained model."""

    pair: int
    outputs: np.ndarray | None  #: (rows asked for, outputs) float32: probabilities, or a regression's values
    error: BaseException | None  #: what its own fit would have raised (TrainingDiverged), or None
    n_iter: int
    converged: bool
    why: str = ""  #: why it did not converge (the ConvergenceWarning's words, as its own fit's)


@dataclasses.dataclass
class GroupResult:
    models: list[ModelResult]
    seconds: float  #: the group's training and inference time
    device: str


def train_group(group: Group, x: np.ndarray, y: np.ndarray, x_score: np.ndarray, score_rows: list[np.ndarray],
                ordinal: int | None = None) -> GroupResult:  # fmt: skip
    """Train `group` on (x, y) (float32; y encoded for the group: class indices or float targets; model k on rows
    `models[k].rows` of them) and return each model's outputs on rows `score_rows[k]` of `x_score`. `ordinal`: the
    GPU of this process to train on (None: the estimator's device as it resolves)."""
    from .. import MultiTrainer

    start = time.perf_counter()
    models = group.models
    count = len(models)
    masks = None
    if group.masked:
        masks = np.zeros((count, x.shape[0]), dtype=bool)
        for k, m in enumerate(models):
            masks[k, m.rows] = True
    hparams = {name: [m.hparams[name] for m in models] for name in models[0].hparams}
    shuffle = group.shuffle_seed
    if shuffle is None:  # random_state=None: a fresh draw, as each fit of its own would make
        shuffle = int(np.random.randint(0, 2**31 - 1))
    devices = 1 if ordinal is None else [ordinal]
    mt = MultiTrainer(group.model, group.optimizer, seeds=[m.seed for m in models], shuffle_seed=shuffle,
                      batch_size=group.batch_size, precision=group.precision, device=group.device, loss=group.loss,
                      devices=devices, **hparams)  # fmt: skip
    plateaus = [Plateau(m.tol, m.patience) for m in models]
    converged = [False] * count
    whys = [f"max_iter={m.max_iter} epochs reached" for m in models]
    rates = [Rate(m.learning_rate, m.hparams["lr"], m.power_t) for m in models]
    objectives: list[float | None] = [None] * count  # LogisticRegression's objective at each one's last plateau
    for k, m in enumerate(models):  # a fresh fit's: no samples seen before its first step
        rates[k].begin(0, 0, m.rows.size, steps_per_epoch(m.rows.size, group.batch_size, False))

    def verdict(k: int) -> bool | None:
        """The estimator's `_at_plateau`: None for the MLPs (the plateau is the rule); LogisticRegression's
        converged once its exact objective over its rows changed by at most tol times its value since its last
        plateau."""
        m = models[k]
        if m.objective_tol is None:
            return None
        value = objective(mt.state_dict(k), mt.optimizers[k], x[m.rows], y[m.rows])
        before, objectives[k] = objectives[k], value
        return before is not None and abs(before - value) <= m.objective_tol * value

    def stop(k: int, record: dict[str, Any]) -> bool:
        """The estimator's own rules (`_fit_new`): at a plateau of the training loss, converge, stop, or go on at
        a divided rate ("adaptive"); max_iter ends; "invscaling" rescales the rate for the next epoch."""
        plateau, rate = plateaus[k], rates[k]
        if plateau(record):
            done, converged[k], why = at_plateau(rate.kind, rate, models[k].divisor, verdict(k))
            if done:
                whys[k] = why or whys[k]
                return True
            plateau.count, plateau.triggered = 0, False
        if record["epoch"] >= models[k].max_iter:
            return True
        lr = rate(int(mt.steps[k]))
        if lr != mt.optimizers[k].lr:
            mt.set_lr(k, lr)
        return False

    try:
        mt.fit(x, y, epochs=max(m.max_iter for m in models), masks=masks, callbacks=[stop])
        outputs = _outputs(mt, x_score)  # each model's weights are those of the epoch it stopped after
        results = [
            ModelResult(m.pair, None, mt.divergences[k], int(mt.epochs[k]), False) if mt.diverged[k]
            else ModelResult(m.pair, outputs[k][score_rows[k]], None, int(mt.epochs[k]), converged[k], whys[k])
            for k, m in enumerate(models)
        ]  # fmt: skip
        device = mt.device
    finally:
        mt.close()
    return GroupResult(results, time.perf_counter() - start, device)


def _outputs(mt: Any, X: np.ndarray) -> np.ndarray:
    """Every model's outputs on every row of X, (K, N, outputs) float32, computed in chunks of rows."""
    count, n = mt.models, X.shape[0]
    width = max(mt.model.sizes[1:])  # the widest activations every model holds for a chunk of rows
    step = max(1, _FORWARD_FLOATS // max(1, count * width))
    if step >= n:
        return mt.forward(X)
    return np.concatenate([mt.forward(X[i : i + step]) for i in range(0, n, step)], axis=1)
