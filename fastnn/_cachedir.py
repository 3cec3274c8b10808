"""The ownership rules of fastnn's on-disk caches: a cache folder, and each file read from it, is trusted only when
this user owns it and nobody else may write to it.

Shared by the kernel cache (cuda/nvrtc.py, whose entries are also sealed with a per-user key) and the decoded
dataset cache (_decoded.py). It imports nothing from fastnn, so any layer may use it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["file_refusal", "refusal"]


def _owner_and_writers(st: os.stat_result, fix: str = "") -> str | None:
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        return f"it is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})"
    writers = [who for who, bit in (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit]
    if writers:
        return f"it is writable by {' and '.join(writers)} (mode {stat.S_IMODE(st.st_mode):04o}{fix})"
    return None


def refusal(directory: Path) -> str | None:
    """Why `directory` cannot be trusted as a cache folder (None when it can): owner and mode checks."""
    try:
        st = os.stat(directory)
    except OSError as exc:
        return f"cannot stat it ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    return _owner_and_writers(st, f"; fix: chmod 700 {directory}")


def file_refusal(st: os.stat_result) -> str | None:
    """Why a file of a trusted cache folder, by its (f)stat, cannot be trusted (None when it can): a regular file
    owned by this user that nobody else may write."""
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    return _owner_and_writers(st)
