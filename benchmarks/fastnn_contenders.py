"""fastnn's contenders: the GPU engine in each precision, and the NumPy engine on the CPU (logreg only).

Timing follows issue 3: the trainer's `fit` is timed with a device synchronize + perf_counter around it,
and History's per-epoch device times ('seconds', CUDA events inside the engine) are recorded beside it.
"""

from __future__ import annotations

import inspect
import sys
import time
from typing import Any

import numpy as np
from workloads import FIRST_TIMED_EPOCH, SEED, Contender, Workload, finite_or_none

import fastnn
from fastnn._model import init_parameters

__all__ = ["Unavailable", "device_sync", "engine_kwargs", "free_memory", "make_trainer", "rewind", "run_fastnn"]

Data = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


class Unavailable(Exception):
    """A contender this fastnn or this device cannot run (reported as unavailable, never as a time)."""


def engine_kwargs(contender: Contender, device: str) -> dict[str, str]:
    """Trainer's `engine=` for `contender`; Unavailable where this Trainer has no engine parameter or no GPU."""
    if contender.engine == "auto":
        return {}
    if "engine" not in inspect.signature(fastnn.Trainer).parameters:
        raise Unavailable(f"this fastnn's Trainer has no engine parameter (engine={contender.engine!r} needs it)")
    if device != "cuda":
        raise Unavailable(f"engine={contender.engine!r} runs on a GPU only")
    return {"engine": contender.engine}


def device_sync() -> None:
    """Wait for all GPU work of this process: fastnn's context, and torch's if torch is in use."""
    from fastnn.cuda import driver

    driver.get_device(0).synchronize()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def free_memory() -> int:
    """Free device memory in bytes (cuMemGetInfo), after returning torch's cached blocks to the driver."""
    from fastnn.cuda import driver

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    return driver.get_device(0).mem_info()[0]


def make_trainer(contender: Contender, workload: Workload, device: str | None = None,
                 check_init: bool = True) -> fastnn.Trainer:  # fmt: skip
    """The trainer of `contender` for `workload`, checked to start from `init_parameters(model, SEED)`.

    `device` overrides the contender's ("cuda" for fastnn, "cpu" for numpy): the dry run builds all on the CPU.
    `check_init=False` skips the check, which draws the weights a second time and downloads the trainer's: the
    end-to-end clock (end_to_end.py) is the user's set-up, not the harness's (MLP 784-8192x3-10: 141M values
    drawn again, 0.56 GB read back); the speed benchmark checks the same construction.

    Raises:
        Unavailable: the contender's engine does not exist in this fastnn, needs a GPU, or refuses the model.
    """
    model = fastnn.MLP(workload.sizes, activation="relu")
    device = device or ("cpu" if contender.family == "numpy" else "cuda")
    try:
        trainer = fastnn.Trainer(
            model,
            optimizer=workload.fastnn_optimizer(),
            batch_size=workload.batch_size,
            precision=contender.precision,
            device=device,
            seed=SEED,
            normalize=workload.normalize,
            **engine_kwargs(contender, device),
        )
    except fastnn.ConfigError as e:  # engine="fused" refuses a model it cannot hold (EngineRefused)
        if contender.engine == "auto":
            raise
        raise Unavailable(f"{type(e).__name__}: {e}") from e
    if not check_init:
        return trainer
    init = init_parameters(model, SEED)
    if contender.precision == "fp16" and device == "cuda":  # fp16 mode stores the weights in fp16
        init = {k: v.astype(np.float16).astype(np.float32) for k, v in init.items()}
    start = trainer.state_dict()
    if any(not np.array_equal(start[k], init[k]) for k in init):
        trainer.close()
        raise RuntimeError(
            f"{contender.name}: the trainer's initial weights differ from init_parameters(model, {SEED})"
        )
    return trainer


def rewind(trainer: fastnn.Trainer, init: dict[str, np.ndarray], steps_per_epoch: int) -> None:
    """Back to the initial weights, with the counters at the first timed epoch (the shuffle is keyed by them)."""
    trainer.load_state_dict(init)
    trainer.epoch = FIRST_TIMED_EPOCH
    trainer.step = FIRST_TIMED_EPOCH * steps_per_epoch


def _graph_id(trainer: fastnn.Trainer) -> int | None:
    """Identity of the engine's captured epoch graph (diagnostic only: tells whether the timed fit re-captured)."""
    ctx = getattr(getattr(trainer, "_engine", None), "_train", None)
    graph = getattr(ctx, "graph", None)
    return None if graph is None else id(graph)


