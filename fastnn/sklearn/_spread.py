"""Where a search's groups train: spread over the GPUs of this process (one thread per GPU, CUDA_VISIBLE_DEVICES
honoured: the driver numbers only the visible GPUs), over threads on the CPU, or, under a joblib backend that runs
tasks elsewhere (Dask, Ray), one joblib task per group on whatever worker (and its GPU) takes it."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["assign", "device_slots", "remote_backend", "run_spread"]

#: joblib's backends that run tasks in this machine's processes or threads: under any other (Dask, Ray, ...), a
#: search's groups go to joblib as tasks.
_LOCAL_BACKENDS = ("LokyBackend", "MultiprocessingBackend", "ThreadingBackend", "SequentialBackend")


def remote_backend() -> bool:
    """Whether the joblib backend in effect runs tasks elsewhere (a `parallel_config(backend="dask")` block)."""
    from joblib.parallel import get_active_backend

    backend, _ = get_active_backend()
    return type(backend).__name__ not in _LOCAL_BACKENDS


def _gpu_count() -> int:
    """The GPUs this process sees (0 without a usable one); the first CUDA call of a search, never at import."""
    from .._device import cuda_status

    if not cuda_status()[0]:
        return 0
    from ..cuda import driver

    return int(driver.device_count())


def device_slots(n_jobs: int | None, devices: Sequence[str], gpus: Callable[[], int] = _gpu_count) -> list[Any]:
    """The places groups train at once: GPU ordinals [0, ..., g-1], or [None] * t threads on the CPU.

    n_jobs as scikit-learn reads it (None: 1; -1: all; -2: all but one); it counts GPUs when a group trains on a
    GPU, threads when every group is on the CPU. `devices`: the groups' `device` parameters."""
    from joblib import effective_n_jobs

    wanted = max(1, int(effective_n_jobs(n_jobs))) if n_jobs is not None else 1
    if all(d == "cpu" for d in devices):
        return [None] * wanted
    count = gpus()
    if count == 0:  # "auto" without a GPU: the CPU, as the estimator's own fit would
        return [None] * wanted
    if n_jobs is not None and n_jobs < 0:
        wanted = max(1, count + 1 + n_jobs)
    return list(range(min(wanted, count)))


def assign(costs: Sequence[float], slots: int) -> list[list[int]]:
    """Groups to slots, the longest first onto the least loaded slot (ties: the lowest slot), so that the slots
    finish close together; each slot's list is in the order it trains them."""
    load = [0.0] * slots
    out: list[list[int]] = [[] for _ in range(slots)]
    for g in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        s = min(range(slots), key=lambda j: (load[j], j))
        out[s].append(g)
        load[s] += costs[g]
    return out


def run_spread(jobs: Sequence[Any], costs: Sequence[float], slots: list[Any],
               work: Callable[[Any, Any], Any]) -> list[Any]:  # fmt: skip
    """work(job, slot) for every job, slot by slot in `assign`'s order, one thread per slot; results in the
    order of `jobs`. The first error is raised once every slot has stopped."""
    plan = assign(costs, len(slots))
    results: list[Any] = [None] * len(jobs)

    def run(s: int) -> None:
        for g in plan[s]:
            results[g] = work(jobs[g], slots[s])

    if len(slots) == 1 or len(jobs) <= 1:
        for s in range(len(slots)):
            run(s)
        return results
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(slots), thread_name_prefix="fastnn-search") as pool:
        futures = [pool.submit(run, s) for s in range(len(slots))]
        errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e
    return results
