"""Per-row sample weights (issue 43): the NumPy engine's weighted mean loss (numpy_engine.weighted), Trainer.fit's
sample_weight, its checks, and the GPU engines' refusal by name."""

from __future__ import annotations

import types

import numpy as np
import pytest

import fastnn
from fastnn.engine.base import Engine
from fastnn.engine.numpy_engine import loss_and_grad, mse_loss_and_grad, weighted


def _data(n: int = 48, d: int = 5, k: int = 3):
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, d)).astype(np.float32), rng.integers(0, k, n), rng.random(n)


@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_weighted_is_the_gradient_of_the_weighted_mean(loss):
    rng = np.random.default_rng(1)
    z = rng.normal(size=(6, 3))
    y = rng.integers(0, 3, 6) if loss == "cross_entropy" else rng.normal(size=(6, 3))
    w = np.array([0.5, 2.0, 0.0, 1.0, 3.0, 0.25])
    f = loss_and_grad if loss == "cross_entropy" else mse_loss_and_grad

    def mean(zz):  # sum(w * loss) / sum(w), the definition
        return (w * f(zz, y)[0]).sum() / w.sum()

    losses, grad = weighted(*f(z, y), w)
    assert losses.sum() / w.sum() == pytest.approx(mean(z))
    eps, numeric = 1e-6, np.zeros_like(z)
    for i in np.ndindex(z.shape):
        dz = np.zeros_like(z)
        dz[i] = eps
        numeric[i] = (mean(z + dz) - mean(z - dz)) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-9)
    assert not grad[2].any()  # a row of weight 0 pulls on nothing
    _, none = weighted(*f(z, y), np.zeros(6))
    assert not none.any()  # a batch of no weight takes no step


def test_a_weighted_full_batch_step_is_the_weighted_gradient_step():
    x, y, w = _data()
    t = fastnn.Trainer(fastnn.MLP([5, 3]), fastnn.SGD(lr=0.5), batch_size=len(x), device="cpu", seed=0)
    before = {k: v.astype(np.float64) for k, v in t.state_dict().items()}
    history = t.fit(x, y, epochs=1, sample_weight=w)
    W, b = before["0.weight"], before["0.bias"]
    z = x.astype(np.float64) @ W.T + b
    losses, dz = weighted(*loss_and_grad(z, y), w)
    assert history["train_loss"][0] == pytest.approx(losses.sum() / w.sum(), rel=1e-5)
    after = t.state_dict()
    np.testing.assert_allclose(after["0.weight"], W - 0.5 * dz.T @ x, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after["0.bias"], b - 0.5 * dz.sum(axis=0), rtol=1e-5, atol=1e-6)


def test_zero_weights_drop_rows_and_equal_weights_change_nothing():
    x, y, w = _data()
    w[::3] = 0.0
    kw = dict(batch_size=len(x), device="cpu", seed=0)  # one step an epoch: the rows' order does not matter
    weighted_fit = fastnn.Trainer(fastnn.MLP([5, 3]), fastnn.SGD(lr=0.5), **kw)
    weighted_fit.fit(x, y, epochs=3, sample_weight=(w > 0).astype(float))
    dropped = fastnn.Trainer(fastnn.MLP([5, 3]), fastnn.SGD(lr=0.5), **dict(kw, batch_size=int((w > 0).sum())))
    dropped.fit(x[w > 0], y[w > 0], epochs=3)
    for k, v in dropped.state_dict().items():
        np.testing.assert_allclose(weighted_fit.state_dict()[k], v, rtol=1e-5, atol=1e-6)
    plain = fastnn.Trainer(fastnn.MLP([5, 3]), fastnn.SGD(lr=0.5), batch_size=16, device="cpu", seed=0)
    equal = fastnn.Trainer(fastnn.MLP([5, 3]), fastnn.SGD(lr=0.5), batch_size=16, device="cpu", seed=0)
    assert plain.fit(x, y, epochs=2)["train_loss"] == equal.fit(x, y, epochs=2, sample_weight=3.0)["train_loss"]


@pytest.mark.parametrize(
    "weight,match",
    [(np.ones(3), r"sample_weight has shape \(3,\); x has 48 rows"), (-np.ones(48), "finite values >= 0"),
     (np.zeros(48), "sums to 0"), ([np.nan] * 48, "finite values >= 0")],  # fmt: skip
)
def test_bad_weights_are_named_before_any_work(weight, match):
    x, y, _ = _data()
    t = fastnn.Trainer(fastnn.MLP([5, 3]), fastnn.SGD(lr=0.1), batch_size=16, device="cpu", seed=0)
    with pytest.raises(fastnn.DataError, match=match):
        t.fit(x, y, sample_weight=weight)
    with pytest.raises(fastnn.ConfigError, match="validation_split"):
        t.fit(x, y, sample_weight=np.arange(48.0) + 1, validation_split=0.2)
    assert t.epoch == 0


def test_the_gpu_engines_refuse_unequal_weights_by_name():
    for name in ("graph", "fused", "grid"):
        with pytest.raises(fastnn.ConfigError, match=f"sample_weight: the {name} engine's loss kernels"):
            Engine.set_sample_weight(types.SimpleNamespace(name=name), np.ones(3, np.float32))
        Engine.set_sample_weight(types.SimpleNamespace(name=name), None)  # unweighted: fine


