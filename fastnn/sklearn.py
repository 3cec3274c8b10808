"""scikit-learn estimators wrapping `fastnn.Trainer`: `MLPClassifier`, `MLPRegressor` and `LogisticRegression`.

They follow scikit-learn's conventions (parameters stored as given and checked in `fit`, `classes_`,
`n_features_in_`, any hashable labels, `predict_proba`, `score`, `partial_fit`, `warm_start`) and take
scikit-learn's parameter names where the meaning carries over, so that
`fastnn.sklearn.MLPClassifier(**sklearn.neural_network.MLPClassifier().get_params())` works. A value fastnn
cannot honour is refused at `fit` with the reason (a ValueError), never ignored. Training is `Trainer`'s: the
same engines, devices, precisions and speed. Needs scikit-learn (`pip install "fastnn-cuda[sklearn]"`).

Differences from scikit-learn's estimators, by design:

- `activation` is "relu" or "gelu" (tanh form); `solver` is "adam" (AdamW: `alpha` is its decoupled weight
  decay) or "sgd" (`alpha` is L2 weight decay on the mean loss), biases included, rather than scikit-learn's
  penalty alpha / (2 * batch rows) * ||W||^2 in the loss; "lbfgs" is refused.
- `learning_rate` ("constant", "invscaling", "adaptive") applies to either solver (scikit-learn: "sgd" only).
- Inputs are used as float32 values as given (no /255 scaling of integer inputs); scale features yourself
  (for example with a `StandardScaler` in a `Pipeline`).
- `sample_weight` is accepted only when every weight is equal (the mean loss is then the same); other
  weights are refused with a ValueError: the loss kernels compute an unweighted mean.
- With `early_stopping`, the held-out rows are those `Trainer(validation_split=...)` holds out (seeded, not
  stratified).
- `MLPRegressor`'s `loss_curve_` is the mean squared error (scikit-learn's is half of it); with several
  outputs its validation score is the variance-weighted R^2.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import os
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

try:
    from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.utils import check_random_state
    from sklearn.utils.multiclass import check_classification_targets
    from sklearn.utils.validation import check_is_fitted, validate_data
except ImportError as exc:  # pragma: no cover - exercised only without scikit-learn
    raise ImportError(
        'fastnn.sklearn needs scikit-learn >= 1.6: pip install "fastnn-cuda[sklearn]" (or pip install scikit-learn)'
    ) from exc

from ._control import split_indices
from ._errors import DeviceUnavailable
from ._model import MLP
from ._optim import SGD, AdamW
from ._trainer import Trainer
from .engine.base import steps_per_epoch

__all__ = ["LogisticRegression", "MLPClassifier", "MLPRegressor"]

_SOLVERS = ("adam", "sgd")
_ACTIVATIONS = ("relu", "gelu")
_LEARNING_RATES = ("constant", "invscaling", "adaptive")
#: "adaptive" stops at a plateau once the rate is at most this, as scikit-learn's SGD optimizer does.
_ADAPTIVE_MIN_LR = 1e-6


def _auto_batch(batch_size: Any, n: int) -> int:
    """scikit-learn's batch_size: "auto" is min(200, n) for the rows of this call; an integer is used as given."""
    return min(200, n) if batch_size == "auto" else int(batch_size)


class _Rate:
    """scikit-learn's `learning_rate` rule as a fastnn schedule (global step -> rate).

    `lr` is the current base rate ("adaptive" divides it by 5 at each plateau); "invscaling" divides it by
    (samples seen + 1) ** power_t, the samples seen before each epoch (scikit-learn's `t_`), which `begin`
    describes for the fit call about to train: its first step, the samples seen before it, its rows per epoch
    and steps per epoch."""

    def __init__(self, kind: str, lr: float, power_t: float) -> None:
        self.kind, self.lr, self.power_t = kind, lr, power_t
        self.step0, self.seen0, self.rows, self.steps = 0, 0, 1, 1

    def begin(self, step0: int, seen0: int, rows: int, steps: int) -> None:
        self.step0, self.seen0, self.rows, self.steps = step0, seen0, rows, steps

    def __call__(self, step: int) -> float:
        if self.kind != "invscaling":
            return self.lr
        seen = self.seen0 + (step - self.step0) // self.steps * self.rows
        return self.lr / (seen + 1) ** self.power_t


