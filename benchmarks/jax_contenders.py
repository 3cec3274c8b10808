"""JAX's contenders: each epoch one `jax.jit` of a `lax.scan` over its steps, data resident on the device.

The parameters are a pytree keyed like fastnn's `state_dict()` ("0.weight" (out, in), "0.bias", ...), loaded from
`fastnn._model.init_parameters`; each epoch's sample order is `fastnn._shuffle.permutation` passed in as an index
array; uint8 images are gathered and scaled (`fastnn._data.input_affine`) inside each step, as fastnn does; SGD or
AdamW with torch's (and fastnn's) update rule. "amp" casts the matmul operands to fp16 and accumulates in fp32
(`preferred_element_type`), keeping fp32 master weights; fp32 dots take the contender's `matmul_precision`
("highest": Precision.HIGHEST, no TF32; "default": no precision argument, JAX's default, TF32 on Hopper). An
epoch whose last batch is short (logreg) runs that step after the scan, inside the same jitted function.

XLA_FLAGS must be set before jax initialises, so every JAX configuration runs in a subprocess of its own:

    python benchmarks/jax_contenders.py --contender jax-fp32 --workloads logreg,mlp-128 --out rows.json [--quick]

`run_subprocess` (used by bench_mnist.py) does that with the contender's flags and reads the rows back.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

if importlib.util.find_spec("fastnn") is None:  # run from a checkout without `pip install -e .`
    sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
from workloads import (  # noqa: E402
    CONTENDERS,
    FIRST_TIMED_EPOCH,
    JAX_DOT_PRECISION,
    SEED,
    Contender,
    Workload,
    build_workloads,
    epoch_orders,
    finite_or_none,
    load_data,
)

import fastnn  # noqa: E402
from fastnn._data import input_affine  # noqa: E402
from fastnn._model import init_parameters, param_names  # noqa: E402

__all__ = ["Job", "dot_precision", "jax_environment", "make_epoch", "run_jax", "run_subprocess", "subprocess_env"]

Data = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def subprocess_env(contender: Contender, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a JAX subprocess: the contender's XLA_FLAGS, no memory preallocation (fastnn and torch
    share the GPU in the parent), and this checkout on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    env["XLA_FLAGS"] = contender.xla_flags
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    repo = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    return env


def jax_environment() -> dict[str, Any]:
    """JAX's version, backend and device for bench.json."""
    import jax

    dev = jax.devices()[0]
    return {
        "jax": jax.__version__,
        "jaxlib": _pkg_version("jaxlib"),
        "jax_backend": jax.default_backend(),
        "jax_device": getattr(dev, "device_kind", str(dev)),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def _pkg_version(name: str) -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "n/a"


def _layers(sizes: tuple[int, ...]) -> list[tuple[str, str]]:
    names = param_names(fastnn.MLP(sizes))
    return list(zip(names[0::2], names[1::2]))


def dot_precision(matmul_precision: str) -> Any:
    """`lax.dot_general`'s precision= for an fp32 contender's `matmul_precision` (None: JAX's default)."""
    from jax import lax

    if matmul_precision not in JAX_DOT_PRECISION:
        raise ValueError(f"matmul_precision must be one of {sorted(JAX_DOT_PRECISION)}, got {matmul_precision!r}")
    name = JAX_DOT_PRECISION[matmul_precision]
    return None if name is None else getattr(lax.Precision, name)


def make_epoch(
    workload: Workload, optimizer: Any, amp: bool, scale: float, shift: float, matmul_precision: str = "highest"
) -> Any:
    """The jitted epoch: (state, x, y, order) -> (state, step losses); state = (params, opt state, step count).

    One `lax.scan` over the full batches; a short last batch (logreg) is one more step after the scan.
    `optimizer` is a `fastnn.SGD` (plain: no momentum or weight decay) or `fastnn.AdamW`; fp32 dots take
    `dot_precision(matmul_precision)`.
    """
    import jax
    import jax.numpy as jnp
    from jax import lax

    layers = _layers(workload.sizes)
    b = workload.batch_size
    n_full = workload.samples // b
    short = workload.samples - n_full * b
    lr = float(optimizer.lr)
    adamw = isinstance(optimizer, fastnn.AdamW)
    if not adamw and (optimizer.momentum or optimizer.weight_decay):
        raise ValueError("the JAX contender implements plain SGD and AdamW only")
    precision = dot_precision(matmul_precision)  # HIGHEST: fp32 as fastnn's fp32; None: JAX's default (TF32)

    def forward(params: dict, xb: Any) -> Any:
        h = xb
        for i, (wn, bn) in enumerate(layers):
            if i:
                h = jax.nn.relu(h)
            w = params[wn]
            if amp:  # fp16 operands, fp32 accumulation; the fp32 master weights are cast in the step
                h = lax.dot_general(h.astype(jnp.float16), w.astype(jnp.float16), (((1,), (1,)), ((), ())),
                                    preferred_element_type=jnp.float32)  # fmt: skip
            else:
                h = lax.dot_general(h, w, (((1,), (1,)), ((), ())), precision=precision)
            h = h + params[bn]
        return h

    def loss_fn(params: dict, xb: Any, yb: Any) -> Any:
        logits = forward(params, xb)
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, yb[:, None], axis=1))

    def update(state: tuple, grads: dict) -> tuple:
        params, opt, t = state
        t = t + 1
        if not adamw:
            return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads), opt, t
        b1, b2 = optimizer.betas
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1.0 - b1) * g, opt[0], grads)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1.0 - b2) * g * g, opt[1], grads)
        tf = t.astype(jnp.float32)
        c1, c2 = 1.0 - b1**tf, 1.0 - b2**tf

        def step(p: Any, m: Any, v: Any) -> Any:  # torch.optim.AdamW / fastnn._optim.adamw_step
            p = p * (1.0 - lr * optimizer.weight_decay)
            return p - (lr / c1) * m / (jnp.sqrt(v / c2) + optimizer.eps)

        return jax.tree_util.tree_map(step, params, m, v), (m, v), t

    def train_step(state: tuple, idx: Any, x: Any, y: Any) -> tuple:
        xb = x[idx].astype(jnp.float32) * scale
        if shift:
            xb = xb + shift
        loss, grads = jax.value_and_grad(loss_fn)(state[0], xb, y[idx])
        return update(state, grads), loss

    @jax.jit
    def epoch(state: tuple, x: Any, y: Any, order: Any) -> tuple:
        idx = order[: n_full * b].reshape(n_full, b)
        state, losses = lax.scan(lambda s, i: train_step(s, i, x, y), state, idx)
        if short:
            state, last = train_step(state, order[n_full * b :], x, y)
            losses = jnp.concatenate([losses, last[None]])
        return state, losses

    return epoch


