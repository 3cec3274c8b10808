"""What fastnn.sklearn's estimators share: scikit-learn's parameters checked and mapped onto a `Trainer`,
its stopping and learning-rate rules, warm starts, partial fits and pickling."""

from __future__ import annotations

import contextlib
import io
import math
import numbers
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from .._checks import number
from .._control import split_indices
from .._data import sample_weight_array
from .._errors import ConfigError, DeviceUnavailable
from .._model import MLP, param_names
from .._optim import SGD, AdamW
from .._state import MAX_EPOCH
from .._trainer import Trainer
from .._warn import warn_at_caller
from ..engine.base import steps_per_epoch
from ..engine.select import EngineRefused

__all__ = [
    "FastnnEstimator", "Guard", "LayersMixin", "Plateau", "Rate", "at_plateau", "auto_batch", "keep_params",
    "trained_layers", "unchanged_on_error",
]

_SOLVERS = ("adam", "sgd")
_ACTIVATIONS = ("relu", "gelu")
_LEARNING_RATES = ("constant", "invscaling", "adaptive")
#: "adaptive" stops at a plateau once the rate is at most this, as scikit-learn's SGD optimizer does.
_ADAPTIVE_MIN_LR = 1e-6
#: The optimizers' names for the estimators' parameters: a refusal of the optimizer's checks names the latter.
_OPTIMIZER_NAMES = {"lr": "learning_rate_init", "weight_decay": "alpha", "betas[0]": "beta_1",
                    "betas[1]": "beta_2", "eps": "epsilon", "momentum": "momentum"}  # fmt: skip


def auto_batch(batch_size: Any, n: int) -> int:
    """scikit-learn's batch_size: "auto" is min(200, n) for the rows of this call; an integer is used as given."""
    return min(200, n) if batch_size == "auto" else int(batch_size)


class Rate:
    """scikit-learn's `learning_rate` rule as a fastnn schedule (global step -> rate).

    `lr` is the current base rate ("adaptive" divides it at each plateau: by 5, LogisticRegression by 2);
    "invscaling" divides it by (samples seen + 1) ** power_t, the samples seen before each epoch (scikit-learn's
    `t_`), which `begin` describes for the fit call about to train: its first step, the samples seen before it,
    its rows per epoch and steps per epoch."""

    def __init__(self, kind: str, lr: float, power_t: float) -> None:
        self.kind, self.lr, self.power_t = kind, lr, power_t
        self.step0, self.seen0, self.rows, self.steps = 0, 0, 1, 1

    def begin(self, step0: int, seen0: int, rows: int, steps: int) -> None:
        self.step0, self.seen0, self.rows, self.steps = step0, seen0, rows, steps

    def __call__(self, step: int) -> float:
        if self.kind != "invscaling":
            return self.lr
        seen = self.seen0 + (step - self.step0) // self.steps * self.rows
        try:
            return self.lr / (seen + 1) ** self.power_t
        except OverflowError:  # (seen + 1) ** power_t beyond a float: scikit-learn's NumPy power gives inf, rate 0
            return 0.0


def at_plateau(kind: str, rate: Rate, divisor: float, verdict: bool | None) -> tuple[bool, bool, str]:
    """`learning_rate`'s rule at a plateau of the training loss, given the estimator's `_at_plateau` verdict:
    (stop, converged, why not converged). Under "adaptive" short of the smallest rate, the fit goes on with
    `rate.lr` divided by `divisor` (a fit's and a search's batched models both follow this)."""
    if verdict is True:
        return True, True, ""
    if kind != "adaptive" or rate.lr <= _ADAPTIVE_MIN_LR:
        return True, verdict is None, f"stopped at a plateau of the learning rate {rate.lr:.3g}"
    rate.lr /= divisor
    return False, False, ""


class Plateau:
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


def keep_params(est: BaseEstimator, params: dict[str, Any]) -> None:
    """Store `__init__`'s arguments as given, unchecked (scikit-learn's rule: `fit` checks them)."""
    for name, value in params.items():
        if name not in ("self", "__class__"):
            setattr(est, name, value)


