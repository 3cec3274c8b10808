"""`fastnn cache`: where fastnn's on-disk caches are, what they hold, and emptying them (`fastnn cache clear`).

Two caches, each bounded (`_cachedir.max_bytes`): compiled kernels with cuBLASLt's autotuning choices
(cuda/nvrtc.py) and decoded datasets (_decoded.py). Clearing removes their entries only, never other files in their
folders; downloaded datasets (`datasets.load`'s default folder) are data, not cache, and are left alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from . import _cachedir

__all__ = ["caches", "clear_caches", "report"]


def caches() -> list[tuple[str, Path, str]]:
    """(name, folder, the variable bounding it in MiB) of each cache, as this process would use it."""
    from ._decoded import MAX_MB_ENV as DATASET_MAX
    from ._decoded import cache_dir as dataset_dir
    from .cuda.nvrtc import MAX_MB_ENV as KERNEL_MAX
    from .cuda.nvrtc import cache_dir as kernel_dir

    return [("kernels", kernel_dir(), KERNEL_MAX), ("datasets", dataset_dir(), DATASET_MAX)]


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def report(out: TextIO) -> int:
    """Print each cache's folder, entries, size and bound; returns the exit code (0)."""
    for name, folder, env in caches():
        entries, size = _cachedir.usage(folder) if folder.is_dir() else (0, 0)
        bound = _cachedir.max_bytes(env) >> 20
        print(f"{name + ':':<10} {folder}: {entries} entries, {_mb(size)} (at most {bound} MiB: ${env})", file=out)
    print(f"{'downloads:':<10} {_cachedir.base_dir()}/<dataset> by default (data, not cache: `fastnn cache clear` "
          "leaves them)", file=out)  # fmt: skip
    return 0


def clear_caches(out: TextIO) -> int:
    """Remove every cache's entries (only fastnn's files, only from folders of this user's); returns the exit code."""
    for name, folder, _ in caches():
        removed, freed = _cachedir.clear(folder)
        print(f"{name + ':':<10} {folder}: removed {removed} files, {_mb(freed)}", file=out)
    return 0
