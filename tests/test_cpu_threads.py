"""The NumPy engine trains small networks with one BLAS thread (fastnn/engine/cpu_threads.py says why), leaves a
large step and the user's own thread count alone."""

from __future__ import annotations

import numpy as np
import pytest

import fastnn
from fastnn.engine import cpu_threads

threadpoolctl = pytest.importorskip("threadpoolctl")


def _blas_threads() -> list[int]:
    return [i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"]


def test_the_rule(monkeypatch):
    for name in cpu_threads.THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    assert cpu_threads.blas_threads(fastnn.MLP([784, 10]), 128) == 1
    assert cpu_threads.blas_threads(fastnn.MLP([784, 1024, 1024, 10]), 128) == 1  # 1.3e8 multiply-adds
    assert cpu_threads.blas_threads(fastnn.MLP([4096, 4096, 10]), 4096) is None  # 6.9e10: BLAS's own count
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_threads.blas_threads(fastnn.MLP([784, 10]), 128) is None  # the user chose


def test_a_small_fit_runs_with_one_blas_thread(monkeypatch):
    if not _blas_threads():
        pytest.skip("NumPy's BLAS is not one threadpoolctl knows")
    for name in cpu_threads.THREAD_ENV:
        monkeypatch.delenv(name, raising=False)
    rng = np.random.default_rng(0)
    x, y = rng.random((256, 20), dtype=np.float32), rng.integers(0, 3, 256)
    seen: list[list[int]] = []
    trainer = fastnn.Trainer(fastnn.MLP([20, 3]), fastnn.SGD(lr=0.1), batch_size=32, device="cpu", seed=0)
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):  # as BLAS's default on a 2-core machine
        trainer.fit(x, y, epochs=2, callbacks=[lambda record: seen.append(_blas_threads())])
        assert _blas_threads() == [2] * len(_blas_threads())  # given back after the fit
    assert seen == [[1] * len(seen[0])] * 2