@pytest.mark.gpu
def test_a_gpu_trainer_refuses_unequal_weights_before_training_and_takes_equal_ones():
    x, y, w = _data(256)
    t = fastnn.Trainer(fastnn.MLP([5, 3]), fastnn.SGD(lr=0.1), batch_size=32, device="cuda", seed=0)
    with pytest.raises(fastnn.ConfigError, match=f"sample_weight: the {t.engine} engine"):
        t.fit(x, y, sample_weight=w)
    assert t.epoch == 0
    t.fit(x, y, epochs=1, sample_weight=np.full(len(x), 2.0))  # equal weights: the unweighted mean, any engine
    assert t.epoch == 1


# ---- the estimators: sample_weight and LogisticRegression's class_weight -------------------------------------


def _imbalanced():
    pytest.importorskip("sklearn")
    from sklearn.datasets import make_classification

    return make_classification(3000, 10, n_informative=5, n_classes=3, weights=[0.7, 0.2, 0.1], random_state=0)


def test_balanced_logistic_regression_reaches_scikit_learns_weighted_objective():
    """class_weight="balanced", C=1: within 1e-3 of scikit-learn's weighted objective (measured 6.6e-5)."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression as SkLogisticRegression
    from sklearn.utils.class_weight import compute_class_weight

    from fastnn.sklearn import LogisticRegression

    x, y = _imbalanced()
    w = compute_class_weight("balanced", classes=np.unique(y), y=y)[y]

    def objective(coef, intercept):  # scikit-learn's: weighted mean log-loss + ||W||^2 / (2 C sum(w))
        z = x @ coef.T + intercept
        z = z - z.max(axis=1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        return (w * -log_p[np.arange(len(y)), y]).sum() / w.sum() + (coef**2).sum() / (2 * w.sum())

    ref = SkLogisticRegression(class_weight="balanced", max_iter=2000).fit(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        ours = LogisticRegression(class_weight="balanced", random_state=0, device="cpu").fit(x, y)
    ours_objective = objective(ours.coef_, ours.intercept_)
    assert ours_objective <= objective(ref.coef_, ref.intercept_) * (1 + 1e-3)
    assert ours.get_params()["class_weight"] == "balanced"


def test_class_weight_is_sample_weight_by_class():
    from fastnn.sklearn import LogisticRegression

    x, y = _imbalanced()
    kw = dict(max_iter=3, tol=0.0, random_state=0, device="cpu")
    by_class = LogisticRegression(class_weight={0: 1.0, 1: 2.0, 2: 5.0}, **kw).fit(x, y)
    by_row = LogisticRegression(**kw).fit(x, y, sample_weight=np.array([1.0, 2.0, 5.0])[y])
    np.testing.assert_array_equal(by_class.predict_proba(x), by_row.predict_proba(x))
    plain = LogisticRegression(**kw).fit(x, y)
    assert not np.array_equal(plain.predict_proba(x), by_row.predict_proba(x))
    assert not hasattr(by_row, "_fit_weight") or by_row._fit_weight is None  # no weights kept (or pickled)


@pytest.mark.parametrize("weight", [-1.0, float("nan"), float("inf")])
def test_a_bad_class_weight_is_named_as_class_weight(weight):
    """A negative or non-finite class weight is refused under its own name (not as the sample_weight it becomes)."""
    from fastnn.sklearn import LogisticRegression

    x, y = _imbalanced()
    est = LogisticRegression(class_weight={0: weight, 1: 1.0, 2: 1.0}, max_iter=2, device="cpu")
    with pytest.raises(ValueError, match=r"class_weight must map each class to a finite weight >= 0.*class 0"):
        est.fit(x, y)
    assert not hasattr(est, "trainer_")


def test_balanced_class_weight_is_refused_by_partial_fit_before_any_work():
    """"balanced" weights would follow each call's rows (a call of one class weighs it 1): refused by name, as
    scikit-learn's SGDClassifier.partial_fit does, leaving the estimator as it was; a dict is fine."""
    from fastnn.sklearn import LogisticRegression

    x, y = _imbalanced()
    est = LogisticRegression(class_weight="balanced", device="cpu")
    with pytest.raises(ValueError, match=r"class_weight='balanced' is not supported for partial_fit"):
        est.partial_fit(x, y, classes=[0, 1, 2])
    assert not hasattr(est, "trainer_") and not hasattr(est, "classes_")
    fixed = LogisticRegression(class_weight={0: 1.0, 1: 2.0, 2: 5.0}, device="cpu")
    assert fixed.partial_fit(x, y, classes=[0, 1, 2]).partial_fit(x, y).n_iter_ == 2


@pytest.mark.parametrize("make", ["MLPClassifier", "MLPRegressor"])
def test_the_mlps_weigh_their_loss(make):
    import fastnn.sklearn as fs

    x, y = _imbalanced()
    y = y if make == "MLPClassifier" else x @ np.arange(10.0)
    w = np.random.default_rng(0).random(len(y))
    kw = dict(hidden_layer_sizes=(6,), max_iter=2, tol=0.0, random_state=0, device="cpu")
    weighted_fit = getattr(fs, make)(**kw).fit(x, y, sample_weight=w)
    assert weighted_fit.trainer_.history["train_loss"] != getattr(fs, make)(**kw).fit(x, y).trainer_.history[
        "train_loss"]  # fmt: skip


def test_a_search_over_class_weighted_fits_fits_each_as_the_estimator_would():
    pytest.importorskip("sklearn")
    import fastnn.sklearn as fs

    x, y = _imbalanced()
    est = fs.LogisticRegression(class_weight="balanced", learning_rate="constant", max_iter=2, tol=0.0,
                                random_state=0, device="cpu")  # fmt: skip
    search = fs.GridSearchCV(est, {"C": [0.1, 1.0]}, cv=2).fit(x[:600], y[:600])
    assert search.plan_.groups == [] and "class_weight='balanced'" in search.plan_.reasons[0]
