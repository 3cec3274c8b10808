"""A trained model of a many-model fit as scikit-learn's scorers see a fitted estimator: its predictions on the
rows it is scored on, computed once for the whole group. Only those rows can be predicted."""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin

__all__ = ["frozen"]


class _Frozen(BaseEstimator):
    """Predictions for one array (the fold's test or training rows, bound by identity)."""

    def __init__(self) -> None:
        self._x: Any = None
        self._out: np.ndarray | None = None

    def bind(self, x: Any, outputs: np.ndarray) -> _Frozen:
        self._x, self._out = x, outputs
        return self

    def _outputs(self, x: Any) -> np.ndarray:
        if x is not self._x:
            raise ValueError(
                "a model of fastnn's batched search predicts only the rows it is scored on (its fold's test or "
                "training rows); a scorer asked for other rows. Use scikit-learn's GridSearchCV for such a scorer"
            )
        return self._out


class _FrozenClassifier(ClassifierMixin, _Frozen):
    classes_: np.ndarray

    def predict_proba(self, X: Any) -> np.ndarray:
        return self._outputs(X).astype(np.float64)

    def predict_log_proba(self, X: Any) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def predict(self, X: Any) -> np.ndarray:
        return self.classes_[self._outputs(X).argmax(axis=1)]


class _FrozenRegressor(RegressorMixin, _Frozen):
    def predict(self, X: Any) -> np.ndarray:
        out = self._outputs(X).astype(np.float64)
        return out.reshape(-1) if out.shape[1] == 1 else out


def frozen(classes: np.ndarray | None) -> _Frozen:
    """An unbound stand-in: a classifier of `classes`, or a regressor (None)."""
    if classes is None:
        return _FrozenRegressor()
    est = _FrozenClassifier()
    est.classes_ = classes
    return est
