"""MultiTrainer on the CPU: K models give each model's result of K separate `Trainer` fits (the NumPy engine, bit for
bit), folds (masks) equal fits on the subsets, one model diverging stops alone, early stopping per model, and bad
input is refused by name before any work."""

from __future__ import annotations

import numpy as np
import pytest

import fastnn
from fastnn import MLP, SGD, AdamW, ConfigError, DataError, EarlyStopping, MultiTrainer, Trainer
from fastnn._model import init_parameters
from fastnn.engine.many.plan import mask_groups, streams


def _data(n: int = 150, d: int = 12, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=(d, classes))
    return x, (x @ w).argmax(axis=1).astype(np.int64)


def _separate(model, opt, seed, x, y, *, shuffle_seed=0, batch_size=16, epochs=2, **fit) -> Trainer:
    """The separate fit model k is defined as: shuffle keyed by shuffle_seed, weights drawn from seed."""
    t = Trainer(model, opt, batch_size=batch_size, device="cpu", seed=shuffle_seed)
    t.load_state_dict(init_parameters(model, seed))
    t.fit(x, y, epochs=epochs, progress=False, **fit)
    return t


def _records(history) -> list[dict]:
    """The records without their times."""
    return [{f: v for f, v in r.items() if f != "seconds"} for r in history]


def _same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for n in a:
        np.testing.assert_array_equal(a[n], b[n], err_msg=n)


@pytest.mark.parametrize(
    "opt, hparams",
    [
        (SGD(lr=0.1), {"lr": [0.05, 0.1, 0.2], "weight_decay": [0.0, 1e-3, 1e-2], "momentum": [0.0, 0.9, 0.5]}),
        (AdamW(lr=1e-3), {"lr": [1e-3, 3e-3, 1e-2], "weight_decay": 0.05, "betas": [(0.9, 0.999), (0.8, 0.99),
                                                                                    (0.5, 0.9)]}),
    ],
    ids=["sgd", "adamw"],
)
def test_k_models_equal_k_separate_fits(opt, hparams):
    x, y = _data()
    model = MLP([12, 8, 3])
    mt = MultiTrainer(model, opt, seeds=[3, 7, 11], shuffle_seed=5, batch_size=16, device="cpu", **hparams)
    mt.fit(x, y, epochs=2, eval_data=(x[:50], y[:50]))
    for k, opt_k in enumerate(mt.optimizers):
        t = _separate(model, opt_k, [3, 7, 11][k], x, y, shuffle_seed=5, eval_data=(x[:50], y[:50]))
        _same_state(mt.state_dicts()[k], t.state_dict())
        assert mt.histories[k]["train_loss"] == t.history["train_loss"]
        assert mt.histories[k]["eval_accuracy"] == t.history["eval_accuracy"]
        assert mt.evaluate(x, y)[k] == t.evaluate(x, y)
    assert mt.optimizers[1].lr == hparams["lr"][1]
    assert mt.epochs.tolist() == [2, 2, 2]
    assert mt.steps.tolist() == [20, 20, 20]  # 150 rows at batch 16: 10 steps an epoch
    assert not mt.diverged.any()


def test_models_differ_when_their_hyperparameters_do():
    """The comparison above could pass with every model trained alike; it doesn't: seeds and lrs matter."""
    x, y = _data()
    mt = MultiTrainer(MLP([12, 3]), SGD(lr=0.1), lr=[0.1, 0.1, 0.3], seeds=[1, 2, 1], batch_size=16, device="cpu")
    mt.fit(x, y, epochs=1)
    w = [s["0.weight"] for s in mt.state_dicts()]
    assert not np.array_equal(w[0], w[1]) and not np.array_equal(w[0], w[2])


