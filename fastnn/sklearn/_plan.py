"""How a search's fits become many-model fits: each (candidate, fold) fit of a fastnn estimator is described as
the `Trainer` its own `fit` would build, split into what one `MultiTrainer` must share (the group key) and what
may differ per model. Fits that cannot be described so go to scikit-learn's own per-fit path.

What may differ per model (batched): `learning_rate_init` (lr), `learning_rate` and `power_t` (each model's rate
follows its own fit's rule between epochs: "adaptive" divides it at each plateau, LogisticRegression's judging `tol`
by its exact objective there; "invscaling" scales it by the samples seen), `alpha` / `C` (weight decay, C with the
fold's rows), `momentum`, `nesterovs_momentum`, `beta_1`, `beta_2`, `epsilon`, `max_iter`, `tol`, `n_iter_no_change`
(each model stops on its own, on the host), `penalty`, `warm_start` (a search's clones start afresh), the fold (a
mask over one copy of the data). What must be the same (group key): the estimator class, `hidden_layer_sizes`,
`activation`, `solver`, the batch size (`batch_size`, "auto" with the fold's rows), `precision`, `device`, the
classes of the fold, and `random_state`: an int (or RandomState) keys both the initial weights and the shuffle of a
fit, and the models of one MultiTrainer share one shuffle, so candidates with different seeds train in different
groups. A Pipeline ending in one of fastnn's estimators: its other steps are fitted once per fold, and the final
step's candidates train on their output, a group (at least) per fold.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

import numpy as np
from sklearn.base import clone

from .._model import MLP
from ._base import Rate, auto_batch
from ._classifier import MLPClassifier
from ._logistic import LogisticRegression
from ._regressor import MLPRegressor

__all__ = ["BATCHED_PARAMS", "GROUP_PARAMS", "Group", "ModelSpec", "Plan", "make_plan"]

#: The estimator classes whose fits batch (exactly these: a subclass may train differently).
BATCHABLE = (MLPClassifier, MLPRegressor, LogisticRegression)
#: Parameters that may differ between the models of one many-model fit.
BATCHED_PARAMS = ("learning_rate_init", "learning_rate", "power_t", "alpha", "C", "penalty", "momentum", "beta_1",
                  "beta_2", "epsilon", "nesterovs_momentum", "max_iter", "tol", "n_iter_no_change", "warm_start",
                  "max_fun")  # fmt: skip
#: Parameters whose values split the fits into several many-model fits.
GROUP_PARAMS = ("hidden_layer_sizes", "activation", "solver", "batch_size", "precision", "device", "random_state")
#: Optimizer fields a MultiTrainer takes per model (all of SGD's and AdamW's).
_PER_MODEL_FIELDS = ("lr", "weight_decay", "momentum", "nesterov", "betas", "eps")


@dataclasses.dataclass
class ModelSpec:
    """One (candidate, fold) fit as one model of a group."""

    pair: int  #: index in the search's candidate-major list of (candidate, fold) fits
    fold: int
    rows: np.ndarray  #: the fold's training rows (ascending) in the group's data
    hparams: dict[str, Any]  #: the optimizer's per-model fields
    seed: int  #: its initial weights' seed
    max_iter: int
    tol: float  #: its plateau's threshold (`_plateau_tol`: LogisticRegression's is 0)
    patience: float  #: n_iter_no_change
    name: str  #: the estimator's class name (ConvergenceWarning's text)
    learning_rate: str = "constant"  #: its rate rule ("constant", "adaptive", "invscaling"), as its fit's `Rate`
    power_t: float = 0.5
    divisor: float = 5.0  #: what "adaptive" divides its rate by at a plateau (`_rate_divisor`)
    objective_tol: float | None = None  #: LogisticRegression's `tol` on its exact objective at plateaus, else None


@dataclasses.dataclass
class Group:
    """Fits that train as one MultiTrainer: one architecture, optimizer class, batch size, shuffle and data."""

    key: tuple
    model: MLP
    loss: str
    optimizer: Any  #: SGD or AdamW: the group's class and shared fields
    batch_size: int
    precision: str
    device: str
    shuffle_seed: int | None  #: None: random_state=None, drawn when the group trains
    own_rows: np.ndarray | None  #: None: a mask over the search's X; else the data is X[own_rows] (one fold)
    head_fold: int | None  #: a Pipeline's fits: the fold whose transformed rows (its other steps' output) it trains on
    classes: np.ndarray | None  #: a classifier's classes (labels are encoded as indices into them)
    models: list[ModelSpec] = dataclasses.field(default_factory=list)
    #: LogisticRegression's: the fold's training mean, which its rows (trained and scored) are less, as its fit's
    centre: np.ndarray | None = None

    def cost(self) -> float:
        """Rough work (models x rows x epochs x parameters), to balance groups over devices."""
        sizes = self.model.sizes
        params = sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
        return float(sum(m.rows.size * m.max_iter for m in self.models)) * params


    @property
    def masked(self) -> bool:
        """Whether the models train on masks over the search's whole X (else on one fold's own data)."""
        return self.own_rows is None and self.head_fold is None


@dataclasses.dataclass
class Plan:
    groups: list[Group]
    fallback: list[int]  #: pairs that take scikit-learn's per-fit path
    reasons: dict[int, str]  #: why, per fallback pair (for the docs and tests)


def _ascending(rows: np.ndarray) -> bool:
    return rows.ndim == 1 and (rows.size < 2 or bool((np.diff(rows) > 0).all()))


def final_step(est: Any) -> str | None:
    """The name of a Pipeline's last step when that step is one of fastnn's estimators (its fits batch, the other
    steps fitted once per fold), else None."""
    from sklearn.pipeline import Pipeline

    if type(est) is Pipeline and est.steps and type(est.steps[-1][1]) in BATCHABLE:
        return est.steps[-1][0]
    return None


def batches(est: Any) -> bool:
    """Whether a search over `est` can batch any fit: one of fastnn's estimators, or a Pipeline ending in one."""
    return type(est) in BATCHABLE or final_step(est) is not None


