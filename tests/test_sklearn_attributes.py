"""scikit-learn's fitted attributes (issue 43): coefs_/intercepts_ on the MLPs, coef_/intercept_/decision_function
on LogisticRegression, and a clear error for predict before fit, on the estimators and on Trainer."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.exceptions import NotFittedError  # noqa: E402

import fastnn  # noqa: E402
from fastnn.sklearn import LogisticRegression, MLPClassifier, MLPRegressor  # noqa: E402


def _data(classes: int = 3, n: int = 120, d: int = 5):
    rng = np.random.default_rng(0)
    y = np.arange(n) % classes
    x = rng.normal(size=(n, d)) + y[:, None]
    return x, y


def _forward(coefs, intercepts, x):
    a = x
    for i, (w, b) in enumerate(zip(coefs, intercepts)):
        a = a @ w + b
        if i < len(coefs) - 1:
            a = np.maximum(a, 0)
    return a


def test_mlp_classifier_coefs_and_intercepts_are_the_trained_network():
    x, y = _data()
    clf = MLPClassifier((7, 4), max_iter=3, random_state=0, device="cpu").fit(x, y)
    assert [c.shape for c in clf.coefs_] == [(5, 7), (7, 4), (4, 3)]
    assert [b.shape for b in clf.intercepts_] == [(7,), (4,), (3,)]
    z = _forward(clf.coefs_, clf.intercepts_, x.astype(np.float32).astype(np.float64))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    np.testing.assert_allclose(p / p.sum(axis=1, keepdims=True), clf.predict_proba(x), rtol=1e-5, atol=1e-6)
    clf.partial_fit(x, y)  # they follow the trained weights
    np.testing.assert_array_equal(clf.coefs_[0].T, clf.trainer_.state_dict()["0.weight"].astype(np.float64))


def test_mlp_regressor_coefs_and_intercepts():
    x, _ = _data()
    target = x @ np.arange(5.0)
    reg = MLPRegressor((6,), max_iter=2, random_state=0, device="cpu").fit(x, target)
    z = _forward(reg.coefs_, reg.intercepts_, x.astype(np.float32).astype(np.float64))
    np.testing.assert_allclose(z[:, 0], reg.predict(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("classes", [2, 3])
def test_logistic_regression_coef_intercept_and_decision_function(classes):
    x, y = _data(classes)
    clf = LogisticRegression(max_iter=5, tol=1.0, random_state=0, device="cpu").fit(x, y)
    rows = 1 if classes == 2 else classes
    assert clf.coef_.shape == (rows, 5) and clf.intercept_.shape == (rows,)
    scores = clf.decision_function(x)
    expected = x.astype(np.float32).astype(np.float64) @ clf.coef_.T + clf.intercept_  # fastnn reads float32
    np.testing.assert_allclose(scores, expected[:, 0] if classes == 2 else expected, rtol=1e-12)
    log_p = clf.predict_log_proba(x)
    if classes == 2:  # scikit-learn's binary model: the log-odds of classes_[1]
        assert scores.shape == (len(x),)
        np.testing.assert_allclose(scores, log_p[:, 1] - log_p[:, 0], rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(clf.classes_[(scores > 0).astype(int)], clf.predict(x))
    else:
        np.testing.assert_allclose(scores - scores.mean(axis=1, keepdims=True),
                                   log_p - log_p.mean(axis=1, keepdims=True), rtol=1e-4, atol=1e-4)  # fmt: skip
        np.testing.assert_array_equal(clf.classes_[scores.argmax(axis=1)], clf.predict(x))


@pytest.mark.parametrize("make", [MLPClassifier, MLPRegressor, LogisticRegression])
def test_estimators_before_fit_raise_scikit_learns_not_fitted(make):
    est = make(device="cpu")
    x, _ = _data()
    with pytest.raises(NotFittedError):
        est.predict(x)
    names = ("coef_", "intercept_") if make is LogisticRegression else ("coefs_", "intercepts_")
    for name in names:
        assert not hasattr(est, name)
    if make is LogisticRegression:
        with pytest.raises(NotFittedError):
            est.decision_function(x)


def test_trainer_predict_before_fit_is_an_error_until_it_has_weights(tmp_path):
    x, y = _data()
    x = x.astype(np.float32)
    t = fastnn.Trainer(fastnn.MLP([5, 3]), fastnn.SGD(lr=0.1), batch_size=16, device="cpu", seed=0)
    for call in (t.predict, t.predict_proba):
        with pytest.raises(fastnn.NotFittedError, match="has not been trained .* random initial weights"):
            call(x)
    with pytest.raises(fastnn.DataError):  # a bad x is named first
        t.predict(x[:, :2])
    assert set(t.evaluate(x, y)) == {"loss", "accuracy"}  # the loss before training stays measurable
    other = fastnn.Trainer(fastnn.MLP([5, 3]), fastnn.SGD(lr=0.1), batch_size=16, device="cpu", seed=1)
    other.load_state_dict(t.state_dict())
    assert other.predict(x).shape == (len(x),)  # given weights
    t.fit(x, y, epochs=1)
    assert t.predict(x).shape == (len(x),)
    t.save(tmp_path / "t.npz")
    assert fastnn.Trainer.load(tmp_path / "t.npz").predict(x).shape == (len(x),)
    reg = fastnn.Trainer(fastnn.MLP([5, 1]), fastnn.SGD(lr=0.1), batch_size=16, device="cpu", seed=0, loss="mse")
    with pytest.raises(fastnn.NotFittedError, match=r"Trainer.predict:"):
        reg.predict(x)


def test_scikit_learns_logistic_regression_parameters_build_this_one():
    """fastnn.sklearn.LogisticRegression(**sklearn's LogisticRegression().get_params()) builds (class_weight, dual,
    intercept_scaling, l1_ratio, n_jobs were a TypeError); its default solver, lbfgs, fits (scikit-learn's solve:
    at max_iter=3 it warns), and with solver="sgd" the rest fits."""
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression as SkLogisticRegression

    params = SkLogisticRegression(max_iter=3).get_params()
    est = LogisticRegression(**params, device="cpu")
    assert {k: est.get_params()[k] for k in params} == params
    x, y = _data()
    with pytest.warns(ConvergenceWarning, match="lbfgs failed to converge after 3 iteration"):
        assert est.fit(x, y).n_iter_ == 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert est.set_params(solver="sgd").fit(x, y).n_iter_ == 3
    for bad, match in (({"dual": True}, "dual=True is not implemented"),
                       ({"l1_ratio": 0.5}, "l1_ratio=0.5 is not implemented")):  # fmt: skip
        with pytest.raises(ValueError, match=match):
            LogisticRegression(**bad, device="cpu").fit(x, y)


def _sk_digits():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return x / 16, y


@pytest.mark.parametrize("case", ["digits", "binary"])
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "balanced+sample_weight"])
def test_lbfgs_is_scikit_learns_fit(case, weighted):
    """Issue 43: solver="lbfgs" (scikit-learn's default) is scikit-learn's own solve: from its default get_params
    the swap fits and gives its coef_, intercept_ and predict_proba (same iterations: same iterates), with
    class_weight="balanced" (the classes counted by their sample weights, as scikit-learn counts them) and
    sample_weight."""
    from sklearn.linear_model import LogisticRegression as SkLogisticRegression

    x, y = _sk_digits()
    if case == "binary":
        x, y = x[y < 2], y[y < 2]
    kw = {"class_weight": "balanced"} if weighted else {}
    fit = {"sample_weight": np.random.default_rng(0).uniform(0.5, 2.0, len(y))} if weighted else {}
    sk = SkLogisticRegression(**kw).fit(x, y, **fit)
    est = LogisticRegression(**SkLogisticRegression(**kw).get_params(), device="cpu").fit(x, y, **fit)
    assert est.n_iter_ == sk.n_iter_[0]
    np.testing.assert_allclose(est.coef_, sk.coef_, rtol=0, atol=1e-4)
    np.testing.assert_allclose(est.intercept_, sk.intercept_, rtol=0, atol=1e-4)
    np.testing.assert_allclose(est.predict_proba(x), sk.predict_proba(x), rtol=0, atol=1e-5)
    np.testing.assert_allclose(est.decision_function(x), sk.decision_function(x), rtol=0, atol=1e-4)
    np.testing.assert_array_equal(est.predict(x), sk.predict(x))
    assert est.score(x, y) == sk.score(x, y)


def test_lbfgs_fit_behaves_like_any_fit():
    """After an lbfgs fit: the trainer holds the weights (its predictions are the estimator's), pickling keeps them,
    warm_start starts from them (converged: no further iterations are needed), there is no partial_fit (an
    AttributeError saying why, as scikit-learn's MLPs for lbfgs), and
    penalty=None drops the penalty (a larger coef_)."""
    import pickle
    import warnings

    from sklearn.exceptions import ConvergenceWarning

    x, y = _data()
    est = LogisticRegression(solver="lbfgs", tol=1e-8, device="cpu").fit(x, y)
    np.testing.assert_array_equal(est.trainer_.predict_proba(est._validate(x, reset=False)), est.predict_proba(x))
    back = pickle.loads(pickle.dumps(est))
    np.testing.assert_array_equal(back.predict_proba(x), est.predict_proba(x))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        warm = back.set_params(warm_start=True, tol=1e-6).fit(x, y)
    assert warm.n_iter_ <= 1
    np.testing.assert_allclose(warm.coef_, est.coef_, rtol=0, atol=1e-5)
    with pytest.raises(AttributeError, match="has no attribute 'partial_fit'") as refused:
        est.partial_fit(x, y, classes=np.unique(y))
    assert "partial_fit is not implemented for solver='lbfgs'" in str(refused.value.__cause__)
    assert not hasattr(est, "partial_fit") and hasattr(est.set_params(solver="sgd"), "partial_fit")
    est.set_params(solver="lbfgs")
    free = LogisticRegression(solver="lbfgs", penalty=None, max_iter=20, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert np.abs(free.fit(x, y).coef_).sum() > np.abs(est.coef_).sum()
