"""Accuracy the NumPy engine must reach on Fashion-MNIST (skipped where the data files are absent)."""

from __future__ import annotations

import numpy as np
import pytest
from _data import fashion_mnist, where

from fastnn import MLP, SGD, Trainer


@pytest.fixture(scope="module")
def fashion() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    data = fashion_mnist()
    if data is None:
        pytest.skip(f"Fashion-MNIST not found in {where()} (apt: dataset-fashion-mnist)")
    return data


def test_fashion_data_shapes(fashion) -> None:
    x_train, y_train, x_test, y_test = fashion
    assert x_train.shape == (60000, 784) and x_train.dtype == np.uint8
    assert x_test.shape == (10000, 784) and set(np.unique(y_test)) == set(range(10))


def test_logistic_regression_reaches_0_82(fashion) -> None:
    x_train, y_train, x_test, y_test = fashion
    t = Trainer(MLP([784, 10]), SGD(lr=0.1), batch_size=128, device="cpu", seed=0)
    history = t.fit(x_train, y_train, epochs=5, eval_data=(x_test, y_test))
    assert history[-1]["eval_accuracy"] >= 0.82
    assert t.evaluate(x_test, y_test)["accuracy"] == history[-1]["eval_accuracy"]


def test_mlp_momentum_reaches_0_85(fashion) -> None:
    x_train, y_train, x_test, y_test = fashion
    t = Trainer(MLP([784, 128, 10]), SGD(lr=0.05, momentum=0.9), batch_size=128, device="cpu", seed=0)
    history = t.fit(x_train, y_train, epochs=5, eval_data=(x_test, y_test), eval_every=5)
    assert history["eval_accuracy"][:4] == [None] * 4
    assert history[-1]["eval_accuracy"] >= 0.85
    assert history[-1]["train_loss"] < history[0]["train_loss"]
