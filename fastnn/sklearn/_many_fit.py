"""One group of a search's fits trained as one `MultiTrainer`: each model stops as its own `fit` would
(scikit-learn's tol / n_iter_no_change on the training loss, or max_iter), and its outputs on the rows it is
scored on are taken at that epoch."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from ._base import Plateau
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

    def stop(k: int, record: dict[str, Any]) -> bool:
        """The estimator's own rule (`_fit_new`): a plateau of the training loss converges; max_iter ends."""
        if plateaus[k](record):
            converged[k] = True
            return True
        return record["epoch"] >= models[k].max_iter

    try:
        mt.fit(x, y, epochs=max(m.max_iter for m in models), masks=masks, callbacks=[stop])
        outputs = _outputs(mt, x_score)  # each model's weights are those of the epoch it stopped after
        results = [
            ModelResult(m.pair, None, mt.divergences[k], int(mt.epochs[k]), False) if mt.diverged[k]
            else ModelResult(m.pair, outputs[k][score_rows[k]], None, int(mt.epochs[k]), converged[k])
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
