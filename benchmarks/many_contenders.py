"""Many models at once: the contenders of benchmarks/bench_many.py, each training K models of one workload.

Every contender trains the same thing: model k starts from `fastnn._model.init_parameters(model, SEED + k)`, takes
SGD steps at its own learning rate with its own L2 penalty (`w -= lr_k * (g + wd_k * w)`, fastnn's SGD weight
decay), on the minibatches of one shared order (`fastnn._shuffle.permutation(SEED, epoch, n)`), uint8 images scaled
by 1/255 inside the step, the cross-entropy of the batch mean. Each `run_*` runs epoch 0 (warm-up: compilation,
capture) and epoch 1 (timed, wall clock after a device synchronization), then scores every model on the test set.

- fastnn: `fastnn.MultiTrainer` (engine="gpu" on a GPU; the NumPy engine on the CPU for the dry run), its default
  precision "mixed": fp32, layer 0's products on TF32 tensor cores (as JAX's default precision below);
- jax: `jax.vmap` over the parameters, learning rates and penalties, the minibatch shared (in_axes None), the epoch
  one `jax.jit` of a `lax.scan` over its steps (a short last batch one more step in the same function), default
  precision (no precision= argument: TF32 on Hopper);
- torch: `torch.func.stack_module_state` + `vmap(grad_and_value(...))` over the stacked parameters, the update in
  place, each step one CUDA graph replay (a second graph for a short last batch), the batch indices copied in.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import fastnn
from fastnn._model import init_parameters, param_names
from fastnn._shuffle import permutation

__all__ = ["SEED", "ManyWorkload", "Result", "hyperparameters", "run_fastnn", "run_jax", "run_torch"]

SEED = 0
SCALE = 1.0 / 255.0  # uint8 images as every contender scales them (fastnn._data.input_affine)


@dataclass(frozen=True)
class ManyWorkload:
    """One model shape, batch and training set size; the learning rates and penalties of K models span the ranges
    geometrically."""

    name: str
    sizes: tuple[int, ...]
    batch: int
    samples: int
    lr_range: tuple[float, float]
    wd_range: tuple[float, float] = (1e-5, 1e-3)

    @property
    def steps(self) -> int:
        return -(-self.samples // self.batch)


@dataclass
class Result:
    contender: str
    workload: str
    models: int
    epoch_s: float  #: the timed epoch, wall clock
    device_s: float | None  #: the timed epoch on the device (fastnn: its graph's events), where known
    best_accuracy: float  #: the best test accuracy of the K models
    best_model: int
    accuracies: list[float]
    steps: int  #: steps of the timed epoch
    profile: dict[str, float] | None = None  #: fastnn on a GPU with --profile: microseconds of each node of a step
    #: the same, each node timed inside a CUDA graph of 20 copies of it (device time, no launch from Python)
    profile_graphed: dict[str, float] | None = None

    @property
    def per_model_step_us(self) -> float:
        """Microseconds of the timed epoch per model and step."""
        return 1e6 * self.epoch_s / self.models / self.steps


def hyperparameters(workload: ManyWorkload, models: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(lr, weight decay, init seed) of each of K models: the same for every contender."""
    lrs = np.geomspace(*workload.lr_range, models) if models > 1 else np.array([np.sqrt(np.prod(workload.lr_range))])
    wds = np.geomspace(*workload.wd_range, models)[::-1].copy() if models > 1 else np.array([workload.wd_range[0]])
    return lrs.astype(np.float64), wds.astype(np.float64), [SEED + k for k in range(models)]


def _orders(n: int) -> list[np.ndarray]:
    return [permutation(SEED, epoch, n) for epoch in (0, 1)]


def _result(name: str, wl: ManyWorkload, models: int, seconds: float, device: float | None,
            accuracies: np.ndarray) -> Result:  # fmt: skip
    acc = [float(a) for a in accuracies]
    best = int(np.argmax(accuracies))
    return Result(name, wl.name, models, seconds, device, acc[best], best, acc, wl.steps)


# ---- fastnn ---------------------------------------------------------------------------------------------------


