"""scikit-learn estimators wrapping `fastnn.Trainer`: `MLPClassifier` and `LogisticRegression`.

They follow scikit-learn's conventions (parameters stored as given and checked in `fit`, `classes_`,
`n_features_in_`, any hashable labels, `predict_proba`, `score`, `partial_fit`) and use scikit-learn's
`MLPClassifier` names where the meaning is the same. Training is `Trainer`'s: the same engines, devices,
precisions and speed. Needs scikit-learn (`pip install "fastnn[sklearn]"`).

Differences from scikit-learn's `MLPClassifier`, by design:

- `activation` is "relu" or "gelu" (tanh form); `optimizer` ("adamw" or "sgd") replaces `solver`, with
  `alpha` as decoupled weight decay (AdamW) or L2 weight decay (SGD) rather than an L2 penalty in the loss.
- Inputs are used as float32 values as given (no /255 scaling of integer inputs); scale features yourself
  (for example with a `StandardScaler` in a `Pipeline`).
- `sample_weight` is accepted only when every weight is equal (the mean loss is then the same); other
  weights are refused with a ValueError: the loss kernels compute an unweighted mean.
- With `early_stopping`, the held-out rows are chosen by `Trainer.fit(validation_split=...)` (seeded, not
  stratified) and the weights of the best epoch (by validation accuracy) are restored at the end.
"""

from __future__ import annotations

import numbers
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np

try:
    from sklearn.base import BaseEstimator, ClassifierMixin
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.utils import check_random_state
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import check_is_fitted, validate_data
except ImportError as exc:  # pragma: no cover - exercised only without scikit-learn
    raise ImportError(
        'fastnn.sklearn needs scikit-learn >= 1.6: pip install "fastnn[sklearn]" (or pip install scikit-learn)'
    ) from exc

from .control import EarlyStopping
from .errors import DeviceUnavailable
from .model import MLP
from .optim import SGD, AdamW
from .trainer import Trainer

__all__ = ["MLPClassifier", "LogisticRegression"]

_OPTIMIZERS = ("adamw", "sgd")
_ACTIVATIONS = ("relu", "gelu")


