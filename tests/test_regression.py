"""Regression (`Trainer(loss="mse")`): the NumPy engine's loss and R^2 against their formulas, training, the
user layer's checks, checkpoints, and device="auto" without a GPU. The GPU engines against the NumPy engine:
tests/test_regression_gpu.py."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import fastnn
from fastnn import MLP, SGD, AdamW, ConfigError, DataError, DeviceUnavailable, Trainer
from fastnn._model import init_parameters, param_names
from fastnn.engine import select
from fastnn.engine.base import EngineConfig
from fastnn.engine.numpy_engine import NumpyEngine, backward, forward, mse_loss_and_grad, r2_score


def _linear_data(n: int = 400, d: int = 5, k: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = x @ rng.normal(size=(d, k)) + 0.5 + 0.05 * rng.normal(size=(n, k))
    return x, y.astype(np.float32)


def test_mse_loss_and_gradient_are_the_mean_squared_error_and_its_derivative():
    rng = np.random.default_rng(0)
    out, y = rng.normal(size=(6, 3)), rng.normal(size=(6, 3))
    losses, grad = mse_loss_and_grad(out, y)
    np.testing.assert_allclose(losses, ((out - y) ** 2).mean(axis=1), rtol=1e-15)
    assert losses.mean() == pytest.approx(((out - y) ** 2).mean(), rel=1e-15)  # the batch loss is the MSE
    eps, numeric = 1e-6, np.empty_like(out)
    for i in np.ndindex(out.shape):
        up, down = out.copy(), out.copy()
        up[i] += eps
        down[i] -= eps
        numeric[i] = (((up - y) ** 2).mean() - ((down - y) ** 2).mean()) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("sizes", [[4, 1], [4, 6, 2], [4, 5, 3, 3]])
def test_network_gradients_of_the_mse_match_finite_differences(sizes):
    model = MLP(sizes, activation="gelu")  # smooth: no kink to land on
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(7, sizes[0])), rng.normal(size=(7, sizes[-1]))
    params = {n: rng.normal(0, 0.8, size=p.shape) for n, p in init_parameters(model, 0).items()}

    def mean_loss() -> float:
        return float(mse_loss_and_grad(forward(params, x, model)[0], y)[0].mean())

    out, cache = forward(params, x, model)
    grads = backward(params, cache, mse_loss_and_grad(out, y)[1], model)
    for name in param_names(model):
        p, numeric = params[name], np.empty_like(params[name])
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + 1e-6
            up = mean_loss()
            p[i] = old - 1e-6
            down = mean_loss()
            p[i] = old
            numeric[i] = (up - down) / 2e-6
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-8, err_msg=name)


def test_r2_score_is_scikit_learns():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(2)
    y = rng.normal(size=(50, 3))
    y[:, 2] = 4.0  # a constant target: 1 when predicted exactly, else 0 (scikit-learn's force_finite)
    for pred in (y + 0.3 * rng.normal(size=y.shape), y.copy(), np.zeros_like(y)):
        sse = ((pred - y) ** 2).sum(axis=0)
        assert r2_score(sse, y) == pytest.approx(sklearn_metrics.r2_score(y, pred), abs=1e-12)


def test_one_sgd_step_is_least_squares_gradient_descent():
    """The engine's step on a linear model is w -= lr * 2/(B*k) * X^T (Xw + b - y), by hand."""
    x, y = _linear_data(n=8, d=3, k=1)
    model = MLP([3, 1])
    state = init_parameters(model, 0)
    eng = NumpyEngine(EngineConfig(model, SGD(lr=0.1), batch_size=8, loss="mse"), state, dtype=np.float64)
    eng.set_train_data(x, y)
    eng.fit_epochs(0, 0, np.array([0.1]), None, frozenset(), lambda stats: None)
    w, b = state["0.weight"].astype(np.float64), state["0.bias"].astype(np.float64)
    residual = x @ w.T + b - y
    np.testing.assert_allclose(eng.params["0.weight"], w - 0.1 * 2 / 8 * residual.T @ x, rtol=1e-6)
    np.testing.assert_allclose(eng.params["0.bias"], b - 0.1 * 2 / 8 * residual.sum(axis=0), rtol=1e-6)


@pytest.mark.parametrize("k", [1, 3])
def test_trainer_fits_a_linear_target_and_reports_mse_and_r2(k):
    x, y = _linear_data(k=k)
    targets = y[:, 0] if k == 1 else y  # (N,) for one output
    t = Trainer(MLP([5, 32, k]), AdamW(lr=0.01), batch_size=32, device="cpu", loss="mse")
    history = t.fit(x, targets, epochs=40, validation_split=0.2)
    assert history[-1]["train_accuracy"] is None and history[-1]["eval_accuracy"] is None
    assert history[-1]["eval_loss"] < history[0]["eval_loss"] / 10
    result = t.evaluate(x, targets)
    assert set(result) == {"loss", "mse", "r2"} and result["loss"] == result["mse"]
    pred = t.predict(x)
    assert pred.shape == targets.shape and pred.dtype == np.float32
    assert result["mse"] == pytest.approx(float(((pred - targets).astype(np.float64) ** 2).mean()), rel=1e-5)
    assert result["r2"] > 0.98
    with pytest.raises(ConfigError, match="predict_proba is for classifiers"):
        t.predict_proba(x)


def test_a_classifier_given_continuous_targets_says_to_use_mse():
    x, y = _linear_data(k=1)
    t = Trainer(MLP([5, 3]), device="cpu")
    with pytest.raises(DataError, match=r"continuous targets: use loss='mse' / MLPRegressor") as err:
        t.fit(x, y[:, 0], epochs=1)
    assert "y holds continuous float32 values (" in str(err.value)
    with pytest.raises(DataError, match="must have an integer dtype"):  # whole numbers as floats: only the dtype
        t.fit(x, np.zeros(len(x)), epochs=1)