def test_masks_equal_separate_fits_on_the_subsets():
    x, y = _data(n=120)
    folds = np.arange(120) % 3
    masks = np.stack([folds != f for f in range(3)] + [folds != 0])  # model 3 shares model 0's fold
    model = MLP([12, 3])
    mt = MultiTrainer(model, SGD(lr=0.1, momentum=0.9), lr=[0.1, 0.1, 0.1, 0.2], seeds=0, batch_size=16,
                      device="cpu")  # fmt: skip
    mt.fit(x, y, epochs=2, masks=masks, eval_data=(x, y), eval_masks=~masks)
    for k in range(4):
        t = _separate(model, mt.optimizers[k], k, x[masks[k]], y[masks[k]], eval_data=(x[~masks[k]], y[~masks[k]]))
        _same_state(mt.state_dicts()[k], t.state_dict())
        assert mt.histories[k]["eval_loss"] == t.history["eval_loss"]
    assert mt.steps.tolist() == [10, 10, 10, 10]  # 80 rows at batch 16: 5 steps an epoch, 2 epochs
    scores = mt.evaluate(x, y, masks=~masks)
    assert scores[2] == _separate(model, mt.optimizers[2], 2, x[masks[2]], y[masks[2]]).evaluate(x[~masks[2]],
                                                                                                   y[~masks[2]])


def test_one_model_diverging_stops_alone():
    x, y = _data()
    x[:, 0] *= 100.0
    model = MLP([12, 16, 3])
    lrs = [0.01, 1e6, 0.02]
    mt = MultiTrainer(model, SGD(lr=0.1), lr=lrs, seeds=0, batch_size=16, device="cpu", precision="fp32")
    with pytest.warns(RuntimeWarning, match="1 of 3 models diverged"):
        mt.fit(x, y, epochs=3)
    assert mt.diverged.tolist() == [False, True, False]
    assert isinstance(mt.divergences[1], fastnn.TrainingDiverged)
    with pytest.raises(fastnn.TrainingDiverged):
        _separate(model, SGD(lr=1e6), 1, x, y, epochs=3)
    for k in (0, 2):
        t = _separate(model, SGD(lr=lrs[k]), k, x, y, epochs=3)
        _same_state(mt.state_dicts()[k], t.state_dict())
        assert len(mt.histories[k]) == 3
    assert all(np.isfinite(v).all() for v in mt.state_dicts()[1].values())  # its last finite epoch's weights
    assert len(mt.histories[1]) < 3 and mt.epochs[1] == len(mt.histories[1])
    mt.fit(x, y, epochs=1)  # a later fit skips the diverged model
    assert mt.epochs.tolist() == [4, len(mt.histories[1]), 4]


def test_early_stopping_per_model_equals_separate_fits():
    x, y = _data(n=120)
    xe, ye = _data(n=60, seed=1)
    model = MLP([12, 3])
    stop = EarlyStopping(patience=1, min_delta=0.0)
    lrs = [0.5, 0.01, 2.0]
    mt = MultiTrainer(model, SGD(lr=0.1), lr=lrs, seeds=0, batch_size=16, device="cpu")
    mt.fit(x, y, epochs=8, eval_data=(xe, ye), early_stopping=stop)
    for k in range(3):
        s = EarlyStopping(patience=1, min_delta=0.0)
        t = _separate(model, SGD(lr=lrs[k]), k, x, y, epochs=8, eval_data=(xe, ye), early_stopping=s)
        _same_state(mt.state_dicts()[k], t.state_dict())
        assert _records(mt.histories[k]) == _records(t.history)
        assert mt.epochs[k] == t.epoch and mt.steps[k] == t.step
        assert mt.early_stoppers[k].best_epoch == s.best_epoch
    assert min(mt.epochs) < 8 == max(mt.epochs)  # one model stopped early, another went on: each its own
    assert stop.best_epoch is None  # the caller's EarlyStopping is a template: each model judges its own copy


