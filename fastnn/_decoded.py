"""The decoded dataset cache: each verified dataset file kept uncompressed on disk and memory-mapped by later loads.

Verifying Fashion-MNIST's 26 MB of gzip and inflating it to 55 MB took most of `datasets.load`; a load whose files
were verified before maps the uncompressed IDX files instead (copy-on-write: the arrays are writable, and the file
is never changed). An entry is one file's content, by the dataset, the file and the published checksum of its
decoded bytes (so every copy of a dataset, a per-job scratch copy included, shares one entry): `<key>.idx`, the
uncompressed IDX file, and `<key>.json`, its record: the paths and identities (size, mtime, inode, device) of the
last MAX_SOURCES source files verified to hold it, and the entry's size, mtime, inode and sha256 when it was
written. A load uses the entry only when
  - the cache folder passes the kernel cache's ownership rules (this user's, closed to others), and both files are
    this user's regular files that nobody else may write;
  - the source is one recorded, unchanged since it was verified (size, mtime, inode and device as recorded), and
    its mtime was not so recent at verification that a write in the same clock tick could have gone unseen;
  - the entry is as written (size, mtime and inode as recorded), its recorded sha256 is the dataset's published
    one where that is known, and its IDX header declares the expected dims and length.
Anything else is rebuilt from the verified source, never trusted. Entries are written whole (a temporary file,
then a rename), so a reader sees a complete entry or none, and an array mapped from an entry replaced since keeps
the old file. The cache is bounded: after a write, entries none of whose sources is still there go, then the least
recently used ones until it holds at most $FASTNN_DATASET_CACHE_MAX_MB (`_cachedir.max_bytes`); `fastnn cache
clear` empties it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from pathlib import Path

import numpy as np

from . import _files
from ._cachedir import base_dir, digest, evict, file_refusal, max_bytes, trusted_dir

__all__ = ["CACHE_ENV", "MAX_MB_ENV", "RACY_NS", "cache_dir", "entry_key", "lookup", "store"]

#: Where decoded files are kept: this variable's folder, else $XDG_CACHE_HOME/fastnn/decoded or
#: ~/.cache/fastnn/decoded.
CACHE_ENV = "FASTNN_DATASET_CACHE_DIR"
#: The cache's bound in MiB (default _cachedir.DEFAULT_MAX_MB).
MAX_MB_ENV = "FASTNN_DATASET_CACHE_MAX_MB"
#: Bump when the key or the files' layout change: old entries are then never read (and go by the size bound).
SCHEMA_VERSION = 2
#: Source files remembered per entry (the last verified): copies of one dataset in several folders all hit.
MAX_SOURCES = 8
#: A source whose mtime is within this of its verification is not recorded: file systems keep mtimes in ticks
#: (a few ms on Linux, 2 s on FAT), and a same-size write in the tick of the last one would leave every recorded
#: field as it was. The next load, later than this, verifies it again and records it.
RACY_NS = 2_000_000_000
_RECORD_MAX = 1 << 16
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)

def cache_dir() -> Path:
    """$FASTNN_DATASET_CACHE_DIR, else $XDG_CACHE_HOME/fastnn/decoded, else ~/.cache/fastnn/decoded (with no home
    directory, a temporary folder of this process: `_cachedir.base_dir`); absolute."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser().absolute()
    return base_dir().absolute() / "decoded"


def _trusted_dir() -> Path | None:
    """cache_dir(), created 0700 if absent, when it passes the ownership rules; else None (warned once)."""
    return trusted_dir(cache_dir(), "dataset cache", "decompressing datasets on every load instead", stacklevel=4)


def entry_key(dataset: str, stem: str, content_sha256: str) -> str:
    """sha256 (hex) naming the entry of `dataset`'s file `stem` whose decoded bytes have `content_sha256` (the
    published one; else the source's checksum): by content, not by path, so copies share it."""
    return digest((f"schema {SCHEMA_VERSION}", dataset, stem, content_sha256))


def _identity(st: os.stat_result, with_device: bool = True) -> dict[str, int]:
    fields = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}
    if with_device:
        fields["dev"] = st.st_dev
    return fields


def _read_record(path: Path) -> dict | None:
    """The JSON record at `path` if it is this user's private regular file and well formed, else None."""
    try:
        with open(path, "rb", opener=lambda p, flags: os.open(p, flags | _NOFOLLOW)) as f:
            if file_refusal(os.fstat(f.fileno())) is not None:
                return None
            record = json.loads(f.read(_RECORD_MAX))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _header(dims: tuple[int, ...]) -> bytes:
    """The IDX header of a uint8 array of `dims`."""
    return bytes([0, 0, 0x08, len(dims)]) + np.asarray(dims, dtype=">u4").tobytes()


