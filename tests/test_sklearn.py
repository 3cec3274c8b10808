"""The scikit-learn estimators: scikit-learn's own estimator checks (CPU engine), labels, the sklearn tools."""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest

sklearn = pytest.importorskip("sklearn")

from sklearn.base import clone  # noqa: E402
from sklearn.exceptions import ConvergenceWarning  # noqa: E402
from sklearn.model_selection import GridSearchCV, cross_val_score  # noqa: E402
from sklearn.pipeline import make_pipeline  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402
from sklearn.utils.estimator_checks import parametrize_with_checks  # noqa: E402

import fastnn  # noqa: E402
from fastnn.sklearn import LogisticRegression, MLPClassifier  # noqa: E402

#: Small, fast, CPU instances for the checks (CI has 2 cores): a high learning rate so the checks' small
#: problems are learned in few epochs.
CHECKED = [
    MLPClassifier(hidden_layer_sizes=(16,), learning_rate_init=0.02, max_iter=60, random_state=0, device="cpu"),
    LogisticRegression(learning_rate_init=0.05, max_iter=60, random_state=0, device="cpu"),
]

#: Checks that fail by design, with the reason (scikit-learn reports them as xfail).
EXPECTED_FAILED = {
    "check_sample_weight_equivalence_on_dense_data": "sample_weight: only equal nonzero weights (the loss is an "
    "unweighted mean); other weights are refused with a ValueError",
    "check_sample_weights_not_adding_values": "unequal sample_weight is refused (see above)",
    "check_sample_weights_not_overwritten": "it fits with unequal sample_weight, which is refused (see above)",
    "check_sample_weight_equivalence_on_sparse_data": "sparse input is refused, and unequal sample_weight too",
}


def _expected_failed(estimator):
    return EXPECTED_FAILED


@parametrize_with_checks(CHECKED, expected_failed_checks=_expected_failed)
def test_sklearn_estimator_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        check(estimator)


def _blobs(n=240, seed=0, labels=("cat", "dog", "emu")):
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 4, size=(len(labels), 5))
    k = rng.integers(0, len(labels), n)
    x = centers[k] + rng.normal(0, 1, size=(n, 5))
    return x, np.asarray(labels, dtype=object)[k]


@pytest.mark.parametrize(
    "labels",
    [("cat", "dog", "emu"), (True, False), (1, 5, 10)],
    ids=["strings", "bools", "sparse-ints"],
)
def test_any_hashable_labels_come_back_as_given(labels):
    x, y = _blobs(labels=labels)
    y = np.asarray(list(y))  # the labels' own dtype
    clf = MLPClassifier((8,), learning_rate_init=0.05, max_iter=30, tol=0.0, random_state=0, device="cpu")
    with pytest.warns(ConvergenceWarning, match="max_iter=30"):
        clf.fit(x, y)
    assert set(clf.classes_.tolist()) == set(labels)
    pred = clf.predict(x)
    assert pred.dtype == y.dtype and set(pred.tolist()) <= set(labels)
    assert clf.score(x, y) > 0.9
    assert clf.predict_proba(x).shape == (len(x), len(labels))
    assert clf.n_features_in_ == 5


def test_works_in_pipeline_clone_cross_val_and_grid_search():
    x, y = _blobs()
    mlp = MLPClassifier((8,), learning_rate_init=0.05, max_iter=20, random_state=0, device="cpu")
    pipe = make_pipeline(StandardScaler(), mlp)
    assert cross_val_score(pipe, x, y, cv=3).mean() > 0.8
    grid = GridSearchCV(
        LogisticRegression(max_iter=20, random_state=0, device="cpu"), {"learning_rate_init": [1e-4, 0.05]}, cv=3
    ).fit(x, y)
    assert grid.best_params_ == {"learning_rate_init": 0.05}  # 20 epochs at 1e-4 barely move
    c = clone(pipe)
    assert c.get_params()["mlpclassifier__max_iter"] == 20 and not hasattr(c[-1], "classes_")