class _FastnnClassifier(ClassifierMixin, BaseEstimator):
    """What both estimators share: parameter checks, label encoding, the Trainer, pickling."""

    _hidden_sizes: tuple[int, ...]  # set by _check_params

    # ---- parameters ---------------------------------------------------------------------------------------

    def _hidden(self) -> Any:
        return ()

    def _activation(self) -> str:
        return "relu"

    def _check_params(self) -> None:
        hidden = self._hidden()
        if isinstance(hidden, numbers.Integral) and not isinstance(hidden, bool):
            hidden = (hidden,)
        try:
            hidden = tuple(hidden)
        except TypeError:
            raise ValueError(f"hidden_layer_sizes must be an int or a sequence of ints, got {hidden!r}") from None
        if any(isinstance(h, bool) or not isinstance(h, numbers.Integral) or h < 1 for h in hidden):
            raise ValueError(f"hidden_layer_sizes must hold integers >= 1, got {self._hidden()!r}")
        self._hidden_sizes = tuple(int(h) for h in hidden)
        if self._activation() not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {self._activation()!r}")
        if self.optimizer not in _OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {_OPTIMIZERS}, got {self.optimizer!r}")
        for name in ("learning_rate_init", "alpha", "momentum", "tol", "validation_fraction"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not np.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.learning_rate_init <= 0:
            raise ValueError(f"learning_rate_init must be > 0, got {self.learning_rate_init!r}")
        if self.early_stopping and not 0 < self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction!r}")
        for name in ("max_iter", "n_iter_no_change"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        b = self.batch_size
        if b != "auto" and (isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1):
            raise ValueError(f"batch_size must be 'auto' or an integer >= 1, got {b!r}")

    def _optimizer(self) -> SGD | AdamW:
        if self.optimizer == "sgd":
            return SGD(
                lr=float(self.learning_rate_init),
                momentum=float(self.momentum),
                nesterov=bool(self.nesterovs_momentum) and self.momentum > 0,
                weight_decay=float(self.alpha),
            )
        return AdamW(lr=float(self.learning_rate_init), weight_decay=float(self.alpha))

    def _seed(self) -> int:
        return int(check_random_state(self.random_state).randint(0, 2**31 - 1))

    # ---- fitting ------------------------------------------------------------------------------------------

    def _validate(self, X: Any, reset: bool) -> np.ndarray:
        """X as float32 (n_samples, n_features_in_), through scikit-learn's checks."""
        return validate_data(self, X, dtype=(np.float32, np.float64), reset=reset).astype(np.float32, copy=False)

    def _validate_xy(self, X: Any, y: Any, sample_weight: Any, reset: bool) -> tuple[np.ndarray, np.ndarray]:
        """(X float32, y) checked as scikit-learn does; rows of weight 0 dropped (see `_keep_rows`)."""
        X, y = validate_data(self, X, y, dtype=(np.float32, np.float64), reset=reset)
        check_classification_targets(y)
        keep = self._keep_rows(sample_weight, X.shape[0])
        if keep is not None:
            X, y = X[keep], y[keep]
        return X.astype(np.float32, copy=False), y

    @staticmethod
    def _keep_rows(sample_weight: Any, n: int) -> np.ndarray | None:
        """Rows to train on under `sample_weight`: those of nonzero weight, which must all be equal (the loss is
        an unweighted mean, so equal weights change nothing and a zero weight drops the row); None = all."""
        if sample_weight is None:
            return None
        w = np.asarray(sample_weight, dtype=np.float64)
        if w.ndim == 0:
            w = np.full(n, float(w))
        if w.shape != (n,):
            raise ValueError(f"sample_weight.shape == {w.shape}, expected ({n},)")
        if not np.isfinite(w).all() or (w < 0).any():
            raise ValueError("sample_weight must hold finite values >= 0")
        keep = w > 0
        if not keep.any():
            raise ValueError("Sample weights must contain at least one non-zero number.")
        if not (w[keep] == w[keep][0]).all():
            raise ValueError(
                "fastnn trains on the unweighted mean loss: sample_weight is supported only when every nonzero weight "
                "is equal (zero drops a row); resample the rows (e.g. sklearn.utils.resample) or drop sample_weight"
            )
        return None if keep.all() else keep

    def _new_trainer(self, n_features: int, n_classes: int, n_samples: int) -> Trainer:
        batch = min(200, n_samples) if self.batch_size == "auto" else int(self.batch_size)
        model = MLP([n_features, *self._hidden_sizes, n_classes], activation=self._activation())
        return Trainer(
            model,
            self._optimizer(),
            batch_size=batch,
            precision=self.precision,
            device=self.device,
            seed=self._seed(),
            engine=self.engine,
        )

    def _encode(self, y: np.ndarray) -> np.ndarray:
        idx = np.searchsorted(self.classes_, y)
        idx = np.clip(idx, 0, len(self.classes_) - 1)
        unseen = self.classes_[idx] != y
        if unseen.any():
            raise ValueError(f"y holds labels not in classes_ {self.classes_!r}: {np.unique(y[unseen])[:5]!r}")
        return idx.astype(np.int32)

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> _FastnnClassifier:
        """Train a new network for up to `max_iter` epochs on (X, y); labels may be any hashable values."""
        self._check_params()
        X, y = self._validate_xy(X, y, sample_weight, reset=True)
        classes = np.unique(y)
        if classes.size < 2:
            raise ValueError(f"Classifier can't train when only one class is present: {classes!r}")
        self.classes_ = classes
        self.trainer_ = self._new_trainer(X.shape[1], classes.size, X.shape[0])
        self.loss_curve_: list[float] = []
        self.validation_scores_: list[float] | None = [] if self.early_stopping else None
        self.n_iter_ = 0
        self._train(X, self._encode(y), self.max_iter, full=True)
        return self

    def partial_fit(self, X: Any, y: Any, classes: Any = None, sample_weight: Any = None) -> _FastnnClassifier:
        """One more epoch on (X, y); the first call needs `classes` (every label that will ever appear)."""
        first = not hasattr(self, "classes_")
        if first:
            self._check_params()
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit")
        X, y = self._validate_xy(X, y, sample_weight, reset=first)
        if first:
            self.classes_ = np.unique(np.asarray(classes))
            if self.classes_.size < 2:
                raise ValueError(f"Classifier can't train when only one class is present: {self.classes_!r}")
            self.trainer_ = self._new_trainer(X.shape[1], self.classes_.size, X.shape[0])
            self.loss_curve_, self.validation_scores_, self.n_iter_ = [], None, 0
        elif classes is not None and not np.array_equal(np.unique(np.asarray(classes)), self.classes_):
            raise ValueError(f"classes={classes!r} differs from the first call's {self.classes_!r}")
        self._train(X, self._encode(y), 1, full=False)
        return self

    def _train(self, X: np.ndarray, y: np.ndarray, epochs: int, full: bool) -> None:
        """Train up to `epochs` epochs; in `fit`, stop as scikit-learn does (tol, n_iter_no_change)."""
        kwargs: dict[str, Any] = {"progress": bool(self.verbose)}
        stop: EarlyStopping | None = None
        if full and self.early_stopping:
            stop = EarlyStopping(patience=self.n_iter_no_change, min_delta=float(self.tol), monitor="eval_accuracy")
            kwargs.update(validation_split=float(self.validation_fraction), early_stopping=stop)
        elif full:
            kwargs["callbacks"] = [_LossPlateau(float(self.tol), self.n_iter_no_change)]
        history = self.trainer_.fit(X, y, epochs=epochs, **kwargs)
        records = list(history) + (list(stop.discarded) if stop is not None else [])
        self.n_iter_ += len(records)
        self.loss_curve_ += [r["train_loss"] for r in records]
        self.loss_ = self.loss_curve_[-1]
        if stop is not None:
            self.validation_scores_ = [r["eval_accuracy"] for r in records]
            self.best_validation_score_ = stop.best
        if not full:
            return
        stopped = stop.stopped_epoch is not None if stop is not None else kwargs["callbacks"][0].stopped
        if not stopped and len(records) == epochs:
            warnings.warn(
                f"{type(self).__name__}: max_iter={self.max_iter} epochs reached without convergence (tol={self.tol})",
                ConvergenceWarning,
                stacklevel=3,
            )

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

    # ---- pickling: the Trainer travels as a fastnn checkpoint -----------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())  # object.__getstate__ returns __dict__ itself: never pop from it
        trainer = state.pop("trainer_", None)
        if trainer is not None:
            with tempfile.TemporaryDirectory() as d:
                path = os.path.join(d, "trainer.npz")
                trainer.save(path)
                state["_trainer_checkpoint"] = Path(path).read_bytes()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        blob = state.pop("_trainer_checkpoint", None)
        super().__setstate__(state)
        if blob is None:
            return
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trainer.npz")
            Path(path).write_bytes(blob)
            try:
                self.trainer_ = Trainer.load(path, device=self.device, engine=self.engine)
            except DeviceUnavailable as exc:  # fitted on a GPU, unpickled where there is none
                warnings.warn(f"{exc}; the unpickled estimator runs on the CPU", RuntimeWarning, stacklevel=2)
                self.trainer_ = Trainer.load(path, device="cpu")

    def __sklearn_tags__(self):  # noqa: D105
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        return tags


class _LossPlateau:
    """scikit-learn's stopping rule without early stopping: the training loss has not improved by more
    than `tol` for `patience` epochs in a row."""

    def __init__(self, tol: float, patience: int) -> None:
        self.tol, self.patience, self.best, self.waited, self.stopped = tol, patience, np.inf, 0, False

    def __call__(self, record: dict[str, Any]) -> bool:
        loss = record["train_loss"]
        if loss < self.best - self.tol:
            self.waited = 0
        else:
            self.waited += 1
        self.best = min(self.best, loss)
        self.stopped = self.waited >= self.patience
        return self.stopped


class MLPClassifier(_FastnnClassifier):
    """A multi-layer perceptron classifier trained by fastnn (scikit-learn's `MLPClassifier` names).

    Args:
        hidden_layer_sizes: widths of the hidden layers; () is logistic regression.
        activation: "relu" or "gelu" (tanh form).
        optimizer: "adamw" (AdamW) or "sgd" (SGD with `momentum`, Nesterov if `nesterovs_momentum`).
        alpha: weight decay.
        batch_size: rows per step, or "auto" = min(200, n_samples).
        learning_rate_init: the (constant) learning rate.
        max_iter: the most epochs `fit` trains.
        random_state: None, an int or a RandomState: keys the initial weights, the shuffle and the split.
        tol: stop when the training loss (or, with early_stopping, the validation
            accuracy) has not improved by more than tol for n_iter_no_change epochs.
        n_iter_no_change: see tol.
        early_stopping: hold out validation_fraction of the rows, stop on its accuracy, and
            keep the best epoch's weights.
        validation_fraction: see early_stopping.
        verbose: print one line per epoch.
        device: as `fastnn.Trainer`: "auto", "cpu" or "cuda".
        precision: as `fastnn.Trainer`: "mixed", "fp16" or "fp32".
        engine: as `fastnn.Trainer`: "auto", "fused" or "graph".
    """

    def __init__(
        self,
        hidden_layer_sizes: Any = (100,),
        activation: str = "relu",
        *,
        optimizer: str = "adamw",
        alpha: float = 0.0001,
        batch_size: int | str = "auto",
        learning_rate_init: float = 0.001,
        max_iter: int = 200,
        random_state: Any = None,
        tol: float = 1e-4,
        momentum: float = 0.9,
        nesterovs_momentum: bool = True,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 10,
        verbose: bool = False,
        device: str = "auto",
        precision: str = "mixed",
        engine: str = "auto",
    ) -> None:
        self.hidden_layer_sizes = hidden_layer_sizes
        self.activation = activation
        self.optimizer = optimizer
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate_init = learning_rate_init
        self.max_iter = max_iter
        self.random_state = random_state
        self.tol = tol
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.verbose = verbose
        self.device = device
        self.precision = precision
        self.engine = engine

    def _hidden(self) -> Any:
        return self.hidden_layer_sizes

    def _activation(self) -> str:
        return self.activation


class LogisticRegression(_FastnnClassifier):
    """Multinomial logistic regression trained by fastnn: `MLPClassifier` with no hidden layer.

    The parameters are `MLPClassifier`'s (not scikit-learn `LogisticRegression`'s `C`/`solver`): the model is
    trained by minibatch AdamW or SGD with `alpha` as weight decay.
    """

    def __init__(
        self,
        *,
        optimizer: str = "adamw",
        alpha: float = 0.0001,
        batch_size: int | str = "auto",
        learning_rate_init: float = 0.001,
        max_iter: int = 200,
        random_state: Any = None,
        tol: float = 1e-4,
        momentum: float = 0.9,
        nesterovs_momentum: bool = True,
        early_stopping: bool = False,
        validation_fraction: float = 0.1,
        n_iter_no_change: int = 10,
        verbose: bool = False,
        device: str = "auto",
        precision: str = "mixed",
        engine: str = "auto",
    ) -> None:
        self.optimizer = optimizer
        self.alpha = alpha
        self.batch_size = batch_size
        self.learning_rate_init = learning_rate_init
        self.max_iter = max_iter
        self.random_state = random_state
        self.tol = tol
        self.momentum = momentum
        self.nesterovs_momentum = nesterovs_momentum
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.verbose = verbose
        self.device = device
        self.precision = precision
        self.engine = engine
