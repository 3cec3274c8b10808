"""PyTorch's contenders: eager, torch.compile (max-autotune and default mode) and whole steps in CUDA graphs.

Each trains `torch.nn.Sequential(Linear, ReLU, ..., Linear)` loaded from `fastnn._model.init_parameters`, on
GPU-resident data (uint8 images converted in the step, as fastnn does), in fastnn's sample order (an index
tensor on the GPU), with plain SGD at the workload's rate: the same math step for step as fastnn.

AMP is fp16 autocast without a GradScaler: these models are small and their gradients stay far above fp16's
underflow, and fastnn's "mixed" does not scale the loss either; the final losses in the report show the effect.
fp32 matmuls follow the contender's `matmul_precision` (torch.set_float32_matmul_precision: "highest" no TF32,
"high" TF32), torch.compile its `compile_kwargs`: `workloads.settings` names both in the tables.
"""

from __future__ import annotations

import contextlib
import gc
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from workloads import FIRST_TIMED_EPOCH, SEED, Contender, Workload, compile_kwargs, epoch_orders, finite_or_none

import fastnn
from fastnn._data import input_affine
from fastnn._model import init_parameters

__all__ = ["build_model", "make_runner", "run_torch", "set_matmul_precision"]

Data = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
#: Side-stream steps before capturing, as PyTorch's CUDA-graph docs do (cuBLAS handles, allocator, autograd).
GRAPH_WARMUP_STEPS = 3


def build_model(sizes: tuple[int, ...], device: torch.device) -> nn.Sequential:
    """`Sequential(Linear, ReLU, ..., Linear)` holding fastnn's initial weights: the state_dict names match."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        if i:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(fan_in, fan_out))
    model = nn.Sequential(*layers)
    init = init_parameters(fastnn.MLP(sizes), SEED)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in init.items()})
    return model.to(device)


def _autocast(device: torch.device, amp: bool, cache_enabled: bool = True) -> contextlib.AbstractContextManager:
    if not amp:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.float16, cache_enabled=cache_enabled)


def _batch_loss(net: nn.Module, x: torch.Tensor, y: torch.Tensor, idx: torch.Tensor, job: _Job, cache: bool = True):
    """Mean cross-entropy of the rows `idx`: gather uint8 rows, scale as fastnn._data.input_affine says, forward."""
    xb = x.index_select(0, idx).to(torch.float32) * job.scale
    if job.shift:
        xb = xb + job.shift
    with _autocast(job.device, job.amp, cache):
        logits = net(xb)
    return F.cross_entropy(logits.float(), y.index_select(0, idx))


class _Job:
    """What every torch contender shares: the model, the data on the device, the initial weights."""

    def __init__(self, workload: Workload, data: Data, device: torch.device, amp: bool) -> None:
        x_train, y_train, x_test, y_test = data
        n = workload.samples
        self.workload, self.device, self.amp = workload, device, amp
        self.x = torch.from_numpy(np.ascontiguousarray(x_train[:n])).to(device)  # uint8 stays uint8
        self.y = torch.from_numpy(np.ascontiguousarray(y_train[:n], dtype=np.int64)).to(device)
        self.x_test = torch.from_numpy(np.ascontiguousarray(x_test)).to(device)
        self.y_test = torch.from_numpy(np.ascontiguousarray(y_test, dtype=np.int64)).to(device)
        self.scale, self.shift = input_affine(np.dtype(np.uint8), workload.normalize)
        self.model = build_model(workload.sizes, device)
        self.params = list(self.model.parameters())
        self.init = [p.detach().clone() for p in self.params]
        self.optimizers: list[torch.optim.Optimizer] = []
        b = workload.batch_size
        self.slices = [(s * b, s * b + m) for s, m in enumerate(workload.batch_sizes())]

    def reset(self) -> None:
        """The initial weights again, copied in place (captured graphs and compiled code keep the addresses)."""
        with torch.no_grad():
            for p, p0 in zip(self.params, self.init):
                p.copy_(p0)
            for opt in self.optimizers:  # AdamW's moments and step counts, zeroed in place
                for state in opt.state.values():
                    for v in state.values():
                        if isinstance(v, torch.Tensor):
                            v.zero_()

    def make_optimizer(self, capturable: bool = False) -> torch.optim.Optimizer:
        """The workload's optimizer over the model's parameters (SGD foreach, or AdamW as fastnn.AdamW)."""
        w = self.workload
        if w.optimizer == "adamw":
            o = w.fastnn_optimizer()
            opt = torch.optim.AdamW(self.params, lr=o.lr, betas=o.betas, eps=o.eps, weight_decay=o.weight_decay,
                                    foreach=True, capturable=capturable)  # fmt: skip
        else:
            opt = torch.optim.SGD(self.params, lr=w.lr)  # foreach on CUDA by default
        self.optimizers.append(opt)
        return opt

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """(mean loss, accuracy) on the test set, in the contender's precision."""
        x = self.x_test.to(torch.float32) * self.scale + self.shift
        with _autocast(self.device, self.amp):
            logits = self.model(x)
        loss = F.cross_entropy(logits.float(), self.y_test)
        acc = (logits.argmax(dim=1) == self.y_test).float().mean()
        return float(loss), float(acc)


