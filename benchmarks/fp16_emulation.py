"""How far "mixed" fp16 rounding alone moves a model from the NumPy engine: the NumPy engine with grid_fast.cu's
operand roundings (fp16 weights, activations and dZ as tensor-core operands; exact uint8 inputs; fp32 dlogits for
the head's gradients), against the plain fp32 NumPy engine, on the GPU tests' synthetic data. An experiment, not
product code: it patches numpy_engine's forward and backward.

    python benchmarks/fp16_emulation.py 256 adamw 32 653

Measured on the CPU (2026-11-25), relative error of 0.weight after 2 epochs: h=256 AdamW(1e-3, wd 0.01) batch 32
n 653: 0.137 (grid_fast.cu on an H100: 0.134); h=512 AdamW(1e-3) batch 16 n 197: 0.114 (H100: 0.103); h=256 SGD
0.05: 0.0008; momentum 0.9 at lr 0.01: 0.0011; AdamW(1e-4, wd 0.01): 0.006.
"""

from __future__ import annotations

import sys

import numpy as np

import fastnn.engine.numpy_engine as ne
from fastnn import MLP, SGD, AdamW, Trainer


def h16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def fwd_mixed(params, x, model):
    names = ne.param_names(model)
    cache = ne.Cache(inputs=[], preacts=[])
    a = x  # exact x * scale (the uint8 path)
    layers = len(model.layers)
    for i in range(layers):
        w, b = params[names[2 * i]], params[names[2 * i + 1]]
        cache.inputs.append(a)
        z = a @ h16(w).T + b
        if i == layers - 1:
            return z, cache
        cache.preacts.append(z)
        a = h16(np.maximum(z, 0))


def bwd_mixed(params, cache, dl, model):
    names = ne.param_names(model)
    g = {}
    last = len(model.layers) - 1
    g[names[2 * last]] = dl.T @ cache.inputs[last]  # the head's gradients from fp32 dlogits
    g[names[2 * last + 1]] = dl.sum(0)
    dz = h16((h16(dl) @ h16(params[names[2 * last]])) * (cache.inputs[last] > 0))
    for i in range(last - 1, -1, -1):
        g[names[2 * i]] = dz.T @ cache.inputs[i]
        g[names[2 * i + 1]] = dz.sum(0)
        if i == 0:
            break
        dz = h16((dz @ h16(params[names[2 * i]])) * (cache.inputs[i] > 0))
    return g


def data(n: int, d: int, classes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """tests/test_gpu_engines.py's _data (uint8)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, d))
    y = rng.integers(0, classes, size=n)
    x = centers[y] + rng.normal(scale=1.5, size=(n, d))
    return np.clip(x * 40 + 128, 0, 255).astype(np.uint8), y


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main() -> None:
    h, opt, batch, n = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    make = {
        "adamw": lambda: AdamW(lr=1e-3, weight_decay=0.01),
        "adamw0": lambda: AdamW(lr=1e-3),
        "adamw-small": lambda: AdamW(lr=1e-4, weight_decay=0.01),
        "mom": lambda: SGD(lr=0.01, momentum=0.9),
        "sgd": lambda: SGD(lr=0.05),
    }[opt]
    sizes = [784, h, h, h, 10]
    x, y = data(n, 784, 10, seed=h + batch)
    ref = Trainer(MLP(sizes), optimizer=make(), batch_size=batch, precision="fp32", device="cpu", seed=7)
    ref.fit(x, y, epochs=2, progress=False)
    ne.forward, ne.backward = fwd_mixed, bwd_mixed
    emu = Trainer(MLP(sizes), optimizer=make(), batch_size=batch, precision="fp32", device="cpu", seed=7)
    emu.fit(x, y, epochs=2, progress=False)
    a, r = emu.state_dict(), ref.state_dict()
    print(h, opt, batch, n, {k: round(rel(a[k], r[k]), 4) for k in r})


if __name__ == "__main__":
    main()
