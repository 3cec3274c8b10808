"""How many BLAS threads the NumPy engine uses: one on small problems, unless the user chose a number.

The NumPy engine's products are small (a batch of 128 against a 784-by-10 layer is 1e6 multiply-adds): waking
BLAS threads costs more than the product. On a busy 2-core machine OpenBLAS's default two threads made the
README's logistic regression 20x slower than one thread (2 epochs: 97.7 s against 5.0 s), and one thread won at
every size up to a 1024-cubed product (128 x 1024 x 1024: 31 ms against 170 ms). So the NumPy engine trains with
one BLAS thread where the step's largest product has fewer than SMALL_MACS multiply-adds, and leaves BLAS alone
above that or where OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS or BLIS_NUM_THREADS is set
(the user's choice). The limit needs threadpoolctl (a dependency); without it BLAS keeps its own count.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any

from .._model import MLP

__all__ = ["SMALL_MACS", "THREAD_ENV", "blas_threads", "limited_blas"]

#: Below this many multiply-adds in a step's largest matrix product, the NumPy engine uses one BLAS thread.
SMALL_MACS = 1 << 30
#: Environment variables by which a user sets BLAS's thread count: set, fastnn leaves the count alone.
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS")


def blas_threads(model: MLP, batch_size: int) -> int | None:
    """The BLAS thread count for training `model` at `batch_size`: 1 for a small step, None (BLAS's own
    choice) for a large one or where the user set one of THREAD_ENV."""
    if any(os.environ.get(name) for name in THREAD_ENV):
        return None
    sizes = model.sizes
    largest = max(sizes[i] * sizes[i + 1] for i in range(len(sizes) - 1)) * batch_size
    return 1 if largest < SMALL_MACS else None


@contextlib.contextmanager
def limited_blas(threads: int | None) -> Iterator[None]:
    """Run the block with BLAS limited to `threads` (None: unchanged, as without threadpoolctl)."""
    if threads is None:
        yield
        return
    controller = _controller()
    if controller is None:  # pragma: no cover - threadpoolctl is a dependency; a bare environment may lack it
        yield
        return
    with controller.limit(limits=threads, user_api="blas"):
        yield


@functools.cache
def _controller() -> Any:
    """threadpoolctl's view of the loaded BLAS libraries, made once: `threadpool_limits` finds them again on every
    call (~0.5-2 ms, paid per fit and per model of a many-model CPU fit), a kept controller's `limit` ~0.1 ms.
    NumPy's BLAS is loaded before fastnn, so the controller made on first use sees it. None without threadpoolctl."""
    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:  # pragma: no cover
        return None
    return ThreadpoolController()