class _Eager:
    """The loop everybody writes: zero_grad, forward, backward, optimizer.step(), one Python call per op."""

    def __init__(self, job: _Job) -> None:
        self.job = job
        self.opt = job.make_optimizer()
        self.setup_detail: dict[str, Any] = {"what": "building + one warm-up epoch (cuBLAS init, allocator)"}

    def loss(self, idx: torch.Tensor) -> torch.Tensor:
        return _batch_loss(self.job.model, self.job.x, self.job.y, idx, self.job)

    def step(self, idx: torch.Tensor) -> torch.Tensor:
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(idx)
        loss.backward()
        self.opt.step()
        return loss

    def run_epoch(self, order: torch.Tensor, losses: torch.Tensor) -> None:
        """Train one epoch in `order` (int64 on the device); each step's loss goes to `losses[s]` (no sync)."""
        for s, (a, b) in enumerate(self.job.slices):
            losses[s].copy_(self.step(order[a:b]).detach())

    def close(self) -> None:
        pass


class _Stepper(nn.Module):
    """The model plus the dataset as buffers: compiled code treats module tensors as static (no input copies)."""

    def __init__(self, job: _Job) -> None:
        super().__init__()
        self.job = job
        self.net = job.model
        self.register_buffer("x", job.x, persistent=False)
        self.register_buffer("y", job.y, persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return _batch_loss(self.net, self.x, self.y, idx, self.job)


class _Compiled(_Eager):
    """torch.compile(**kwargs) over gather + convert + forward + loss (workloads.compile_kwargs), with AMP.

    mode="max-autotune" tunes the GEMMs and replays forward and backward through CUDA graphs (cudagraph trees);
    the default mode fuses and launches kernels without graphs. The optimizer step stays eager (one foreach
    kernel for SGD). dynamic=False: the short last batch of an epoch gets its own specialised graph instead of
    turning every shape dynamic.
    """

    def __init__(self, job: _Job, kwargs: dict[str, Any]) -> None:
        super().__init__(job)
        self.compiled = torch.compile(_Stepper(job), **kwargs)
        self.setup_detail = {"what": f"torch.compile({kwargs}), its autotuning and graphs, inside one warm-up epoch"}

    def loss(self, idx: torch.Tensor) -> torch.Tensor:
        torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs are dead: reuse them
        return self.compiled(idx)

    def close(self) -> None:
        torch._dynamo.reset()  # drop compiled code and its cudagraph pools before the next contender


class _Graphed:
    """The strongest PyTorch: every step of an epoch (gather, forward, loss, backward, SGD update) in one CUDA graph.

    The graph reads its sample order from a static index buffer that is refilled before each replay, writes each
    step's loss to a static buffer, and updates the weights in place with one foreach kernel per step. Gradients
    come from autograd.grad (fresh tensors each step, recycled by the graph's memory pool), so nothing
    accumulates across the steps of one replay. Autocast's weight cache is off: the weights change every step.
    """

    def __init__(self, job: _Job) -> None:
        self.job = job
        w = job.workload
        self.lr = w.lr
        # AdamW runs torch.optim.AdamW(capturable=True) inside the graph; plain SGD is one foreach add per step
        self.opt = job.make_optimizer(capturable=True) if w.optimizer == "adamw" else None
        self.static_order = torch.zeros(w.samples, dtype=torch.int64, device=job.device)
        self.static_losses = torch.zeros(w.steps_per_epoch, dtype=torch.float32, device=job.device)
        t0 = time.perf_counter()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP_STEPS):
                self._step(self.static_order[: w.batch_size])
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            for s, (a, b) in enumerate(job.slices):
                self.static_losses[s].copy_(self._step(self.static_order[a:b]).detach())
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        self.setup_detail = {
            "what": "side-stream warm-up steps + capture of one epoch + one warm-up replay",
            "side_stream_warmup_seconds": t1 - t0,
            "capture_seconds": t2 - t1,
            "graph_steps": len(job.slices),
        }

    def _step(self, idx: torch.Tensor) -> torch.Tensor:
        loss = _batch_loss(self.job.model, self.job.x, self.job.y, idx, self.job, cache=False)
        grads = torch.autograd.grad(loss, self.job.params)
        if self.opt is not None:
            for p, g in zip(self.job.params, grads):
                p.grad = g
            self.opt.step()
            return loss
        with torch.no_grad():
            torch._foreach_add_(self.job.params, grads, alpha=-self.lr)
        return loss

    def run_epoch(self, order: torch.Tensor, losses: torch.Tensor) -> None:
        self.static_order.copy_(order)
        self.graph.replay()
        losses.copy_(self.static_losses)

    def close(self) -> None:
        self.graph.reset()


