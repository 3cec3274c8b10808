"""fastnn.sklearn's refusals: a fit refused before it trains leaves the estimator exactly as it was, and every
refusal names the estimator's own arguments (issue 36)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest

pytest.importorskip("sklearn")

from sklearn.exceptions import NotFittedError  # noqa: E402
from sklearn.utils.validation import check_is_fitted  # noqa: E402

from fastnn import ConfigError, DataError  # noqa: E402
from fastnn.sklearn import LogisticRegression, MLPClassifier, MLPRegressor  # noqa: E402

RNG = np.random.default_rng(0)
X = RNG.normal(size=(60, 4)).astype(np.float32)
Y = (X[:, 0] > 0).astype(int) + (X[:, 1] > 0)
Y_REG = X @ np.array([1.0, -2.0, 0.5, 0.0]) + 0.1


def _snapshot(est) -> dict:
    """Everything a refused call could change: the attributes (by identity and value), the trainer's weights,
    counters and history, the rate rule's and stopping count's state."""
    snap = {"attrs": {k: (v, copy.deepcopy(v) if k not in ("trainer_",) else None) for k, v in vars(est).items()}}
    if hasattr(est, "trainer_"):
        t = est.trainer_
        snap["trainer"] = (t.state_dict(), t.epoch, t.step, list(t.history), t.config.batch_size)
        snap["rate"] = dict(vars(est._rate_))
        snap["plateau"] = dict(vars(est._plateau_))
    return snap


def _assert_unchanged(est, snap: dict, X_pred: np.ndarray, pred: np.ndarray) -> None:
    now = vars(est)
    assert set(now) == set(snap["attrs"])
    for k, (obj, value) in snap["attrs"].items():
        assert now[k] is obj, k  # the same objects: nothing replaced
        if k not in ("trainer_", "_rate_", "_plateau_"):
            np.testing.assert_equal(now[k], value, err_msg=k)
    t = est.trainer_
    state, epoch, step, history, batch = snap["trainer"]
    assert (t.epoch, t.step, list(t.history), t.config.batch_size) == (epoch, step, history, batch)
    for name, w in state.items():
        np.testing.assert_array_equal(t.state_dict()[name], w, err_msg=name)
    assert dict(vars(est._rate_)) == snap["rate"] and dict(vars(est._plateau_)).keys() == snap["plateau"].keys()
    np.testing.assert_array_equal(est.predict(X_pred), pred)  # still open, still the fitted model


def _fitted(make):
    est = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, Y_REG if isinstance(est, MLPRegressor) else Y)
    return est


# (estimator, what the refit changes, the error, its message): each refused by Trainer.fit's own checks.
REFUSED_REFITS = {
    "input beyond float16 under mixed": (
        lambda: MLPClassifier((8,), device="cpu", max_iter=3),
        lambda est: est.fit(X * 1e5, Y), DataError, "65504",
    ),
    "y beyond float32": (
        lambda: MLPRegressor((8,), device="cpu", max_iter=3),
        lambda est: est.fit(X, Y_REG * 1e39), DataError, "y holds",
    ),
    "max_iter beyond 2**32": (
        lambda: MLPClassifier((8,), device="cpu", max_iter=3),
        lambda est: est.set_params(max_iter=2**32 + 1).fit(X, Y), ValueError, "max_iter",
    ),
    "warm start, input beyond float16": (
        lambda: MLPClassifier((8,), device="cpu", max_iter=3, warm_start=True),
        lambda est: est.fit(X * 1e5, Y), DataError, "65504",
    ),
    "partial_fit at another batch size, input beyond float16": (
        lambda: LogisticRegression(device="cpu", max_iter=3),
        lambda est: est.partial_fit(X[:30] * 1e5, Y[:30]), DataError, "65504",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED_REFITS))
def test_a_refused_refit_leaves_the_estimator_exactly_as_it_was(case) -> None:
    make, refit, error, match = REFUSED_REFITS[case]
    est = _fitted(make)
    snap, pred = _snapshot(est), est.predict(X)
    with pytest.raises(error, match=match):
        refit(est)
    if "max_iter" in case:
        est.set_params(max_iter=3)  # the parameter the user set stays set, as scikit-learn's set_params does
        snap["attrs"]["max_iter"] = (est.max_iter, 3)
    _assert_unchanged(est, snap, X, pred)


@pytest.mark.parametrize(
    "make, fit",
    [
        (lambda: MLPClassifier((8,), device="cpu"), lambda est: est.fit(X * 1e5, Y)),
        (lambda: MLPRegressor((8,), device="cpu"), lambda est: est.fit(X, Y_REG * 1e39)),
        (lambda: MLPClassifier((8,), device="cpu"), lambda est: est.partial_fit(X * 1e5, Y, classes=[0, 1, 2])),
    ],
)
def test_a_refused_first_fit_leaves_the_estimator_unfitted(make, fit) -> None:
    est = make()
    with pytest.raises(DataError):
        fit(est)
    with pytest.raises(NotFittedError):
        check_is_fitted(est)
    assert not [k for k in vars(est) if k.endswith("_")]


# The estimator's parameter, a value Trainer or its optimizer refuses, and the Trainer's name for it.
NAMED = [
    ("max_iter", 2**32 + 1, "epochs", {}),
    ("learning_rate_init", 1e300, "lr", {}),
    ("learning_rate_init", 1e-60, "lr", {}),
    ("alpha", 1e300, "weight_decay", {}),
    ("beta_1", 1.5, "betas[0]", {}),
    ("beta_2", 1.0, "betas[1]", {}),
    ("epsilon", 1e-60, "eps", {}),
]


@pytest.mark.parametrize("make", [MLPClassifier, MLPRegressor])
@pytest.mark.parametrize("param, value, theirs, extra", NAMED)
def test_refusals_name_the_estimators_arguments(make, param, value, theirs, extra) -> None:
    est = make((8,), device="cpu", **{param: value, **extra})
    with pytest.raises(ValueError) as info:
        est.fit(X * 1e5, Y)  # the parameter is named before the data is read (X is refused under "mixed")
    message = str(info.value)
    assert message.startswith(f"{param} must") and repr(value) in message, message
    assert not message.startswith(theirs + " "), message


def test_an_overflowing_invscaling_power_is_a_rate_of_zero_not_a_refusal() -> None:
    """(samples seen + 1) ** power_t beyond a float: scikit-learn's rate is learning_rate_init / inf = 0; the
    Trainer used to refuse the schedule by its own name ("schedule(1) raised OverflowError")."""
    est = MLPClassifier((8,), device="cpu", learning_rate="invscaling", power_t=1e300, max_iter=3, batch_size=20)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(X, Y)
    assert est.n_iter_ == 3 and est._rate_(0) == est.learning_rate_init and est._rate_(3) == 0.0


@pytest.mark.parametrize("scale", [2e19, -1e30])
def test_targets_whose_square_overflows_float32_are_refused_up_front(scale) -> None:
    """Above ~1.84e19 the squared error overflows float32: refused naming y and saying to scale it, before the
    trainer is built (it used to train and end as TrainingDiverged '... (lower lr?)'), by the Trainer too."""
    from fastnn import MLP, Trainer

    y = Y_REG.copy()
    y[7] = scale
    est = MLPRegressor((8,), device="cpu", max_iter=2)
    with pytest.raises(DataError, match=r"y holds .* row 7, column 0: its squared error overflows float32.*scale y"):
        est.fit(X, y)
    assert "trainer_" not in vars(est)
    t = Trainer(MLP([4, 8, 1]), device="cpu", loss="mse")
    with pytest.raises(DataError, match="scale y"):
        t.fit(X, y)
    assert t.epoch == 0
    t.fit(X, np.clip(y, -1e3, 1e3))  # the same trainer takes the targets once scaled


def test_the_target_bound_is_the_square_root_of_float32s_largest_number() -> None:
    from fastnn._data import TARGET_MAX, check_targets

    top = np.float32(TARGET_MAX)
    assert np.isfinite(top * top) and not np.isfinite(np.nextafter(top, np.float32(np.inf)) ** 2)
    check_targets(np.array([top, -top]), 2, 1)
    with pytest.raises(DataError, match="squared error overflows"):
        check_targets(np.array([0.0, np.nextafter(top, np.float32(np.inf))]), 2, 1)


def test_logistic_partial_fits_decay_follows_the_samples_seen_for_any_split() -> None:
    """scikit-learn's penalty ||W||^2 / (2 C) on the summed loss is weight decay 1 / (C n) on the mean loss; for
    partial_fit n is every row seen so far, so the data split into calls ends at the decay of one call over it
    (it was fixed by the first call's rows: one row per call decayed by 1 / C for the whole stream)."""
    sizes, seen = [1, 1, 3, 50, 5], 0
    est = LogisticRegression(device="cpu", C=2.0, random_state=0)
    for n in sizes:
        est.partial_fit(X[seen:seen + n], Y[seen:seen + n], classes=[0, 1, 2])
        seen += n
        assert est.t_ == seen and est.trainer_.optimizer.weight_decay == 1.0 / (2.0 * seen)
    whole = LogisticRegression(device="cpu", C=2.0, random_state=0).partial_fit(X[:seen], Y[:seen], classes=[0, 1, 2])
    assert whole.trainer_.optimizer.weight_decay == est.trainer_.optimizer.weight_decay
    assert est.trainer_.epoch == len(sizes) and len(est.trainer_.history) == len(sizes)  # one trainer's life


def test_logistic_regression_streamed_one_row_per_call_learns_as_one_call() -> None:
    from sklearn.datasets import load_digits

    Xd, yd = load_digits(return_X_y=True)
    Xd = (Xd / 16).astype(np.float32)
    kw = dict(device="cpu", random_state=0, learning_rate_init=0.05, learning_rate="constant")
    stream = LogisticRegression(**kw)
    for i in range(400):
        stream.partial_fit(Xd[i:i + 1], yd[i:i + 1], classes=np.arange(10))
    once = LogisticRegression(batch_size=1, **kw).partial_fit(Xd[:400], yd[:400], classes=np.arange(10))
    # Measured on held-out rows: streamed 0.876, one call 0.849 (0.348 streamed before, at decay 1 / C throughout).
    assert stream.score(Xd[1000:], yd[1000:]) > once.score(Xd[1000:], yd[1000:]) - 0.05


def test_a_continued_trainer_goes_on_exactly_with_its_new_batch_size_and_decay(tmp_path) -> None:
    """Trainer._continued (partial_fit's rebatching and re-decay, in memory) goes on as save and load would."""
    import dataclasses

    from fastnn import MLP, SGD, Trainer

    t = Trainer(MLP([4, 8, 3]), SGD(lr=0.1, momentum=0.9, weight_decay=0.01), batch_size=16, device="cpu")
    t.fit(X, Y, epochs=2)
    t.save(tmp_path / "t.npz")
    c = t._continued(None, batch_size=7)
    loaded = Trainer.load(tmp_path / "t.npz", device="cpu", batch_size=7)
    assert (c.epoch, c.step, list(c.history)) == (loaded.epoch, loaded.step, list(loaded.history))
    c.fit(X, Y, epochs=2)
    loaded.fit(X, Y, epochs=2)
    for name, w in loaded._engine.get_state().items():
        np.testing.assert_array_equal(c._engine.get_state()[name], w, err_msg=name)
    d = t._continued(None, weight_decay=0.5)
    assert d.optimizer == dataclasses.replace(t.optimizer, weight_decay=0.5) and d.config.batch_size == 16
    t.state_dict()  # the continued one is left open
    with pytest.raises(ConfigError, match="weight_decay"):
        t._continued(None, weight_decay=-1.0)


@pytest.mark.gpu
def test_logistic_partial_fit_continues_on_the_gpu_as_its_decay_changes() -> None:
    """Each partial_fit of another decay (or batch size) continues on a new GPU trainer: same engine, the counters
    and history carried, the decay 1 / (C t_), and it learns."""
    rng = np.random.default_rng(3)
    centers = rng.normal(size=(3, 16)) * 3
    labels = rng.integers(0, 3, 600)
    Xg = (centers[labels] + rng.normal(size=(600, 16))).astype(np.float32)
    est = LogisticRegression(device="cuda", random_state=0, learning_rate_init=0.05)
    seen = 0
    for n in (1, 7, 50, 142, 400):
        est.partial_fit(Xg[seen:seen + n], labels[seen:seen + n], classes=[0, 1, 2])
        seen += n
        assert est.trainer_.device == "cuda" and est.trainer_.optimizer.weight_decay == 1.0 / seen
    assert est.trainer_.epoch == 5 and len(est.trainer_.history) == 5 and est.score(Xg, labels) > 0.9