def run_fastnn(wl: ManyWorkload, models: int, data: tuple, device: str = "cuda", profile: bool = False,
               fold: bool = False, tuning: Any = None, name: str | None = None) -> tuple[Result, Any]:  # fmt: skip
    """fastnn.MultiTrainer; returns (result, the trainer) (its engine's phase profile in result when `profile`).
    fold: the GPU engine's opt-in fold_sgd (layer 0's SGD update folded into its weight-gradient GEMM); tuning: a
    fastnn.engine.Tuning (the GPU engine's kernel variants), reported as contender `name`."""
    x, y, x_test, y_test = data
    lrs, wds, seeds = hyperparameters(wl, models)
    mt = fastnn.MultiTrainer(fastnn.MLP(wl.sizes), fastnn.SGD(lr=float(lrs[0])), lr=lrs, weight_decay=wds,
                             seeds=seeds, shuffle_seed=SEED, batch_size=wl.batch, precision="mixed", device=device,
                             engine="gpu" if device == "cuda" else "numpy", tuning=tuning)  # fmt: skip
    if fold and device == "cuda":
        mt._engine.fold_sgd = True  # an engine switch, not yet an argument (fastnn/engine/many/gpu/engine.py)
    x, y = x[: wl.samples], y[: wl.samples]
    mt.fit(x, y, epochs=1)  # epoch 0: NVRTC, capture
    start = time.perf_counter()
    mt.fit(x, y, epochs=1)
    seconds = time.perf_counter() - start
    device_s = mt.histories[0][-1]["seconds"] if device == "cuda" else None
    acc = np.array([r["accuracy"] for r in mt.evaluate(x_test, y_test)])
    result = _result(name or ("fastnn-fold" if fold else "fastnn"), wl, models, seconds, device_s, acc)
    if profile and device == "cuda":
        result.profile = mt._engine.profile_step(step=1)  # the GPU engine's phases (fastnn/engine/many/gpu/profile.py)
        result.profile_graphed = mt._engine.profile_step(step=1, graphed=True)
    return result, mt


# ---- JAX --------------------------------------------------------------------------------------------------------


