"""The ownership rules of fastnn's on-disk caches: a cache folder, and each file read from it, is trusted only when
this user owns it and nobody else may write to it.

Shared by the kernel cache (cuda/nvrtc.py, whose entries are also sealed with a per-user key) and the decoded
dataset cache (_decoded.py). It imports nothing from fastnn, so any layer may use it.
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
import warnings
from collections.abc import Iterable
from pathlib import Path

__all__ = ["digest", "file_refusal", "refusal", "trusted_dir", "warn_once"]

_warned: set[tuple[Path, str]] = set()  # (folder, problem) already warned about in this process
_lock = threading.Lock()


def digest(fields: Iterable[str | bytes]) -> str:
    """sha256 (hex) of `fields` (text as UTF-8), each prefixed with its length (8 bytes, little-endian) so that no
    two different field lists hash the same stream. Names cache entries: keep it byte-stable."""
    h = hashlib.sha256()
    for field in fields:
        data = field.encode() if isinstance(field, str) else field
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def _owner_and_writers(st: os.stat_result, private: bool = False, fix: str = "") -> str | None:
    # The effective uid: what this process's files are created as (a setuid process's own files pass).
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if private and st.st_mode & 0o077:
        return f"is open to others (mode {stat.S_IMODE(st.st_mode):04o})"
    writers = [who for who, bit in (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit]
    if writers:
        return f"is writable by {' and '.join(writers)} (mode {stat.S_IMODE(st.st_mode):04o}{fix})"
    return None


def refusal(directory: Path) -> str | None:
    """Why `directory` cannot be trusted as a cache folder (None when it can): owner and mode checks."""
    try:
        st = os.stat(directory)
    except OSError as exc:
        return f"cannot stat it ({exc.strerror or exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    reason = _owner_and_writers(st, fix=f"; fix: chmod 700 {directory}")
    return None if reason is None else f"it {reason}"


def file_refusal(st: os.stat_result, private: bool = False) -> str | None:
    """Why a file, by its (f)stat, cannot be trusted (None when it can): it must be a regular file owned by this
    user that nobody else may write (`private`: that nobody else may even read). Completes "the file ..."."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    return _owner_and_writers(st, private)


def warn_once(directory: Path, problem: str, message: str, stacklevel: int) -> None:
    """One RuntimeWarning per cache folder and kind of problem: a failing cache must not flood the output.
    `stacklevel` counts from the caller, as warnings.warn's does."""
    with _lock:
        if (directory, problem) in _warned:
            return
        _warned.add((directory, problem))
    warnings.warn(message, RuntimeWarning, stacklevel=stacklevel + 1)


def trusted_dir(directory: Path, what: str, fallback: str, stacklevel: int) -> Path | None:
    """`directory`, created 0700 if absent, when it passes the owner and mode checks; else None, with one warning
    naming the `what` ("kernel cache") not used and the `fallback` taken instead."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # parents get the umask's mode, the cache 0700
    except OSError:
        return None  # an unwritable location: no cache, nothing trusted, nothing to warn about
    reason = refusal(directory)
    if reason is None:
        return directory
    warn_once(directory, what, f"fastnn: not using the {what} {directory}: {reason}; {fallback}", stacklevel + 1)
    return None