class Job:
    """What one JAX run holds: the data and test set on the device, the initial state, the compiled epoch."""

    def __init__(
        self, workload: Workload, data: Data, amp: bool, optimizer: Any = None, matmul_precision: str = "highest"
    ) -> None:
        import jax
        import jax.numpy as jnp

        x_train, y_train, x_test, y_test = data
        n = workload.samples
        self.workload, self.amp = workload, amp
        self.optimizer = optimizer if optimizer is not None else workload.fastnn_optimizer()
        self.x = jax.device_put(np.ascontiguousarray(x_train[:n]))  # uint8 stays uint8
        self.y = jax.device_put(np.ascontiguousarray(y_train[:n], dtype=np.int32))
        self.x_test = jax.device_put(np.ascontiguousarray(x_test))
        self.y_test = jax.device_put(np.ascontiguousarray(y_test, dtype=np.int32))
        self.scale, self.shift = input_affine(np.dtype(np.uint8), workload.normalize)
        params = {k: jnp.asarray(v) for k, v in init_parameters(fastnn.MLP(workload.sizes), SEED).items()}
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        opt = (zeros, zeros) if isinstance(self.optimizer, fastnn.AdamW) else ()
        self.init = (params, opt, jnp.zeros((), jnp.int32))
        self.epoch_fn = make_epoch(workload, self.optimizer, amp, self.scale, self.shift, matmul_precision)
        layers = _layers(workload.sizes)

        @jax.jit
        def evaluate(params: dict, x: Any, y: Any) -> tuple:
            from jax import lax

            h = x.astype(jnp.float32) * self.scale + self.shift
            for i, (wn, bn) in enumerate(layers):
                if i:
                    h = jax.nn.relu(h)
                h = lax.dot_general(h, params[wn], (((1,), (1,)), ((), ())), precision=lax.Precision.HIGHEST)
                h = h + params[bn]
            logp = jax.nn.log_softmax(h, axis=-1)
            loss = -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))
            return loss, jnp.mean((jnp.argmax(h, axis=1) == y).astype(jnp.float32))

        self._evaluate = evaluate

    def order(self, epoch: int) -> Any:
        """fastnn's sample order of `epoch` as an int32 array on the device."""
        import jax

        return jax.device_put(epoch_orders(self.workload, epoch, 1)[0].astype(np.int32))

    def compile(self) -> float:
        """Ahead-of-time compile the epoch (the first call would do it anyway); returns the seconds it took."""
        t0 = time.perf_counter()
        self.epoch_fn = self.epoch_fn.lower(self.init, self.x, self.y, self.order(0)).compile()
        return time.perf_counter() - t0

    def evaluate(self, params: dict) -> tuple[float, float]:
        """(mean loss, accuracy) on the test set, fp32."""
        loss, acc = self._evaluate(params, self.x_test, self.y_test)
        return float(loss), float(acc)


