"""fastnn.sklearn's GridSearchCV / RandomizedSearchCV against scikit-learn's own searches over the same fastnn
estimators on the CPU: the same cv_results_ keys, scores per candidate (to the engines' tolerance), ranks,
best_params_, refit and error_score; how fits group and fall back; the spread over devices; Dask."""

from __future__ import annotations

import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn import model_selection  # noqa: E402
from sklearn.datasets import load_digits, make_regression  # noqa: E402
from sklearn.exceptions import FitFailedWarning  # noqa: E402
from sklearn.linear_model import Ridge  # noqa: E402

import fastnn.sklearn as fs  # noqa: E402
from fastnn.sklearn import _spread  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: Scores of equal models agree to float32 rounding on the CPU; differently summed (batched) float32 products
#: could move a borderline row, so allow one test row in a few hundred.
ATOL = 0.01


@pytest.fixture(scope="module")
def digits() -> tuple[np.ndarray, np.ndarray]:
    X, y = load_digits(return_X_y=True)
    return (X / 16).astype(np.float32)[:540], y[:540]


@pytest.fixture(scope="module")
def regression() -> tuple[np.ndarray, np.ndarray]:
    X, y = make_regression(n_samples=300, n_features=8, noise=5.0, random_state=0)
    return X.astype(np.float32), (y / y.std()).astype(np.float64)


def mlp(**kw) -> fs.MLPClassifier:
    return fs.MLPClassifier(**{"hidden_layer_sizes": (16,), "max_iter": 6, "random_state": 0, "device": "cpu", **kw})


def both(search, est, grid, X, y, **kw):
    """(fastnn's search, scikit-learn's search), fitted on the same data with the same arguments."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = getattr(fs, search)(est, grid, **kw).fit(X, y)
        theirs = getattr(model_selection, search)(est, grid, **kw).fit(X, y)
    return ours, theirs


def assert_same_results(ours, theirs, atol: float = ATOL) -> None:
    a, b = ours.cv_results_, theirs.cv_results_
    assert sorted(a) == sorted(b)
    for key in a:
        if key.endswith("_time"):
            continue
        if "score" in key and not key.startswith("rank"):
            np.testing.assert_allclose(np.asarray(a[key], float), np.asarray(b[key], float), atol=atol, err_msg=key)
        elif key.startswith("param"):
            assert list(a[key]) == list(b[key]), key
        else:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_classifier_grid_matches_scikit_learn(digits):
    X, y = digits
    grid = {"learning_rate_init": [0.03, 0.001], "alpha": [1e-4, 0.3], "momentum": [0.9]}
    ours, theirs = both("GridSearchCV", mlp(), grid, X, y, cv=3, return_train_score=True)
    assert_same_results(ours, theirs)
    assert ours.best_params_ == theirs.best_params_
    assert ours.best_score_ == pytest.approx(theirs.best_score_, abs=ATOL)
    assert len(ours.plan_.groups) == 1 and not ours.plan_.fallback  # 4 candidates x 3 folds: one 12-model fit
    assert isinstance(ours.best_estimator_, fs.MLPClassifier)
    np.testing.assert_array_equal(ours.predict(X), theirs.predict(X))  # the refit is the estimator's own fit
    assert ours.n_splits_ == 3 and ours.multimetric_ is False


def test_groups_by_what_must_differ(digits):
    """Hidden sizes, solvers and seeds split the fits into groups; everything else batches."""
    X, y = digits
    grid = {"hidden_layer_sizes": [(8,), (16,)], "random_state": [0, 1], "alpha": [1e-4, 1e-2],
            "solver": ["adam", "sgd"]}  # fmt: skip
    ours, theirs = both("GridSearchCV", mlp(), grid, X, y, cv=2)
    assert_same_results(ours, theirs)
    assert len(ours.plan_.groups) == 8 and all(len(g.models) == 4 for g in ours.plan_.groups)
    assert ours.best_params_ == theirs.best_params_


def test_optimizer_constants_batch(digits):
    """SGD's momentum and Nesterov (which momentum 0 turns off), AdamW's betas and eps: per model, one group."""
    X, y = digits
    grid = [{"solver": ["sgd"], "momentum": [0.0, 0.9], "nesterovs_momentum": [True, False],
             "learning_rate_init": [0.05]},
            {"beta_1": [0.9, 0.5], "epsilon": [1e-8, 1e-3]}]  # fmt: skip
    ours, theirs = both("GridSearchCV", mlp(), grid, X, y, cv=2)
    assert_same_results(ours, theirs)
    assert [len(g.models) for g in ours.plan_.groups] == [8, 8]  # one group per solver
    assert ours.best_params_ == theirs.best_params_


def test_multimetric_and_refit_by_name(digits):
    X, y = digits
    grid = {"learning_rate_init": [0.03, 0.003], "alpha": [1e-4, 1.0]}
    scoring = {"acc": "accuracy", "nll": "neg_log_loss", "f1": "f1_macro"}
    ours, theirs = both("GridSearchCV", mlp(), grid, X, y, cv=3, scoring=scoring, refit="nll")
    assert_same_results(ours, theirs, atol=0.02)
    assert ours.multimetric_ and ours.best_params_ == theirs.best_params_
    assert set(ours.scorer_) == {"acc", "nll", "f1"}


def test_regressor_randomized_matches_scikit_learn(regression):
    X, y = regression
    est = fs.MLPRegressor(hidden_layer_sizes=(16,), max_iter=10, random_state=3, device="cpu")
    dist = {"learning_rate_init": [0.03, 0.01, 0.001], "alpha": [0.0, 1e-3, 0.5], "beta_1": [0.9, 0.5]}
    ours, theirs = both("RandomizedSearchCV", est, dist, X, y, n_iter=5, random_state=1,
                        cv=model_selection.KFold(3, shuffle=True, random_state=0))  # fmt: skip
    assert_same_results(ours, theirs, atol=1e-3)
    assert ours.best_params_ == theirs.best_params_
    assert len(ours.plan_.groups) == 1


def test_logistic_regression_c_uses_each_folds_rows(digits):
    """C is weight decay 1 / (C n) with n the fold's rows: unequal folds still batch, each with its own decay; each
    fold is its own group, trained on its rows less their mean as the estimator's fit trains (`_centred`)."""
    X, y = digits
    est = fs.LogisticRegression(max_iter=5, learning_rate="constant", random_state=0, device="cpu")
    ours, theirs = both("GridSearchCV", est, {"C": [0.01, 1.0, 100.0]}, X[:500], y[:500], cv=3)
    assert_same_results(ours, theirs)
    assert len(ours.plan_.groups) == 3 and ours.best_params_ == theirs.best_params_
    from sklearn.model_selection import StratifiedKFold  # cv=3's folds for a classifier

    for (train, _), group in zip(StratifiedKFold(3).split(X[:500], y[:500]), ours.plan_.groups, strict=True):
        assert len(group.models) == 3
        np.testing.assert_allclose(group.centre, X[:500][train].astype(np.float32).mean(axis=0), rtol=1e-6)


