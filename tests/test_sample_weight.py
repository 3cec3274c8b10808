"""Per-row sample weights (issue 43): the NumPy engine's weighted mean loss (numpy_engine.weighted), Trainer.fit's
sample_weight, its checks, the graph engine's weighted fit (pinned to the NumPy engine on the GPU) and the kernel
engines' refusal by name (engine="auto": the graph step trains the weighted fit)."""

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


def _engine_without_gpu(cls: type, graph_fallback: bool = False, drop_last: bool = False, group: object = None):
    """An engine of class `cls` as far as set_sample_weight reads it (no GPU: its constructor is skipped)."""
    eng = object.__new__(cls)
    eng.resources = types.SimpleNamespace(group=group, config=None)
    eng.config = types.SimpleNamespace(drop_last=drop_last)
    eng.graph_fallback = graph_fallback
    return eng


def test_the_graph_engine_takes_unequal_weights_and_the_kernel_engines_refuse_them_by_name():
    """Issue 43: the graph engine's step trains a weighted fit (its weighted loss kernels); engine="fused" and
    "grid" refuse one by name, and so does an engine whose weighted mean would need every rank's weights or whose
    history divides by other rows (drop_last); an engine="auto" fused or grid engine takes it, for the graph step."""
    pytest.importorskip("fastnn.engine.graph.engine", reason="needs the CUDA wheels")  # no GPU needed
    from fastnn.engine.fused import FusedEngine
    from fastnn.engine.graph import GraphEngine
    from fastnn.engine.grid import GridEngine

    w = np.linspace(0.5, 2.0, 3).astype(np.float32)
    graph = _engine_without_gpu(GraphEngine)
    graph.set_sample_weight(w)
    assert graph._weight is w
    graph.set_sample_weight(None)
    assert graph._weight is None
    for cls, name in ((FusedEngine, "fused"), (GridEngine, "grid")):
        forced = _engine_without_gpu(cls)
        refusal = f"sample_weight: the {name} engine's loss kernels.*engine='graph'"
        with pytest.raises(fastnn.ConfigError, match=refusal):
            forced.set_sample_weight(w)
        forced.set_sample_weight(None)  # unweighted: fine
        auto = _engine_without_gpu(cls, graph_fallback=True)
        auto.set_sample_weight(w)
        assert auto._weight is w
    with pytest.raises(fastnn.ConfigError, match="sample_weight: the graph engine trains weighted fits on one GPU"):
        _engine_without_gpu(GraphEngine, group=object()).set_sample_weight(w)
    with pytest.raises(fastnn.ConfigError, match="sample_weight: .*drop_last=False"):
        _engine_without_gpu(GraphEngine, drop_last=True).set_sample_weight(w)
    with pytest.raises(fastnn.ConfigError, match="sample_weight: the replicas engine's loss kernels"):
        Engine.set_sample_weight(types.SimpleNamespace(name="replicas"), w)  # any other GPU engine: by name


def test_an_auto_grid_engine_trains_a_weighted_set_with_the_graph_step_and_goes_back_after():
    """GridEngine.step_for: "graph" while the fit is weighted (engine="auto" only), and the held context is
    replaced when the next fit changes that (context_serves)."""
    pytest.importorskip("fastnn.engine.graph.engine", reason="needs the CUDA wheels")  # no GPU needed
    from fastnn.engine.grid import GridEngine
    from fastnn.engine.grid.engine import GridTrainContext
    from fastnn.engine.grid.plan import GridPlan

    auto = _engine_without_gpu(GridEngine, graph_fallback=True)
    auto.plan_for = lambda dtype: object.__new__(GridPlan)  # grid_fast.cu serves these rows
    weighted_ctx = auto._for_weights = types.SimpleNamespace()  # the graph step's, made for a weighted fit
    other_ctx = types.SimpleNamespace()  # the graph step's, for rows or a set size the kernel cannot take
    grid_ctx = object.__new__(GridTrainContext)
    assert auto.step_for(np.uint8) == "grid" and auto.context_serves(grid_ctx) and auto.context_serves(other_ctx)
    assert not auto.context_serves(weighted_ctx)  # the unweighted fit after a weighted one: the kernel's again
    auto.set_sample_weight(np.ones(3, np.float32))
    assert auto.step_for(np.uint8) == "graph" and auto.context_serves(weighted_ctx) and auto.context_serves(other_ctx)
    assert not auto.context_serves(grid_ctx)


def _weighted_case(loss: str, n: int = 200):
    x, y, w = _data(n)
    if loss == "mse":
        y = np.random.default_rng(2).normal(size=(n, 3)).astype(np.float32)
    w[::7] = 0.0  # rows of no weight, and batches of unequal sums
    return x, y, w