def run_jax(contender: Contender, workload: Workload, data: Data) -> dict[str, Any]:
    """Train `workload` with the JAX `contender` by the shared protocol; returns the result row's numbers."""
    import jax

    w = workload
    t0 = time.perf_counter()
    job = Job(w, data, amp=contender.precision == "amp", matmul_precision=contender.matmul_precision)
    compile_s = job.compile()
    t_compiled = time.perf_counter()
    state, losses = job.epoch_fn(job.init, job.x, job.y, job.order(0))  # warm-up epoch: first launch, autotuned
    jax.block_until_ready((state, losses))
    setup = time.perf_counter() - t0
    orders = [job.order(FIRST_TIMED_EPOCH + e) for e in range(w.epochs)]
    jax.block_until_ready(orders)
    state = job.init
    marks = [time.perf_counter()]
    step_losses = []
    for e in range(w.epochs):
        state, losses = job.epoch_fn(state, job.x, job.y, orders[e])
        jax.block_until_ready(state)
        marks.append(time.perf_counter())
        step_losses.append(losses)
    test_loss, test_acc = job.evaluate(state[0])
    steps = np.concatenate([np.asarray(v, dtype=np.float64) for v in step_losses])
    sizes = np.array(w.batch_sizes(), dtype=np.float64)
    epoch_losses = (steps.reshape(w.epochs, w.steps_per_epoch) * sizes).sum(axis=1) / w.samples
    epoch_seconds = [b - a for a, b in zip(marks[:-1], marks[1:])]
    return {
        "train_seconds": marks[-1] - marks[0],
        "wall_seconds": marks[-1] - marks[0],
        "device_seconds": float(sum(epoch_seconds)),
        "timing": "perf_counter around each epoch with jax.block_until_ready (warm-up epoch excluded)",
        "epoch_seconds": epoch_seconds,
        "setup_seconds": setup,
        "setup_detail": {
            "what": "device_put of the data + jit lower/compile of the epoch + one warm-up epoch",
            "compile_seconds": compile_s,
            "warmup_epoch_seconds": setup - (t_compiled - t0),
        },
        "epoch_losses": [float(v) for v in epoch_losses],
        "final_train_loss": finite_or_none(float(epoch_losses[-1])),
        "test_loss": finite_or_none(test_loss),
        "test_accuracy": finite_or_none(test_acc),
        "peak_memory_bytes": _peak_memory(),
        "memory_note": "jax device memory_stats peak_bytes_in_use (includes the dataset)",
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def _peak_memory() -> int | None:
    import jax

    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:  # the CPU backend has none
        return None
    return stats.get("peak_bytes_in_use")


def run_subprocess(
    contender: Contender, workloads: list[Workload], data_dir: str | None, quick: bool, timeout_s: float = 600.0
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run `contender` on `workloads` in a fresh process with its XLA_FLAGS; returns (rows by workload, jax env).

    A subprocess that dies or times out gives every workload it did not finish an error row.
    """
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fastnn-jax-") as tmp:
        out = Path(tmp) / "rows.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--contender", contender.name,
               "--workloads", ",".join(w.name for w in workloads), "--out", str(out)]  # fmt: skip
        if data_dir:
            cmd += ["--data", data_dir]
        if quick:
            cmd.append("--quick")
        try:
            res = subprocess.run(cmd, env=subprocess_env(contender), capture_output=True, text=True, timeout=timeout_s)
            tail = (res.stdout + res.stderr)[-2000:]
            why = f"subprocess exit {res.returncode}: {tail}"
        except subprocess.TimeoutExpired:
            why = f"subprocess timed out after {timeout_s:.0f} s"
        sys.stdout.write(f"  [{contender.name}] {why[:2000] if not out.exists() else 'done'}\n")
        doc = json.loads(out.read_text()) if out.exists() else {"rows": {}, "environment": {}}
    rows = [doc["rows"].get(w.name, {"status": "error", "error": why[-500:]}) for w in workloads]
    return rows, doc["environment"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="one JAX configuration on some workloads (a bench_mnist subprocess)")
    p.add_argument("--contender", required=True)
    p.add_argument("--workloads", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--data")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--cpu", action="store_true", help="tests: run on the CPU on tiny fake data")
    args = p.parse_args(argv)
    contender = next(c for c in CONTENDERS if c.name == args.contender)
    wanted = args.workloads.split(",")
    plan = [w for w in build_workloads(args.quick) if w.name in wanted]
    if args.cpu:
        os.environ["JAX_PLATFORMS"] = "cpu"
        plan = [_tiny(w) for w in plan]
        data = _fake_data(max(w.samples for w in plan))
    else:
        data = load_data(args.data)
    doc: dict[str, Any] = {"environment": jax_environment(), "rows": {}}
    for w in plan:
        try:
            row = run_jax(contender, w, data)
            row["status"] = "ok"
        except Exception as e:  # one workload failing keeps the others
            traceback.print_exc()
            row = {"status": "error", "error": f"{type(e).__name__}: {e}"}
        doc["rows"][w.name] = row
        print(f"{contender.name} {w.name}: {row.get('train_seconds', row.get('error'))}", flush=True)
        Path(args.out).write_text(json.dumps(doc))
    return 0


def _tiny(w: Workload) -> Workload:
    """A CPU-sized copy of `w` (tests): a few batches, small hidden layers, the short last batch kept for logreg."""
    sizes = (w.sizes[0], *(min(s, 16) for s in w.sizes[1:-1]), w.sizes[-1])
    samples = 3 * w.batch_size + (5 if w.samples % w.batch_size else 0)
    return dataclasses.replace(w, sizes=sizes, samples=samples, epochs=min(w.epochs, 2))


def _fake_data(n: int) -> Data:
    rng = np.random.default_rng(SEED)
    return (rng.integers(0, 256, (n, 784), dtype=np.uint8), rng.integers(0, 10, n),
            rng.integers(0, 256, (50, 784), dtype=np.uint8), rng.integers(0, 10, 50))  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