def _same_as_own_fits(monkeypatch, est, grid, X, y, cv):
    """Run both searches, recording each batched model's epochs and convergence, and check them against the
    estimator's own fit on that fold (candidate-major pairs, as the plan numbers them); returns the searches and
    the own fits."""
    from sklearn.base import clone, is_classifier

    from fastnn.sklearn import _search

    trained = {}

    def recording(*args, **kwargs):
        result = train_group(*args, **kwargs)
        trained.update({r.pair: r for r in result.models})
        return result

    train_group = _search.train_group
    monkeypatch.setattr(_search, "train_group", recording)
    ours, theirs = both("GridSearchCV", est, grid, X, y, cv=cv)
    assert ours.plan_.fallback == [] and sorted(trained) == list(range(len(ours.cv_results_["params"]) * cv))
    splits = list(model_selection.check_cv(cv, y, classifier=is_classifier(est)).split(X, y))
    own = {}
    for pair, r in trained.items():
        params, (train, _) = ours.cv_results_["params"][pair // cv], splits[pair % cv]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fit = clone(est).set_params(**params).fit(X[train], y[train])
        own[pair] = fit
        assert r.n_iter == fit.n_iter_, (pair, params)
        assert r.converged == (not any("without convergence" in str(w.message) for w in caught)), (pair, params)
    return ours, theirs, own


def test_logistic_regressions_lbfgs_fits_one_at_a_time(digits):
    """solver="lbfgs" is scikit-learn's solve on the CPU: its candidates take the per-fit path, with the reason in
    plan_, and the search's results are scikit-learn's search's over the same estimator."""
    X, y = digits
    est = fs.LogisticRegression(solver="lbfgs", random_state=0, device="cpu")
    ours, theirs = both("GridSearchCV", est, {"C": [0.1, 1.0, 10.0]}, X[:300], y[:300], cv=2)
    assert_same_results(ours, theirs, atol=0)
    assert not ours.plan_.groups and sorted(ours.plan_.fallback) == list(range(6))
    assert all("solver='lbfgs'" in ours.plan_.reasons[i] for i in ours.plan_.fallback)


def test_logistic_regressions_adaptive_rate_batches(digits, monkeypatch):
    """LogisticRegression's default learning_rate="adaptive" batches: each model halves its own rate at its
    plateaus and stops when its exact objective changed by at most tol over a phase, at the epoch its own fit
    stops; the scores are scikit-learn's search's."""
    X, y = digits
    est = fs.LogisticRegression(max_iter=60, n_iter_no_change=2, tol=1e-3, random_state=0, device="cpu")
    ours, theirs, own = _same_as_own_fits(monkeypatch, est, {"C": [0.01, 1.0, 100.0]}, X[:300], y[:300], 2)
    assert_same_results(ours, theirs)
    assert ours.best_params_ == theirs.best_params_ and len(ours.plan_.groups) == 2  # a group per fold
    assert any(f._rate_.lr < est.learning_rate_init / 2 for f in own.values())  # the rate was halved, twice at least
    assert any(f.n_iter_ < est.max_iter for f in own.values())  # and some stopped on tol


def test_mlp_adaptive_and_invscaling_rates_batch(digits, monkeypatch):
    """MLPClassifier's "adaptive" (the rate divided by 5 at each plateau until 1e-6) and "invscaling" (scaled by
    the samples seen before each epoch) batch beside "constant", each model at its own fit's rates."""
    X, y = digits
    est = mlp(max_iter=25, n_iter_no_change=1, tol=1e-2, learning_rate_init=0.05)
    grid = {"learning_rate": ["constant", "adaptive", "invscaling"], "power_t": [0.5, 0.25], "alpha": [1e-4]}
    ours, theirs, own = _same_as_own_fits(monkeypatch, est, grid, X, y, 2)
    assert_same_results(ours, theirs)
    assert ours.best_params_ == theirs.best_params_ and len(ours.plan_.groups) == 1
    assert any(f.learning_rate == "adaptive" and f._rate_.lr < est.learning_rate_init / 5 for f in own.values())


def test_regressor_adaptive_and_invscaling_rates_batch(regression, monkeypatch):
    X, y = regression
    est = fs.MLPRegressor(hidden_layer_sizes=(8,), max_iter=30, n_iter_no_change=1, tol=1e-2, random_state=0,
                          device="cpu", learning_rate_init=0.01)  # fmt: skip
    grid = {"learning_rate": ["adaptive", "invscaling"], "alpha": [1e-4, 1.0]}
    ours, theirs, own = _same_as_own_fits(monkeypatch, est, grid, X, y, 3)
    assert_same_results(ours, theirs)
    assert ours.best_params_ == theirs.best_params_
    assert any(f.learning_rate == "adaptive" and f._rate_.lr < est.learning_rate_init for f in own.values())


def test_an_invscaling_rate_that_reaches_zero_falls_back(digits):
    """A rate that "invscaling" takes to 0 in float32 within max_iter is one a MultiTrainer cannot train at: that
    fit takes scikit-learn's path, with its reason."""
    X, y = digits
    ours, theirs = both("GridSearchCV", mlp(learning_rate="invscaling"), {"power_t": [0.5, 50.0]}, X, y, cv=2)
    assert_same_results(ours, theirs)
    assert ours.plan_.fallback == [2, 3] and "float32" in ours.plan_.reasons[2]


def test_shuffled_folds_train_on_their_own_copy(digits):
    """A splitter whose training rows are not ascending (ShuffleSplit): the fit sees them in that order, so each
    such fold's models train on their own copy of the data; the results are still scikit-learn's."""
    X, y = digits
    cv = model_selection.ShuffleSplit(n_splits=2, test_size=0.25, random_state=0)
    ours, theirs = both("GridSearchCV", mlp(), {"alpha": [1e-4, 0.1]}, X, y, cv=cv)
    assert_same_results(ours, theirs)
    assert len(ours.plan_.groups) == 2 and all(g.own_rows is not None for g in ours.plan_.groups)


def test_a_pipeline_fits_its_other_steps_once_per_fold(digits):
    """Pipeline(StandardScaler, MLPClassifier): the scaler is fitted on each fold once, as the pipeline's fit would,
    and the candidates of the final step train on its output, one group per fold; a candidate that changes the
    scaler takes the per-fit path."""
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = digits
    pipe = Pipeline([("scale", StandardScaler()), ("mlp", mlp())])
    grid = [{"mlp__alpha": [1e-4, 0.3], "mlp__learning_rate_init": [0.03, 0.003]},
            {"scale__with_std": [False], "mlp__alpha": [1e-4]}]  # fmt: skip
    ours, theirs = both("GridSearchCV", pipe, grid, X, y, cv=3, return_train_score=True)
    assert_same_results(ours, theirs)
    assert ours.best_params_ == theirs.best_params_
    assert [len(g.models) for g in ours.plan_.groups] == [4, 4, 4]  # one group per fold
    assert ours.plan_.fallback == [12, 13, 14] and "scale__with_std" in ours.plan_.reasons[12]
    assert isinstance(ours.best_estimator_, Pipeline)


def test_what_falls_back_is_scikit_learns_fit(digits):
    """early_stopping and a refused parameter take the per-fit path (the refusal becoming error_score), next to
    batched candidates in the same search."""
    X, y = digits
    grid = [{"early_stopping": [False, True]}, {"activation": ["tanh"]}]
    with pytest.warns(FitFailedWarning):
        ours = fs.GridSearchCV(mlp(), grid, cv=2).fit(X, y)
    with pytest.warns(FitFailedWarning):
        theirs = model_selection.GridSearchCV(mlp(), grid, cv=2).fit(X, y)
    assert_same_results(ours, theirs)
    plan = ours.plan_
    assert sorted(plan.fallback) == [2, 3, 4, 5]
    assert "early_stopping" in plan.reasons[2] and "tanh" in plan.reasons[4]
    assert np.isnan(ours.cv_results_["mean_test_score"][2])


def test_a_diverged_model_gets_error_score(digits):
    """A candidate whose training diverges: its own fit raises TrainingDiverged, which the search records as
    error_score (nan, FitFailedWarning) or raises with error_score="raise", as scikit-learn's search does."""
    X, y = digits
    X = X * 1e3  # a rate this large on inputs this large overflows
    grid = {"learning_rate_init": [1e-3, 1e4], "solver": ["sgd"], "momentum": [0.0]}
    with pytest.warns(FitFailedWarning, match="TrainingDiverged"):
        ours = fs.GridSearchCV(mlp(), grid, cv=2, error_score=-1.0).fit(X, y)
    with pytest.warns(FitFailedWarning, match="TrainingDiverged"):
        theirs = model_selection.GridSearchCV(mlp(), grid, cv=2, error_score=-1.0).fit(X, y)
    assert_same_results(ours, theirs)
    assert ours.cv_results_["mean_test_score"][1] == -1.0
    from fastnn import TrainingDiverged

    with pytest.raises(TrainingDiverged):
        fs.GridSearchCV(mlp(), grid, cv=2, error_score="raise").fit(X, y)


def test_refit_false_and_callable_refit(digits):
    X, y = digits
    grid = {"alpha": [1e-4, 0.5]}
    ours, theirs = both("GridSearchCV", mlp(), grid, X, y, cv=2, refit=False)
    assert not hasattr(ours, "best_estimator_") and ours.best_params_ == theirs.best_params_
    pick = lambda results: int(np.argmax(results["mean_test_score"]))  # noqa: E731
    ours, theirs = both("GridSearchCV", mlp(), grid, X, y, cv=2, refit=pick)
    assert ours.best_index_ == theirs.best_index_ and not hasattr(ours, "best_score_")


def test_other_estimators_are_scikit_learns_search(regression):
    X, y = regression
    ours, theirs = both("GridSearchCV", Ridge(), {"alpha": [0.1, 10.0]}, X, y, cv=3)
    assert_same_results(ours, theirs, atol=0)
    assert ours.plan_ is None


def test_a_pipeline_ending_elsewhere_is_scikit_learns_search(regression):
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    X, y = regression
    ours, theirs = both("GridSearchCV", make_pipeline(StandardScaler(), Ridge()), {"ridge__alpha": [0.1, 10.0]}, X,
                        y, cv=3)  # fmt: skip
    assert_same_results(ours, theirs, atol=0)
    assert ours.plan_ is None


def test_random_state_none_batches_with_fresh_seeds(digits):
    """random_state=None: each fit's seed is a fresh draw, so no result is reproducible; the models of a group
    share one (fresh) shuffle and have their own initial weights, and the search's surface is unchanged."""
    X, y = digits
    ours = fs.GridSearchCV(mlp(random_state=None), {"alpha": [1e-4, 1e-2]}, cv=2).fit(X, y)
    assert len(ours.plan_.groups) == 1
    seeds = [m.seed for m in ours.plan_.groups[0].models]
    assert len(set(seeds)) == len(seeds)
    assert np.isfinite(ours.cv_results_["mean_test_score"]).all()


def test_the_search_pickles_and_clones(digits):
    X, y = digits
    search = fs.GridSearchCV(mlp(), {"alpha": [1e-4, 0.5]}, cv=2).fit(X, y)
    again = pickle.loads(pickle.dumps(search))
    np.testing.assert_array_equal(again.predict(X), search.predict(X))
    from sklearn.base import clone

    assert type(clone(search)) is fs.GridSearchCV and clone(search).get_params()["cv"] == 2


def test_nothing_touches_cuda_at_import_or_construction():
    """Importing fastnn.sklearn and building estimators and searches loads no CUDA library and makes no CUDA call:
    they pickle to, and start on, a worker that owns a GPU (or none)."""
    code = (
        "import sys, pickle\n"
        "import fastnn.sklearn as fs\n"
        "s = fs.GridSearchCV(fs.MLPClassifier(), {'alpha': [1e-4, 1e-3]}, n_jobs=-1)\n"
        "pickle.loads(pickle.dumps(s))\n"
        "from fastnn import _device\n"
        "assert _device._cuda_status.cache_info().currsize == 0, 'probed CUDA'\n"
        "assert not any(m.startswith(('cuda.bindings', 'fastnn.cuda.driver')) for m in sys.modules), 'loaded CUDA'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert res.returncode == 0, res.stderr


# ---- devices: the slots groups train in and how groups are spread over them --------------------------------


@pytest.mark.parametrize(
    ("n_jobs", "devices", "gpus", "slots"),
    [
        (None, ["auto"], 4, [0]),  # scikit-learn's None: one job, one GPU
        (-1, ["cuda"], 4, [0, 1, 2, 3]),  # every visible GPU (CUDA_VISIBLE_DEVICES: the driver numbers those)
        (-2, ["cuda"], 4, [0, 1, 2]),  # all but one
        (2, ["auto", "cuda"], 4, [0, 1]),
        (8, ["cuda"], 2, [0, 1]),  # never more slots than GPUs
        (-1, ["auto"], 0, [None] * 2),  # "auto" without a GPU: the CPU, threads as the machine's cores (2 here)
        (3, ["cpu"], 4, [None] * 3),  # every group on the CPU: threads
    ],
)
def test_device_slots(n_jobs, devices, gpus, slots, monkeypatch):
    monkeypatch.setattr("joblib.cpu_count", lambda *a, **k: 2)
    assert _spread.device_slots(n_jobs, devices, gpus=lambda: gpus) == slots


def test_assign_balances_the_longest_first():
    assert _spread.assign([5, 1, 4, 3, 2], 2) == [[0, 4, 1], [2, 3]]  # 5, 4, then 3 onto 4, 2 onto 5, 1 (tie)
    assert _spread.assign([1, 1, 1], 3) == [[0], [1], [2]]
    assert _spread.assign([2, 2], 1) == [[0, 1]]
    assert _spread.assign([], 2) == [[], []]
    plan = _spread.assign(list(np.random.default_rng(0).uniform(1, 10, 40)), 4)
    assert sorted(i for s in plan for i in s) == list(range(40))


def test_run_spread_runs_every_job_on_its_slot():
    seen = []
    out = _spread.run_spread(["a", "b", "c", "d"], [4, 3, 2, 1], [0, 1], lambda j, s: seen.append((j, s)) or j * 2)
    assert out == ["aa", "bb", "cc", "dd"]
    assert sorted(seen) == [("a", 0), ("b", 1), ("c", 1), ("d", 0)]

    def fail(j, s):
        if j == "c":
            raise RuntimeError("group c failed")
        return j

    with pytest.raises(RuntimeError, match="group c"):
        _spread.run_spread(["a", "b", "c"], [1, 1, 1], [0, 1], fail)


def test_search_spreads_groups_over_slots(digits, monkeypatch):
    """With two slots (as on two GPUs) every group trains once, on the slot `assign` gives it, and the results
    are the one-slot search's."""
    X, y = digits
    used = []
    real = fs._search.train_group

    def spy(group, x, y, x_score, rows, ordinal=None):
        used.append(ordinal)
        return real(group, x, y, x_score, rows, None)

    monkeypatch.setattr(fs._search, "train_group", spy)
    monkeypatch.setattr(fs._search, "device_slots", lambda n_jobs, devices: [0, 1])
    grid = {"hidden_layer_sizes": [(8,), (16,), (24,)], "alpha": [1e-4, 0.1]}
    ours = fs.GridSearchCV(mlp(), grid, cv=2, n_jobs=2).fit(X, y)
    assert sorted(used) == [0, 1, 1]  # 24 wide alone on one slot, 16 and 8 on the other
    monkeypatch.setattr(fs._search, "device_slots", lambda n_jobs, devices: [None])
    one = fs.GridSearchCV(mlp(), grid, cv=2).fit(X, y)
    assert_same_results(ours, one, atol=0)


# ---- Dask: scikit-learn's search and fastnn's, group by group, on a LocalCluster ------------------------------


@pytest.mark.timeout(240)
def test_dask_backend_runs_both_searches(digits):
    distributed = pytest.importorskip("distributed")
    import joblib

    X, y = digits
    grid = {"alpha": [1e-4, 0.3], "hidden_layer_sizes": [(8,), (16,)]}
    local = fs.GridSearchCV(mlp(), grid, cv=2).fit(X, y)
    # processes=False: workers are threads of this process, so the test cannot hang on spawning processes
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None) as c, \
            distributed.Client(c) as client, joblib.parallel_backend("dask"):  # fmt: skip
        assert _spread.remote_backend()
        ours = fs.GridSearchCV(mlp(), grid, cv=2).fit(X, y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = model_selection.GridSearchCV(mlp(), grid, cv=2).fit(X, y)
        ran = client.run(lambda: True)
    assert len(ran) == 2
    assert_same_results(ours, local, atol=0)
    assert_same_results(ours, theirs)
    assert not _spread.remote_backend()


# ---- the guide's Optuna recipe, run as written --------------------------------------------------------------


def test_the_optuna_recipe_runs(digits):
    """docs/guide/search.md's ask-and-tell recipe, executed from the page on small data (where optuna is
    installed: it is not a fastnn dependency)."""
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    page = (REPO / "docs" / "guide" / "search.md").read_text()
    blocks = page.split("```python\n")
    recipe = next(b for b in blocks if b.startswith("import optuna")).split("```")[0]
    namespace: dict = {}
    exec(compile(recipe, "search.md", "exec"), namespace)
    X, y = digits
    study = namespace["tune"](X[:400], y[:400], X[400:], y[400:], rounds=2, per_round=4, epochs=2, hidden=8,
                              device="cpu")  # fmt: skip
    assert len(study.trials) == 8 and all(t.state.name == "COMPLETE" for t in study.trials)
    assert set(study.best_params) == {"lr", "weight_decay"} and np.isfinite(study.best_value)


def test_a_scikit_learn_without_the_private_helpers_fails_the_searches_not_the_estimators(monkeypatch):
    """The searches build on scikit-learn's private helpers: a release that moves one makes `fs.GridSearchCV` an
    ImportError naming it and the versions tested, while the estimators keep working."""
    from sklearn.model_selection import _validation

    monkeypatch.delattr(_validation, "_insert_error_scores")
    monkeypatch.delitem(sys.modules, "fastnn.sklearn._search")
    for name in ("GridSearchCV", "RandomizedSearchCV", "_search"):
        monkeypatch.delitem(vars(fs), name, raising=False)
    with pytest.raises(ImportError, match=r"_insert_error_scores.*tested with scikit-learn 1\.6"):
        fs.GridSearchCV  # noqa: B018
    X, y = load_digits(return_X_y=True)
    assert fs.LogisticRegression(max_iter=1, device="cpu").fit(X[:100] / 16, y[:100]).predict(X[:5]).shape == (5,)
