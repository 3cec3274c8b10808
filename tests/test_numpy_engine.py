"""The NumPy engine against independent references: finite differences, hand-written optimizers, a manual loop."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from fastnn import MLP, SGD, AdamW, TrainingDiverged
from fastnn._model import init_parameters, param_names
from fastnn._optim import adamw_step, sgd_step
from fastnn._shuffle import permutation
from fastnn.engine.base import EngineConfig, batch_slices, steps_per_epoch
from fastnn.engine.numpy_engine import (
    NumpyEngine,
    activation,
    activation_grad,
    backward,
    forward,
    log_softmax,
    loss_and_grad,
    softmax,
)

SIZES = {0: [7, 4], 1: [7, 5, 4], 2: [7, 6, 5, 4]}


def _params64(model: MLP, seed: int = 0) -> dict[str, np.ndarray]:
    # Larger than torch's init so that pre-activations spread well away from relu's kink.
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in init_parameters(model, seed).items():
        out[name] = rng.normal(0.0, 0.8, size=p.shape)
    return out


def _mean_loss(params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, model: MLP) -> float:
    logits, _ = forward(params, x, model)
    return float(loss_and_grad(logits, y)[0].mean())


@pytest.mark.parametrize("depth", [0, 1, 2])
@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_gradients_match_finite_differences(depth: int, act: str) -> None:
    model = MLP(SIZES[depth], activation=act)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(9, model.in_features))
    y = rng.integers(0, model.classes, size=9)
    params = _params64(model, seed=depth)
    logits, cache = forward(params, x, model)
    for z in cache.preacts:
        assert np.abs(z).min() > 1e-4, "a pre-activation sits on relu's kink; pick another seed"
    _, dlogits = loss_and_grad(logits, y)
    grads = backward(params, cache, dlogits, model)
    assert sorted(grads) == sorted(param_names(model))
    eps = 1e-6
    for name in param_names(model):
        p = params[name]
        numeric = np.empty_like(p)
        for i in np.ndindex(p.shape):
            old = p[i]
            p[i] = old + eps
            up = _mean_loss(params, x, y, model)
            p[i] = old - eps
            down = _mean_loss(params, x, y, model)
            p[i] = old
            numeric[i] = (up - down) / (2 * eps)
        assert grads[name].shape == p.shape
        np.testing.assert_allclose(grads[name], numeric, rtol=1e-5, atol=1e-8, err_msg=name)


def test_activations_match_their_formulas() -> None:
    z = np.linspace(-6, 6, 101)
    np.testing.assert_array_equal(activation(z, "relu"), np.where(z > 0, z, 0.0))
    gelu = np.array([0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3))) for v in z])
    np.testing.assert_allclose(activation(z, "gelu"), gelu, rtol=1e-12, atol=1e-15)
    eps = 1e-6
    zz = z + 0.013  # keep clear of relu's kink at 0
    for name in ("relu", "gelu"):
        numeric = (activation(zz + eps, name) - activation(zz - eps, name)) / (2 * eps)
        np.testing.assert_allclose(activation_grad(zz, name), numeric, rtol=1e-6, atol=1e-8)


def test_loss_is_stable_cross_entropy() -> None:
    logits = np.array([[1.0, 2.0, 3.0], [1e4, 0.0, -1e4], [-50.0, -50.0, -50.0]], dtype=np.float32)
    y = np.array([2, 1, 0])
    losses, dlogits = loss_and_grad(logits, y)
    assert np.isfinite(losses).all()
    p = np.exp(np.array([1.0, 2.0, 3.0]))
    p /= p.sum()
    assert losses[0] == pytest.approx(-math.log(p[2]), rel=1e-6)
    assert losses[1] == pytest.approx(1e4, rel=1e-6)
    assert losses[2] == pytest.approx(math.log(3), rel=1e-6)
    np.testing.assert_allclose(softmax(logits).sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.exp(log_softmax(logits)), softmax(logits), rtol=1e-5, atol=1e-30)
    expected = softmax(logits.astype(np.float64))
    expected[np.arange(3), y] -= 1.0
    np.testing.assert_allclose(dlogits, expected / 3, rtol=1e-5, atol=1e-7)
    assert losses.dtype == np.float32 and dlogits.dtype == np.float32


# ---- optimizers against torch.optim's formulas, written out here -------------------------------------------


def _torch_sgd(w, grads, lr, momentum, weight_decay, nesterov):
    """torch.optim.SGD (dampening 0): the buffer starts as the first gradient."""
    buf = None
    for g in grads:
        g = g + weight_decay * w
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + g
            g = g + momentum * buf if nesterov else buf
        w = w - lr * g
    return w


def _torch_adamw(w, grads, lr, betas, eps, weight_decay):
    """torch.optim.AdamW: decoupled decay, then bias-corrected moments."""
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        w = w * (1 - lr * weight_decay)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        bc1, bc2 = 1 - betas[0] ** t, 1 - betas[1] ** t
        w = w - (lr / bc1) * m / (np.sqrt(v) / math.sqrt(bc2) + eps)
    return w


@pytest.mark.parametrize(
    "opt",
    [
        SGD(lr=0.1),
        SGD(lr=0.1, momentum=0.9),
        SGD(lr=0.05, momentum=0.8, nesterov=True),
        SGD(lr=0.1, momentum=0.9, weight_decay=0.01),
        AdamW(lr=0.01),
        AdamW(lr=0.003, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    ],
    ids=lambda o: repr(o),
)
def test_optimizer_step_matches_torch_formulas(opt: SGD | AdamW) -> None:
    rng = np.random.default_rng(2)
    w0 = rng.normal(size=(4, 3))
    grads = [rng.normal(size=(4, 3)) for _ in range(3)]
    model = MLP([3, 4])
    engine = NumpyEngine(EngineConfig(model, opt, batch_size=4), init_parameters(model, 0), dtype=np.float64)
    w = w0.copy()
    state = engine.opt_state["0.weight"]
    for t, g in enumerate(grads, start=1):
        if isinstance(opt, AdamW):
            adamw_step(opt, w, g, state, opt.lr, t)
        else:
            sgd_step(opt, w, g, state, opt.lr)
    if isinstance(opt, AdamW):
        ref = _torch_adamw(w0, grads, opt.lr, opt.betas, opt.eps, opt.weight_decay)
    else:
        ref = _torch_sgd(w0, grads, opt.lr, opt.momentum, opt.weight_decay, opt.nesterov)
    np.testing.assert_allclose(w, ref, rtol=1e-12, atol=1e-14)
    assert not np.allclose(w, w0)


@pytest.mark.parametrize("opt", [SGD(lr=0.1, weight_decay=0.5, bias_decay=0.0),
                                 AdamW(lr=0.1, weight_decay=0.5, bias_decay=0.0)], ids=repr)  # fmt: skip
def test_bias_decay_decays_biases_only(opt: SGD | AdamW) -> None:
    """A zero gradient leaves only the decay: the weights shrink, the biases (bias_decay=0) stay; bias_decay=None
    decays them as the weights (PyTorch's one parameter group)."""
    model = MLP([3, 4])
    for bias_decay, bias_factor in ((0.0, 1.0), (None, 1 - 0.1 * 0.5)):
        o = dataclasses.replace(opt, bias_decay=bias_decay)
        engine = NumpyEngine(EngineConfig(model, o, batch_size=4), init_parameters(model, 0), dtype=np.float64)
        for name, w in engine.params.items():
            w0, state = w.copy(), engine.opt_state[name]
            if isinstance(o, AdamW):
                adamw_step(o, w, np.zeros_like(w), state, o.lr, 1, name.endswith(".bias"))
            else:
                sgd_step(o, w, np.zeros_like(w), state, o.lr, name.endswith(".bias"))
            np.testing.assert_allclose(w, w0 * (bias_factor if name.endswith(".bias") else 1 - 0.1 * 0.5))


# ---- the engine's loop against a manual loop ---------------------------------------------------------------


def _data(n: int = 50, d: int = 6, classes: int = 3, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, d)).astype(np.uint8), rng.integers(0, classes, size=n).astype(np.int32)