@pytest.mark.gpu
@pytest.mark.parametrize("loss", ["cross_entropy", "mse"])
def test_a_weighted_gpu_fit_matches_numpy_or_is_refused_by_name(engine, loss):
    """Issue 43 on the engine matrix: the graph engine's weighted fit (gather_weights, wxent / wmse) follows the
    NumPy engine's: per-epoch weighted mean loss, accuracy and weights; every other entry refuses by name, before
    any work."""
    x, y, w = _weighted_case(loss)
    kw = dict(batch_size=32, precision="fp32", seed=7, loss=loss)
    model, opt = fastnn.MLP([5, 16, 3]), fastnn.SGD(lr=0.05, momentum=0.9)
    gpu = fastnn.Trainer(model, opt, device="cuda", **kw, **engine)
    if set(engine) != {"engine"} or engine["engine"] != "graph":  # fused, or a data-parallel graph engine
        with pytest.raises(fastnn.ConfigError, match="sample_weight: the"):
            gpu.fit(x, y, epochs=1, sample_weight=w)
        assert gpu.epoch == 0
        gpu.close()
        return
    cpu = fastnn.Trainer(model, opt, device="cpu", **kw)
    hc = cpu.fit(x, y, epochs=3, sample_weight=w)
    hg = gpu.fit(x, y, epochs=3, sample_weight=w)
    np.testing.assert_allclose(hg["train_loss"], hc["train_loss"], rtol=1e-4, atol=1e-6)
    if loss == "cross_entropy":
        np.testing.assert_allclose(hg["train_accuracy"], hc["train_accuracy"], atol=1e-9)
    for name, value in cpu.state_dict().items():
        np.testing.assert_allclose(gpu.state_dict()[name], value, rtol=1e-3, atol=1e-5, err_msg=name)
    # the next unweighted fit replays the unweighted epoch again, as the CPU's does
    np.testing.assert_allclose(gpu.fit(x, y, epochs=1)["train_loss"], cpu.fit(x, y, epochs=1)["train_loss"],
                               rtol=1e-4, atol=1e-6)  # fmt: skip
    gpu.close()


@pytest.mark.gpu
def test_weights_are_gathered_in_the_batch_rows_order():
    """gather_weights reads the shuffle's order (shuffle.cuh) as the batch's rows were gathered."""
    from fastnn._shuffle import permutation
    from fastnn.engine.base import EngineConfig
    from fastnn.engine.graph import GraphEngine, kernels
    from fastnn.engine.numpy_engine import init_parameters

    n, B = 1000, 64
    x, y = np.zeros((n, 4), np.float32), (np.arange(n) % 3).astype(np.int32)
    model = fastnn.MLP([4, 3])
    cfg = EngineConfig(model=model, optimizer=fastnn.SGD(lr=0.1), batch_size=B, precision="fp32", seed=12345678901)
    eng = GraphEngine(cfg, init_parameters(model, 0))
    try:
        eng.set_train_data(x, y)
        ctx = eng.train_context
        ctx.use_weights(np.arange(1, n + 1, dtype=np.float32))  # weight i + 1 (exact in fp32): the sample's index
        scale = np.float32(n / (n * (n + 1) / 2))
        mod = ctx.weight_mods[0]
        for epoch in (0, 3):
            eng.write_epoch_state(epoch, 0)
            seen = []
            for s, rows in enumerate(ctx.rows):
                kernels.record_weight_gather(eng.resources, mod, ctx.weights.ptr, n, s * B, rows, ctx.w_batch.ptr)
                wb = np.empty(rows, dtype=np.float32)
                eng.stream.synchronize()
                ctx.w_batch.download(wb)
                seen.append(np.rint(wb / scale).astype(np.int64) - 1)
            np.testing.assert_array_equal(np.concatenate(seen), permutation(cfg.seed, epoch, n))
    finally:
        eng.close()


@pytest.mark.gpu
def test_an_auto_trainer_trains_a_weighted_fit_on_the_gpu_and_goes_back_after():
    """engine="auto": a weighted fit on the engine it chose trains with the graph step (Trainer.engine "graph"),
    as the NumPy engine would; the next unweighted fit is the chosen engine's again."""
    x, y, w = _weighted_case("cross_entropy", 256)
    kw = dict(batch_size=32, precision="fp32", seed=0)
    t = fastnn.Trainer(fastnn.MLP([5, 3]), fastnn.SGD(lr=0.1), device="cuda", **kw)
    chosen = t.engine
    cpu = fastnn.Trainer(fastnn.MLP([5, 3]), fastnn.SGD(lr=0.1), device="cpu", **kw)
    hg, hc = t.fit(x, y, epochs=2, sample_weight=w), cpu.fit(x, y, epochs=2, sample_weight=w)
    np.testing.assert_allclose(hg["train_loss"], hc["train_loss"], rtol=1e-4, atol=1e-6)
    assert t.engine == "graph" and t.epoch == 2
    t.fit(x, y, epochs=1, sample_weight=np.full(len(x), 2.0))  # equal weights: the unweighted mean, any engine
    assert t.engine == chosen and t.epoch == 3
    t.close()


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


@pytest.mark.gpu
@pytest.mark.parametrize("make", ["MLPClassifier", "MLPRegressor"])
def test_the_estimators_train_weighted_fits_on_the_gpu_as_on_the_cpu(make):
    """Issue 43: an estimator's weighted fit (engine="auto") trains on the GPU, with the graph engine's weighted
    loss, and its loss curve is the CPU's."""
    import fastnn.sklearn as fs

    x, y = _imbalanced()
    y = y if make == "MLPClassifier" else x @ np.arange(10.0)
    w = np.random.default_rng(0).random(len(y))
    kw = dict(hidden_layer_sizes=(6,), max_iter=3, tol=0.0, random_state=0, precision="fp32")
    gpu = getattr(fs, make)(device="cuda", **kw).fit(x, y, sample_weight=w)
    cpu = getattr(fs, make)(device="cpu", **kw).fit(x, y, sample_weight=w)
    assert gpu.trainer_.device == "cuda"
    np.testing.assert_allclose(gpu.loss_curve_, cpu.loss_curve_, rtol=1e-4)
