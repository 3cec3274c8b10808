"""MultiTrainer's per-model stopping callbacks and its choice of GPU (`devices`): what fastnn.sklearn's searches
stand on (each model stops by scikit-learn's rule on its own; groups spread over a process's GPUs)."""

from __future__ import annotations

import numpy as np
import pytest

import fastnn
from fastnn import ConfigError


def data(n: int = 96, d: int = 6, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, d)).astype(np.float32), rng.integers(0, classes, n)


def multi(**kw) -> fastnn.MultiTrainer:
    args = {"lr": [0.1, 0.05, 0.02], "seeds": 3, "shuffle_seed": 7, "batch_size": 16, "device": "cpu", **kw}
    return fastnn.MultiTrainer(fastnn.MLP([6, 8, 3]), fastnn.SGD(momentum=0.9), **args)


def test_a_callback_stops_one_model_at_its_epoch():
    """Model 1 stopped after epoch 2 holds exactly the weights of a run of 2 epochs; the others train on."""
    x, y = data()
    seen = []

    def stop(k, record):
        seen.append((k, record["epoch"]))
        return k == 1 and record["epoch"] == 2

    with multi() as mt, multi() as two:
        mt.fit(x, y, epochs=4, callbacks=[stop])
        two.fit(x, y, epochs=2)
        assert list(mt.epochs) == [4, 2, 4] and [len(h) for h in mt.histories] == [4, 2, 4]
        assert seen.count((1, 2)) == 1 and (1, 3) not in seen and (0, 4) in seen and (2, 4) in seen
        for name, value in two.state_dicts()[1].items():
            np.testing.assert_array_equal(mt.state_dicts()[1][name], value, err_msg=name)
        assert not np.array_equal(mt.state_dicts()[0]["0.weight"], two.state_dicts()[0]["0.weight"])
        mt.fit(x, y, epochs=1)  # a stop is for that fit call: the next one trains model 1 again
        assert list(mt.epochs) == [5, 3, 5]


def test_every_callback_sees_every_epoch():
    x, y = data()
    calls = {"a": 0, "b": 0}

    def a(k, record):
        calls["a"] += 1
        return True

    def b(k, record):
        calls["b"] += 1

    with multi() as mt:
        mt.fit(x, y, epochs=3, callbacks=[a, b])
        assert calls == {"a": 3, "b": 3} and list(mt.epochs) == [1, 1, 1]


@pytest.mark.parametrize("bad", [3, "stop", [1], (lambda k, r: None, None)])
def test_bad_callbacks_are_refused_by_name(bad):
    x, y = data()
    with multi() as mt, pytest.raises(ConfigError, match="callbacks must be a list of callables"):
        mt.fit(x, y, epochs=1, callbacks=bad)
    assert list(mt.epochs) == [0, 0, 0]


def test_devices_names_one_gpu():
    with multi(devices=[0]) as mt:
        assert mt.device == "cpu"
    with pytest.raises(ConfigError, match="one GPU"):
        multi(devices=2, device="cuda")
    with pytest.raises(ConfigError, match="device='cpu'"):
        multi(devices=[1])
    with pytest.raises(ConfigError, match="devices must be"):
        multi(devices=[-1])


@pytest.mark.gpu
def test_the_second_gpu_trains_as_the_first():
    """devices=[1] trains on GPU 1 and gives what GPU 0 gives (needs two GPUs)."""
    from fastnn.cuda import driver

    if driver.device_count() < 2:
        pytest.skip("needs two GPUs")
    x, y = data()
    with multi(device="cuda") as a, multi(device="cuda", devices=[1]) as b:
        a.fit(x, y, epochs=2)
        b.fit(x, y, epochs=2)
        np.testing.assert_array_equal(a.forward(x), b.forward(x))
