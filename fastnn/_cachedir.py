"""Where fastnn's on-disk caches live, how large they may grow, and their ownership rules: a cache folder, and each
file read from it, is trusted only when this user owns it and nobody else may write to it.

The caches live under one root, `base_dir()`: $XDG_CACHE_HOME/fastnn, else ~/.cache/fastnn; with no home directory
to be found (HOME unset and no passwd entry, common in containers) a private temporary folder of this process, said
in one warning. Each cache is bounded (`max_bytes`): after a write, its least recently used entries go until it
fits. `clear` removes a cache's entries, and only them (`fastnn cache clear`).

Shared by the kernel cache (cuda/nvrtc.py, whose entries are also sealed with a per-user key) and the decoded
dataset cache (_decoded.py). It imports nothing from fastnn, so any layer may use it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import re
import shutil
import stat
import tempfile
import threading
import warnings
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "DEFAULT_MAX_MB", "base_dir", "clear", "digest", "evict", "file_refusal", "max_bytes", "refusal", "trusted_dir",
    "usage", "warn_once",
]  # fmt: skip

#: Each cache's default bound, in MiB (the kernel cache: $FASTNN_CACHE_MAX_MB, the decoded datasets:
#: $FASTNN_DATASET_CACHE_MAX_MB). A decoded MNIST or Fashion-MNIST takes 55 MB, a compiled kernel 0.1-1 MB.
DEFAULT_MAX_MB = 1024
#: A cache entry's files: 64 hex digits (a digest() key), a suffix; and the temporary files `_files` leaves
#: while writing one (or the key), should a process die mid-write.
_ENTRY = re.compile(r"(?P<key>[0-9a-f]{64})\.[a-z]+")
_TEMPORARY = re.compile(r"\.(?:[0-9a-f]{64}\.[a-z]+|\.key)\.[0-9a-f]{12}\.tmp")

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
    naming the `what` ("kernel cache") not used and the `fallback` taken instead.

    A symbolic link at `directory` is followed only when this user owns the link itself: one planted in a shared
    folder (/tmp) at the cache's name would lead into a folder of this user's, which would pass the checks.
    """
    try:
        st = os.lstat(directory)
    except OSError:
        st = None  # absent (made below) or unreachable (mkdir says)
    if st is not None and stat.S_ISLNK(st.st_mode) and hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        reason = f"it is a symbolic link owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
        warn_once(directory, what, f"fastnn: not using the {what} {directory}: {reason}; {fallback}", stacklevel + 1)
        return None
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # parents get the umask's mode, the cache 0700
    except OSError:
        return None  # an unwritable location: no cache, nothing trusted, nothing to warn about
    reason = refusal(directory)
    if reason is None:
        return directory
    warn_once(directory, what, f"fastnn: not using the {what} {directory}: {reason}; {fallback}", stacklevel + 1)
    return None


# ---- where the caches live ---------------------------------------------------------------------------------------

_temporary: list[Path] = []  # this process's fallback root, made at most once


def _home() -> Path | None:
    """The home directory, or None when none can be found (or it is not an absolute path)."""
    try:
        home = Path.home()
    except (RuntimeError, KeyError, OSError):  # HOME unset and no passwd entry for this uid
        return None
    return home if home.is_absolute() else None


