"""The estimate behind the warning that a model trains slower on several GPUs than on one (engine/scaling.py),
checked against the three models measured on 2 x H200, and the warning itself through create_engine's checks."""

from __future__ import annotations

import warnings

import pytest

import fastnn
from fastnn.engine import select
from fastnn.engine.base import EngineConfig
from fastnn.engine.scaling import grad_bytes_of, one_gpu_is_faster


@pytest.mark.parametrize(
    "sizes, batch, measured_two_gpu_speedup",
    [
        ([784, 10], 128, 0.62),
        ([784, 128, 128, 128, 10], 32, 0.66),
        ([784, 4096, 4096, 4096, 10], 8192, 1.55),
    ],
)
def test_the_estimate_agrees_with_the_measured_two_gpu_runs(sizes, batch, measured_two_gpu_speedup):
    slower, saved, cost = one_gpu_is_faster(sizes, batch, 2, grad_bytes_of("mixed"))
    assert slower == (measured_two_gpu_speedup < 1), (saved, cost)
    assert saved > 0 and cost > 0


def test_more_gpus_save_more_and_fp32_gradients_cost_twice_the_bytes():
    sizes = [784, 1024, 1024, 10]
    _, saved2, cost2 = one_gpu_is_faster(sizes, 4096, 2, 2)
    _, saved4, _ = one_gpu_is_faster(sizes, 4096, 4, 2)
    _, _, cost32 = one_gpu_is_faster(sizes, 4096, 2, grad_bytes_of("fp32"))
    assert saved4 == pytest.approx(1.5 * saved2)
    assert cost32 > cost2 and grad_bytes_of("fp32") == 4 and grad_bytes_of("fp16") == 2


def _config(sizes, batch):
    return EngineConfig(model=fastnn.MLP(sizes), optimizer=fastnn.SGD(lr=0.1), batch_size=batch)


def test_a_small_model_on_two_gpus_warns_once_naming_the_alternative(monkeypatch):
    select._warned.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            select._warn_if_one_gpu_is_faster(_config([784, 10], 128), 2, 1)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1, messages
    assert "2 GPUs will likely train this model slower than one GPU" in messages[0]
    assert "MultiTrainer" in messages[0]


def test_a_wide_model_on_two_gpus_does_not_warn():
    select._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        select._warn_if_one_gpu_is_faster(_config([784, 4096, 4096, 4096, 10], 8192), 2, 1)
