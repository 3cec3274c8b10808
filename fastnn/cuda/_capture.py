"""Releases that wait for the end of this thread's stream capture: the one place every binding frees through.

A capture (thread-local mode) is invalidated by a call on the capturing thread that frees device memory or
synchronizes: cuMemFree, cuMemFreeHost, cuGraphExecDestroy, and the library destroys that do so inside
(cudnnDestroy, cublasLtDestroy, ncclCommDestroy: each measured to invalidate a capture on an H200). The garbage
collector may run any finalizer in the middle of a capture, for instance a dropped trainer's while another trainer
captures its epoch, so driver objects and library objects release through `release`, which defers while this
thread captures. Other threads are unaffected (thread-local mode) and free at once. `deferring` opens the same
scope around work that other GPUs wait on (a replica's epoch launch), since a free synchronizes its device.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_state = threading.local()  # .depth: captures under way on this thread; .deferred: [(fn, args)] to run after


def capturing() -> bool:
    """True while this thread records a stream capture, or runs a `deferring` call: its releases wait."""
    return getattr(_state, "depth", 0) > 0


def begin() -> None:
    """A capture started on this thread (Stream.begin_capture, once the driver accepted it)."""
    if not capturing():
        _state.deferred = []
    _state.depth = getattr(_state, "depth", 0) + 1


def end() -> None:
    """A capture ended on this thread; once the outermost ends, run the releases it deferred. A failing one is
    reported as a finalizer's would be (sys.unraisablehook), so the others still run and the graph is kept."""
    _state.depth -= 1
    if _state.depth:
        return
    deferred, _state.deferred = _state.deferred, []
    for fn, args in deferred:
        try:
            fn(*args)
        except Exception as exc:
            sys.unraisablehook(
                types.SimpleNamespace(
                    exc_type=type(exc),
                    exc_value=exc,
                    exc_traceback=exc.__traceback__,
                    err_msg="Exception ignored in a release deferred past a capture",
                    object=None,
                )
            )


def deferring(fn: Callable[..., T]) -> Callable[..., T]:
    """fn with this thread's releases deferred to its end, as during a capture: for work that other GPUs wait on,
    where a free (which synchronizes the device it frees on) could wait for them in turn."""

    @functools.wraps(fn)
    def deferred(*args: Any, **kwargs: Any) -> T:
        begin()
        try:
            return fn(*args, **kwargs)
        finally:
            end()

    return deferred


def release(fn: Callable[..., Any], *args: Any) -> None:
    """fn(*args) now, or at the end of this thread's capture if one is under way."""
    if capturing():
        _state.deferred.append((fn, args))
    else:
        fn(*args)
