"""Atomic file writes: a temporary file beside the target, written, its length checked, then renamed over it.

Readers see the old file or the new one, never a partial one; a failure at any point (disk full, a short
write, an interrupt) removes the temporary file and leaves the target as it was. The temporary file is created
exclusively and without following links (a name planted in a shared folder is not opened), in the target's own
folder so that the rename is atomic. Used by checkpoints, dataset downloads and the kernel cache; it imports
nothing from fastnn, so the bindings layer may use it too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

__all__ = ["reason", "replacing", "sync_folder", "write_bytes"]

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
#: errnos of a link(2) the file system does not support (FAT, some network and FUSE file systems).
_NO_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV, errno.EMLINK}


def _create_temp(path: Path, mode: int) -> tuple[int, Path]:
    """(fd, name) of a new file beside `path`: mkstemp's exclusive creation, but with `mode` (the umask applies).

    At most 100 characters of the target's name are kept, so a name near the 255-byte limit still fits.
    """
    for _ in range(100):
        tmp = path.with_name(f".{path.name[:100]}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, _FLAGS, mode), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name beside {path}")


class _Counted:
    """The temporary file as the writer sees it; `extent` is the end of the furthest byte it was given to write,
    which is the file's length once flushed (a writer may seek back, as zipfile does to finish its headers)."""

    def __init__(self, f: BinaryIO) -> None:
        self._f, self.extent = f, 0

    def write(self, data: bytes) -> int:
        n = self._f.write(data)
        self.extent = max(self.extent, self._f.tell())
        return n

    def __getattr__(self, name: str):  # seek, tell, flush, ... (zipfile needs a seekable file)
        return getattr(self._f, name)


@contextlib.contextmanager
def replacing(
    path: str | os.PathLike[str],
    *,
    mode: int = 0o666,
    keep_mode: bool = False,
    fsync: bool = False,
    exclusive: bool = False,
) -> Iterator[BinaryIO]:
    """A binary file to write `path`'s new content into; on a clean exit it becomes `path`, atomically.

    Args:
        mode: the new file's permissions before the umask (0o666: an ordinary file; 0o600: a private one).
        keep_mode: a file replaced keeps its own permissions (a private checkpoint stays private); the temporary
            file has them from its creation.
        fsync: the data reaches the disk before the rename makes it visible (`sync_folder` makes the
            rename itself durable).
        exclusive: do not replace an existing `path` (FileExistsError): the first writer wins. Where the file
            system has no hard links this falls back to a plain rename.

    Raises:
        OSError: creating, writing or renaming failed, or the file's length on disk differs from what was
            written (a short write); the temporary file is removed and `path` is unchanged.
    """
    path = Path(path)
    if keep_mode:
        # Created with the replaced file's permissions from the start (the umask may only narrow them): content
        # meant for a 0600 file never sits in a 0644 one that another user could open before the chmod below.
        with contextlib.suppress(FileNotFoundError):
            mode = os.stat(path).st_mode & 0o777
    fd, tmp = _create_temp(path, mode)
    try:
        with os.fdopen(fd, "wb") as raw:
            f = _Counted(raw)
            yield f  # type: ignore[misc]
            raw.flush()
            size = os.fstat(raw.fileno()).st_size
            if size != f.extent:
                raise OSError(errno.EIO, f"short write: {size} bytes on disk, {f.extent} written", str(tmp))
            if keep_mode:
                with contextlib.suppress(FileNotFoundError):
                    os.fchmod(raw.fileno(), os.stat(path).st_mode & 0o7777)
            if fsync:
                os.fsync(raw.fileno())
        _publish(tmp, path, exclusive)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _publish(tmp: Path, path: Path, exclusive: bool) -> None:
    if exclusive:
        try:
            os.link(tmp, path)  # fails with FileExistsError if another writer was first
        except FileExistsError:
            raise
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
        else:
            tmp.unlink()
            return
    os.replace(tmp, path)


def write_bytes(
    path: str | os.PathLike[str],
    data: bytes,
    *,
    mode: int = 0o666,
    keep_mode: bool = False,
    fsync: bool = False,
    exclusive: bool = False,
) -> None:
    """Write `data` to `path` atomically (see `replacing` for the arguments and errors)."""
    with replacing(path, mode=mode, keep_mode=keep_mode, fsync=fsync, exclusive=exclusive) as f:
        f.write(data)


#: errnos of a folder fsync the file system does not support: the rename is done, only its durability is weaker.
_NO_FOLDER_SYNC = {errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES}


def sync_folder(folder: str | os.PathLike[str]) -> None:
    """fsync `folder` so a rename into it survives a power loss; folders that cannot be opened or synced are
    let be (the file is in place, only its durability is weaker).

    Raises:
        OSError: the fsync failed for another reason (an I/O error).
    """
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # e.g. a folder we may write but not read
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _NO_FOLDER_SYNC:
            raise
    finally:
        os.close(fd)


def reason(exc: OSError) -> str:
    """'ENOSPC (No space left on device)': the symbolic name a user can search for, and the text."""
    return f"{errno.errorcode.get(exc.errno, exc.errno)} ({exc.strerror})" if exc.errno else str(exc)
