"""fastnn.sklearn's searches on the GPU: the many-model engine's scores against scikit-learn's search over the same
estimators fit by fit (the single-model engines), the spread over two GPUs, and a Dask cluster of one worker per
GPU. Marked `gpu`; the two-GPU tests skip on one."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn import model_selection  # noqa: E402
from sklearn.datasets import load_digits, make_regression  # noqa: E402

import fastnn.sklearn as fs  # noqa: E402

pytestmark = pytest.mark.gpu


def gpus() -> int:
    from fastnn.cuda import driver

    return driver.device_count()


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    X, y = load_digits(return_X_y=True)
    return (X / 16).astype(np.float32), y


def fit_quietly(search, X, y):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return search.fit(X, y)


#: Candidates far apart (rates 30x apart, a penalty that cripples): the ranking cannot hinge on rounding.
GRID = {"learning_rate_init": [0.03, 0.001], "alpha": [1e-4, 1.0]}
#: Two widths: two groups, to spread over two GPUs.
WIDTHS = {**GRID, "hidden_layer_sizes": [(16,), (32,)]}


@pytest.mark.parametrize(("precision", "atol"), [("fp32", 0.02), ("mixed", 0.04)])
def test_classifier_scores_match_scikit_learns_search(digits, precision, atol):
    """The many-model engine (fp32) against each fit on the single-model engines: the same ranking and best
    candidate; each mean score within `atol` (a few of 360 test rows per fold; "mixed" trains the single fits
    with fp16 operands)."""
    X, y = digits
    est = fs.MLPClassifier(hidden_layer_sizes=(32,), max_iter=15, random_state=0, device="cuda", precision=precision)
    ours = fit_quietly(fs.GridSearchCV(est, GRID, cv=5), X, y)
    theirs = fit_quietly(model_selection.GridSearchCV(est, GRID, cv=5), X, y)
    assert sorted(ours.cv_results_) == sorted(theirs.cv_results_)
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"], atol=atol)
    assert ours.best_params_ == theirs.best_params_
    assert len(ours.plan_.groups) == 1 and not ours.plan_.fallback
    assert ours.best_estimator_.trainer_.device == "cuda"


@pytest.mark.parametrize(
    "est, grid",
    [(fs.LogisticRegression(max_iter=100, random_state=0, device="cuda", precision="fp32"), {"C": [1e-4, 1.0]}),
     (fs.MLPClassifier(hidden_layer_sizes=(32,), max_iter=30, n_iter_no_change=2, random_state=0, device="cuda",
                       precision="fp32"), {"learning_rate": ["adaptive", "invscaling"], "alpha": [1e-4, 1.0]})],
    ids=["logistic-default", "mlp-adaptive-invscaling"],
)  # fmt: skip
def test_adaptive_rates_batch_on_the_gpu(digits, est, grid):
    """The default LogisticRegression (learning_rate="adaptive") and MLPs with "adaptive" / "invscaling" batch:
    each model's rate set between epochs (`MultiTrainer.set_lr`) reaches the many-model GPU engine's lr tables;
    the scores are those of scikit-learn's search over the single-model engines, to a few test rows."""
    X, y = digits
    ours = fit_quietly(fs.GridSearchCV(est, grid, cv=3), X, y)
    theirs = fit_quietly(model_selection.GridSearchCV(est, grid, cv=3), X, y)
    assert not ours.plan_.fallback and ours.best_params_ == theirs.best_params_
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"], atol=0.03)


def test_regressor_scores_match_scikit_learns_search():
    X, y = make_regression(n_samples=2000, n_features=20, noise=10.0, random_state=0)
    X, y = X.astype(np.float32), y / y.std()
    est = fs.MLPRegressor(hidden_layer_sizes=(32,), max_iter=20, random_state=0, device="cuda", precision="fp32")
    grid = {"learning_rate_init": [0.01, 0.0003], "alpha": [0.0, 1e-3]}
    ours = fit_quietly(fs.GridSearchCV(est, grid, cv=4), X, y)
    theirs = fit_quietly(model_selection.GridSearchCV(est, grid, cv=4), X, y)
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"], atol=0.01)
    assert ours.best_params_ == theirs.best_params_


def test_two_gpus_give_one_gpus_results(digits):
    """n_jobs=2 trains the groups on GPUs 0 and 1 (one thread each) and gives what one GPU gives, bit for bit."""
    if gpus() < 2:
        pytest.skip("needs two GPUs")
    X, y = digits
    est = fs.MLPClassifier(max_iter=5, random_state=0, device="cuda", precision="fp32")
    one = fit_quietly(fs.GridSearchCV(est, WIDTHS, cv=3, refit=False), X, y)
    two = fit_quietly(fs.GridSearchCV(est, WIDTHS, cv=3, refit=False, n_jobs=2), X, y)
    for key in ("mean_test_score", "std_test_score", "rank_test_score"):
        np.testing.assert_array_equal(one.cv_results_[key], two.cv_results_[key], err_msg=key)


@pytest.mark.timeout(600)
def test_a_dask_cluster_of_one_worker_per_gpu(digits):
    """joblib's Dask backend over a local cluster of single-threaded workers, each seeing one GPU
    (CUDA_VISIBLE_DEVICES), runs fastnn's search group by group and scikit-learn's fit by fit."""
    distributed = pytest.importorskip("distributed")
    import joblib

    n = min(gpus(), 2)
    X, y = digits
    est = fs.MLPClassifier(max_iter=5, random_state=0, device="cuda", precision="fp32")
    local = fit_quietly(fs.GridSearchCV(est, WIDTHS, cv=3, refit=False), X, y)
    workers = {f"gpu{i}": {"cls": distributed.Nanny,
                           "options": {"nthreads": 1, "env": {"CUDA_VISIBLE_DEVICES": str(i)}}} for i in range(n)}
    scheduler = {"cls": distributed.Scheduler, "options": {"dashboard_address": None}}
    with distributed.SpecCluster(workers=workers, scheduler=scheduler) as cluster, \
            distributed.Client(cluster) as client, joblib.parallel_backend("dask"):  # fmt: skip
        ours = fit_quietly(fs.GridSearchCV(est, WIDTHS, cv=3, refit=False), X, y)
        theirs = fit_quietly(model_selection.GridSearchCV(est, WIDTHS, cv=3, refit=False), X, y)
        seen = client.run(lambda: __import__("os").environ.get("CUDA_VISIBLE_DEVICES"))
    assert sorted(seen.values()) == [str(i) for i in range(n)]
    np.testing.assert_array_equal(ours.cv_results_["mean_test_score"], local.cv_results_["mean_test_score"])
    np.testing.assert_allclose(ours.cv_results_["mean_test_score"], theirs.cv_results_["mean_test_score"], atol=0.02)