KINDS = {"eager": _Eager, "compile": _Compiled, "graph": _Graphed}


def make_runner(job: _Job, contender: Contender) -> _Eager | _Graphed:
    """The runner of `contender`'s kind over `job` (compile: with the contender's torch.compile arguments)."""
    if contender.kind == "compile":
        return _Compiled(job, compile_kwargs(contender))
    return KINDS[contender.kind](job)


def set_matmul_precision(contender: Contender) -> None:
    """fp32 matmuls as the contender says: "highest" (no TF32, like fastnn's fp32) or "high" (TF32)."""
    torch.set_float32_matmul_precision(contender.matmul_precision)


class _Clock:
    """Device events on CUDA (the GPU's own timeline), perf_counter on the CPU (tests)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def seconds(self, a: Any, b: Any) -> float:
        return a.elapsed_time(b) / 1000.0 if self.cuda else b - a


def run_torch(
    contender: Contender, workload: Workload, data: Data, device: str = "cuda", record_steps: bool = False
) -> dict[str, Any]:
    """Train `workload` with the torch `contender` by the shared protocol; returns the result row's numbers."""
    dev = torch.device(device)
    if contender.kind != "eager" and dev.type != "cuda":
        raise ValueError(f"{contender.name} needs a CUDA device, got {device!r}")
    set_matmul_precision(contender)
    clock = _Clock(dev)
    if clock.cuda:
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    w = workload
    spe = w.steps_per_epoch
    t0 = time.perf_counter()
    job = _Job(w, data, dev, amp=contender.precision == "amp")
    runner = make_runner(job, contender)
    try:
        clock.sync()
        t_built = time.perf_counter()
        warm_order = torch.from_numpy(epoch_orders(w, 0, 1)[0]).to(dev)
        warm_losses = torch.zeros(spe, dtype=torch.float32, device=dev)
        runner.run_epoch(warm_order, warm_losses)
        clock.sync()
        t_warm = time.perf_counter()
        setup = t_warm - t0
        detail = dict(runner.setup_detail, build_seconds=t_built - t0, warmup_epoch_seconds=t_warm - t_built)
        job.reset()
        orders = torch.from_numpy(epoch_orders(w, FIRST_TIMED_EPOCH, w.epochs)).to(dev)
        losses = torch.zeros(w.epochs * spe, dtype=torch.float32, device=dev)
        clock.sync()
        t1 = time.perf_counter()
        marks = [clock.mark()]
        for e in range(w.epochs):
            runner.run_epoch(orders[e], losses[e * spe : (e + 1) * spe])
            marks.append(clock.mark())
        clock.sync()
        wall = time.perf_counter() - t1
        test_loss, test_acc = job.evaluate()
        step_losses = losses.cpu().numpy().astype(np.float64)
    finally:
        runner.close()
    peak = torch.cuda.max_memory_allocated() if clock.cuda else None
    epoch_seconds = [clock.seconds(a, b) for a, b in zip(marks[:-1], marks[1:])]
    sizes = np.array(w.batch_sizes(), dtype=np.float64)
    epoch_losses = (step_losses.reshape(w.epochs, spe) * sizes).sum(axis=1) / w.samples
    row: dict[str, Any] = {
        "train_seconds": clock.seconds(marks[0], marks[-1]),
        "wall_seconds": wall,
        "device_seconds": clock.seconds(marks[0], marks[-1]),
        "timing": "CUDA events on the stream around the timed epochs" if clock.cuda else "perf_counter (CPU)",
        "epoch_seconds": epoch_seconds,
        "setup_seconds": setup,
        "setup_detail": detail,
        "epoch_losses": [float(v) for v in epoch_losses],
        "final_train_loss": finite_or_none(float(epoch_losses[-1])),
        "test_loss": finite_or_none(test_loss),
        "test_accuracy": finite_or_none(test_acc),
        "peak_memory_bytes": peak,
        "memory_note": "torch.cuda.max_memory_allocated (includes the dataset on the device)" if clock.cuda else "n/a",
    }
    if record_steps:
        row["step_losses"] = [float(f"{v:.6g}") for v in step_losses]
    del job, runner
    if clock.cuda:
        gc.collect()
        torch.cuda.empty_cache()
    return row