class Guard:
    """What `unchanged_on_error` yields: `trained` turns True once the block's fitting has trained an epoch (see
    `FastnnEstimator._train`); from then on a failure keeps what training did instead of undoing the block."""

    trained = False


@contextlib.contextmanager
def unchanged_on_error(est: BaseEstimator) -> Iterator[Guard]:
    """Run the block; if it raises before an epoch was trained (a bad argument, or a refusal of `Trainer.fit`'s
    own checks), give `est` back exactly as it was: every attribute, its rate rule's and stopping count's state,
    the trainer it had (still open); a trainer made in the block is closed. A refused first fit leaves it
    unfitted. The trainer the block replaced is closed only once the block ends without being undone."""
    before = dict(est.__dict__)
    inner = {k: dict(vars(before[k])) for k in ("_rate_", "_plateau_") if k in before}
    guard = Guard()
    try:
        yield guard
    except BaseException:
        if not guard.trained:
            made = est.__dict__.get("trainer_")
            if made is not None and made is not before.get("trainer_"):
                made.close()
            est.__dict__.clear()
            est.__dict__.update(before)
            for k, attrs in inner.items():
                vars(before[k]).clear()
                vars(before[k]).update(attrs)
            raise
        _close_replaced(est, before)
        raise
    _close_replaced(est, before)


def _close_replaced(est: BaseEstimator, before: dict[str, Any]) -> None:
    old = before.get("trainer_")
    if old is not None and old is not est.__dict__.get("trainer_"):
        old.close()


def trained_layers(est: BaseEstimator) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weight (out, in), bias) of each layer of a fitted estimator, float64 copies of the trained float32 values."""
    check_is_fitted(est, "trainer_")
    state = est.trainer_.state_dict()
    names = param_names(est.trainer_.model)
    return [(state[w].astype(np.float64), state[b].astype(np.float64)) for w, b in zip(names[::2], names[1::2])]


class LayersMixin:
    """scikit-learn MLPs' `coefs_` and `intercepts_`, read from the trained network each time (so they follow
    `partial_fit`)."""

    @property
    def coefs_(self) -> list[np.ndarray]:
        """Each layer's weights, (n_in, n_out) as scikit-learn's MLPs hold them (float64 copies)."""
        return [w.T.copy() for w, _ in trained_layers(self)]

    @property
    def intercepts_(self) -> list[np.ndarray]:
        """Each layer's biases, (n_out,) (float64 copies)."""
        return [b for _, b in trained_layers(self)]