def run_fastnn(contender: Contender, workload: Workload, data: Data, cpu_budget_s: float = 60.0) -> dict[str, Any]:
    """Train `workload` with `contender` by the shared protocol; returns the result row (see bench_mnist.py)."""
    if contender.family == "numpy":
        return _run_numpy(contender, workload, data, cpu_budget_s)
    x_train, y_train, x_test, y_test = data
    x, y = x_train[: workload.samples], y_train[: workload.samples]
    init = init_parameters(fastnn.MLP(workload.sizes), SEED)
    free = [free_memory()]
    t0 = time.perf_counter()
    trainer = make_trainer(contender, workload)
    try:
        free.append(free_memory())
        # Warm-up: NVRTC, plans, autotuning, capture. As many epochs as the timed fit, so the engine sizes its
        # per-epoch tables for it and the timed fit replays the same graph instead of capturing again.
        warm = trainer.fit(x, y, epochs=workload.epochs, progress=False)
        device_sync()
        setup = time.perf_counter() - t0
        free.append(free_memory())
        graph_before = _graph_id(trainer)
        rewind(trainer, init, workload.steps_per_epoch)
        device_sync()
        t1 = time.perf_counter()
        hist = trainer.fit(x, y, epochs=workload.epochs, progress=False)
        device_sync()
        wall = time.perf_counter() - t1
        free.append(free_memory())
        graph_after = _graph_id(trainer)
        ev = trainer.evaluate(x_test, y_test)
        free.append(free_memory())
        engine = getattr(trainer, "engine", "graph")  # before Trainer(engine=...) there was only the graph engine
    finally:
        trainer.close()
    epoch_seconds = [float(s) for s in hist["seconds"]]
    return {
        "train_seconds": wall,
        "wall_seconds": wall,
        "device_seconds": float(sum(epoch_seconds)),
        "timing": "fit() wall clock with device synchronize + perf_counter; device_seconds: History 'seconds' sum",
        "epoch_seconds": epoch_seconds,
        "setup_seconds": setup,
        "setup_detail": {
            "what": f"Trainer construction + a warm-up fit of {workload.epochs} epochs (NVRTC, plans, capture)",
            "warmup_epoch_seconds": [float(s) for s in warm["seconds"]],
        },
        "graph_recaptured": None if graph_before is None else graph_before != graph_after,
        "engine": engine,
        "epoch_losses": [float(v) for v in hist["train_loss"]],
        "final_train_loss": finite_or_none(hist[-1]["train_loss"]),
        "final_train_accuracy": finite_or_none(hist[-1]["train_accuracy"]),
        "test_loss": finite_or_none(ev["loss"]),
        "test_accuracy": finite_or_none(ev["accuracy"]),
        "peak_memory_bytes": free[0] - min(free),
        "memory_note": "cuMemGetInfo: free before the trainer minus the least free sampled after construction, "
        "warm-up, timed fit and evaluate (includes the dataset, cuBLASLt workspace, kernels, graphs)",
    }


def _run_numpy(contender: Contender, workload: Workload, data: Data, budget_s: float) -> dict[str, Any]:
    """The NumPy engine, one epoch per fit until the workload or `budget_s` is done; time scaled to the workload."""
    x_train, y_train, x_test, y_test = data
    x, y = x_train[: workload.samples], y_train[: workload.samples]
    init = init_parameters(fastnn.MLP(workload.sizes), SEED)
    t0 = time.perf_counter()
    trainer = make_trainer(contender, workload)
    losses: list[float] = []
    epoch_seconds: list[float] = []
    wall = 0.0
    try:
        trainer.fit(x, y, epochs=1, progress=False)  # warm-up epoch, as for all: first-touch allocations, BLAS threads
        setup = time.perf_counter() - t0
        rewind(trainer, init, workload.steps_per_epoch)
        while len(losses) < workload.epochs and (not losses or wall < budget_s):
            t1 = time.perf_counter()
            hist = trainer.fit(x, y, epochs=1, progress=False)
            wall += time.perf_counter() - t1
            losses += [float(v) for v in hist["train_loss"]]
            epoch_seconds += [float(s) for s in hist["seconds"]]
        ev = trainer.evaluate(x_test, y_test)
        last = hist[-1]
    finally:
        trainer.close()
    done = len(losses)
    scaled = done < workload.epochs
    total = wall / done * workload.epochs
    return {
        "train_seconds": total,
        "wall_seconds": wall,
        "device_seconds": float(sum(epoch_seconds)),
        "timing": "fit() wall clock per epoch (perf_counter)"
        + (f"; measured {done} of {workload.epochs} epochs, scaled to {workload.epochs}" if scaled else ""),
        "epoch_seconds": epoch_seconds,
        "measured_epochs": done,
        "scaled": scaled,
        "setup_seconds": setup,
        "setup_detail": {"what": "Trainer construction + one warm-up epoch (no compilation on the CPU)"},
        "epoch_losses": losses,
        "final_train_loss": finite_or_none(last["train_loss"]),
        "final_train_accuracy": finite_or_none(last["train_accuracy"]),
        "test_loss": finite_or_none(ev["loss"]),
        "test_accuracy": finite_or_none(ev["accuracy"]),
        "peak_memory_bytes": None,
        "memory_note": "n/a (CPU)",
        "note": f"loss and accuracy after {done} epochs" if scaled else "",
    }