def test_the_estimator_is_trainer_training():
    """One implementation of training: the estimator's weights equal a Trainer's with the same settings."""
    x, y = _blobs()
    clf = MLPClassifier((8,), optimizer="sgd", momentum=0.9, learning_rate_init=0.01, batch_size=32, max_iter=3,
                        random_state=7, tol=0.0, n_iter_no_change=100, device="cpu")  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x, y)
    seed = int(np.random.RandomState(7).randint(0, 2**31 - 1))
    t = fastnn.Trainer(fastnn.MLP([5, 8, 3]), fastnn.SGD(lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4),
                       batch_size=32, device="cpu", seed=seed)  # fmt: skip
    t.fit(x.astype(np.float32), np.searchsorted(clf.classes_, y), epochs=3, progress=False)
    for k, v in t.state_dict().items():
        np.testing.assert_array_equal(clf.trainer_.state_dict()[k], v)
    assert clf.n_iter_ == 3 and len(clf.loss_curve_) == 3


def test_early_stopping_restores_the_best_validation_epoch():
    x, y = _blobs(n=400)
    clf = MLPClassifier((16,), learning_rate_init=0.05, max_iter=200, early_stopping=True, n_iter_no_change=3,
                        random_state=0, device="cpu").fit(x, y)  # fmt: skip
    assert clf.n_iter_ < 200
    assert clf.best_validation_score_ == max(clf.validation_scores_)
    assert clf.trainer_.history[-1]["eval_accuracy"] == clf.best_validation_score_


def test_partial_fit_needs_classes_first_and_continues():
    x, y = _blobs()
    clf = MLPClassifier((8,), learning_rate_init=0.05, random_state=0, device="cpu")
    with pytest.raises(ValueError, match="classes must be passed"):
        clf.partial_fit(x, y)
    for _ in range(5):
        clf.partial_fit(x, y, classes=["cat", "dog", "emu"])
    assert clf.trainer_.epoch == 5 and clf.n_iter_ == 5
    with pytest.raises(ValueError, match="not in classes_"):
        clf.partial_fit(x[:3], np.array(["cat", "dog", "yak"]))


def test_sample_weight_equal_is_accepted_unequal_refused():
    x, y = _blobs(n=60)
    clf = LogisticRegression(max_iter=2, random_state=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        a = clf.fit(x, y, sample_weight=np.full(60, 3.0)).predict_proba(x)
        b = clone(clf).fit(x, y).predict_proba(x)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="supported only when every nonzero weight is equal"):
        clf.fit(x, y, sample_weight=np.arange(60.0))


@pytest.mark.parametrize(
    ("param", "value", "match"),
    [
        ("hidden_layer_sizes", (8, 0), "hidden_layer_sizes must hold integers >= 1"),
        ("activation", "tanh", "activation must be one of"),
        ("optimizer", "lbfgs", "optimizer must be one of"),
        ("max_iter", 0, "max_iter must be an integer >= 1"),
        ("learning_rate_init", 0.0, "learning_rate_init must be > 0"),
        ("batch_size", "big", "batch_size must be 'auto' or an integer"),
    ],
)
def test_bad_parameters_are_named_at_fit(param, value, match):
    x, y = _blobs(n=30)
    clf = MLPClassifier(device="cpu").set_params(**{param: value})  # stored as given
    assert clf.get_params()[param] == value
    with pytest.raises(ValueError, match=match):
        clf.fit(x, y)


def test_pickle_round_trip_predicts_the_same():
    x, y = _blobs()
    clf = MLPClassifier((8,), max_iter=5, random_state=0, device="cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x, y)
    back = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(back.predict_proba(x), clf.predict_proba(x))
    assert back.trainer_.epoch == clf.trainer_.epoch


@pytest.mark.gpu
def test_gpu_fit_predict_and_pickle_to_cpu():
    x, y = _blobs(n=2000)
    clf = MLPClassifier((64, 64), learning_rate_init=0.01, max_iter=10, random_state=0, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x, y)
    assert clf.trainer_.device == "cuda"
    assert clf.score(x, y) > 0.9
    blob = pickle.dumps(clf)
    cpu = pickle.loads(blob)  # device="cuda" here: on a machine without a GPU it would load on the CPU
    cpu.trainer_ = fastnn.Trainer.load(_save(clf), device="cpu")
    # The GPU evaluates in "mixed" (fp16 operands): tests/test_cuda_engine.py's bound for its probabilities.
    np.testing.assert_allclose(cpu.predict_proba(x), clf.predict_proba(x), atol=2e-2)
    assert (cpu.predict(x) == clf.predict(x)).mean() > 0.99
    assert pickle.loads(blob).trainer_.device == "cuda"


def _save(clf):
    import os
    import tempfile

    path = os.path.join(tempfile.mkdtemp(), "m.npz")
    clf.trainer_.save(path)
    return path