@pytest.mark.parametrize(
    ("sizes", "loss", "match"),
    [
        ([5, 1], "cross_entropy", r"needs at least 2 classes; for a regression of one target pass loss='mse'"),
        ([5, 2], "huber", r"loss must be one of \('cross_entropy', 'mse'\), got 'huber'"),
        ([5, 2], None, "loss must be one of"),
    ],
)
def test_bad_loss_or_a_one_output_classifier_is_refused(sizes, loss, match):
    with pytest.raises(ConfigError, match=match):
        Trainer(MLP(sizes), loss=loss, device="cpu")


@pytest.mark.parametrize(
    ("y", "match"),
    [
        (np.zeros((400, 3)), r"y must have shape \(N, 2\) for a model with 2 output\(s\), got shape \(400, 3\)"),
        (np.zeros(400), r"must have shape \(N, 2\)"),
        (np.zeros((300, 2)), "300 rows of targets but the inputs have 400 rows"),
        (np.array([["a", "b"]] * 400), "must hold numbers"),
        (np.full((400, 2), np.nan), "must hold finite values, got nan in row 0, column 0 .missing values"),
        (np.full((400, 2), 1e40), r"y holds 1e\+40 in row 0, column 0: a finite number, but beyond float32's range"),
    ],
)
def test_bad_targets_are_named(y, match):
    x, _ = _linear_data()
    t = Trainer(MLP([5, 2]), device="cpu", loss="mse")
    with pytest.raises(DataError, match=match):
        t.fit(x, y)
    assert t.epoch == 0


def test_early_stopping_on_accuracy_is_refused_for_a_regression():
    x, y = _linear_data()
    t = Trainer(MLP([5, 2]), device="cpu", loss="mse")
    with pytest.raises(ConfigError, match="use EarlyStopping.monitor='eval_loss'."):
        t.fit(x, y, validation_split=0.2, early_stopping=fastnn.EarlyStopping(monitor="eval_accuracy"))
    t.fit(x, y, epochs=3, validation_split=0.2, early_stopping=2)  # eval_loss (the default) works


def test_checkpoint_records_the_loss_and_old_files_are_classifiers(tmp_path: Path):
    x, y = _linear_data()
    t = Trainer(MLP([5, 4, 2]), AdamW(lr=0.01), batch_size=50, device="cpu", loss="mse")
    t.fit(x, y, epochs=3, validation_split=0.25)
    path = tmp_path / "reg.npz"
    t.save(path)
    back = Trainer.load(path, device="cpu")
    assert back.loss == "mse" and back.history == t.history
    np.testing.assert_array_equal(back.predict(x), t.predict(x))
    back.fit(x, y, epochs=1)  # continues as a regression
    # A file written before regression existed has no "loss": it is a classifier's.
    from fastnn import _checkpoint as checkpoint
    config, arrays = checkpoint.load(path)
    config = {k: v for k, v in config.items() if k != "loss"}
    config["model"]["sizes"][-1] = 3
    config["history"] = []
    clf = Trainer(MLP([5, 4, 3]), AdamW(lr=0.01), device="cpu")
    old = tmp_path / "old.npz"
    checkpoint.save(old, config, clf._engine.get_state())
    assert Trainer.load(old, device="cpu").loss == "cross_entropy"
    config["loss"] = "huber"
    checkpoint.save(old, config, clf._engine.get_state())
    with pytest.raises(DataError, match=r"old.npz' holds an invalid config: loss must be one of"):
        Trainer.load(old, device="cpu")


def test_regression_records_pass_the_history_check_and_print():
    from fastnn._history import History, check_records
    from fastnn._progress import format_epoch

    record = {"epoch": 1, "train_loss": 0.5, "train_accuracy": None, "eval_loss": 0.7, "eval_accuracy": None,
              "seconds": 0.1}  # fmt: skip
    assert check_records([record]) == [record]
    assert format_epoch(record, 3) == "epoch 1/3  loss 0.5000  eval loss 0.7000  0.10s"
    with pytest.raises(ValueError, match="has an eval_accuracy but no train_accuracy"):
        check_records([{**record, "eval_accuracy": 0.5}])
    assert "-" in str(History([record]))


def test_auto_without_a_gpu_falls_back_as_a_classifier_does(monkeypatch):
    """With no usable GPU, device="auto" trains a regression on the CPU with the one fallback warning every trainer
    gets; the loss itself sends nothing to the CPU (the GPU engines train it: tests/test_regression_gpu.py)."""

    def no_gpu():
        raise DeviceUnavailable("no usable GPU: none in this test")

    monkeypatch.setattr(select, "graph_engine_class", no_gpu)
    monkeypatch.setattr(select, "_warned", set())  # as in a fresh process: the warning is shown once per process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = Trainer(MLP([5, 2]), loss="mse", device="auto")
        Trainer(MLP([5, 2]), device="auto")  # a classifier after it: the same warning, already shown
    assert t.engine == "numpy"
    assert [str(w.message) for w in caught] == [
        "device='auto': no usable GPU: none in this test; training on the CPU (NumPy engine) instead"
    ]


def test_saved_config_names_the_loss(tmp_path: Path):
    x, y = _linear_data()
    t = Trainer(MLP([5, 2]), device="cpu", loss="mse")
    t.save(tmp_path / "r.npz")
    with np.load(tmp_path / "r.npz") as f:
        assert json.loads(str(f["__fastnn_config__"]))["loss"] == "mse"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing noisy about a classifier's file either
        Trainer(MLP([5, 2]), device="cpu").save(tmp_path / "c.npz")
