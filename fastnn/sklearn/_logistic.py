"""fastnn.sklearn's `LogisticRegression`: a classifier with no hidden layer, whose L2 penalty `C` is weight
decay."""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils.metaestimators import available_if

from .._optim import decay_of
from .._warn import warn_at_caller
from ._base import Guard, keep_params, trained_layers
from ._classifier import FastnnClassifier

__all__ = ["LogisticRegression", "objective"]


class LogisticRegression(FastnnClassifier):
    """Multinomial logistic regression trained by fastnn: a network with no hidden layer.

    It takes scikit-learn `LogisticRegression`'s `C`, `penalty` and `fit_intercept`, and `MLPClassifier`'s
    training parameters (see there). The L2 penalty ||W||^2 / (2 C) on the summed loss is SGD weight decay
    1 / (C * n_samples) on the mean loss, of the weights only (bias_decay=0: the intercept is unpenalised, as
    scikit-learn's), so with solver="sgd" (the default) training goes to the optimum scikit-learn's solvers find;
    with solver="adam" it is AdamW's decoupled decay, a different regulariser of the same strength.

    solver="lbfgs" (scikit-learn's default, so that its `get_params()` builds a working estimator) is scikit-learn's
    own solve, on the CPU: scipy's L-BFGS-B, full batch, in float64, on scikit-learn's objective (binomial on one row
    for two classes, else multinomial), with `max_iter` as its iterations and `tol` as its gradient tolerance (the
    options scikit-learn passes): exact parity with scikit-learn's fit, not fastnn's GPU speed ("sgd" is the fast
    path, to the same optimum). It has no partial_fit and refuses early_stopping, as scikit-learn has neither; the
    minibatch parameters (batch_size, learning_rate, ...) do not apply. scikit-learn's other solvers ("newton-cg",
    "liblinear", "sag", "saga", ...) are refused.

    `partial_fit` takes n_samples as the samples seen so far, this call's included (`t_`: every row given counts,
    as in "invscaling"): the penalty is ||W||^2 / (2 C) on the summed loss of all the data seen, however it was
    split into calls, and the decay follows it call by call (a new trainer continues the old one when it changes).

    The network trains on the rows less their mean (the first fit's; the same objective, since the intercept is
    unpenalised, and better conditioned); `coef_`, `intercept_` and every prediction are in the rows' own terms.
    The rate is halved ("adaptive", the default) each time the training loss has not improved at all for more
    than `n_iter_no_change` epochs (the minibatch noise dominates the progress), and there scikit-learn's
    objective (the mean log-loss plus ||W||^2 / (2 C n_samples)) is computed exactly over the training rows:
    training stops once it changed by at most `tol` times its value over a whole phase of the rate. A
    ConvergenceWarning says when `max_iter` epochs, or a rate that can no longer fall, come first. Measured on the
    CPU with C=1 and the defaults: within 2e-5 of scikit-learn's objective on `make_classification(15000 x 50, 3
    classes)` (about 210 epochs) and on `load_digits` / 16 (170-200), within 8e-4 on standardised `load_digits`
    (140), stopping on `tol`; the optimum is approached slowly where the penalty is weak against nearly separable
    data, and a looser `tol` stops sooner.

    Args:
        penalty: "l2" or None (no penalty, as C=numpy.inf).
        C: the inverse of the penalty's strength, > 0.
        fit_intercept: True (every fastnn layer has a bias; False is refused).
        dual: scikit-learn's (liblinear's), accepted so that its parameter set builds this estimator: False only.
        intercept_scaling: liblinear's, accepted likewise; no effect here.
        l1_ratio: None or 0 (an L1 part is refused). penalty="deprecated" (scikit-learn >= 1.8's default) is "l2".
        n_jobs: accepted likewise; no effect (a fit trains on one device).
        class_weight: None, a dict label -> weight, or "balanced" (n_samples / (n_classes * the label's count)),
            as scikit-learn's: each row's loss is weighted by its class's weight (times its `sample_weight`).
            Unequal weights train on the GPU with the graph engine's weighted loss (engine="auto": see `Trainer.fit`).
        learning_rate: "adaptive" (the default: halved at each plateau short of `tol`), "constant" (stop at the
            first plateau, with a warning: one plateau gives no change to judge `tol` by) or "invscaling".
        solver: "sgd" (the default, fastnn's fast path), "adam", or "lbfgs" (scikit-learn's solve, on the CPU).
        max_iter: epochs at most (1000, scikit-learn's SGDClassifier's: minibatch steps need more epochs than
            lbfgs needs iterations); with solver="lbfgs", L-BFGS iterations (scikit-learn's default is 100).
        tol: the relative change of the exact objective over a phase of the adaptive rate at which training
            stops; with solver="lbfgs", L-BFGS-B's gradient tolerance (`gtol`), as scikit-learn's.
    """

    def __init__(
        self,
        *,
        penalty: str | None = "l2",
        C: float = 1.0,
        fit_intercept: bool = True,
        class_weight: dict[Any, float] | str | None = None,
        dual: bool = False,
        intercept_scaling: float = 1.0,
        l1_ratio: float | None = None,
        n_jobs: int | None = None,
        solver: str = "sgd",
        batch_size: int | str = "auto",
        learning_rate: str = "adaptive",
        learning_rate_init: float = 0.5,
        power_t: float = 0.5,
        max_iter: int = 1000,
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
        keep_params(self, locals())

    # Parameters of MLPClassifier's that logistic regression does not take: their one meaning here.
    alpha = 0.0
    max_fun = 15000

    #: solver="lbfgs" is scikit-learn's solve, on the CPU (`_fit_lbfgs`).
    _lbfgs = True

    def _check_params(self) -> None:
        if self.solver in ("liblinear", "newton-cg", "newton-cholesky", "sag", "saga"):
            raise ValueError(
                f"solver={self.solver!r} is not implemented: fastnn trains by minibatch gradient steps on the GPU; "
                f"use 'sgd' (the default: with C it reaches the same optimum), 'adam', or 'lbfgs' (scikit-learn's "
                f"solver, on the CPU)"
            )
        if self.solver == "lbfgs" and self.early_stopping is True:
            raise ValueError("early_stopping=True is not implemented for solver='lbfgs': a full-batch solve has no "
                             "epochs to hold out rows for; pass early_stopping=False or solver='sgd'")  # fmt: skip
        if self.dual is not False and not (isinstance(self.dual, np.bool_) and not self.dual):
            raise ValueError(f"dual={self.dual!r} is not implemented: it is liblinear's dual formulation; pass False")
        if self.l1_ratio not in (None, 0, 0.0):
            raise ValueError(f"l1_ratio={self.l1_ratio!r} is not implemented: fastnn's optimizers decay weights (L2); "
                             f"an L1 part needs a proximal solver: pass 0 or None")  # fmt: skip
        if self.penalty not in ("l2", None, "deprecated"):
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

    # ---- scikit-learn's attributes of a fitted LogisticRegression ----------------------------------------------

    def _linear(self) -> tuple[np.ndarray, np.ndarray]:
        """(coef_, intercept_): the softmax layer's, or for two classes the log-odds of the second (one row). The
        network sees centred rows (`_centred`): W (x - c) + b is W x + (b - W c)."""
        ((w, b),) = trained_layers(self)
        centre = getattr(self, "_centre_", None)
        if centre is not None:
            b = b - w @ centre
        if w.shape[0] == 2:  # scikit-learn's binary model: one row, the second class against the first
            return (w[1] - w[0])[None, :], (b[1] - b[0])[None]
        return w, b

    @property
    def coef_(self) -> np.ndarray:
        """(n_classes, n_features) float64 weights; (1, n_features) with two classes, as scikit-learn's."""
        return self._linear()[0]

    @property
    def intercept_(self) -> np.ndarray:
        """(n_classes,) float64 intercepts; (1,) with two classes."""
        return self._linear()[1]

    def decision_function(self, X: Any) -> np.ndarray:
        """Confidence scores X @ coef_.T + intercept_: (n_samples, n_classes), or (n_samples,) with two classes
        (the log-odds of `classes_[1]`)."""
        coef, intercept = self._linear()
        scores = super()._validate(X, reset=False).astype(np.float64) @ coef.T + intercept  # the rows as given
        return scores[:, 0] if coef.shape[0] == 1 else scores

    def _minibatch(self) -> bool:
        """True, or with solver="lbfgs" an AttributeError saying why there is no `partial_fit` (as scikit-learn's
        MLPs hide theirs for lbfgs: `hasattr(est, "partial_fit")` is then False)."""
        if self.solver == "lbfgs":
            raise AttributeError(
                "partial_fit is not implemented for solver='lbfgs': L-BFGS solves on the whole data at once "
                "(scikit-learn's LogisticRegression has no partial_fit); use fit, or solver='sgd'"
            )
        return True

    @available_if(_minibatch)
    def partial_fit(self, X: Any, y: Any, classes: Any = None, sample_weight: Any = None) -> LogisticRegression:
        """One more epoch on (X, y), as `MLPClassifier.partial_fit`. class_weight="balanced" is refused, as by
        scikit-learn's SGDClassifier: its weights would follow each call's rows, not the whole stream's. There is
        none with solver="lbfgs" (a full-batch solve: scikit-learn's LogisticRegression has no partial_fit)."""
        if isinstance(self.class_weight, str) and self.class_weight == "balanced":
            raise ValueError(
                "class_weight='balanced' is not supported for partial_fit: each call's rows would set it; pass "
                "class_weight=dict(zip(classes, compute_class_weight('balanced', classes=classes, y=y))) with y "
                "a large enough sample of the stream (sklearn.utils.class_weight)"
            )
        super().partial_fit(X, y, classes=classes, sample_weight=sample_weight)
        return self

    # ---- training: centred rows, the adaptive rate and the stopping rule ---------------------------------------

    #: "adaptive" halves the rate at a plateau (scikit-learn's MLPs divide by 5): the flat directions of a weak
    #: penalty need rate-steps, and a fifth of the rate left them unconverged on load_digits (see `_at_plateau`).
    _rate_divisor = 2.0

    def _plateau_tol(self) -> float:
        """A plateau is epochs that do not improve the training loss at all: the minibatch noise has come to
        dominate the progress at this rate (`tol` judges the exact objective, in `_at_plateau`)."""
        return 0.0

    def _validate(self, X: Any, reset: bool) -> np.ndarray:
        """X as float32, less the training rows' mean (`_centred`)."""
        return self._centred(super()._validate(X, reset=reset), reset=reset)

    def _validate_xy(self, X: Any, y: Any, sample_weight: Any, reset: bool) -> tuple[np.ndarray, np.ndarray]:
        X, y = super()._validate_xy(X, y, sample_weight, reset=reset)
        self._rows_ = X if self.solver == "lbfgs" else None  # this fit's rows as given, for `_fit_lbfgs`
        return self._centred(X, reset=reset), y

    def _centred(self, X: np.ndarray, reset: bool) -> np.ndarray:
        """X less the mean of the rows of the fit that set `n_features_in_` (kept through warm starts and partial
        fits): the network trains on centred rows. With the intercept unpenalised this is the same objective (W
        (x - c) + b = W x + (b - W c); `coef_` and `intercept_` are in the rows' own terms), better conditioned
        where features share a large mean (pixels scaled to [0, 1]): SGD reaches the optimum in fewer epochs."""
        if reset:
            self._centre_ = X.mean(axis=0, dtype=np.float64) if X.shape[0] else None
        centre = getattr(self, "_centre_", None)
        return X if centre is None else (X - centre).astype(np.float32)

    def _start(self, X: np.ndarray) -> None:
        self._warm_ = bool(self.warm_start) and getattr(self, "trainer_", None) is not None  # from the fitted weights
        super()._start(X)
        self._checked_objective = None  # the objective at this fit's last plateau

    def _fit_new(self, X: np.ndarray, y: np.ndarray, guard: Guard) -> None:
        """`fit`'s training: minibatch epochs, or with solver="lbfgs" scikit-learn's solve (`_fit_lbfgs`)."""
        if self.solver == "lbfgs":
            self._fit_lbfgs(X, y, guard)
        else:
            super()._fit_new(X, y, guard)

    def _fit_lbfgs(self, X: np.ndarray, y: np.ndarray, guard: Guard) -> None:
        """scikit-learn's lbfgs fit, on the CPU (`_lbfgs.lbfgs_solve`): on the rows as given (in float64, so that
        the iterates and the stopping test are scikit-learn's), from zeros or with warm_start the fitted coef_ and
        intercept_; the solution goes into `trainer_` as the centred network's weights. A ConvergenceWarning, as
        scikit-learn's, when it stops short (max_iter iterations reached, or the line search failed)."""
        from ._lbfgs import lbfgs_solve

        w, total = self._fit_weight, self._fit_weight_sum
        self._fit_weight = self._fit_weight_sum = None  # this call's: the estimator keeps no weights
        rows, self._rows_ = self._rows_.astype(np.float64), None  # not X + centre: X - centre rounded in float32
        centre = getattr(self, "_centre_", None)
        k = len(self.classes_)
        if self._warm_:  # `_start` loaded the fitted weights
            coef, intercept = self._linear()
            start = np.concatenate([coef, intercept[:, None]], axis=1)
        else:
            start = np.zeros((1 if k == 2 else k, X.shape[1] + 1))
        none = self.penalty is None or math.isinf(self.C)
        l2 = 0.0 if none else 1.0 / (float(self.C) * (total or X.shape[0]))  # scikit-learn's: C times the weights' sum
        solution, result, curve = lbfgs_solve(rows, y, w, l2, k, start, int(self.max_iter), float(self.tol))
        coef, intercept = solution[:, :-1], solution[:, -1]
        if k == 2:  # one row of log-odds as the softmax's two: [-coef / 2, coef / 2] differ by coef
            coef, intercept = np.stack([-coef[0] / 2, coef[0] / 2]), np.array([-intercept[0] / 2, intercept[0] / 2])
        bias = intercept if centre is None else intercept + coef @ centre  # W (x - c) + (b + W c) = W x + b
        self.trainer_.load_state_dict({"0.weight": coef.astype(np.float32), "0.bias": bias.astype(np.float32)})
        guard.trained = True
        self.n_iter_ = min(int(result.nit), int(self.max_iter))
        self.t_ += X.shape[0] * self.n_iter_
        self.loss_curve_ += curve
        self.loss_ = self.best_loss_ = float(result.fun)
        self.validation_scores_ = self.best_validation_score_ = None
        if result.status != 0:
            warn_at_caller(
                f"LogisticRegression: lbfgs failed to converge after {self.n_iter_} iteration(s) "
                f"(status={result.status}): {result.message} (tol={self.tol}); raise max_iter, or scale the data",
                ConvergenceWarning,
            )

    def _at_plateau(self, X: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> bool:
        """Converged when scikit-learn's objective, computed exactly over the training rows, changed by at most
        `tol` times its value since the previous plateau (a whole phase of the adaptive rate); the first plateau
        only records it."""
        value, before = self._objective(X, y, w), self._checked_objective
        self._checked_objective = value
        return before is not None and abs(before - value) <= float(self.tol) * value

    def _unconverged_hint(self) -> str:
        return "; raise max_iter, or C to weaken the penalty" if self.learning_rate == "adaptive" else (
            '; learning_rate="adaptive" goes on at a smaller rate')  # fmt: skip

    def _objective(self, X: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> float:
        """scikit-learn's per-sample objective at the trained parameters (`objective`)."""
        return objective(self.trainer_.state_dict(), self.trainer_.optimizer, X, y, w)

    def _class_weighted(self, sample_weight: Any, y: np.ndarray) -> Any:
        """`sample_weight` (None: ones) times each row's weight from `class_weight` (scikit-learn's: a dict of
        label -> weight, or "balanced": n_samples / (n_classes * the class's count), the counts and n_samples
        weighted by `sample_weight` as scikit-learn's own fits count them); None without either."""
        if self.class_weight is None:
            return sample_weight
        from sklearn.utils.class_weight import compute_class_weight

        classes = np.unique(y)
        counted = {}  # "balanced" counts the classes by their weights where scikit-learn does (its fits do, >= 1.6)
        if sample_weight is not None and "sample_weight" in inspect.signature(compute_class_weight).parameters:
            counted = {"sample_weight": np.broadcast_to(np.asarray(sample_weight, np.float64), y.shape).copy()}
        per_class = compute_class_weight(self.class_weight, classes=classes, y=y, **counted)
        bad = ~np.isfinite(per_class) | (per_class < 0)
        if bad.any():  # said here, by its name: as a row weight it would be reported as sample_weight's
            raise ValueError(f"class_weight must map each class to a finite weight >= 0, got {self.class_weight!r} "
                             f"(class {classes[bad].tolist()[0]!r}: {per_class[bad].tolist()[0]!r})")  # fmt: skip
        rows = per_class[np.searchsorted(classes, y)]
        return rows if sample_weight is None else rows * np.asarray(sample_weight, np.float64)

    def _decay(self, n_samples: int) -> float:
        """The L2 penalty ||W||^2 / (2 C) on the summed loss of `n_samples` rows (a fit's; for partial_fit, all
        the rows seen), as weight decay on the mean loss."""
        if self.penalty is None or math.isinf(self.C):
            return 0.0
        total = getattr(self, "_fit_weight_sum", None) or n_samples  # scikit-learn: C times the weights' sum
        return min(1.0 / (float(self.C) * total), 1e6)  # fastnn's optimizers take weight decay up to 1e6


def objective(state: dict[str, np.ndarray], opt: Any, X: np.ndarray, y: np.ndarray, w: np.ndarray | None = None
              ) -> float:  # fmt: skip
    """scikit-learn's per-sample objective of the parameters `state` (float64, exact over the rows): the mean
    log-loss (weighted by `w`) plus the optimizer `opt`'s decay, ||W||^2 / (2 C n) (the intercept unpenalised), for
    the rows `X` as the network sees them (centred) and encoded labels `y` (a fit's and a search's models both)."""
    W, b = state["0.weight"].astype(np.float64), state["0.bias"].astype(np.float64)
    z = X.astype(np.float64) @ W.T + b
    z -= z.max(axis=1, keepdims=True)
    loss = np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(y)), y]
    mean = float(loss.mean() if w is None else np.average(loss, weights=np.asarray(w, np.float64)))
    return mean + 0.5 * (decay_of(opt, False) * float((W**2).sum()) + decay_of(opt, True) * float((b**2).sum()))