def run_jax(wl: ManyWorkload, models: int, data: tuple) -> tuple[Result, dict[str, np.ndarray]]:
    """JAX vmap; returns (result, the K models' final parameters as NumPy arrays keyed like state_dict)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # fastnn and torch share the GPU
    import jax
    import jax.numpy as jnp
    from jax import lax

    x, y, x_test, y_test = data
    n, b = wl.samples, wl.batch
    n_full, short = n // b, n % b
    lrs, wds, seeds = hyperparameters(wl, models)
    names = param_names(fastnn.MLP(wl.sizes))
    layers = list(zip(names[0::2], names[1::2]))
    inits = [init_parameters(fastnn.MLP(wl.sizes), s) for s in seeds]
    params = {k: jnp.asarray(np.stack([p[k] for p in inits])) for k in names}

    def forward(p: dict, xb: Any) -> Any:
        h = xb
        for i, (wn, bn) in enumerate(layers):
            if i:
                h = jax.nn.relu(h)
            h = h @ p[wn].T + p[bn]  # default precision
        return h

    def loss_fn(p: dict, xb: Any, yb: Any) -> Any:
        logp = jax.nn.log_softmax(forward(p, xb), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1))

    def step(p: dict, lr: Any, wd: Any, xb: Any, yb: Any) -> tuple:
        loss, g = jax.value_and_grad(loss_fn)(p, xb, yb)
        return jax.tree_util.tree_map(lambda w, gw: w - lr * (gw + wd * w), p, g), loss

    vstep = jax.vmap(step, in_axes=(0, 0, 0, None, None))

    @jax.jit
    def epoch(p: dict, lr: Any, wd: Any, xs: Any, ys: Any, order: Any) -> dict:
        def body(p: dict, idx: Any) -> tuple:
            return vstep(p, lr, wd, xs[idx].astype(jnp.float32) * SCALE, ys[idx])

        p, _ = lax.scan(body, p, order[: n_full * b].reshape(n_full, b))
        if short:
            p, _ = body(p, order[n_full * b :])
        return p

    predict = jax.jit(jax.vmap(lambda p, xt: jnp.argmax(forward(p, xt.astype(jnp.float32) * SCALE), axis=1),
                               in_axes=(0, None)))  # fmt: skip
    xs, ys = jax.device_put(np.ascontiguousarray(x[:n])), jax.device_put(np.asarray(y[:n], dtype=np.int32))
    lr, wd = jnp.asarray(lrs, jnp.float32), jnp.asarray(wds, jnp.float32)
    orders = [jax.device_put(o.astype(np.int32)) for o in _orders(n)]
    params = jax.block_until_ready(epoch(params, lr, wd, xs, ys, orders[0]))
    start = time.perf_counter()
    params = jax.block_until_ready(epoch(params, lr, wd, xs, ys, orders[1]))
    seconds = time.perf_counter() - start
    labels = np.asarray(predict(params, jax.device_put(np.ascontiguousarray(x_test))))
    acc = (labels == np.asarray(y_test)[None, :]).mean(axis=1)
    return _result("jax-vmap", wl, models, seconds, None, acc), {k: np.asarray(v) for k, v in params.items()}


# ---- torch.func -------------------------------------------------------------------------------------------------


def run_torch(wl: ManyWorkload, models: int, data: tuple, device: str = "cuda",
              graphs: bool = True) -> tuple[Result, dict[str, np.ndarray]]:  # fmt: skip
    """torch.func (stack_module_state + vmap), each step a CUDA graph replay (`graphs`; eager on the CPU)."""
    import torch
    from torch.func import functional_call, grad_and_value, stack_module_state, vmap

    x, y, x_test, y_test = data
    n, b = wl.samples, wl.batch
    n_full, short = n // b, n % b
    lrs, wds, seeds = hyperparameters(wl, models)
    dev = torch.device(device)
    graphs = graphs and dev.type == "cuda"

    def module() -> Any:
        layers: list[Any] = []
        for i, (fan_in, fan_out) in enumerate(zip(wl.sizes[:-1], wl.sizes[1:])):
            if i:
                layers.append(torch.nn.ReLU())
            layers.append(torch.nn.Linear(fan_in, fan_out))
        return torch.nn.Sequential(*layers)

    nets = []
    for s in seeds:
        m = module()
        m.load_state_dict({k: torch.from_numpy(v) for k, v in init_parameters(fastnn.MLP(wl.sizes), s).items()})
        nets.append(m.to(dev))
    stacked, _ = stack_module_state(nets)
    params = {k: v.detach().clone() for k, v in stacked.items()}
    base = module().to("meta")

    def loss_fn(p: dict, xb: Any, yb: Any) -> Any:
        return torch.nn.functional.cross_entropy(functional_call(base, p, (xb,)), yb)

    grads_of = vmap(grad_and_value(loss_fn), in_dims=(0, None, None))
    lr_t = torch.tensor(lrs, dtype=torch.float32, device=dev)
    wd_t = torch.tensor(wds, dtype=torch.float32, device=dev)
    views = {k: (lr_t.view(-1, *([1] * (v.dim() - 1))), wd_t.view(-1, *([1] * (v.dim() - 1))))
             for k, v in params.items()}  # fmt: skip
    xs = torch.from_numpy(np.ascontiguousarray(x[:n])).to(dev)
    ys = torch.from_numpy(np.asarray(y[:n], dtype=np.int64)).to(dev)

    def step(idx: Any) -> None:
        xb = xs[idx].to(torch.float32) * SCALE
        g, _ = grads_of(params, xb, ys[idx])
        with torch.no_grad():
            for k, v in params.items():
                lr_k, wd_k = views[k]
                v.sub_(lr_k * (g[k] + wd_k * v))

    sizes = [b] + ([short] if short else [])
    static = {m: torch.zeros(m, dtype=torch.int64, device=dev) for m in sizes}
    replay: dict[int, Any] = {}
    if graphs:
        saved = {k: v.clone() for k, v in params.items()}
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for m in sizes:
                for _ in range(3):  # warm-up before capture, as torch's CUDA graph notes ask
                    step(static[m])
        torch.cuda.current_stream().wait_stream(side)
        for m in sizes:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step(static[m])
            replay[m] = graph
        with torch.no_grad():
            for k, v in params.items():
                v.copy_(saved[k])

    def epoch(order: np.ndarray) -> None:
        o = torch.from_numpy(order).to(dev)
        for s in range(n_full + (1 if short else 0)):
            m = min(b, n - s * b)
            if graphs:
                static[m].copy_(o[s * b : s * b + m])
                replay[m].replay()
            else:
                step(o[s * b : s * b + m])

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    orders = _orders(n)
    epoch(orders[0])
    sync()
    start = time.perf_counter()
    epoch(orders[1])
    sync()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        xt = torch.from_numpy(np.ascontiguousarray(x_test)).to(dev).to(torch.float32) * SCALE
        logits = vmap(lambda p: functional_call(base, p, (xt,)))(params)
        labels = logits.argmax(dim=2).cpu().numpy()
    acc = (labels == np.asarray(y_test)[None, :]).mean(axis=1)
    name = "torch-func-graphs" if graphs else "torch-func"
    return _result(name, wl, models, seconds, None, acc), {k: v.cpu().numpy() for k, v in params.items()}