class _Plateau:
    """scikit-learn's stopping rule, as a fit callback: an epoch that does not improve the training loss by more
    than `tol` (or, with a validation `score`, the best score by at least `tol`) counts; more than `patience` in
    a row stop (`triggered`). With a score, `best_state` holds the parameters of the best epoch so far."""

    def __init__(self, tol: float, patience: float, score: Callable[[dict[str, Any]], float] | None = None) -> None:
        self.tol, self.patience, self.score = tol, patience, score
        self.best_loss, self.best_score, self.count, self.triggered = math.inf, -math.inf, 0, False
        self.scores: list[float] = []
        self.best_state: dict[str, np.ndarray] | None = None
        self.trainer: Trainer | None = None  # set while a fit with a score runs, for best_state

    def __call__(self, record: dict[str, Any]) -> bool:
        if self.score is None:
            loss = record["train_loss"]
            self.count = self.count + 1 if not loss < self.best_loss - self.tol else 0
            self.best_loss = min(self.best_loss, loss)
        else:
            score = self.score(record)
            self.scores.append(score)
            self.count = self.count + 1 if not score >= self.best_score + self.tol else 0  # NaN never improves
            if score > self.best_score:
                self.best_score = score
                if self.trainer is not None:
                    self.best_state = self.trainer.state_dict()
        self.triggered = self.count > self.patience
        return self.triggered


def _keep_params(est: BaseEstimator, params: dict[str, Any]) -> None:
    """Store `__init__`'s arguments as given, unchecked (scikit-learn's rule: `fit` checks them)."""
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(est, name, value)


@contextlib.contextmanager
def _unchanged_on_error(est: BaseEstimator) -> Iterator[None]:
    """Run the block; if it raises, give `est` back every attribute it had before (a trainer made in the block is
    closed), so a failed first `partial_fit` leaves nothing half set and the corrected call works."""
    before = dict(est.__dict__)
    try:
        yield
    except BaseException:
        made = est.__dict__.get("trainer_")
        if made is not None and made is not before.get("trainer_"):
            made.close()
        est.__dict__.clear()
        est.__dict__.update(before)
        raise


