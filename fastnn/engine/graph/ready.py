"""What the fused and grid engines' first evaluation needs, made on a thread while their first fit trains.

Their epoch is one kernel of their own, so the graph step's libraries (GraphEngine.load_step_libraries: the gather
and loss kernels, cuBLASLt's and cuDNN's handles) are needed only to evaluate or predict, with the graph engine's
forward graph. Made at that moment, they cost the first `evaluate()` after a fit 1.9 s on a fresh H100 (NVRTC
compiling gather.cu and loss.cu 1.6 s, the cuDNN handle 0.16 s) against 0.006 s for a later one. Made at build, they
would delay every fit, scored or not. So the engine starts this thread when it is built; the thread makes them one
by one (and pays cuBLASLt's first heuristic query, 0.08 s, with a throwaway plan: cublaslt.warm_up) while the fit's
own kernel compiles and trains (NVRTC releases the GIL and, after a short front-end, compiles two programs at once;
the handles are driver work; capture is thread-local: engine.capture), and the first evaluation takes what it made,
waiting only for a step still under way.

The alternative, a forward pass of the fused and grid engines' own (a forward-only kernel per engine), would
need a kernel per engine and model shape that adds up exactly as the graph engine's does (same GEMM rounding,
same loss sums), or evaluation would change numbers between engines: this keeps one evaluation for every GPU
engine and moves only when its pieces are made.

The thread raises nothing: a step that fails is left for the evaluation to make again, which meets the same
error on the caller's thread with its usual type and message. It never holds the process: `cancel` (the engine's
close, or the interpreter's exit through `atexit`) lets the step under way finish (NVRTC cannot be interrupted;
with a warm kernel cache a step is milliseconds) and skips the rest.
"""

from __future__ import annotations

import atexit
import contextlib
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["THREAD_NAME", "Preparation"]

#: The name of the thread (tests look for it).
THREAD_NAME = "fastnn-eval-prepare"

_live: weakref.WeakSet[Preparation] = weakref.WeakSet()  # those whose thread may still run: cancelled at exit


class Preparation:
    """Runs `steps`, (name, make) pairs in order, on a daemon thread with `make_current` called first; each make is
    given {name: what the earlier steps made}. `take` hands that over for the steps that succeeded."""

    def __init__(self, steps: Sequence[tuple[str, Callable[[dict[str, Any]], Any]]],
                 make_current: Callable[[], None]) -> None:  # fmt: skip
        self._steps = list(steps)
        self._made: dict[str, Any] = {}
        self._stop = threading.Event()
        # A daemon thread, cancelled and joined by the atexit hook below: a non-daemon one would make the
        # interpreter wait for every remaining step before it even runs atexit.
        self._thread = threading.Thread(target=self._run, args=(make_current,), name=THREAD_NAME, daemon=True)
        _live.add(self)
        self._thread.start()

    def _run(self, make_current: Callable[[], None]) -> None:
        try:
            make_current()
        except Exception:
            return  # no context on this thread: the evaluation makes everything itself
        for name, make in self._steps:
            if self._stop.is_set():
                return
            try:
                self._made[name] = make(dict(self._made))
            except Exception:
                return  # the evaluation makes this step and the later ones itself, and meets the error

    def take(self) -> dict[str, Any]:
        """Wait for the thread to finish every step; what the steps made (each taken once: later calls get {})."""
        self._thread.join()
        _live.discard(self)
        made, self._made = self._made, {}
        return made

    def cancel(self) -> dict[str, Any]:
        """Skip the steps not begun, wait for the one under way; what the steps made, for the caller to release."""
        self._stop.set()
        return self.take()

    @property
    def running(self) -> bool:
        """Whether the thread is still at work (tests)."""
        return self._thread.is_alive()


@atexit.register
def _cancel_all() -> None:
    """At the interpreter's exit: no step begins; the ones under way end before the interpreter tears down what
    they use (a daemon thread inside NVRTC or cuDNN while the process unloads them could crash the exit). What they
    made is left to the CUDA driver, which frees a process's resources when it ends."""
    for prep in list(_live):
        with contextlib.suppress(Exception):
            prep.cancel()
