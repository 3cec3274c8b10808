"""Where the training set lives on the GPU: the decision (CPU) and host-placed training (GPU, marked gpu)."""

from __future__ import annotations

import numpy as np
import pytest

import fastnn
from fastnn import MLP, SGD, AdamW, ConfigError, DataError, Trainer
from fastnn.engine.placement import DEVICE_FRACTION, check_placement, choose_placement


@pytest.mark.parametrize("bad", ["gpu0", None, 1, "HOST"])
def test_bad_placement_is_named(bad):
    with pytest.raises(ConfigError, match=r"data_placement must be one of \('auto', 'device', 'host'\)"):
        Trainer(MLP([4, 3]), device="cpu", data_placement=bad)


def test_cpu_takes_auto_only():
    assert check_placement("cpu", "auto") == "auto"
    with pytest.raises(ConfigError, match="data_placement='host' places data for a GPU engine, but device='cpu'"):
        Trainer(MLP([4, 3]), device="cpu", data_placement="host")


def test_choice():
    free = 10_000
    assert choose_placement("auto", int(DEVICE_FRACTION * free), free) == "device"
    assert choose_placement("auto", int(DEVICE_FRACTION * free) + 1, free) == "host"
    assert choose_placement("host", 1, free) == "host"
    assert choose_placement("device", free, free) == "device"
    with pytest.raises(DataError, match="data_placement='device': the training set takes 10,001 bytes"):
        choose_placement("device", free + 1, free)


def _data(n=300, d=20, c=4, dtype=np.uint8):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(n, d)).astype(np.uint8)
    return (x if dtype == np.uint8 else (x / 255).astype(np.float32)), rng.integers(0, c, size=n)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.uint8, np.float32], ids=["uint8", "float32"])
@pytest.mark.parametrize("opt", [SGD(lr=0.1, momentum=0.9), AdamW(lr=1e-3)], ids=["sgd", "adamw"])
def test_host_placed_training_equals_device_placed(dtype, opt, one_gemm_algorithm):
    x, y = _data(dtype=dtype)
    runs = {}
    for placement in ("device", "host"):
        with Trainer(MLP([20, 16, 4]), opt, batch_size=32, device="cuda", engine="graph", seed=3,
                     data_placement=placement, tuning=one_gemm_algorithm) as t:  # fmt: skip
            h = t.fit(x, y, epochs=3, eval_data=(x, y), progress=False)
            assert t._engine.train_context.placement == placement
            runs[placement] = (t.state_dict(), [r["train_loss"] for r in h], t.predict_proba(x))
            x2 = x.copy()
            x2[:10] = 0  # a new array of the same shape goes into the same host buffer
            t.fit(x2, y, epochs=1, progress=False)
            runs[placement] += (t.state_dict(),)
    d, h = runs["device"], runs["host"]
    for k in d[0]:
        np.testing.assert_array_equal(h[0][k], d[0][k], err_msg=k)
        np.testing.assert_array_equal(h[3][k], d[3][k], err_msg=k)
    assert h[1] == d[1]
    np.testing.assert_array_equal(h[2], d[2])


@pytest.mark.gpu
def test_fused_engine_refuses_host_placement_and_auto_takes_the_graph_engine():
    with pytest.raises(fastnn.ConfigError, match="data_placement='host' needs engine='graph'"):
        Trainer(MLP([784, 10]), device="cuda", engine="fused", data_placement="host")
    with Trainer(MLP([784, 10]), device="cuda", data_placement="host") as t:
        assert t.engine == "graph"