def test_trainer_k_continues_as_the_separate_fit_would():
    x, y = _data()
    model = MLP([12, 8, 3])
    mt = MultiTrainer(model, AdamW(lr=1e-2), models=2, weight_decay=[0.0, 0.1], seeds=4, batch_size=16, device="cpu")
    mt.fit(x, y, epochs=1)
    t = mt.trainer(1)
    assert t.epoch == 1 and t.step == 10 and len(t.history) == 1 and t.optimizer.weight_decay == 0.1
    t.fit(x, y, epochs=1, progress=False)
    ref = _separate(model, AdamW(lr=1e-2, weight_decay=0.1), 5, x, y, epochs=2)
    _same_state(t.state_dict(), ref.state_dict())  # the optimizer state came along
    mt.fit(x, y, epochs=1)
    _same_state(mt.state_dicts()[1], ref.state_dict())


def test_state_dicts_round_trip_and_best():
    x, y = _data()
    mt = MultiTrainer(MLP([12, 3]), SGD(lr=0.1), lr=[1e-4, 0.3], batch_size=16, device="cpu")
    mt.fit(x, y, epochs=2, eval_data=(x, y))
    assert mt.best() == mt.best("eval_loss") == mt.best("val_loss") == 1  # the tiny lr barely moved
    assert mt.best("train_accuracy") == 1
    states = mt.state_dicts()
    mt.load_state_dicts(states[::-1])
    _same_state(mt.state_dicts()[0], states[1])


def test_predict_before_fit_is_an_error_until_the_models_have_weights():
    """As `Trainer.predict`: no answer from the random initial weights; loaded weights count as given, and model k
    handed back as a Trainer keeps them."""
    x, y = _data()
    mt = MultiTrainer(MLP([12, 3]), SGD(lr=0.1), models=2, batch_size=16, device="cpu")
    for call in (mt.predict, mt.predict_proba, mt.forward):
        with pytest.raises(fastnn.NotFittedError, match=r"MultiTrainer\.\w+: .* random initial weights"):
            call(x)
    with pytest.raises(DataError):  # a bad x is named first
        mt.predict(x[:, :2])
    assert len(mt.evaluate(x, y)) == 2  # the loss before training stays measurable
    fitted = MultiTrainer(MLP([12, 3]), SGD(lr=0.1), models=2, batch_size=16, device="cpu").fit(x, y, epochs=1)
    assert fitted.predict(x).shape == (2, len(x))
    mt.load_state_dicts(fitted.state_dicts())
    np.testing.assert_array_equal(mt.predict(x), fitted.predict(x))
    assert mt.trainer(1).predict(x).shape == (len(x),)
    x[:, 0] *= 100.0  # every model diverging in its first epoch was fitted: its weights are its last finite ones
    gone = MultiTrainer(MLP([12, 16, 3]), SGD(lr=1e6), models=2, batch_size=16, device="cpu", precision="fp32")
    with pytest.warns(RuntimeWarning, match="2 of 2 models diverged"):
        gone.fit(x, y, epochs=1)
    assert gone.diverged.all() and not gone.epochs.any()
    assert gone.forward(x).shape == (2, len(x), 3)  # what a search scores as error_score


def test_regression_outputs_have_a_model_axis():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype(np.float32)
    y = rng.normal(size=(64, 2)).astype(np.float32)
    mt = MultiTrainer(MLP([5, 4, 2]), SGD(lr=0.01), models=3, batch_size=16, device="cpu", loss="mse")
    mt.fit(x, y, epochs=1, eval_data=(x, y))
    assert mt.predict(x).shape == (3, 64, 2) and mt.forward(x).shape == (3, 64, 2)
    assert set(mt.evaluate(x, y)[0]) == {"loss", "mse", "r2"}
    with pytest.raises(ConfigError, match="predict_proba is for classifiers"):
        mt.predict_proba(x)


