"""`GridSearchCV` and `RandomizedSearchCV`: scikit-learn's searches, whose fits of fastnn's estimators train
as many-model fits (`fastnn.MultiTrainer`), several candidates and folds at once, on one GPU or spread over several.

Everything a user sees is scikit-learn's (the arguments, `cv_results_` and its keys, ranks, `best_*`, refit,
scoring, error_score): the search's own `_format_results`, `_select_best_index` and `_score` build it, from the
scores of models that each equal the estimator's own `fit` on the fold. Fits that do not batch (see `_plan`) take
scikit-learn's per-fit path (`_fit_and_score`) in the same search.
"""

from __future__ import annotations

import time
import traceback
import warnings
from collections.abc import Iterable
from typing import Any

import numpy as np
from sklearn import model_selection
from sklearn.base import _fit_context, clone, is_classifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.model_selection import ParameterGrid, ParameterSampler, check_cv
from sklearn.model_selection._validation import (
    _fit_and_score,
    _insert_error_scores,
    _score,
    _warn_or_raise_about_fit_failures,
)
from sklearn.utils import _safe_indexing
from sklearn.utils.parallel import Parallel, delayed
from sklearn.utils.validation import _check_method_params, check_array, indexable

from ._many_fit import GroupResult, train_group
from ._plan import Group, Plan, batches, final_step, make_plan
from ._scored import frozen
from ._spread import device_slots, remote_backend, run_spread

__all__ = ["GridSearchCV", "RandomizedSearchCV"]


