"""fastnn.sklearn's classifiers: what they share (labels of any hashable type, encoded as indices into
`classes_`; probabilities; partial fits that name every class first) and `MLPClassifier`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.base import ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from ._base import FastnnEstimator, LayersMixin, keep_params, unchanged_on_error

__all__ = ["FastnnClassifier", "MLPClassifier"]


class FastnnClassifier(ClassifierMixin, FastnnEstimator):
    """A classifier: labels of any hashable type, encoded as indices into `classes_`."""

    def _outputs(self) -> int:
        return int(self.classes_.size)

    def _validation_score(self, y_val: np.ndarray) -> Callable[[dict[str, Any]], float]:
        return lambda record: record["eval_accuracy"]  # the accuracy: scikit-learn's score for a classifier

    def _validate_xy(self, X: Any, y: Any, sample_weight: Any, reset: bool) -> tuple[np.ndarray, np.ndarray]:
        """(X float32, y) checked as scikit-learn does; rows of weight 0 dropped, the others' weights kept for
        this call's training (see `_weigh_rows`)."""
        X, y = validate_data(self, X, y, dtype=(np.float32, np.float64), reset=reset)
        try:
            check_classification_targets(y)
        except ValueError as exc:
            if "continuous" in str(exc):
                raise ValueError(f"{exc} continuous targets: use loss='mse' / MLPRegressor "
                                 f"(fastnn.sklearn.MLPRegressor)") from None  # fmt: skip
            raise
        X, y = self._weigh_rows(X, y, self._class_weighted(sample_weight, y))
        return X.astype(np.float32, copy=False), y

    def _class_weighted(self, sample_weight: Any, y: np.ndarray) -> Any:
        """`sample_weight` times each row's class weight (LogisticRegression's class_weight); here unchanged."""
        return sample_weight

    def _encode(self, y: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.classes_, y)
        idx = np.clip(idx, 0, len(self.classes_) - 1)
        unseen = self.classes_[idx] != y
        if unseen.any():
            raise ValueError(f"y holds labels not in classes_ {self.classes_!r}: {np.unique(y[unseen])[:5]!r}")
        return idx.astype(np.int32)

    @staticmethod
    def _classes(y: Any, what: str) -> np.ndarray:
        classes = np.unique(np.asarray(y))
        if classes.size < 2:
            raise ValueError(f"Classifier can't train when only one class is present: {what} holds {classes!r}")
        return classes

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> FastnnClassifier:
        """Train for up to `max_iter` epochs on (X, y) (from the fitted weights with warm_start); labels may be
        any hashable values. A fit refused before it trains (bad arguments, data `Trainer.fit` refuses) leaves the
        estimator as it was: the fitted model, or none."""
        with unchanged_on_error(self) as guard:
            self._check_params()
            warm = self.warm_start and hasattr(self, "trainer_")
            X, y = self._validate_xy(X, y, sample_weight, reset=not warm)
            classes = self._classes(y, "y")
            if warm and not np.array_equal(classes, self.classes_):
                raise ValueError(
                    f"warm_start can only be used where `y` has the same classes as in the previous call to fit. "
                    f"Previously got {self.classes_}, `y` has {classes}"
                )
            self.classes_ = classes
            y = self._encode(y)
            self._start(X)
            self._fit_new(X, y, guard)
        return self

    def partial_fit(self, X: Any, y: Any, classes: Any = None, sample_weight: Any = None) -> FastnnClassifier:
        """One more epoch on (X, y); the first call needs `classes` (every label that will ever appear). A call
        refused before it trains leaves the estimator as it was (a first one: no classes_, no trainer)."""
        if hasattr(self, "trainer_"):
            with unchanged_on_error(self) as guard:
                X, y = self._validate_xy(X, y, sample_weight, reset=False)
                if classes is not None and not np.array_equal(np.unique(np.asarray(classes)), self.classes_):
                    raise ValueError(f"classes={classes!r} differs from the first call's {self.classes_!r}")
                y = self._encode(y)
                self._continued(X.shape[0])
                self._fit_one_epoch(X, y, guard)
            return self
        with unchanged_on_error(self) as guard:
            self._check_params()
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit")
            X, y = self._validate_xy(X, y, sample_weight, reset=True)
            self.classes_ = self._classes(classes, "classes")
            y = self._encode(y)
            self._start(X)
            self._fit_one_epoch(X, y, guard)
        return self

    # ---- inference ----------------------------------------------------------------------------------------

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities, (n_samples, n_classes) float64, columns in the order of `classes_`."""
        check_is_fitted(self)
        return self.trainer_.predict_proba(self._validate(X, reset=False)).astype(np.float64)

    def predict_log_proba(self, X: Any) -> np.ndarray:
        """log of `predict_proba`."""
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    def predict(self, X: Any) -> np.ndarray:
        """The most probable label of each row, as the labels given to `fit`."""
        proba = self.predict_proba(X)
        return self.classes_[proba.argmax(axis=1)]


class MLPClassifier(LayersMixin, FastnnClassifier):
    """A multi-layer perceptron classifier trained by fastnn, with scikit-learn's `MLPClassifier` parameters.

    Args:
        hidden_layer_sizes: widths of the hidden layers; () is logistic regression.
        activation: "relu" or "gelu" (tanh form); scikit-learn's "identity", "logistic", "tanh" are refused.
        solver: "adam" (AdamW with `beta_1`, `beta_2`, `epsilon`) or "sgd" (with `momentum`, Nesterov if
            `nesterovs_momentum`); "lbfgs" is refused.
        alpha: weight decay (AdamW's decoupled decay, SGD's L2 decay) of the weights; the biases are not decayed
            (bias_decay=0), as scikit-learn penalises coefs_ only.
        batch_size: rows per step, or "auto" = min(200, n_samples) of each fit or partial_fit call.
        learning_rate: "constant"; "invscaling" (learning_rate_init / (samples seen + 1) ** power_t, updated
            each epoch); "adaptive" (divided by 5 where a plateau would stop training, until at most 1e-6).
        learning_rate_init: the initial learning rate. The default, 0.01, is ten times scikit-learn's: it
            converges on small data in tens of epochs (scikit-learn's 0.001 leaves load_digits unconverged
            after 50).
        power_t: the exponent of "invscaling".
        max_iter: the most epochs `fit` trains.
        shuffle: True (fastnn shuffles every epoch; False is refused).
        random_state: None, an int or a RandomState: keys the initial weights, the shuffle and the split.
        tol: stop when the training loss (or, with early_stopping, the validation accuracy) has not improved by
            more than tol for more than n_iter_no_change epochs in a row.
        n_iter_no_change: see tol.
        verbose: print one line per epoch.
        warm_start: `fit` starts from the weights of the previous fit (a new optimizer), same classes.
        early_stopping: hold out validation_fraction of the rows, stop on its accuracy, and end with the best
            epoch's weights.
        validation_fraction: see early_stopping.
        max_fun: accepted for scikit-learn's parameter set; it bounds "lbfgs" only, which fastnn refuses.
        device: as `fastnn.Trainer`: "auto", "cpu" or "cuda".
        precision: as `fastnn.Trainer`: "mixed", "fp16" or "fp32".
        engine: as `fastnn.Trainer`: "auto", "fused", "grid" or "graph".
    """

    def __init__(
        self,
        hidden_layer_sizes: Any = (100,),
        activation: str = "relu",
        *,
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