def test_mask_groups_and_streams_plan():
    masks = np.array([[1, 1, 0], [0, 1, 1], [1, 1, 0], [1, 1, 1]], dtype=bool)
    group, rows = mask_groups(masks, 4)
    assert group.tolist() == [0, 1, 0, 2]
    assert [r.tolist() for r in rows] == [[0, 1], [1, 2], [0, 1, 2]]
    s = streams(group, np.array([0, 0, 1, 0]), np.array([True, True, True, False]))
    assert s.count == 3 and s.of_model.tolist() == [0, 1, 2, -1]
    assert s.models(0).tolist() == [0] and s.group.tolist() == [0, 1, 0] and s.epoch.tolist() == [0, 0, 1]
    assert mask_groups(None, 3)[1] is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"lr": [0.1, 0.2], "weight_decay": [0.0, 0.1, 0.2]}, r"weight_decay must have one value per model: lr has 2 "
                                                              r"values, but weight_decay has 3"),
        ({"models": 3, "lr": [0.1, 0.2]}, r"lr must have one value per model: models=3, but lr has 2"),
        ({"models": 0}, r"models must be an integer in \[1, "),
        ({"lr": []}, r"lr must be a number or a non-empty sequence"),
        ({}, r"the number of models is not given"),
        ({"lr": [0.1, -1.0]}, r"model 1 \(lr\[1\]=-1.0\): lr must be a finite number > 0"),
        ({"models": 2, "betas": (0.9, 0.99)}, r"SGD has no hyperparameter 'betas'"),
        ({"models": 2, "seeds": -1}, r"seeds must be an integer in \[0, "),
        ({"seeds": [1, 2**64]}, r"seeds\[1\] must be an integer in \[0, 2\*\*64\)|seeds\[1\] must be an integer"),
        ({"models": 2, "shuffle_seed": -3}, r"shuffle_seed must be an integer"),
        ({"models": 2, "device": "tpu"}, r"device must be one of"),
        ({"models": 2, "device": "cpu", "engine": "gpu"}, r"engine='gpu' trains on the GPU but device='cpu'"),
        ({"models": 2, "batch_size": 0}, r"batch_size must be an integer >= 1, got 0"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs, match):
    kwargs = {"device": "cpu", **kwargs}
    with pytest.raises(ConfigError, match=match):
        MultiTrainer(MLP([4, 2]), SGD(lr=0.1), **kwargs)


def test_bad_fit_input_is_refused_before_any_work():
    x, y = _data(n=40, d=4)
    mt = MultiTrainer(MLP([4, 3]), SGD(lr=0.1), models=2, batch_size=8, device="cpu")
    before = mt.state_dicts()
    bad = [
        ({"masks": np.ones((3, 40), dtype=bool)}, DataError, r"masks must have shape \(models, rows\) = \(2, 40\), got "
                                                             r"\(3, 40\)"),
        ({"masks": np.ones((2, 40), dtype=np.int64)}, DataError, r"masks must be a boolean array .* got dtype int64"),
        ({"masks": np.stack([np.ones(40, bool), np.zeros(40, bool)])}, DataError, r"masks\[1\] selects no row"),
        ({"eval_masks": np.ones((2, 40), dtype=bool)}, ConfigError, r"eval_masks needs eval_data"),
        ({"early_stopping": True}, ConfigError, r"early_stopping=True needs validation data"),
        ({"epochs": -1}, ConfigError, r"epochs must be an integer >= 0, got -1"),
        ({"eval_data": (x, y, y)}, DataError, r"eval_data must be a pair"),
    ]
    for kwargs, error, match in bad:
        with pytest.raises(error, match=match):
            mt.fit(x, y, **kwargs)
    with pytest.raises(DataError, match="masks\\[0\\] gives model 0 3 rows, fewer than batch_size=8"):
        MultiTrainer(MLP([4, 3]), SGD(lr=0.1), models=2, batch_size=8, device="cpu", drop_last=True).fit(
            x, y, masks=np.stack([np.arange(40) < 3, np.ones(40, bool)]))
    with pytest.raises(DataError, match="x has 3 features per row but the model takes 4"):
        mt.fit(x[:, :3], y)
    with pytest.raises(ConfigError, match=r"k must be an integer in \[0, 2\), got 2"):
        mt.trainer(2)
    with pytest.raises(ConfigError, match="metric must be one of"):
        mt.best("loss")
    with pytest.raises(ConfigError, match="no model has a finite eval_loss"):
        mt.best("eval_loss")
    with pytest.raises(DataError, match="state_dicts must be a sequence of 2 state dicts, got 1"):
        mt.load_state_dicts(before[:1])
    _same_state(mt.state_dicts()[0], before[0])
    assert mt.epochs.tolist() == [0, 0] and not any(len(h) for h in mt.histories)