def not_batchable(est: Any) -> str | None:
    """Why this estimator's fits take scikit-learn's per-fit path, or None when they batch."""
    if type(est) not in BATCHABLE:
        return f"{type(est).__name__} is not one of fastnn's estimators {[c.__name__ for c in BATCHABLE]}"
    if getattr(est, "solver", None) == "lbfgs":
        return "solver='lbfgs' is scikit-learn's full-batch solve on the CPU, one fit at a time"
    if est.early_stopping:
        return "early_stopping=True holds out rows and keeps each model's best epoch"
    if est.verbose:
        return "verbose prints each fit's epochs"
    if est.engine != "auto":
        return f"engine={est.engine!r} names a single-model engine"
    if getattr(est, "class_weight", None) is not None:
        return f"class_weight={est.class_weight!r} weighs the rows, which the many-model engines do not"
    return None


def _seed(est: Any) -> int | None:
    """The seed the fit would use for its weights and shuffle, or None for random_state=None (a fresh draw)."""
    return None if est.random_state is None else est._seed()


def make_plan(
    base: Any, candidates: list[dict[str, Any]], splits: list[tuple[np.ndarray, np.ndarray]], X: np.ndarray | None,
    y: Any, fit_params: dict[str, Any], heads: list[Any] | None = None,
) -> Plan:
    """Group the (candidate, fold) fits (candidate-major, as scikit-learn orders them). `X` is the search's data
    as float32 (None when it is not usable as such: its fits fall back); `y` its targets. For a Pipeline, `heads`
    holds each fold's (training rows, all rows) as its other steps fitted on the fold give them (float32), or None
    for a fold where they do not give such arrays."""
    n_splits = len(splits)
    groups: dict[tuple, Group] = {}
    fallback: list[int] = []
    reasons: dict[int, str] = {}
    classifier = _targets(base, y)
    folds = [(np.asarray(train), np.asarray(test)) for train, test in splits]
    for c, params in enumerate(candidates):
        for f, (train, _) in enumerate(folds):
            pair = c * n_splits + f
            why, spec = _describe(base, params, train, f, X, heads, classifier, fit_params)
            if why is not None:
                fallback.append(pair)
                reasons[pair] = why
                continue
            group, model = spec
            group = groups.setdefault(group.key, group)
            model.pair = pair
            group.models.append(model)
    return Plan(list(groups.values()), fallback, reasons)


def _targets(base: Any, y: Any) -> Any:
    """For a classifier: y as an array that labels can be taken from (None: unusable, fall back); for a
    regressor: y float64 (n, k)."""
    from sklearn.base import is_classifier
    from sklearn.utils.multiclass import check_classification_targets

    try:
        if is_classifier(base):
            y = np.asarray(y)
            if y.ndim != 1:
                return None
            check_classification_targets(y)
            return y
        y = np.asarray(y, dtype=np.float64)
        return y.reshape(-1, 1) if y.ndim == 1 else (y if y.ndim == 2 else None)
    except (TypeError, ValueError):
        return None