class FastnnEstimator(BaseEstimator):
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
        """The optimizer's weight decay for a fit on `n_samples` rows (partial_fit: the rows seen so far)."""
        return float(self.alpha)

    #: Whether solver="lbfgs" is honoured (LogisticRegression: scipy's, on the CPU); the MLPs refuse it.
    _lbfgs = False

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
        if self.solver == "lbfgs" and not self._lbfgs:
            raise ValueError(
                "solver='lbfgs' is not implemented: fastnn trains by minibatch gradient steps (one CUDA graph or "
                "kernel per epoch on a GPU), and L-BFGS is a full-batch quasi-Newton method; use 'adam' or 'sgd'"
            )
        solvers = (*_SOLVERS, "lbfgs") if self._lbfgs else _SOLVERS
        if self.solver not in solvers:
            raise ValueError(f"solver must be one of {solvers}, got {self.solver!r}")
        if self.learning_rate not in _LEARNING_RATES:
            raise ValueError(f"learning_rate must be one of {_LEARNING_RATES}, got {self.learning_rate!r}")
        for name in ("learning_rate_init", "alpha", "momentum", "tol", "validation_fraction", "power_t"):
            number(name, getattr(self, name), "a finite number >= 0", lambda v: v >= 0)  # 10**400, Fractions
        if self.learning_rate_init <= 0:
            raise ValueError(f"learning_rate_init must be > 0, got {self.learning_rate_init!r}")
        if self.early_stopping and not 0 < self.validation_fraction < 1:
            raise ValueError(f"validation_fraction must be in (0, 1), got {self.validation_fraction!r}")
        for name in ("max_iter", "max_fun"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.max_iter > MAX_EPOCH:
            raise ValueError(f"max_iter must be at most 2**32, got {self.max_iter!r}: a fastnn trainer counts at "
                             f"most 2**32 epochs (the GPU's epoch counter and the shuffle key are 32-bit)")  # fmt: skip
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
        self._optimizer(1)  # the optimizer's own checks (float32 ranges), before any data is read

    def _optimizer(self, n_samples: int) -> SGD | AdamW:
        """The optimizer for a fit on `n_samples` rows; its refusals name the estimator's parameters. The penalty
        (alpha, C) decays the weights only, bias_decay=0: scikit-learn penalises coef_ / coefs_, never intercepts."""
        try:
            if self.solver in ("sgd", "lbfgs"):  # lbfgs: the trainer holds the solution and the penalty as decay
                return SGD(
                    lr=float(self.learning_rate_init),
                    momentum=float(self.momentum),
                    nesterov=bool(self.nesterovs_momentum) and self.momentum > 0,
                    weight_decay=self._decay(n_samples),
                    bias_decay=0.0,
                )
            return AdamW(
                lr=float(self.learning_rate_init),
                betas=(self.beta_1, self.beta_2),
                eps=self.epsilon,
                weight_decay=self._decay(n_samples),
                bias_decay=0.0,
            )
        except ConfigError as exc:
            message = str(exc)
            for theirs, ours in _OPTIMIZER_NAMES.items():
                if message.startswith(f"{theirs} must"):
                    raise ConfigError(ours + message[len(theirs):]) from None
            raise

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

    def _weigh_rows(self, X: np.ndarray, y: np.ndarray, sample_weight: Any) -> tuple[np.ndarray, np.ndarray]:
        """(X, y) without the rows of weight 0 (they count for nothing); the kept rows' weights go to this call's
        training as `_fit_weight` (None where they are all equal: the weighted mean is then the plain one)."""
        keep = self._keep_rows(sample_weight, X.shape[0])
        w = None if sample_weight is None else np.broadcast_to(np.asarray(sample_weight, np.float64), X.shape[:1])
        if keep is not None:
            X, y, w = X[keep], y[keep], w[keep]
        self._fit_weight = None if w is None or (w == w[0]).all() else np.ascontiguousarray(w)
        self._fit_weight_sum = None if w is None else float(w.sum())
        return X, y

    @staticmethod
    def _keep_rows(sample_weight: Any, n: int) -> np.ndarray | None:
        """Rows to train on under `sample_weight`: those of nonzero weight (a zero weight drops the row, which
        counts for nothing in the weighted mean loss); None = all."""
        if sample_weight is None:
            return None
        keep = sample_weight_array(sample_weight, n) > 0  # fastnn's check (a DataError is a ValueError)
        if not keep.any():
            raise ValueError("Sample weights must contain at least one non-zero number.")
        return None if keep.all() else keep

    def _new_trainer(self, n_features: int, n_samples: int, schedule: Rate) -> Trainer:
        model = MLP([n_features, *self._hidden_sizes, self._outputs()], activation=self._activation())
        return Trainer(
            model,
            self._optimizer(n_samples),
            batch_size=auto_batch(self.batch_size, n_samples),
            precision=self.precision,
            device=self.device,
            seed=self._seed(),
            engine=self.engine,
            schedule=schedule,
            loss=self._loss,
        )

    def _start(self, X: np.ndarray) -> None:
        """A new trainer for a fit (or a first partial_fit) on X, replacing the fitted one (which
        `unchanged_on_error` closes once the fit is not undone); with warm_start, it starts from the fitted
        weights (scikit-learn keeps them and starts a new optimizer, as this does)."""
        rate = Rate(self.learning_rate, float(self.learning_rate_init), float(self.power_t))
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
        self.trainer_, self._rate_ = trainer, rate
        if not warm or not hasattr(self, "loss_curve_"):
            self.loss_curve_: list[float] = []
            self.t_ = 0
        self.n_iter_ = 0
        self._plateau_ = Plateau(self._plateau_tol(), self.n_iter_no_change)

    def _continued(self, n_samples: int) -> None:
        """Before a partial_fit on `n_samples` rows: as scikit-learn, batch_size="auto" takes min(200, n) of each
        call's rows, and the penalty's weight decay (`_decay`) follows the samples seen so far, this call's
        included; when either changes, a new trainer continues (weights, optimizer state, counters) with it."""
        batch = auto_batch(self.batch_size, n_samples)
        decay = self._decay(self.t_ + n_samples)
        trainer = self.trainer_
        if batch == trainer.config.batch_size and decay == trainer.optimizer.weight_decay:
            return
        self.trainer_ = trainer._continued(self._rate_, batch_size=batch, weight_decay=decay)  # the guard closes it

    def _train(self, guard: Guard, X: np.ndarray, y: np.ndarray, **kwargs: Any) -> Any:
        """`trainer_.fit(X, y, **kwargs)`; `guard.trained` once it has trained an epoch, even if it then raises."""
        trainer = self.trainer_
        epoch0 = trainer.epoch
        try:
            return trainer.fit(X, y, **kwargs)
        finally:
            guard.trained = guard.trained or trainer.epoch != epoch0
            self._fit_weight = self._fit_weight_sum = None  # this call's: the estimator keeps no weights

    def _fit_new(self, X: np.ndarray, y: np.ndarray, guard: Guard) -> None:
        """`fit`'s training: up to max_iter epochs, stopping as scikit-learn does (tol, n_iter_no_change; with
        early_stopping on a held-out score, ending with the best epoch's weights); "adaptive" divides the rate
        by `_rate_divisor` at each plateau instead of stopping, until it is at most 1e-6."""
        trainer, plateau, rate = self.trainer_, self._plateau_, self._rate_
        eval_data, w = None, getattr(self, "_fit_weight", None)
        if self.early_stopping:
            train, val = split_indices(X.shape[0], float(self.validation_fraction), trainer.config.seed)
            X, y, eval_data = X[train], y[train], (X[val], y[val])
            w = None if w is None else w[train]
            plateau.score, plateau.trainer = self._validation_score(eval_data[1]), trainer
        steps = steps_per_epoch(X.shape[0], trainer.config.batch_size, trainer.config.drop_last)
        left, converged, why = int(self.max_iter), False, f"max_iter={self.max_iter} epochs reached"
        try:
            while left > 0:
                rate.begin(trainer.step, self.t_, X.shape[0], steps)
                history = self._train(guard, X, y, epochs=left, eval_data=eval_data, callbacks=[plateau],
                                      progress=bool(self.verbose), sample_weight=w)  # fmt: skip
                self._record(history, X.shape[0])
                left -= len(history)
                if not plateau.triggered:
                    break
                verdict = self._at_plateau(X, y, w)  # None: the plateau is the stopping rule
                stop, converged, reason = at_plateau(self.learning_rate, rate, self._rate_divisor, verdict)
                if stop:
                    why = reason or why
                    break
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
            warn_at_caller(
                f"{type(self).__name__}: {why} without convergence (tol={self.tol}){self._unconverged_hint()}",
                ConvergenceWarning,
            )

    #: What "adaptive" divides the rate by at a plateau (scikit-learn's MLPs: 5).
    _rate_divisor = 5.0

    def _plateau_tol(self) -> float:
        """How much an epoch must improve the training loss (or the validation score) not to count towards a
        plateau: scikit-learn's MLPs' `tol`."""
        return float(self.tol)

    def _at_plateau(self, X: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> bool | None:
        """At a plateau of the training loss: True if converged, False if not (go on with a smaller rate under
        "adaptive"), None if the plateau itself is the stopping rule (scikit-learn's MLPs)."""
        return None

    def _unconverged_hint(self) -> str:
        return ""

    def _fit_one_epoch(self, X: np.ndarray, y: np.ndarray, guard: Guard) -> None:
        """`partial_fit`'s training: one epoch; the stopping count goes on across calls, and with "adaptive" a
        plateau divides the rate by `_rate_divisor` (scikit-learn's partial_fit does neither early stopping nor
        stopping)."""
        trainer, plateau, rate = self.trainer_, self._plateau_, self._rate_
        rate.begin(trainer.step, self.t_, X.shape[0], steps_per_epoch(X.shape[0], trainer.config.batch_size, False))
        # A new array object over the caller's memory, so that every call uploads what X holds now. The GPU engines
        # know the set they hold by the array's identity (engine/graph/upload.py's DataKey), and a caller may refill
        # one float32 buffer between calls (a stream, an augmentation loop): passed through, it trained every call
        # on the first call's rows. No content check instead: deciding "unchanged" means reading every byte, which
        # is most of an upload's cost (a memcpy into pinned memory, then PCIe), and reads slower than it: on a
        # 60000x784 float32 X (188 MB) measured on a 2-core CI host, np.copy 1.5 GB/s, sha256 0.46, crc32 0.68,
        # and a sum (4 GB/s) misses rows swapped in place. The cost is one upload per call, as for new arrays.
        X = X.view()
        history = self._train(guard, X, y, epochs=1, progress=bool(self.verbose),
                              sample_weight=getattr(self, "_fit_weight", None))  # fmt: skip
        self._record(history, X.shape[0])
        for record in history:
            plateau(record)
        if plateau.triggered and self.learning_rate == "adaptive" and rate.lr > _ADAPTIVE_MIN_LR:
            rate.lr /= self._rate_divisor
            plateau.count, plateau.triggered = 0, False
        self.best_loss_ = plateau.best_loss

    def _record(self, history: Any, rows: int) -> None:
        """scikit-learn's counters after epochs of `rows` rows: n_iter_, t_, loss_curve_, loss_."""
        self.n_iter_ += len(history)
        self.t_ += rows * len(history)
        self.loss_curve_ += [r["train_loss"] for r in history]
        if self.loss_curve_:
            self.loss_ = self.loss_curve_[-1]

    # ---- pickling: the Trainer travels as a fastnn checkpoint, made in memory ---------------------------------

    def __getstate__(self) -> dict[str, Any]:
        state = dict(super().__getstate__())  # object.__getstate__ returns __dict__ itself: never pop from it
        trainer = state.pop("trainer_", None)
        if trainer is not None:
            buf = io.BytesIO()  # no temporary folder: a full or read-only one must not break pickling
            trainer.save(buf)
            state["_trainer_checkpoint"] = buf.getvalue()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        blob = state.pop("_trainer_checkpoint", None)
        super().__setstate__(state)
        if blob is None:
            return
        schedule = state.get("_rate_")
        try:
            self.trainer_ = Trainer.load(io.BytesIO(blob), device=self.device, engine=self.engine, schedule=schedule)
        except DeviceUnavailable as exc:  # fitted on a GPU, unpickled where there is none
            warnings.warn(f"{exc}; the unpickled estimator runs on the CPU", RuntimeWarning, stacklevel=2)
            self.trainer_ = Trainer.load(io.BytesIO(blob), device="cpu", schedule=schedule)
        except EngineRefused as exc:  # engine="grid"/"fused" on a GPU that cannot run it (older than Hopper)
            again = f"a new fit asks for engine={self.engine!r} again"
            warnings.warn(f"{exc}; the unpickled estimator trains with the engine chosen here (engine='auto'); "
                          f"{again}", RuntimeWarning, stacklevel=2)  # fmt: skip
            self.trainer_ = Trainer.load(io.BytesIO(blob), device=self.device, engine="auto", schedule=schedule)

    def __sklearn_tags__(self):  # noqa: D105
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = False
        return tags