def test_constant_rate_tables_are_lr_tables():
    """Without a schedule, the rate tables are made directly: the tables schedules.lr_table makes."""
    from fastnn.schedules import bind, lr_table

    lrs = [0.1, 1e-7, 3.3e-3, 0.7]
    mt = MultiTrainer(MLP([4, 2]), SGD(lr=0.1), lr=lrs, device="cpu")
    tables = mt._lr_tables(np.array([True, True, False, True]), np.array([7, 5, 7, 6]))
    assert tables[2] is None
    for k, steps in ((0, 7), (1, 5), (3, 6)):
        np.testing.assert_array_equal(tables[k], lr_table(bind(None, lrs[k]), 0, steps))
        assert tables[k].dtype == np.float32


def test_set_lr_changes_one_models_rate_between_epochs():
    """set_lr(k, lr) from a fit callback: model k trains its next epochs at lr, as a separate fit whose schedule
    changes its rate there (SGD with momentum: its velocity comes along); the other models are unchanged."""
    x, y = _data()
    model = MLP([12, 8, 3])
    mt = MultiTrainer(model, SGD(lr=0.1, momentum=0.9), models=2, seeds=4, batch_size=16, device="cpu")

    def halve(k: int, record: dict) -> bool:
        if k == 1:
            mt.set_lr(1, mt.optimizers[1].lr / 2)
        return False

    mt.fit(x, y, epochs=3, callbacks=[halve])
    spe = 10  # 150 rows in batches of 16
    assert mt.optimizers[0].lr == 0.1 and mt.optimizers[1].lr == 0.1 / 8 and mt.trainer(1).optimizer.lr == 0.1 / 8
    ref = Trainer(model, SGD(lr=0.1, momentum=0.9), batch_size=16, device="cpu", seed=0,
                  schedule=lambda step: 0.1 / 2 ** (step // spe))  # fmt: skip
    ref.load_state_dict(init_parameters(model, 5))
    ref.fit(x, y, epochs=3, progress=False)
    _same_state(mt.state_dict(1), ref.state_dict())
    _same_state(mt.state_dict(0), _separate(model, SGD(lr=0.1, momentum=0.9), 4, x, y, epochs=3).state_dict())
    _same_state(mt.state_dict(1), mt.state_dicts()[1])


@pytest.mark.parametrize(
    "k, lr, match",
    [(2, 0.1, "k must be"), (-1, 0.1, "k must be"), (0, 0.0, "lr must be"), (0, float("nan"), "lr must be"),
     (0, 1e300, "lr must be"), (0, 1e-50, "lr must be"), (0, "0.1", "lr must be"), (0, True, "lr must be")],
)  # fmt: skip
def test_set_lr_refuses_bad_values_by_name(k, lr, match):
    mt = MultiTrainer(MLP([4, 3]), SGD(lr=0.1), models=2, batch_size=8, device="cpu")
    with pytest.raises(ConfigError, match=match):
        mt.set_lr(k, lr)
    assert [o.lr for o in mt.optimizers] == [0.1, 0.1]


def test_set_lr_is_refused_under_a_schedule():
    mt = MultiTrainer(MLP([4, 3]), SGD(lr=0.1), models=2, batch_size=8, device="cpu",
                      schedule=fastnn.schedules.Cosine(total_steps=100))  # fmt: skip
    with pytest.raises(ConfigError, match="schedule"):
        mt.set_lr(0, 0.05)
