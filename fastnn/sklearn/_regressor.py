"""fastnn.sklearn's regressor: `MLPRegressor`, trained on the mean squared error, one or several targets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.base import RegressorMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from .._data import check_targets
from ._base import FastnnEstimator, LayersMixin, keep_params, unchanged_on_error

__all__ = ["MLPRegressor"]


class MLPRegressor(LayersMixin, RegressorMixin, FastnnEstimator):
    """A multi-layer perceptron regressor trained by fastnn (`Trainer(loss="mse")`), with scikit-learn's
    `MLPRegressor` parameters (see `MLPClassifier` for their meaning here).

    Targets are (n_samples,) or (n_samples, k); `predict` returns (n_samples,) for one target, else
    (n_samples, k). With early_stopping, the validation score is R^2 (variance-weighted over several targets).

    Args:
        loss: "squared_error" (scikit-learn's "poisson" is refused).
    """

    _loss = "mse"

    def __init__(
        self,
        hidden_layer_sizes: Any = (100,),
        activation: str = "relu",
        *,
        loss: str = "squared_error",
        solver: str = "adam",
        alpha: float = 0.0001,
        batch_size: int | str = "auto",
        learning_rate: str = "constant",
        learning_rate_init: float = 0.01,
        power_t: float = 0.5,
        max_iter: int = 200,
        shuffle: bool = True,
        random_state: Any = None,
        tol: float = 1e-4,
        verbose: bool = False,
        warm_start: bool = False,
        momentum: float = 0.9,
        nesterovs_momentum: bool = True,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-8,
        n_iter_no_change: int = 10,
        max_fun: int = 15000,
        device: str = "auto",
        precision: str = "mixed",
        engine: str = "auto",
    ) -> None:
        keep_params(self, locals())

    def _hidden(self) -> Any:
        return self.hidden_layer_sizes

    def _activation(self) -> str:
        return self.activation

    def _check_params(self) -> None:
        if self.loss == "poisson":
            raise ValueError("loss='poisson' is not implemented: fastnn trains squared error only; "
                             "use loss='squared_error'")  # fmt: skip
        if self.loss != "squared_error":
            raise ValueError(f"loss must be 'squared_error', got {self.loss!r}")
        super()._check_params()

    def _outputs(self) -> int:
        return self.n_outputs_

    def _validation_score(self, y_val: np.ndarray) -> Callable[[dict[str, Any]], float]:
        spread = float(y_val.astype(np.float64).var(axis=0).mean())  # R^2 = 1 - MSE / mean target variance

        def r2(record: dict[str, Any]) -> float:
            if spread > 0:
                return 1.0 - record["eval_loss"] / spread
            return 1.0 if record["eval_loss"] == 0 else 0.0

        return r2

    def _validate_xy(self, X: Any, y: Any, sample_weight: Any, reset: bool) -> tuple[np.ndarray, np.ndarray]:
        """(X float32, y float32 (n, k)) checked as scikit-learn does; rows of weight 0 dropped."""
        X, y = validate_data(self, X, y, dtype=(np.float32, np.float64), multi_output=True, y_numeric=True,
                             reset=reset)  # fmt: skip
        y = np.asarray(y, dtype=np.float64)
        y = y.reshape(-1, 1) if y.ndim == 1 else y
        check_targets(y, X.shape[0], y.shape[1], "y")  # Trainer.fit's check, before the trainer is built
        X, y = self._weigh_rows(X, y, sample_weight)
        return X.astype(np.float32, copy=False), y

    def _check_outputs(self, y: np.ndarray) -> None:
        if y.shape[1] != self.n_outputs_:
            raise ValueError(f"y has {y.shape[1]} target(s) per row; this regressor was fitted on {self.n_outputs_}")

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> MLPRegressor:
        """Train for up to `max_iter` epochs on (X, y) (from the fitted weights with warm_start). A fit refused
        before it trains (bad arguments, data `Trainer.fit` refuses) leaves the estimator as it was."""
        with unchanged_on_error(self) as guard:
            self._check_params()
            warm = self.warm_start and hasattr(self, "trainer_")
            X, y = self._validate_xy(X, y, sample_weight, reset=not warm)
            if warm:
                self._check_outputs(y)
            self.n_outputs_ = y.shape[1]
            self._start(X)
            self._fit_new(X, y, guard)
        return self

    def partial_fit(self, X: Any, y: Any, sample_weight: Any = None) -> MLPRegressor:
        """One more epoch on (X, y). A call refused before it trains leaves the estimator as it was."""
        if hasattr(self, "trainer_"):
            with unchanged_on_error(self) as guard:
                X, y = self._validate_xy(X, y, sample_weight, reset=False)
                self._check_outputs(y)
                self._continued(X.shape[0])
                self._fit_one_epoch(X, y, guard)
            return self
        with unchanged_on_error(self) as guard:
            self._check_params()
            X, y = self._validate_xy(X, y, sample_weight, reset=True)
            self.n_outputs_ = y.shape[1]
            self._start(X)
            self._fit_one_epoch(X, y, guard)
        return self

    def __sklearn_tags__(self):  # noqa: D105
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # y of shape (n_samples, k) trains k outputs
        return tags

    def predict(self, X: Any) -> np.ndarray:
        """Predicted targets, float64: (n_samples,) for one target, else (n_samples, k)."""
        check_is_fitted(self)
        out = self.trainer_.predict(self._validate(X, reset=False)).astype(np.float64)
        return out.reshape(-1) if self.n_outputs_ == 1 else out
