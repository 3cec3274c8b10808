"""A GPU trainer's slow start begun on a thread: the CUDA probe (cuInit, the libraries) and the primary context.

`Trainer(device="cuda" or "auto")` builds its engine right after drawing the initial weights; the engine needs the
CUDA context first. Creating it is driver work that releases the GIL (on an H100: cuInit ~0.10 s, the primary
context ~0.12 s, dlopen of cuBLASLt, cuDNN and NVRTC ~0.05 s), so `overlapped` starts it on a thread while the
caller draws the weights (0.1-0.9 s for MLP 784-8192x3-10) and imports the engine's modules.

The thread only fills the caches the engine's own calls read: `cuda_status()` (cached, and serialised so that a
second caller waits for the first probe) and `driver.get_device(ordinal)` (cached once made). It raises nothing:
a failure leaves no cache entry behind, so the engine's own call meets it again and raises it as it always did,
with the same type, message and traceback. It warns nothing either. The thread is joined before `overlapped`'s
block ends (a GPU trainer's constructor), so none outlives the call that started it: nothing runs at interpreter
exit or across a fork. Nothing starts for device="cpu" or for several GPUs of one process (each replica makes its
own context).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

__all__ = ["THREAD_NAME", "overlapped", "warm_ordinal"]

#: The name of the thread (tests look for it).
THREAD_NAME = "fastnn-gpu-warmup"


def warm_ordinal(device: str, devices: object, group: object) -> int | None:
    """The GPU whose context a trainer of these (already validated) arguments makes first, or None: no GPU is
    asked for (device="cpu"), or several (the replica engine makes one per GPU itself)."""
    if device == "cpu":
        return None
    if group is not None:
        return int(group.device)  # type: ignore[attr-defined]
    if isinstance(devices, (list, tuple)):
        return int(devices[0]) if len(devices) == 1 else None
    return 0 if devices == 1 else None


def _warm(ordinal: int) -> None:
    """Probe CUDA and make `ordinal`'s primary context current on this thread; every failure is left for the
    engine's own calls to meet again and raise (see the module)."""
    with contextlib.suppress(Exception):
        from .._device import cuda_status

        if cuda_status()[0]:
            from ..cuda import driver

            driver.get_device(ordinal)


@contextlib.contextmanager
def overlapped(device: str, devices: object = 1, group: object = None) -> Iterator[None]:
    """Run the block while CUDA starts on a thread (see the module), then wait for the thread.

    The block is the caller's work that needs no GPU yet (drawing the weights) and the engine's construction,
    whose first CUDA calls find the probe and context made or wait for them.
    """
    ordinal = warm_ordinal(device, devices, group)
    if ordinal is None:
        yield
        return
    thread = threading.Thread(target=_warm, args=(ordinal,), name=THREAD_NAME)
    thread.start()
    try:
        yield
    finally:
        thread.join()
