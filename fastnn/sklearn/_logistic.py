"""fastnn.sklearn's `LogisticRegression`: a classifier with no hidden layer, whose L2 penalty `C` is weight
decay."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from .._optim import decay_of
from ._base import keep_params, trained_layers
from ._classifier import FastnnClassifier

__all__ = ["LogisticRegression"]


class LogisticRegression(FastnnClassifier):
    """Multinomial logistic regression trained by fastnn: a network with no hidden layer.

    It takes scikit-learn `LogisticRegression`'s `C`, `penalty` and `fit_intercept`, and `MLPClassifier`'s
    training parameters (see there). The L2 penalty ||W||^2 / (2 C) on the summed loss is SGD weight decay
    1 / (C * n_samples) on the mean loss, so with solver="sgd" (the default) training goes to the optimum
    scikit-learn's solvers find (the bias is decayed too); with solver="adam" it is AdamW's decoupled decay, a
    different regulariser of the same strength. scikit-learn's solvers ("lbfgs", "newton-cg", "liblinear",
    "sag", "saga", ...) are refused: fastnn trains by minibatch gradient steps.

    `partial_fit` takes n_samples as the samples seen so far, this call's included (`t_`: every row given counts,
    as in "invscaling"): the penalty is ||W||^2 / (2 C) on the summed loss of all the data seen, however it was
    split into calls, and the decay follows it call by call (a new trainer continues the old one when it changes).

    Training stops where scikit-learn's lbfgs stops: when the largest component of the gradient of the
    per-sample objective (the mean log-loss plus ||W||^2 / (2 C n_samples), the intercept penalised alike) is at
    most `tol`, computed exactly over the training rows each time the training loss stops improving by `tol`
    for more than `n_iter_no_change` epochs. Short of it, the default `learning_rate="adaptive"` divides the
    rate by 5 and goes on; a ConvergenceWarning says when `max_iter` epochs, or a plateau of a rate that can
    no longer fall, come first. On `make_classification(15000 x 50, 3 classes)` with C=1 this ends within 1e-5
    of scikit-learn's objective (float32 steps settle at a gradient near 7e-4, so it warns at `max_iter`). Two
    limits: the intercept is penalised too (fastnn's weight decay covers every parameter), which moves the
    optimum where the intercepts are large (+0.8% on standardised `load_digits`); and minibatch steps converge
    slowly where the penalty is weak against near-separable data (there `max_iter` runs out, with a warning).

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
            Unequal weights train on the CPU (the GPU engines' loss kernels are unweighted: see `Trainer.fit`).
        learning_rate: "adaptive" (the default: divided by 5 at each plateau short of `tol`), "constant" (stop
            at the first plateau, warning when short of `tol`) or "invscaling".
        tol: the largest gradient component of the objective at which training stops (scikit-learn's lbfgs
            criterion: float32 minibatch steps may settle above 1e-4, with the objective already within 1e-5).
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
        keep_params(self, locals())

    # Parameters of MLPClassifier's that logistic regression does not take: their one meaning here.
    alpha = 0.0
    max_fun = 15000

    def _check_params(self) -> None:
        if self.solver in ("lbfgs", "liblinear", "newton-cg", "newton-cholesky", "sag", "saga"):
            raise ValueError(
                f"solver={self.solver!r} is not implemented: fastnn trains by minibatch gradient steps on the GPU; "
                f"use 'sgd' (the default: with C it reaches the same optimum) or 'adam'"
            )
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
        """(coef_, intercept_): the softmax layer's, or for two classes the log-odds of the second (one row)."""
        ((w, b),) = trained_layers(self)
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
        scores = self._validate(X, reset=False).astype(np.float64) @ coef.T + intercept
        return scores[:, 0] if coef.shape[0] == 1 else scores

    def partial_fit(self, X: Any, y: Any, classes: Any = None, sample_weight: Any = None) -> LogisticRegression:
        """One more epoch on (X, y), as `MLPClassifier.partial_fit`. class_weight="balanced" is refused, as by
        scikit-learn's SGDClassifier: its weights would follow each call's rows, not the whole stream's."""
        if isinstance(self.class_weight, str) and self.class_weight == "balanced":
            raise ValueError(
                "class_weight='balanced' is not supported for partial_fit: each call's rows would set it; pass "
                "class_weight=dict(zip(classes, compute_class_weight('balanced', classes=classes, y=y))) with y "
                "a large enough sample of the stream (sklearn.utils.class_weight)"
            )
        super().partial_fit(X, y, classes=classes, sample_weight=sample_weight)
        return self

    def _at_plateau(self, X: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> bool:
        """Converged when the objective's largest gradient component is at most tol (scikit-learn's lbfgs gtol)."""
        return float(np.abs(self._objective_gradient(X, y, w)).max()) <= float(self.tol)

    def _unconverged_hint(self) -> str:
        return "; raise max_iter, or C to weaken the penalty" if self.learning_rate == "adaptive" else (
            '; learning_rate="adaptive" goes on at a smaller rate')  # fmt: skip

    def _objective_gradient(self, X: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
        """The gradient of the per-sample objective (float64, weights then intercepts, flat) at the trained
        parameters, for encoded labels `y` and row weights `w` (the weighted mean log-loss plus the trainer's
        weight decay): what stopping is judged on, computed exactly, not from minibatches."""
        state = self.trainer_.state_dict()
        W, b = state["0.weight"].astype(np.float64), state["0.bias"].astype(np.float64)
        X64 = X.astype(np.float64)
        z = X64 @ W.T + b
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(y)), y] -= 1.0
        p *= (1.0 / len(y)) if w is None else (np.asarray(w, np.float64) / float(np.sum(w)))[:, None]
        opt = self.trainer_.optimizer
        decay, bias_decay = decay_of(opt, False), decay_of(opt, True)  # bias_decay 0: the intercept unpenalised
        return np.concatenate([(p.T @ X64 + decay * W).ravel(), p.sum(axis=0) + bias_decay * b])

    def _class_weighted(self, sample_weight: Any, y: np.ndarray) -> Any:
        """`sample_weight` (None: ones) times each row's weight from `class_weight` (scikit-learn's: a dict of
        label -> weight, or "balanced": n_samples / (n_classes * the class's count)); None without either."""
        if self.class_weight is None:
            return sample_weight
        from sklearn.utils.class_weight import compute_class_weight

        classes = np.unique(y)
        per_class = compute_class_weight(self.class_weight, classes=classes, y=y)
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