class _ManyModelSearch:
    """What both searches add to scikit-learn's: `fit` batches the fits of fastnn's estimators. (The searches'
    parameters, `self.estimator` and the rest, are scikit-learn's, set by its `__init__`.)"""

    def _candidates(self) -> Iterable[dict[str, Any]]:
        raise NotImplementedError

    def fit(self, X: Any, y: Any = None, **params: Any) -> Any:
        """Run fit with every candidate on every fold, as scikit-learn's search does; fits of fastnn's estimators
        train several at once (the fastnn.sklearn guide, "Searches", says which). Returns self."""
        if not batches(self.estimator) or getattr(self, "_skl_callbacks", None):
            self.plan_ = None
            return super().fit(X, y, **params)  # type: ignore[misc]
        return self._fit_many(X, y, **params)

    @_fit_context(prefer_skip_nested_validation=False)
    def _fit_many(self, X: Any, y: Any = None, **params: Any) -> Any:
        """scikit-learn's `BaseSearchCV.fit`, with the fits evaluated by `_evaluate`."""
        scorers, refit_metric = self._get_scorers()
        X, y = indexable(X, y)
        params = _check_method_params(X, params=params)
        routed = self._get_routed_params_for_fit(params)
        cv = check_cv(self.cv, y, classifier=is_classifier(self.estimator))
        n_splits = cv.get_n_splits(X, y, **routed.splitter.split)
        base = clone(self.estimator)
        candidates = list(self._candidates())
        splits = list(cv.split(X, y, **routed.splitter.split))
        if len(splits) != n_splits:
            raise ValueError(f"cv.split and cv.get_n_splits return inconsistent results. Expected {n_splits} splits, "
                             f"got {len(splits)}")  # fmt: skip
        if self.verbose > 0:
            print(f"Fitting {n_splits} folds for each of {len(candidates)} candidates, totalling "
                  f"{n_splits * len(candidates)} fits")  # fmt: skip
        out = self._evaluate(base, X, y, candidates, splits, scorers, routed)
        if len(out) < 1:
            raise ValueError("No fits were performed. Was the CV iterator empty? Were there no candidates?")
        _warn_or_raise_about_fit_failures(out, self.error_score)
        if callable(self.scoring):
            _insert_error_scores(out, self.error_score)
        results = self._format_results(candidates, n_splits, out)

        self.multimetric_ = isinstance(out[0]["test_scores"], dict)
        if callable(self.scoring) and self.multimetric_:
            self._check_refit_for_multimetric(out[0]["test_scores"])
            refit_metric = self.refit
        if self.refit or not self.multimetric_:
            self.best_index_ = self._select_best_index(self.refit, refit_metric, results)
            if not callable(self.refit):
                self.best_score_ = results[f"mean_test_{refit_metric}"][self.best_index_]
            self.best_params_ = results["params"][self.best_index_]
        if self.refit:
            self.best_estimator_ = clone(base).set_params(**clone(self.best_params_, safe=False))
            start = time.time()
            if y is not None:
                self.best_estimator_.fit(X, y, **routed.estimator.fit)
            else:
                self.best_estimator_.fit(X, **routed.estimator.fit)
            self.refit_time_ = time.time() - start
            if hasattr(self.best_estimator_, "feature_names_in_"):
                self.feature_names_in_ = self.best_estimator_.feature_names_in_
        self.scorer_ = getattr(scorers, "_scorers", scorers)  # a multimetric scorer is stored as its dict
        self.cv_results_ = results
        self.n_splits_ = n_splits
        return self

    def _evaluate(self, base: Any, X: Any, y: Any, candidates: list[dict[str, Any]], splits: list[Any], scorers: Any,
                  routed: Any) -> list[dict[str, Any]]:  # fmt: skip
        """scikit-learn's `_fit_and_score` result for every (candidate, fold), candidate-major."""
        n_splits = len(splits)
        fit_params, score_params = routed.estimator.fit, routed.scorer.score
        pipeline = final_step(base) is not None
        heads = _heads(base, X, y, splits, candidates) if pipeline else None
        X32 = None if pipeline else _float32(X)  # what each fit's own checks make of X, once
        plan = make_plan(base, candidates, splits, X32, y, fit_params, heads)
        self.plan_ = plan
        out: list[dict[str, Any] | None] = [None] * (len(candidates) * n_splits)
        if plan.fallback:
            parallel = Parallel(n_jobs=self.n_jobs, pre_dispatch=self.pre_dispatch)
            done = parallel(
                delayed(_fit_and_score)(
                    clone(base), X, y, train=splits[p % n_splits][0], test=splits[p % n_splits][1],
                    parameters=candidates[p // n_splits], split_progress=(p % n_splits, n_splits),
                    candidate_progress=(p // n_splits, len(candidates)), scorer=scorers, fit_params=fit_params,
                    score_params=score_params, return_train_score=self.return_train_score,
                    return_n_test_samples=True, return_times=True, return_parameters=False,
                    error_score=self.error_score, verbose=self.verbose,
                )  # fmt: skip
                for p in plan.fallback
            )
            for p, result in zip(plan.fallback, done):
                out[p] = result
        if plan.groups:
            scorer = _Scorer(self, X, y, splits, scorers, score_params)
            for group, result in zip(plan.groups, self._train(plan, X32, y, splits, heads)):
                for model, r in zip(group.models, result.models, strict=True):  # train_group keeps the order
                    out[r.pair] = scorer.result(group, model, r, result.seconds / len(group.models))
        return out  # type: ignore[return-value]

    def _train(self, plan: Plan, X32: np.ndarray | None, y: Any, splits: list[tuple[np.ndarray, np.ndarray]],
               heads: list[Any] | None) -> list[GroupResult]:  # fmt: skip
        """Train every group: spread over this process's GPUs (or CPU threads), or as joblib tasks under a backend
        that runs them elsewhere (Dask); each group's models report their outputs on their fold's scored rows."""
        data = []
        for g, t in zip(plan.groups, _encoded_targets(plan.groups, y)):
            rows = [_scored_rows(splits[m.fold], self.return_train_score) for m in g.models]
            if g.head_fold is not None:  # the fold's rows as the pipeline's other steps give them
                (x_train, x_score), train = heads[g.head_fold], splits[g.head_fold][0]  # type: ignore[index]
                data.append((x_train, t[train], x_score, rows))
            elif g.own_rows is not None:
                data.append((X32[g.own_rows], t[g.own_rows], X32, rows))
            else:
                data.append((X32, t, X32, rows))
            if g.centre is not None:  # LogisticRegression's rows less its fold's mean, as its fit's (`_centred`)
                x_train, y_train, x_score, rows = data[-1]
                data[-1] = ((x_train - g.centre).astype(np.float32), y_train, (x_score - g.centre).astype(np.float32),
                            rows)  # fmt: skip
        if remote_backend():
            results = Parallel(n_jobs=self.n_jobs)(delayed(train_group)(g, *d) for g, d in zip(plan.groups, data))
        else:
            slots = device_slots(self.n_jobs, [g.device for g in plan.groups])
            index = {id(g): i for i, g in enumerate(plan.groups)}

            def work(g: Group, slot: Any) -> GroupResult:
                return train_group(g, *data[index[id(g)]], slot)

            results = run_spread(plan.groups, [g.cost() for g in plan.groups], slots, work)
        for g, result in zip(plan.groups, results):
            for m, r in zip(g.models, result.models):
                if r.error is None and not r.converged:
                    tol = m.tol if m.objective_tol is None else m.objective_tol  # the estimator's own tol
                    warnings.warn(f"{m.name}: {r.why} without convergence (tol={tol})",
                                  ConvergenceWarning, stacklevel=4)  # fmt: skip
        return results


class _Scorer:
    """Scores trained models as `_fit_and_score` does, each fold's rows and score params taken once."""

    def __init__(self, search: Any, X: Any, y: Any, splits: list[tuple[np.ndarray, np.ndarray]], scorers: Any,
                 score_params: dict[str, Any]) -> None:  # fmt: skip
        self.search, self.X, self.y, self.splits = search, X, y, splits
        self.scorers, self.score_params = scorers, score_params
        self._folds: dict[int, tuple[Any, ...]] = {}

    def _fold(self, f: int) -> tuple[Any, ...]:
        if f not in self._folds:
            train, test = self.splits[f]
            parts = [_safe_indexing(self.X, test), None if self.y is None else _safe_indexing(self.y, test),
                     _check_method_params(self.X, params=self.score_params, indices=test)]  # fmt: skip
            if self.search.return_train_score:
                parts += [_safe_indexing(self.X, train), None if self.y is None else _safe_indexing(self.y, train),
                          _check_method_params(self.X, params=self.score_params, indices=train)]  # fmt: skip
            self._folds[f] = tuple(parts)
        return self._folds[f]

    def result(self, group: Group, model: Any, r: Any, fit_time: float) -> dict[str, Any]:
        """The dict `_fit_and_score` returns for this fit."""
        search, error_score = self.search, self.search.error_score
        train, test = self.splits[model.fold]
        result: dict[str, Any] = {"fit_error": None}
        start = time.time()
        if r.error is not None:
            if error_score == "raise":
                raise r.error
            names = getattr(self.scorers, "_scorers", None)
            test_scores = {n: error_score for n in names} if names is not None else error_score
            train_scores = dict(test_scores) if names is not None else error_score
            result["fit_error"] = "".join(traceback.format_exception(type(r.error), r.error, r.error.__traceback__))
        else:
            fold = self._fold(model.fold)
            x_test, y_test, params_test = fold[:3]
            est = frozen(group.classes).bind(x_test, r.outputs[: len(test)])
            test_scores = _score(est, x_test, y_test, self.scorers, params_test, error_score)
            if search.return_train_score:
                x_train, y_train, params_train = fold[3:]
                est = frozen(group.classes).bind(x_train, r.outputs[len(test) :])
                train_scores = _score(est, x_train, y_train, self.scorers, params_train, error_score)
        result["test_scores"] = test_scores
        if search.return_train_score:
            result["train_scores"] = train_scores
        result["n_test_samples"] = len(test)
        result["fit_time"] = fit_time
        result["score_time"] = time.time() - start
        return result


def _float32(X: Any) -> np.ndarray | None:
    """X as the estimators' fit sees it (float32), or None when it is not such an array (every fit falls back)."""
    try:
        return check_array(X, dtype=(np.float32, np.float64)).astype(np.float32, copy=False)
    except (TypeError, ValueError):
        return None


def _heads(base: Any, X: Any, y: Any, splits: list[Any], candidates: list[dict[str, Any]]) -> list[Any] | None:
    """A Pipeline's other steps fitted on each fold as its own fit would (`fit_transform` of the fold's rows), with
    their output on every row of X (`transform`, as its predict does): (training rows, all rows) float32 per fold,
    None for a fold where they fail or give no numeric array (its fits fall back and report it). None when no
    candidate leaves the other steps as they are."""
    final = final_step(base)
    if all(any(not k.startswith(f"{final}__") for k in c) for c in candidates):
        return None
    out = []
    for train, _ in splits:
        head = clone(base[:-1])
        try:
            y_train = None if y is None else _safe_indexing(y, train)
            x_train = _float32(head.fit_transform(_safe_indexing(X, train), y_train))
            x_all = _float32(head.transform(X))
        except Exception:  # the per-fit path meets the same failure and reports it as scikit-learn does
            x_train = x_all = None
        out.append(None if x_train is None or x_all is None else (x_train, x_all))
    return out


def _encoded_targets(groups: list[Group], y: Any) -> list[np.ndarray]:
    """Each group's targets over every row: indices into its classes (rows of other labels, never trained on by
    its models, get 0), or float64 (n, k) targets."""
    out = []
    for g in groups:
        if g.classes is None:
            t = np.asarray(y, dtype=np.float64)
            out.append(t.reshape(-1, 1) if t.ndim == 1 else t)
        else:
            labels = np.asarray(y)
            idx = np.clip(np.searchsorted(g.classes, labels), 0, g.classes.size - 1)
            out.append(np.where(g.classes[idx] == labels, idx, 0).astype(np.int32))
    return out


def _scored_rows(split: tuple[np.ndarray, np.ndarray], train_too: bool) -> np.ndarray:
    """The rows of X a model's outputs are needed on: its test rows, then its training rows for train scores."""
    train, test = np.asarray(split[0]), np.asarray(split[1])
    return np.concatenate([test, train]) if train_too else test


class GridSearchCV(_ManyModelSearch, model_selection.GridSearchCV):
    """scikit-learn's `GridSearchCV` (same arguments, attributes and results), whose fits of fastnn's estimators
    train as many-model fits: candidates and folds that differ only in batchable parameters in one, the rest
    grouped; other estimators and parameters take scikit-learn's path. See the guide page "Searches".

    `n_jobs`: for the batched fits, the GPUs the groups spread over (None: one, -1: every visible GPU), or CPU
    threads on the CPU; for fits that fall back, scikit-learn's meaning. Under a joblib backend that runs tasks
    elsewhere (Dask), each group is one task. `plan_` (after `fit`): the groups and the fits that fell back,
    with the reason for each (None when no fit batched).
    """

    def _candidates(self) -> Iterable[dict[str, Any]]:
        return ParameterGrid(self.param_grid)


class RandomizedSearchCV(_ManyModelSearch, model_selection.RandomizedSearchCV):
    """scikit-learn's `RandomizedSearchCV` (same arguments, attributes and results), whose fits of fastnn's
    estimators train as many-model fits, as `GridSearchCV`'s do. See the guide page "Searches"."""

    def _candidates(self) -> Iterable[dict[str, Any]]:
        return ParameterSampler(self.param_distributions, self.n_iter, random_state=self.random_state)