class _FastnnEstimator(BaseEstimator):
    """What the estimators share: parameter checks, the Trainer, scikit-learn's stopping and rate rules,
    warm starts, pickling. Subclasses say how targets are checked and encoded and what the loss is."""

    _loss = "cross_entropy"
    _hidden_sizes: tuple[int, ...]  # set by _check_params

    # ---- parameters ---------------------------------------------------------------------------------------

    def _hidden(self) -> Any:
        return ()

    def _activation(self) -> str:
        return "relu"

    def _decay(self, n_samples: int) -> float:
        """The optimizer's weight decay for a fit on `n_samples` rows."""
        return float(self.alpha)

    def _check_params(self) -> None:
        """Every parameter's value, or a ValueError naming it (ConfigError is a ValueError too)."""
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
        if self._activation() in ("identity", "logistic", "tanh"):
            raise ValueError(
                f"activation={self._activation()!r} is not implemented: fastnn's kernels fuse 'relu' and 'gelu' "
                f"(its tanh form) into the matrix products; use one of {_ACTIVATIONS}"
            )
        if self._activation() not in _ACTIVATIONS:
            raise ValueError(f"activation must be one of {_ACTIVATIONS}, got {self._activation()!r}")
        if self.solver == "lbfgs":
            raise ValueError(
                "solver='lbfgs' is not implemented: fastnn trains by minibatch gradient steps (one CUDA graph or "
                "kernel per epoch on a GPU), and L-BFGS is a full-batch quasi-Newton method; use 'adam' or 'sgd'"
            )
        if self.solver not in _SOLVERS:
            raise ValueError(f"solver must be one of {_SOLVERS}, got {self.solver!r}")
        if self.learning_rate not in _LEARNING_RATES:
            raise ValueError(f"learning_rate must be one of {_LEARNING_RATES}, got {self.learning_rate!r}")
        for name in ("learning_rate_init", "alpha", "momentum", "tol", "validation_fraction", "power_t"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not np.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.learning_rate_init <= 0:
            raise ValueError(f"learning_rate_init must be > 0, got {self.learning_rate_init!r}")
        if self.early_stopping and not 0 < self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction!r}")
        for name in ("max_iter", "max_fun"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        v = self.n_iter_no_change
        if v != math.inf and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1):
            raise ValueError(f"n_iter_no_change must be an integer >= 1 or numpy.inf, got {v!r}")
        b = self.batch_size
        if b != "auto" and (isinstance(b, bool) or not isinstance(b, numbers.Integral) or b < 1):
            raise ValueError(f"batch_size must be 'auto' or an integer >= 1, got {b!r}")
        if self.shuffle is not True and not (isinstance(self.shuffle, np.bool_) and self.shuffle):
            raise ValueError(
                f"shuffle={self.shuffle!r} is not implemented: fastnn draws a new order of the rows every epoch "
                f"(the GPU gathers each batch through a seeded permutation); pass shuffle=True"
            )
        for name in ("warm_start", "nesterovs_momentum", "early_stopping"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")

    def _optimizer(self, n_samples: int) -> SGD | AdamW:
        if self.solver == "sgd":
            return SGD(
                lr=float(self.learning_rate_init),
                momentum=float(self.momentum),
                nesterov=bool(self.nesterovs_momentum) and self.momentum > 0,
                weight_decay=self._decay(n_samples),
            )
        return AdamW(
            lr=float(self.learning_rate_init),
            betas=(self.beta_1, self.beta_2),
            eps=self.epsilon,
            weight_decay=self._decay(n_samples),
        )

    def _seed(self) -> int:
        return int(check_random_state(self.random_state).randint(0, 2**31 - 1))

    # ---- targets (subclasses) -----------------------------------------------------------------------------

    def _outputs(self) -> int:
        """The network's outputs for the targets seen at the first fit."""
        raise NotImplementedError

    def _validation_score(self, y_val: np.ndarray) -> Callable[[dict[str, Any]], float]:
        """record -> the validation score scikit-learn stops on, for encoded validation targets `y_val`."""
        raise NotImplementedError

    # ---- fitting ------------------------------------------------------------------------------------------

    def _validate(self, X: Any, reset: bool) -> np.ndarray:
        """X as float32 (n_samples, n_features_in_), through scikit-learn's checks."""
        return validate_data(self, X, dtype=(np.float32, np.float64), reset=reset).astype(np.float32, copy=False)

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

    def _new_trainer(self, n_features: int, n_samples: int, schedule: _Rate) -> Trainer:
        model = MLP([n_features, *self._hidden_sizes, self._outputs()], activation=self._activation())
        return Trainer(
            model,
            self._optimizer(n_samples),
            batch_size=_auto_batch(self.batch_size, n_samples),
            precision=self.precision,
            device=self.device,
            seed=self._seed(),
            engine=self.engine,
            schedule=schedule,
            loss=self._loss,
        )

    def _start(self, X: np.ndarray) -> None:
        """A new trainer for a fit (or a first partial_fit) on X, replacing (and closing) the fitted one; with
        warm_start, it starts from the fitted weights (scikit-learn keeps them and starts a new optimizer, as
        this does)."""
        rate = _Rate(self.learning_rate, float(self.learning_rate_init), float(self.power_t))
        old = getattr(self, "trainer_", None)
        warm = old is not None and self.warm_start
        trainer = self._new_trainer(X.shape[1], X.shape[0], rate)
        if warm:
            if old.model != trainer.model:
                trainer.close()
                raise ValueError(
                    f"warm_start=True needs the network fitted before, {list(old.model.sizes)}, but the parameters "
                    f"and data now make {list(trainer.model.sizes)}: pass warm_start=False to start afresh"
                )
            trainer.load_state_dict(old.state_dict())
        if old is not None:
            old.close()
        self.trainer_, self._rate_ = trainer, rate
        if not warm or not hasattr(self, "loss_curve_"):
            self.loss_curve_: list[float] = []
            self.t_ = 0
        self.n_iter_ = 0
        self._plateau_ = _Plateau(float(self.tol), self.n_iter_no_change)

    def _rebatched(self, n_samples: int) -> None:
        """partial_fit with batch_size="auto" takes min(200, n) of each call's rows, as scikit-learn does: the
        trainer continues (weights, optimizer state, counters) at the new batch size when it changes."""
        batch = _auto_batch(self.batch_size, n_samples)
        trainer = self.trainer_
        if batch == trainer.config.batch_size:
            return
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trainer.npz")
            trainer.save(path)
            engine = trainer.engine if trainer.device == "cuda" else "auto"  # the engine that trained: the same
            self.trainer_ = Trainer.load(path, device=trainer.device, engine=engine, schedule=self._rate_,
                                         batch_size=batch)  # fmt: skip
        trainer.close()

    def _fit_new(self, X: np.ndarray, y: np.ndarray) -> None:
        """`fit`'s training: up to max_iter epochs, stopping as scikit-learn does (tol, n_iter_no_change; with
        early_stopping on a held-out score, ending with the best epoch's weights); "adaptive" divides the rate
        by 5 at each plateau instead of stopping, until it is at most 1e-6."""
        trainer, plateau, rate = self.trainer_, self._plateau_, self._rate_
        eval_data = None
        if self.early_stopping:
            train, val = split_indices(X.shape[0], float(self.validation_fraction), trainer.config.seed)
            X, y, eval_data = X[train], y[train], (X[val], y[val])
            plateau.score, plateau.trainer = self._validation_score(eval_data[1]), trainer
        steps = steps_per_epoch(X.shape[0], trainer.config.batch_size, trainer.config.drop_last)
        left, converged = int(self.max_iter), False
        try:
            while left > 0:
                rate.begin(trainer.step, self.t_, X.shape[0], steps)
                history = trainer.fit(X, y, epochs=left, eval_data=eval_data, callbacks=[plateau],
                                      progress=bool(self.verbose))  # fmt: skip
                self._record(history, X.shape[0])
                left -= len(history)
                if not plateau.triggered:
                    break
                if self.learning_rate != "adaptive" or rate.lr <= _ADAPTIVE_MIN_LR:
                    converged = True
                    break
                rate.lr /= 5.0
                plateau.count, plateau.triggered = 0, False
        finally:
            plateau.trainer = plateau.score = None  # this fit's: the estimator pickles without them
        if self.early_stopping:
            self.validation_scores_ = list(plateau.scores)
            self.best_validation_score_ = plateau.best_score
            self.best_loss_ = None
            if plateau.best_state is not None:
                trainer.load_state_dict(plateau.best_state)  # scikit-learn ends with the best epoch's weights
            plateau.best_state = None
        else:
            self.validation_scores_ = None
            self.best_validation_score_ = None
            self.best_loss_ = plateau.best_loss
        if not converged:
            warnings.warn(
                f"{type(self).__name__}: max_iter={self.max_iter} epochs reached without convergence (tol={self.tol})",
                ConvergenceWarning,
                stacklevel=3,
            )

    def _fit_one_epoch(self, X: np.ndarray, y: np.ndarray) -> None:
        """`partial_fit`'s training: one epoch; the stopping count goes on across calls, and with "adaptive" a
        plateau divides the rate by 5 (scikit-learn's partial_fit does neither early stopping nor stopping)."""
        trainer, plateau, rate = self.trainer_, self._plateau_, self._rate_
        rate.begin(trainer.step, self.t_, X.shape[0], steps_per_epoch(X.shape[0], trainer.config.batch_size, False))
        history = trainer.fit(X, y, epochs=1, progress=bool(self.verbose))
        self._record(history, X.shape[0])
        for record in history:
            plateau(record)
        if plateau.triggered and self.learning_rate == "adaptive" and rate.lr > _ADAPTIVE_MIN_LR:
            rate.lr /= 5.0
            plateau.count, plateau.triggered = 0, False
        self.best_loss_ = plateau.best_loss

    def _record(self, history: Any, rows: int) -> None:
        """scikit-learn's counters after epochs of `rows` rows: n_iter_, t_, loss_curve_, loss_."""
        self.n_iter_ += len(history)
        self.t_ += rows * len(history)
        self.loss_curve_ += [r["train_loss"] for r in history]
        if self.loss_curve_:
            self.loss_ = self.loss_curve_[-1]

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
        schedule = state.get("_rate_")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trainer.npz")
            Path(path).write_bytes(blob)
            try:
                self.trainer_ = Trainer.load(path, device=self.device, engine=self.engine, schedule=schedule)
            except DeviceUnavailable as exc:  # fitted on a GPU, unpickled where there is none
                warnings.warn(f"{exc}; the unpickled estimator runs on the CPU", RuntimeWarning, stacklevel=2)
                self.trainer_ = Trainer.load(path, device="cpu", schedule=schedule)

    def __sklearn_tags__(self):  # noqa: D105
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        return tags


class _FastnnClassifier(ClassifierMixin, _FastnnEstimator):
    """A classifier: labels of any hashable type, encoded as indices into `classes_`."""

    def _outputs(self) -> int:
        return int(self.classes_.size)

    def _validation_score(self, y_val: np.ndarray) -> Callable[[dict[str, Any]], float]:
        return lambda record: record["eval_accuracy"]  # the accuracy: scikit-learn's score for a classifier

    def _validate_xy(self, X: Any, y: Any, sample_weight: Any, reset: bool) -> tuple[np.ndarray, np.ndarray]:
        """(X float32, y) checked as scikit-learn does; rows of weight 0 dropped (see `_keep_rows`)."""
        X, y = validate_data(self, X, y, dtype=(np.float32, np.float64), reset=reset)
        try:
            check_classification_targets(y)
        except ValueError as exc:
            if "continuous" in str(exc):
                raise ValueError(f"{exc} continuous targets: use loss='mse' / MLPRegressor "
                                 f"(fastnn.sklearn.MLPRegressor)") from None  # fmt: skip
            raise
        keep = self._keep_rows(sample_weight, X.shape[0])
        if keep is not None:
            X, y = X[keep], y[keep]
        return X.astype(np.float32, copy=False), y

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

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> _FastnnClassifier:
        """Train for up to `max_iter` epochs on (X, y) (from the fitted weights with warm_start); labels may be
        any hashable values. Bad arguments leave the estimator as it was."""
        with _unchanged_on_error(self):
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
        self._fit_new(X, y)
        return self

    def partial_fit(self, X: Any, y: Any, classes: Any = None, sample_weight: Any = None) -> _FastnnClassifier:
        """One more epoch on (X, y); the first call needs `classes` (every label that will ever appear). A first
        call that fails leaves the estimator as it was (no classes_, no trainer)."""
        if hasattr(self, "trainer_"):
            X, y = self._validate_xy(X, y, sample_weight, reset=False)
            if classes is not None and not np.array_equal(np.unique(np.asarray(classes)), self.classes_):
                raise ValueError(f"classes={classes!r} differs from the first call's {self.classes_!r}")
            y = self._encode(y)
            self._rebatched(X.shape[0])
            self._fit_one_epoch(X, y)
            return self
        with _unchanged_on_error(self):
            self._check_params()
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit")
            X, y = self._validate_xy(X, y, sample_weight, reset=True)
            self.classes_ = self._classes(classes, "classes")
            y = self._encode(y)
            self._start(X)
            self._fit_one_epoch(X, y)
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


class MLPClassifier(_FastnnClassifier):
    """A multi-layer perceptron classifier trained by fastnn, with scikit-learn's `MLPClassifier` parameters.

    Args:
        hidden_layer_sizes: widths of the hidden layers; () is logistic regression.
        activation: "relu" or "gelu" (tanh form); scikit-learn's "identity", "logistic", "tanh" are refused.
        solver: "adam" (AdamW with `beta_1`, `beta_2`, `epsilon`) or "sgd" (with `momentum`, Nesterov if
            `nesterovs_momentum`); "lbfgs" is refused.
        alpha: weight decay (AdamW's decoupled decay, SGD's L2 decay), biases included.
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
        engine: as `fastnn.Trainer`: "auto", "fused" or "graph".
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
        _keep_params(self, locals())

    def _hidden(self) -> Any:
        return self.hidden_layer_sizes

    def _activation(self) -> str:
        return self.activation


class LogisticRegression(_FastnnClassifier):
    """Multinomial logistic regression trained by fastnn: a network with no hidden layer.

    It takes scikit-learn `LogisticRegression`'s `C`, `penalty` and `fit_intercept`, and `MLPClassifier`'s
    training parameters (see there). The L2 penalty ||W||^2 / (2 C) on the summed loss is SGD weight decay
    1 / (C * n_samples) on the mean loss, so with solver="sgd" (the default) training goes to the optimum
    scikit-learn's solvers find (the bias is decayed too); with solver="adam" it is AdamW's decoupled decay, a
    different regulariser of the same strength. scikit-learn's solvers ("lbfgs", "newton-cg", "liblinear",
    "sag", "saga", ...) are refused: fastnn trains by minibatch gradient steps.

    Args:
        penalty: "l2" or None (no penalty, as C=numpy.inf).
        C: the inverse of the penalty's strength, > 0.
        fit_intercept: True (every fastnn layer has a bias; False is refused).
    """

    def __init__(
        self,
        *,
        penalty: str | None = "l2",
        C: float = 1.0,
        fit_intercept: bool = True,
        solver: str = "sgd",
        batch_size: int | str = "auto",
        learning_rate: str = "constant",
        learning_rate_init: float = 0.5,
        power_t: float = 0.5,
        max_iter: int = 100,
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
        device: str = "auto",
        precision: str = "mixed",
        engine: str = "auto",
    ) -> None:
        _keep_params(self, locals())

    # Parameters of MLPClassifier's that logistic regression does not take: their one meaning here.
    alpha = 0.0
    max_fun = 15000

    def _check_params(self) -> None:
        if self.solver in ("lbfgs", "liblinear", "newton-cg", "newton-cholesky", "sag", "saga"):
            raise ValueError(
                f"solver={self.solver!r} is not implemented: fastnn trains by minibatch gradient steps on the GPU; "
                f"use 'sgd' (the default: with C it reaches the same optimum) or 'adam'"
            )
        if self.penalty not in ("l2", None):
            raise ValueError(
                f"penalty={self.penalty!r} is not implemented: fastnn's optimizers decay weights (L2); use 'l2' or "
                f"None" + (" (an L1 penalty needs a proximal solver)" if self.penalty in ("l1", "elasticnet") else "")
            )
        c = self.C
        if isinstance(c, bool) or not isinstance(c, numbers.Real) or not c > 0:
            raise ValueError(f"C must be a number > 0 (numpy.inf: no penalty), got {c!r}")
        if self.fit_intercept is not True and not (isinstance(self.fit_intercept, np.bool_) and self.fit_intercept):
            raise ValueError(
                f"fit_intercept={self.fit_intercept!r} is not implemented: every fastnn layer has a bias; "
                f"pass fit_intercept=True"
            )
        super()._check_params()

    def _decay(self, n_samples: int) -> float:
        """The L2 penalty ||W||^2 / (2 C) on the summed loss, as weight decay on the mean loss."""
        if self.penalty is None or math.isinf(self.C):
            return 0.0
        return min(1.0 / (float(self.C) * n_samples), 1e6)  # fastnn's optimizers take weight decay up to 1e6


class MLPRegressor(RegressorMixin, _FastnnEstimator):
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
        _keep_params(self, locals())

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
        keep = self._keep_rows(sample_weight, X.shape[0])
        if keep is not None:
            X, y = X[keep], y[keep]
        return X.astype(np.float32, copy=False), y

    def _check_outputs(self, y: np.ndarray) -> None:
        if y.shape[1] != self.n_outputs_:
            raise ValueError(f"y has {y.shape[1]} target(s) per row; this regressor was fitted on {self.n_outputs_}")

    def fit(self, X: Any, y: Any, sample_weight: Any = None) -> MLPRegressor:
        """Train for up to `max_iter` epochs on (X, y) (from the fitted weights with warm_start). Bad arguments
        leave the estimator as it was."""
        with _unchanged_on_error(self):
            self._check_params()
            warm = self.warm_start and hasattr(self, "trainer_")
            X, y = self._validate_xy(X, y, sample_weight, reset=not warm)
            if warm:
                self._check_outputs(y)
            self.n_outputs_ = y.shape[1]
            self._start(X)
        self._fit_new(X, y)
        return self

    def partial_fit(self, X: Any, y: Any, sample_weight: Any = None) -> MLPRegressor:
        """One more epoch on (X, y). A first call that fails leaves the estimator as it was."""
        if hasattr(self, "trainer_"):
            X, y = self._validate_xy(X, y, sample_weight, reset=False)
            self._check_outputs(y)
            self._rebatched(X.shape[0])
            self._fit_one_epoch(X, y)
            return self
        with _unchanged_on_error(self):
            self._check_params()
            X, y = self._validate_xy(X, y, sample_weight, reset=True)
            self.n_outputs_ = y.shape[1]
            self._start(X)
            self._fit_one_epoch(X, y)
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