def base_dir() -> Path:
    """The folder fastnn's caches live under: $XDG_CACHE_HOME/fastnn (an absolute XDG_CACHE_HOME, as the XDG spec
    says), else <home>/.cache/fastnn; with no home directory, a private temporary folder made for this process and
    removed at its exit, with one warning saying how to keep the caches."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "fastnn"
    home = _home()
    if home is not None:
        return home / ".cache" / "fastnn"
    with _lock:
        if not _temporary:
            try:
                folder = Path(tempfile.mkdtemp(prefix="fastnn-cache-"))  # 0700, a new name: nothing planted there
                atexit.register(shutil.rmtree, folder, ignore_errors=True)
            except OSError:  # no writable temporary folder: a name trusted_dir will fail to make (no cache)
                folder = Path(tempfile.gettempdir()) / f"fastnn-cache-{os.getpid()}-unwritable"
            _temporary.append(folder)
            warnings.warn(
                f"fastnn: no home directory (HOME is unset and this user has no passwd entry): its caches (compiled "
                f"kernels, decoded datasets, downloads) go to {folder} for this process only; set XDG_CACHE_HOME "
                "(or FASTNN_CACHE_DIR and FASTNN_DATASET_CACHE_DIR) to a folder of yours to keep them",
                RuntimeWarning,
                stacklevel=3,
            )
        return _temporary[0]


# ---- their size ----------------------------------------------------------------------------------------------------


def max_bytes(env: str) -> int:
    """A cache's bound in bytes: $`env` in MiB (a number >= 0; 0 keeps nothing), else DEFAULT_MAX_MB; a value that
    is not such a number warns once and the default holds."""
    text = os.environ.get(env, "")
    if not text:
        return DEFAULT_MAX_MB << 20
    try:
        mb = float(text)
        if not mb >= 0 or mb == float("inf"):
            raise ValueError
    except ValueError:
        warn_once(Path(env), "bound", f"fastnn: ${env}={text!r} is not a size in MiB (a number >= 0); the cache "
                                      f"keeps up to {DEFAULT_MAX_MB} MiB", stacklevel=2)  # fmt: skip
        return DEFAULT_MAX_MB << 20
    return int(mb * (1 << 20))


def _entries(directory: Path) -> dict[str, list[tuple[Path, os.stat_result]]]:
    """The cache's entries by key: each key's files (a kernel: one; a decoded dataset: its .idx and .json) with their
    lstat. Files of other names are not the cache's and are never counted or removed."""
    groups: dict[str, list[tuple[Path, os.stat_result]]] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return groups
    for name in names:
        match = _ENTRY.fullmatch(name)
        if match is None:
            continue
        try:
            st = os.lstat(directory / name)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            groups.setdefault(match["key"], []).append((directory / name, st))
    return groups


def usage(directory: Path) -> tuple[int, int]:
    """(entries, bytes) of the cache in `directory` (its files of cache names only)."""
    groups = _entries(directory)
    return len(groups), sum(st.st_size for files in groups.values() for _, st in files)


def evict(directory: Path, limit: int, keep: str | None = None) -> int:
    """Remove the least recently used entries (by their newest file's mtime: a hit touches it) until the cache in
    `directory` takes at most `limit` bytes; entry `keep` (just written) goes last. Returns the bytes freed."""
    groups = _entries(directory)
    total = sum(st.st_size for files in groups.values() for _, st in files)
    order = sorted(groups, key=lambda k: (k == keep, max(st.st_mtime_ns for _, st in groups[k])))
    freed = 0
    for key in order:
        if total - freed <= limit:
            break
        for path, st in groups[key]:
            try:
                path.unlink()
                freed += st.st_size
            except FileNotFoundError:
                freed += st.st_size  # another process evicted it first
            except OSError:
                pass
    return freed


def clear(directory: Path) -> tuple[int, int]:
    """Remove the cache's entries and leftover temporary files from `directory` (nothing else in it, and nothing at
    all from a folder that fails the ownership checks); returns (files removed, bytes freed)."""
    if not directory.is_dir() or os.path.islink(directory) or refusal(directory) is not None:
        return 0, 0
    removed = freed = 0
    paths = [p for files in _entries(directory).values() for p, _ in files]
    with contextlib.suppress(OSError):
        paths += [directory / n for n in os.listdir(directory) if _TEMPORARY.fullmatch(n)]
    for path in paths:
        try:
            size = os.lstat(path).st_size
            path.unlink()
        except OSError:
            continue
        removed, freed = removed + 1, freed + size
    return removed, freed