def _reference_run(cfg: EngineConfig, x, y, lrs, first_epoch=0, first_step=0):
    """Train with forward/backward and torch's optimizer formulas written out; float64."""
    model, opt = cfg.model, cfg.optimizer
    params = {k: v.astype(np.float64) for k, v in init_parameters(model, cfg.seed).items()}
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v2 = {k: np.zeros_like(v) for k, v in params.items()}
    xs = x.astype(np.float64) / 255.0
    if cfg.normalize:
        xs = (xs - cfg.normalize[0]) / cfg.normalize[1]
    n = x.shape[0]
    spe = steps_per_epoch(n, cfg.batch_size, cfg.drop_last)
    stats, step = [], 0
    for k in range(len(lrs) // spe):
        order = permutation(cfg.seed, first_epoch + k, n)
        losses, correct = [], 0
        for lo, hi in batch_slices(n, cfg.batch_size, cfg.drop_last):
            idx = order[lo:hi]
            logits, cache = forward(params, xs[idx], model)
            ls, dl = loss_and_grad(logits, y[idx])
            losses += list(ls)
            correct += int((logits.argmax(1) == y[idx]).sum())
            grads = backward(params, cache, dl, model)
            lr, t = float(lrs[step]), first_step + step + 1
            for name in params:
                g, w = grads[name], params[name]
                wd = opt.bias_decay if name.endswith(".bias") and opt.bias_decay is not None else opt.weight_decay
                if isinstance(opt, AdamW):
                    w = w * (1 - lr * wd)
                    m[name] = opt.betas[0] * m[name] + (1 - opt.betas[0]) * g
                    v2[name] = opt.betas[1] * v2[name] + (1 - opt.betas[1]) * g * g
                    mh, vh = m[name] / (1 - opt.betas[0] ** t), v2[name] / (1 - opt.betas[1] ** t)
                    params[name] = w - lr * mh / (np.sqrt(vh) + opt.eps)
                else:
                    g = g + wd * w
                    if opt.momentum:
                        m[name] = g if t == 1 else opt.momentum * m[name] + g
                        g = g + opt.momentum * m[name] if opt.nesterov else m[name]
                    params[name] = w - lr * g
            step += 1
        stats.append((float(np.mean(losses)), correct / len(losses)))
    return params, stats


@pytest.mark.parametrize(
    "opt,sizes,act,normalize,drop_last",
    [
        (SGD(lr=0.5), [6, 3], "relu", None, False),
        (SGD(lr=0.2, momentum=0.9, weight_decay=0.01), [6, 8, 3], "relu", (0.5, 0.25), False),
        (SGD(lr=0.2, momentum=0.9, nesterov=True), [6, 8, 5, 3], "gelu", None, True),
        (AdamW(lr=0.01, weight_decay=0.05), [6, 8, 3], "gelu", (0.3, 0.2), False),
        # bias_decay: the biases' own decay (fastnn.sklearn's 0: scikit-learn penalises weights only)
        (SGD(lr=0.2, momentum=0.9, weight_decay=0.3, bias_decay=0.0), [6, 8, 3], "relu", None, False),
        (AdamW(lr=0.01, weight_decay=0.5, bias_decay=0.02), [6, 8, 3], "gelu", None, False),
    ],
)
def test_engine_matches_manual_loop(opt, sizes, act, normalize, drop_last) -> None:
    model = MLP(sizes, activation=act)
    cfg = EngineConfig(model, opt, batch_size=16, seed=5, normalize=normalize, drop_last=drop_last)
    x, y = _data()
    spe = steps_per_epoch(len(x), 16, drop_last)
    lrs = (opt.lr * (1.0 + np.arange(3 * spe) % 3) / 2).astype(np.float32)  # varying rates test the table
    engine = NumpyEngine(cfg, init_parameters(model, cfg.seed), dtype=np.float64)
    engine.set_train_data(x, y)
    seen = []
    engine.fit_epochs(0, 0, lrs, None, frozenset(), seen.append)
    ref_params, ref_stats = _reference_run(cfg, x, y, lrs)
    assert [s.epoch for s in seen] == [0, 1, 2]
    for s, (loss, acc) in zip(seen, ref_stats):
        assert s.loss == pytest.approx(loss, rel=1e-9)
        assert s.accuracy == pytest.approx(acc)
        assert s.samples == (spe * 16 if drop_last else len(x))
        assert s.eval_loss is None and s.eval_accuracy is None
    for name, p in ref_params.items():
        np.testing.assert_allclose(engine.params[name], p, rtol=1e-9, atol=1e-12, err_msg=name)


def test_split_calls_equal_one_call_adam_counts_global_steps() -> None:
    model = MLP([6, 8, 3])
    cfg = EngineConfig(model, AdamW(lr=0.02), batch_size=16, seed=1)
    x, y = _data()
    spe = steps_per_epoch(len(x), 16, False)
    lrs = np.full(3 * spe, 0.02, dtype=np.float32)
    whole = NumpyEngine(cfg, init_parameters(model, 1))
    whole.set_train_data(x, y)
    whole.fit_epochs(0, 0, lrs, None, frozenset(), lambda s: None)
    split = NumpyEngine(cfg, init_parameters(model, 1))
    split.set_train_data(x, y)
    split.fit_epochs(0, 0, lrs[:spe], None, frozenset(), lambda s: None)
    split.fit_epochs(1, spe, lrs[spe:], None, frozenset(), lambda s: None)
    for name, arr in whole.get_state().items():
        np.testing.assert_array_equal(split.get_state()[name], arr, err_msg=name)
    # A restart that forgets the global step (t from 1 again) must give different weights.
    wrong = NumpyEngine(cfg, init_parameters(model, 1))
    wrong.set_train_data(x, y)
    wrong.fit_epochs(0, 0, lrs[:spe], None, frozenset(), lambda s: None)
    wrong.fit_epochs(1, 0, lrs[spe:], None, frozenset(), lambda s: None)
    assert not np.array_equal(wrong.get_state()["0.weight"], whole.get_state()["0.weight"])


def test_eval_after_and_evaluate_predict() -> None:
    model = MLP([6, 8, 3])
    cfg = EngineConfig(model, SGD(lr=0.3), batch_size=16)
    x, y = _data()
    ex, ey = _data(n=30, seed=9)
    engine = NumpyEngine(cfg, init_parameters(model, 0))
    engine.set_train_data(x, y)
    seen = []
    engine.fit_epochs(0, 0, np.full(3 * 4, 0.3, np.float32), (ex, ey), frozenset({1}), seen.append)
    assert [s.eval_loss is None for s in seen] == [True, False, True]
    # Evaluated after epoch 1 means with epoch 1's weights: not equal to the final ones' numbers.
    final_loss, final_acc = engine.evaluate(ex, ey)
    logits, _ = forward(engine.params, ex.astype(np.float32) / 255, model)
    losses, _ = loss_and_grad(logits, ey)
    assert final_loss == pytest.approx(float(losses.mean()), rel=1e-5)
    assert final_acc == pytest.approx(float((logits.argmax(1) == ey).mean()))
    proba = engine.predict_proba(ex)
    assert proba.dtype == np.float32 and proba.shape == (30, 3)
    np.testing.assert_allclose(proba, softmax(logits), rtol=1e-5, atol=1e-7)


def test_state_names_and_round_trip() -> None:
    model = MLP([6, 8, 3])
    x, y = _data()
    for opt, names in (
        (SGD(lr=0.1), ()),
        (SGD(lr=0.1, momentum=0.5), ("momentum",)),
        (AdamW(), ("exp_avg", "exp_avg_sq")),
    ):
        engine = NumpyEngine(EngineConfig(model, opt, batch_size=16), init_parameters(model, 0))
        engine.set_train_data(x, y)
        engine.fit_epochs(0, 0, np.full(4, opt.lr, np.float32), None, frozenset(), lambda s: None)
        state = engine.get_state()
        expected = param_names(model) + [f"opt.{s}.{n}" for n in param_names(model) for s in names]
        assert sorted(state) == sorted(expected)
        assert all(a.dtype == np.float32 for a in state.values())
        if names:
            assert np.abs(state[f"opt.{names[0]}.0.weight"]).max() > 0
        other = NumpyEngine(EngineConfig(model, opt, batch_size=16), init_parameters(model, 7))
        other.set_state(state)
        for k, a in other.get_state().items():
            np.testing.assert_array_equal(a, state[k])
        state["0.bias"][:] = 99.0  # get_state returns copies
        assert not (engine.params["0.bias"] == 99.0).any()


def test_divergence_restores_the_epoch_before() -> None:
    model = MLP([6, 32, 32, 3])
    cfg = EngineConfig(model, SGD(lr=0.1, momentum=0.9), batch_size=16)
    x, y = _data()
    engine = NumpyEngine(cfg, init_parameters(model, 0))
    engine.set_train_data(x, y)
    seen = []
    engine.fit_epochs(0, 0, np.full(4, 0.1, np.float32), None, frozenset(), seen.append)
    before = engine.get_state()
    lrs = np.array([0.1] * 4 + [1e6] * 8, np.float32)
    with pytest.raises(TrainingDiverged) as info:
        engine.fit_epochs(1, 4, lrs, None, frozenset(), seen.append)
    assert info.value.epoch == 3  # index 1 trains at 0.1; index 2 (numbered 3, from 1) blows up
    assert not math.isfinite(info.value.loss)
    assert [s.epoch for s in seen] == [0, 1]
    after = engine.get_state()
    assert not np.array_equal(after["0.weight"], before["0.weight"])  # epoch 1's update is kept
    assert all(np.isfinite(a).all() for a in after.values())
    # Epoch 1's end is what is kept: redo epoch 1 from `before` and compare.
    redo = NumpyEngine(cfg, before)
    redo.set_train_data(x, y)
    redo.fit_epochs(1, 4, lrs[:4], None, frozenset(), lambda s: None)
    for k, a in redo.get_state().items():
        np.testing.assert_array_equal(after[k], a, err_msg=k)


def test_interrupted_epoch_keeps_the_last_whole_epoch(monkeypatch: pytest.MonkeyPatch) -> None:
    model = MLP([6, 8, 3])
    engine = NumpyEngine(EngineConfig(model, AdamW(lr=0.01), batch_size=16), init_parameters(model, 0))
    x, y = _data()
    engine.set_train_data(x, y)
    engine.fit_epochs(0, 0, np.full(4, 0.01, np.float32), None, frozenset(), lambda s: None)
    before = engine.get_state()
    real_step, calls = engine._step, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_step(*args)

    monkeypatch.setattr(engine, "_step", interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine.fit_epochs(1, 4, np.full(4, 0.01, np.float32), None, frozenset(), lambda s: None)
    for k, a in engine.get_state().items():
        np.testing.assert_array_equal(a, before[k], err_msg=k)


def test_prediction_does_not_depend_on_the_rows_predicted_with_it() -> None:
    """Evaluation and prediction compute in float64 from the float32 weights: a row alone, in a slice or in the
    whole set gets the same outputs (scikit-learn's check_methods_subset_invariance), to the bit."""
    model = MLP([6, 40, 3])
    engine = NumpyEngine(EngineConfig(model, SGD(), batch_size=16, loss="mse"), init_parameters(model, 0))
    rng = np.random.default_rng(5)
    x = rng.normal(size=(257, 6)).astype(np.float32)
    whole = engine.predict_outputs(x)
    assert whole.dtype == np.float32
    for i in (0, 17, 256):
        np.testing.assert_array_equal(engine.predict_outputs(x[i : i + 1])[0], whole[i])
    np.testing.assert_array_equal(engine.predict_outputs(x[5:69]), whole[5:69])
    np.testing.assert_array_equal(engine.predict_proba(x[100:101])[0], engine.predict_proba(x)[100])
