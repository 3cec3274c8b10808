"""scikit-learn estimators wrapping `fastnn.Trainer`: `MLPClassifier`, `MLPRegressor` and `LogisticRegression`.

They follow scikit-learn's conventions (parameters stored as given and checked in `fit`, `classes_`,
`n_features_in_`, any hashable labels, `predict_proba`, `score`, `partial_fit`, `warm_start`) and take
scikit-learn's parameter names where the meaning carries over, so that
`fastnn.sklearn.MLPClassifier(**sklearn.neural_network.MLPClassifier().get_params())` works. A value fastnn
cannot honour is refused at `fit` with the reason (a ValueError), never ignored. Training is `Trainer`'s: the
same engines, devices, precisions and speed. Needs scikit-learn (in a fastnn checkout: `pip install -e ".[sklearn]"`).

Differences from scikit-learn's estimators, by design:

- `activation` is "relu" or "gelu" (tanh form); `solver` is "adam" (AdamW: `alpha` is its decoupled weight
  decay) or "sgd" (`alpha` is L2 weight decay on the mean loss), of the weights only, rather than scikit-learn's
  penalty alpha / (2 * batch rows) * ||W||^2 in the loss; "lbfgs" is refused.
- `learning_rate` ("constant", "invscaling", "adaptive") applies to either solver (scikit-learn: "sgd" only).
- Inputs are used as float32 values as given (no /255 scaling of integer inputs); scale features yourself
  (for example with a `StandardScaler` in a `Pipeline`).
- `sample_weight` (and `LogisticRegression`'s `class_weight`) weigh each row's loss: a minibatch's loss is the
  weighted mean (`Trainer.fit`). Equal weights change nothing (LogisticRegression: C is scaled by their sum, as
  in scikit-learn); unequal ones train on the GPU with the graph engine's weighted loss (engine="auto"; engine
  "fused" or "grid" refuses them).
- With `early_stopping`, the held-out rows are those `Trainer(validation_split=...)` holds out (seeded, not
  stratified).
- `MLPRegressor`'s `loss_curve_` is the mean squared error (scikit-learn's is half of it); with several
  outputs its validation score is the variance-weighted R^2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:  # validate_data is new in scikit-learn 1.6: an older one is refused here with the same message
    from sklearn.utils.validation import validate_data
except ImportError as exc:  # pragma: no cover - exercised only without scikit-learn
    from .._install import pip_install

    raise ImportError(
        f"fastnn.sklearn needs scikit-learn >= 1.6: {pip_install('sklearn')}, or pip install scikit-learn"
    ) from exc

from ._base import Plateau, Rate
from ._classifier import MLPClassifier
from ._logistic import LogisticRegression
from ._regressor import MLPRegressor

if TYPE_CHECKING:  # imported on first use (__getattr__ below); named here for type checkers and the API reference
    from ._search import GridSearchCV, RandomizedSearchCV

__all__ = ["GridSearchCV", "LogisticRegression", "MLPClassifier", "MLPRegressor", "RandomizedSearchCV"]

# A pickle (or joblib file) names each class by module and qualified name, and a fitted estimator's holds a Rate
# and a Plateau too: every one keeps the name it had when fastnn.sklearn was one module, so files written before
# and after the split load alike, and the private modules stay free to move.
for _cls in (LogisticRegression, MLPClassifier, MLPRegressor):
    _cls.__module__ = __name__
_Rate, _Plateau = Rate, Plateau
for _cls, _name in ((Rate, "_Rate"), (Plateau, "_Plateau")):
    _cls.__module__, _cls.__qualname__ = __name__, _name
del _cls, _name, Plateau, Rate, validate_data


#: The scikit-learn releases the searches are tested with (CI installs the newest the extras allow).
_SEARCH_TESTED = "1.6 to 1.9"


def __getattr__(name: str) -> type:
    """GridSearchCV and RandomizedSearchCV, imported on first use: they build on scikit-learn's private search
    helpers (`_search.py` names them), so a scikit-learn release that moves one fails the searches with the names,
    never the estimators."""
    if name not in ("GridSearchCV", "RandomizedSearchCV"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import sklearn

    try:
        from . import _search
    except ImportError as exc:
        raise ImportError(
            f"fastnn.sklearn.{name} builds on scikit-learn's private search helpers, which scikit-learn "
            f"{sklearn.__version__} does not have as fastnn expects ({exc}); fastnn is tested with scikit-learn "
            f"{_SEARCH_TESTED}: install one of those, or use sklearn.model_selection.{name}, which trains fit by fit"
        ) from exc
    for cls in (_search.GridSearchCV, _search.RandomizedSearchCV):
        cls.__module__ = __name__
    globals().update(GridSearchCV=_search.GridSearchCV, RandomizedSearchCV=_search.RandomizedSearchCV)
    return globals()[name]