def _describe(base: Any, params: dict[str, Any], train: np.ndarray, fold: int, X: np.ndarray | None,
              heads: list[Any] | None, targets: Any, fit_params: dict[str, Any]) -> tuple[str | None, Any]:  # fmt: skip
    """(reason, None) for a fit that falls back, else (None, (its Group (key and shared values), its ModelSpec))."""
    if targets is None:
        return "the targets are not an array fastnn's estimators take as such", None
    if fit_params:
        return f"fit parameters {sorted(fit_params)} are passed to each fit", None
    final = final_step(base)
    head_fold = None
    if final is not None:
        other = sorted(k for k in params if not k.startswith(final + "__"))
        if other:
            return f"the candidate sets {other}: the pipeline's other steps would differ per candidate", None
        if heads is None or heads[fold] is None:
            return "the pipeline's other steps do not give a numeric array on this fold", None
        est = clone(base).set_params(**clone(params, safe=False)).steps[-1][1]
        width, head_fold = heads[fold][0].shape[1], fold
    else:
        if X is None:
            return "the data is not an array fastnn's estimators take as such", None
        est = clone(base).set_params(**clone(params, safe=False))
        width = X.shape[1]
    why = not_batchable(est)
    if why is not None:
        return why, None
    try:
        est._check_params()  # the fit's own checks: a bad value takes the per-fit path, which reports it
    except ValueError as exc:
        return f"the fit refuses its parameters ({exc})", None
    own = None if head_fold is not None or _ascending(train) else train  # the fit sees X[train] in this order
    centre = None
    if isinstance(est, LogisticRegression):  # it trains on rows less its fit's mean: each fold's own (`_centred`)
        rows = heads[fold][0] if head_fold is not None else X[train]  # type: ignore[index]
        centre = rows.mean(axis=0, dtype=np.float64) if rows.shape[0] else None
        own = None if head_fold is not None else train
    n = int(train.size)
    classes = None
    if isinstance(est, (MLPClassifier, LogisticRegression)):
        classes = np.unique(targets[train])
        if classes.size < 2:
            return "the fold holds one class", None
        outputs = int(classes.size)
    else:
        outputs = int(targets.shape[1])
    model = MLP([width, *est._hidden_sizes, outputs], activation=est._activation())
    opt = est._optimizer(n)
    shared = {f.name: getattr(opt, f.name) for f in dataclasses.fields(opt) if f.name not in _PER_MODEL_FIELDS}
    hparams = {f.name: getattr(opt, f.name) for f in dataclasses.fields(opt) if f.name in _PER_MODEL_FIELDS}
    seed = _seed(est)
    batch = auto_batch(est.batch_size, n)
    key = (
        type(est).__name__, model.sizes, model.activation, est._loss, type(opt).__name__, tuple(sorted(shared.items())),
        batch, est.precision, est.device, seed,
        None if own is None else ("fold", fold), None if head_fold is None else ("pipeline", fold),
        None if classes is None else tuple(classes.tolist()),
    )  # fmt: skip
    group = Group(key=key, model=model, loss=est._loss, optimizer=type(opt)(**{**shared, **hparams}),
                  batch_size=batch, precision=est.precision, device=est.device, shuffle_seed=seed, own_rows=own,
                  head_fold=head_fold, classes=classes, centre=centre)  # fmt: skip
    patience = est.n_iter_no_change
    if est.learning_rate == "invscaling" and not _rates_fit(est, n, int(est.max_iter)):
        return (f"learning_rate='invscaling' with power_t={est.power_t!r} takes the rate to 0 in float32 within "
                f"max_iter={est.max_iter} epochs, which a MultiTrainer's rate cannot be"), None
    spec = ModelSpec(pair=-1, fold=fold, rows=train if group.masked else np.arange(n), hparams=hparams,
                     seed=est._seed() if seed is None else seed, max_iter=int(est.max_iter), tol=est._plateau_tol(),
                     patience=patience if isinstance(patience, numbers.Real) else float(patience),
                     name=type(est).__name__, learning_rate=est.learning_rate, power_t=float(est.power_t),
                     divisor=float(est._rate_divisor),
                     objective_tol=float(est.tol) if isinstance(est, LogisticRegression) else None)  # fmt: skip
    return None, (group, spec)


def _rates_fit(est: Any, n: int, max_iter: int) -> bool:
    """Whether "invscaling"'s rate stays finite and nonzero in float32 up to the fit's last epoch (it falls:
    lr / (samples seen + 1) ** power_t, as the fit's `Rate` gives it), as a MultiTrainer's lr must."""
    rate = Rate("invscaling", float(est.learning_rate_init), float(est.power_t))
    rate.begin(0, 0, n, 1)
    last = float(np.float32(rate(max(0, max_iter - 1))))
    return math.isfinite(last) and last > 0
