"""Whether this process can use a GPU: the one place that decides, so tests, `info` and `Trainer` agree."""

from __future__ import annotations

import functools
import os
import threading

from ._errors import DeviceUnavailable

__all__ = ["cuda_status", "require_cuda"]

# pathfinder's names of the libraries every GPU engine needs.
_LIBRARIES = ("cublasLt", "cudnn", "nvrtc")


_status_lock = threading.Lock()


def _fresh_lock_in_child() -> None:
    """A child forked while a warm-up thread probed must not inherit the lock held: the probe does not continue
    there (threads do not survive a fork)."""
    global _status_lock
    _status_lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)


def cuda_status() -> tuple[bool, str]:
    """(True, device 0's name) if a GPU is usable, else (False, the reason and the fix). Cached; never raises.

    Usable means: cuda-bindings imports, the driver initializes, at least one device is visible, and the
    cuBLASLt, cuDNN and NVRTC libraries load. No CUDA context is created. A call made while another thread probes
    (a GPU trainer's warm-up, engine/warmup.py) waits for that probe's answer instead of probing again.
    """
    with _status_lock:
        return _cuda_status()


@functools.cache
def _cuda_status() -> tuple[bool, str]:
    try:
        usable, reason = _probe()
    except Exception as exc:  # anything unforeseen still means "not usable", never a crash
        usable, reason = False, f"CUDA probe failed unexpectedly: {type(exc).__name__}: {exc}"
    if not usable:
        try:
            from ._environment import cuda_packages

            mixed = cuda_packages().problem()
        except Exception:  # unreadable metadata must not hide the reason itself
            mixed = None
        if mixed:
            reason = f"{reason} ({mixed})"
    return usable, reason


cuda_status.cache_clear = _cuda_status.cache_clear  # type: ignore[attr-defined]  (tests probe again)


def _probe() -> tuple[bool, str]:
    from .cuda._loader import INSTALL_HINT, load_library

    try:
        from .cuda import driver
    except ImportError as exc:
        return False, f"cuda-bindings is not importable ({exc}); fix: {INSTALL_HINT}"
    try:
        count = driver.device_count()
    except DeviceUnavailable as exc:
        return False, str(exc)
    if count == 0:
        return False, "no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
    for libname in _LIBRARIES:
        try:
            load_library(libname)
        except DeviceUnavailable as exc:
            return False, str(exc)
    try:
        return True, driver.device_name(0)
    except Exception as exc:
        return False, f"cannot query CUDA device 0: {exc}"


def require_cuda() -> None:
    """Raise DeviceUnavailable (with the reason and the fix) unless a GPU is usable."""
    usable, reason = cuda_status()
    if not usable:
        raise DeviceUnavailable(reason)