def lookup(
    key: str, source: Path, dims: tuple[int | None, ...], published_sha256: str | None
) -> np.ndarray | None:
    """The cached uint8 array of `source` (a copy-on-write memory map), if entry `key` can be trusted (see the
    module's rules) and its header matches `dims` (None: any size on that axis); else None."""
    directory = _trusted_dir()
    if directory is None:
        return None
    record = _read_record(directory / f"{key}.json")
    if record is None or record.get("schema") != SCHEMA_VERSION or record.get("key") != key:
        return None
    entry = record.get("entry")
    try:
        if _identity(os.stat(source)) not in _source_identities(record):
            return None  # not a source verified to hold this, or changed since it was
    except OSError:
        return None
    if not isinstance(entry, dict) or (published_sha256 is not None and entry.get("sha256") != published_sha256):
        return None
    try:
        with open(directory / f"{key}.idx", "rb", opener=lambda p, flags: os.open(p, flags | _NOFOLLOW)) as f:
            st = os.fstat(f.fileno())
            if file_refusal(st) is not None or {k: entry.get(k) for k in ("size", "mtime_ns", "ino")} != _identity(
                st, with_device=False
            ):
                return None
            head = f.read(4)
            if len(head) != 4 or head[:3] != b"\0\0\x08" or head[3] != len(dims):
                return None
            got = tuple(int(d) for d in np.frombuffer(f.read(4 * len(dims)), dtype=">u4"))
            if len(got) != len(dims) or any(e is not None and e != g for e, g in zip(dims, got)):
                return None
            offset = 4 + 4 * len(dims)
            if st.st_size != offset + math.prod(got):
                return None
            # Mapped from the file already checked (not reopened by name: it may be replaced meanwhile).
            mapped = np.memmap(f, dtype=np.uint8, mode="c", offset=offset, shape=got)
    except (OSError, ValueError):
        return None
    with contextlib.suppress(OSError):
        os.utime(directory / f"{key}.json")  # recently used (the .idx's mtime is part of its identity: untouched)
    return mapped


def _source_identities(record: dict) -> list[dict]:
    """The identities (size, mtime, inode, device) of the sources a record lists; [] for a malformed one."""
    sources = record.get("sources")
    if not isinstance(sources, list):
        return []
    return [{k: s.get(k) for k in ("size", "mtime_ns", "ino", "dev")} for s in sources if isinstance(s, dict)]


def store(
    key: str, source: Path, array: np.ndarray, before: os.stat_result, checked_ns: int, published_sha256: str | None
) -> None:
    """Keep `array`, decoded from `source` after verifying it, as entry `key`.

    `before` is the source's stat taken before it was read and `checked_ns` the time then (time.time_ns()); nothing
    is stored when the source changed while it was read, or was written too recently to tell a later write from it,
    or when the decoded bytes are not the published ones. A cache that cannot be written is skipped silently.
    """
    directory = _trusted_dir()
    if directory is None or array.dtype != np.uint8 or before.st_mtime_ns + RACY_NS >= checked_ns:
        return
    try:
        if _identity(os.stat(source)) != _identity(before):
            return
    except OSError:
        return
    data = np.ascontiguousarray(array)
    header = _header(data.shape)
    content = hashlib.sha256(header)
    content.update(memoryview(data).cast("B"))
    sha = content.hexdigest()
    if published_sha256 is not None and sha != published_sha256:
        return
    source_record = {"path": os.path.abspath(source), **_identity(before)}
    sources = []
    old = _read_record(directory / f"{key}.json")
    if old is not None and old.get("schema") == SCHEMA_VERSION and isinstance(old.get("sources"), list) and (
        isinstance(old.get("entry"), dict) and old["entry"].get("sha256") == sha
    ):  # another copy of the same content: the record keeps the sources verified before (the .idx is rewritten,
        # whole: cheaper and surer than checking the old one's bytes)
        sources = [s for s in old["sources"] if isinstance(s, dict) and s.get("path") != source_record["path"]]
    try:
        st = _write_private(directory / f"{key}.idx", (header, memoryview(data).cast("B")))
        record = {
            "schema": SCHEMA_VERSION,
            "key": key,
            "sources": [*sources, source_record][-MAX_SOURCES:],
            "entry": {**_identity(st, with_device=False), "sha256": sha},
        }
        _write_private(directory / f"{key}.json", (json.dumps(record).encode(),))
    except OSError:
        return  # a full or read-only disk: the load itself succeeded, only the next one decodes again
    _bound(directory, key)


def _bound(directory: Path, keep: str) -> None:
    """Drop entries none of whose recorded sources is still there (a deleted scratch copy's), then the least
    recently used until the cache fits $FASTNN_DATASET_CACHE_MAX_MB; entry `keep` (just written) is kept."""
    for record_path in directory.glob("*.json"):
        key = record_path.stem
        record = _read_record(record_path)
        if key == keep or len(key) != 64 or record is None:
            continue  # not an entry's record, or one this user does not own: left alone
        alive = False
        for source in record.get("sources") or [] if record.get("schema") == SCHEMA_VERSION else []:  # old: never read
            try:
                alive = alive or _identity(os.stat(source["path"])) == {
                    k: source.get(k) for k in ("size", "mtime_ns", "ino", "dev")
                }
            except (OSError, KeyError, TypeError):
                continue
        if not alive:
            for suffix in (".idx", ".json"):
                with contextlib.suppress(OSError):
                    (directory / f"{key}{suffix}").unlink()
    evict(directory, max_bytes(MAX_MB_ENV), keep=keep)


def _write_private(path: Path, chunks: tuple[bytes | memoryview, ...]) -> os.stat_result:
    """Write `chunks` to `path` atomically, mode 0600 (`_files.replacing`); returns the file's stat as written
    (the folder is the user's alone, so nothing replaces the file between the rename and the stat)."""
    with _files.replacing(path, mode=0o600) as f:
        for chunk in chunks:
            f.write(chunk)
    return os.stat(path, follow_symlinks=False)
