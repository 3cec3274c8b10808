"""Checkpoint files: one .npz holding a format marker and version, the trainer's config as JSON, and arrays.

Arrays are the engine's state as `Engine.get_state` names it (parameters "0.weight", ..., optimizer
state "opt.<state>.<param>"). Files are written atomically and read without pickle, so loading a
file never runs code from it. A binary file object (io.BytesIO) takes the place of a path for a checkpoint kept
in memory (an estimator's pickle).

Reading trusts nothing in the file before checking it, in this order, so a hostile or damaged file costs
at most a few kilobytes plus what its config implies: the zip's member list; the marker, version and config
(small members with capped sizes); every member's name against the names the config implies; every .npy
header's shape and dtype against the config, and the zip entry's declared size against the header's byte
count; only then the data, exactly the declared bytes of each member.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from . import _files
from ._errors import ConfigError, DataError

__all__ = ["FORMAT", "VERSION", "load", "save"]

FORMAT = "fastnn-checkpoint"
#: Bumped when the layout changes incompatibly; `load` refuses files newer than it knows.
VERSION = 1

_FORMAT_KEY = "__fastnn_format__"
_VERSION_KEY = "__fastnn_version__"
_CONFIG_KEY = "__fastnn_config__"

#: Largest declared size of the marker and version members (a few hundred bytes in a real file).
_SMALL_MEMBER_BYTES = 4096
#: Largest declared size of the config member: JSON stored as UTF-32, mostly the history (~150 characters per
#: epoch, at most ~220), so ~200,000 epochs; a zip bomb in this member costs at most this much memory. `save`
#: refuses a config beyond it (Trainer.save keeps the last _history.SAVED_RECORDS epochs, well within it).
_CONFIG_MEMBER_BYTES = 128 << 20
#: Room left for the config member's .npy header when `save` checks its size against _CONFIG_MEMBER_BYTES.
_CONFIG_HEADER_ROOM = 4096
#: Largest .npy header read (numpy writes ~128 bytes; numpy itself refuses headers over 10,000 characters).
_HEADER_BYTES = 1 << 16
#: dtype kinds an array member may have (the engine writes float32; ints are accepted and checked by the caller).
_ARRAY_KINDS = "fiu"


def _is_file_object(path: Any, method: str) -> bool:
    """A binary file object (io.BytesIO, an open file) rather than a name: it has `method` ("read" or "write")."""
    return not isinstance(path, (str, bytes, os.PathLike)) and callable(getattr(path, method, None))


def _check_path(path: Any, what: str) -> Path:
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"{what} path must be a str, an os.PathLike or a binary file object, got {path!r}")
    try:
        return Path(path)
    except TypeError as exc:  # an os.PathLike whose __fspath__ returns bytes or something else
        raise ConfigError(f"{what} path must be a str or os.PathLike, got {path!r}") from exc


def save(path: str | os.PathLike[str] | BinaryIO, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write `config` (JSON-serialisable) and `arrays` to `path`: a temp file in the same folder, then os.replace.

    A crash or error midway leaves any existing file at `path` untouched and no temp file behind. A new file
    gets the umask's permissions (not mkstemp's 0600), like any file the user writes; a file replaced keeps
    its mode (a 0600 checkpoint stays private). After the rename the folder is fsynced, so the new name
    survives a power loss. A binary file object is written in place (nothing touches the disk for io.BytesIO).

    Raises:
        ConfigError: `path` is not a str, os.PathLike or binary file object.
        DataError: the config is larger than `load` reads (nothing is written); `path`'s folder does not exist,
            `path` is a folder, or the write fails (disk full, read-only file system, I/O error, name too long);
            the OSError is the cause, nothing is changed.
    """
    payload = _payload(path, config, arrays)
    if _is_file_object(path, "write"):
        np.savez(path, **payload)
        return
    path = _check_path(path, "checkpoint")
    parent = path.parent
    try:
        if not parent.is_dir():
            raise DataError(f"cannot save checkpoint {str(path)!r}: its folder {str(parent)!r} does not exist")
        if path.is_dir():
            raise DataError(f"cannot save checkpoint {str(path)!r}: it is a folder")
    except OSError as exc:  # a name too long, a folder we may not search
        raise DataError(f"cannot save checkpoint {str(path)!r}: {_files.reason(exc)}") from exc
    try:
        # A temp file in the same folder, then a rename: a new file gets the umask's mode, a replaced one keeps its.
        with _files.replacing(path, keep_mode=True, fsync=True) as f:
            np.savez(f, **payload)
    except OSError as exc:
        raise DataError(
            f"cannot save checkpoint {str(path)!r}: {_files.reason(exc)}; the previous file, if any, is unchanged"
        ) from exc
    try:
        _files.sync_folder(parent)  # the rename itself survives a power loss
    except OSError as exc:
        raise DataError(
            f"checkpoint {str(path)!r} was written but its folder could not be synced: {exc.strerror or exc}"
        ) from exc


def _payload(path: Any, config: dict[str, Any], arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The members of the .npz; DataError when the config member is larger than `load` reads (save never writes
    a file load refuses)."""
    text = np.array(json.dumps(config, allow_nan=False))  # strict JSON: any tool reads it
    if text.nbytes > _CONFIG_MEMBER_BYTES - _CONFIG_HEADER_ROOM:
        raise DataError(
            f"not saving checkpoint {_name(path)}: its config and history take {text.nbytes} bytes, more than the "
            f"{_CONFIG_MEMBER_BYTES} load reads; nothing was written"
        )
    payload: dict[str, np.ndarray] = {
        _FORMAT_KEY: np.array(FORMAT),
        _VERSION_KEY: np.array(VERSION, dtype=np.int64),
        _CONFIG_KEY: text,
    }
    for name, arr in arrays.items():
        if name.startswith("__fastnn_"):
            raise ValueError(f"array name {name!r} is reserved for the checkpoint format")
        payload[name] = np.asarray(arr)
    return payload


def _name(path: Any) -> str:
    """How messages name the checkpoint: its path quoted, or the file object."""
    return repr(str(path)) if isinstance(path, (str, os.PathLike)) else f"<{type(path).__name__}>"


ExpectedShapes = Callable[[dict[str, Any]], Mapping[str, tuple[int, ...]]]


def load(
    path: str | os.PathLike[str] | BinaryIO, expect: ExpectedShapes | None = None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config, arrays) of a checkpoint written by `save`.

    Args:
        path: the .npz file, or a seekable binary file object holding it (io.BytesIO).
        expect: config -> {array name: shape}, the arrays that config implies. The file must hold exactly
            these, with these shapes, which is checked from the headers before any array data is read. A
            KeyError/TypeError/ValueError from it means the config is invalid (a DataError naming the file).
            Without it every member is read after its header is checked against its declared size.

    Raises:
        ConfigError: `path` is not a str, os.PathLike or binary file object.
        DataError: the file is missing, not an .npz, not a fastnn checkpoint, from a newer format, or its
            members disagree with its config or with their own headers.
    """
    if _is_file_object(path, "read"):
        return _load_from(path, Path(_name(path)), f"checkpoint {_name(path)}", expect)
    path = _check_path(path, "checkpoint")
    where = f"checkpoint {str(path)!r}"
    try:
        is_file = path.is_file()
    except OSError as exc:
        raise DataError(f"cannot read {where}: {_files.reason(exc)}") from exc
    if not is_file:
        raise DataError(f"{where} does not exist or is not a file")
    try:
        with open(path, "rb") as raw:
            return _load_from(raw, path, where, expect)
    except OSError as exc:
        raise DataError(f"cannot read {where}: {_files.reason(exc)}") from exc


def _load_from(
    raw: BinaryIO, path: Path, where: str, expect: ExpectedShapes | None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """`load` from an open binary file."""
    try:
        if raw.read(6) == b"\x93NUMPY":
            raise DataError(f"{str(path)!r} is not a fastnn checkpoint: it holds one .npy array, not an .npz archive")
        raw.seek(0)
        with zipfile.ZipFile(raw) as zf:
            return _read(zf, path, where, expect)
    except DataError:
        raise
    except (OSError, EOFError, zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, RuntimeError) as exc:
        # RuntimeError: encrypted members; NotImplementedError: unknown compression methods.
        raise DataError(f"{str(path)!r} is not a fastnn checkpoint: cannot read it as .npz ({exc})") from exc


def _members(zf: zipfile.ZipFile, path: Path) -> dict[str, zipfile.ZipInfo]:
    members: dict[str, zipfile.ZipInfo] = {}
    for info in zf.infolist():
        if not info.filename.endswith(".npy"):
            raise DataError(f"{str(path)!r} is not a fastnn checkpoint: member {info.filename!r} is not an .npy array")
        key = info.filename[: -len(".npy")]
        if key in members:
            raise DataError(f"{str(path)!r} is not a fastnn checkpoint: member {info.filename!r} appears twice")
        members[key] = info
    return members


def _read(
    zf: zipfile.ZipFile, path: Path, where: str, expect: ExpectedShapes | None
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    members = _members(zf, path)
    if _FORMAT_KEY not in members:
        raise DataError(f"{str(path)!r} is not a fastnn checkpoint: it has no {FORMAT!r} marker")
    marker = _read_member(zf, members[_FORMAT_KEY], where, "U", (), _SMALL_MEMBER_BYTES)
    if str(marker) != FORMAT:
        raise DataError(f"{str(path)!r} is not a fastnn checkpoint: it has no {FORMAT!r} marker")
    for key in (_VERSION_KEY, _CONFIG_KEY):
        if key not in members:
            raise DataError(f"{where} is damaged: it has no {key!r} member")
    version_arr = _read_member(zf, members[_VERSION_KEY], where, "iu", (), _SMALL_MEMBER_BYTES)
    version = int(version_arr)
    if version < 1:
        raise DataError(f"{where} is damaged: format version {version} (versions start at 1)")
    if version > VERSION:
        raise DataError(
            f"{where} has format version {version}, newer than this fastnn reads ({VERSION}); upgrade fastnn"
        )
    text = str(_read_member(zf, members[_CONFIG_KEY], where, "U", (), _CONFIG_MEMBER_BYTES))
    try:
        config = json.loads(text)
    except RecursionError as exc:
        raise DataError(f"{where} is damaged: its config is nested too deeply to be a fastnn config") from exc
    except ValueError as exc:
        raise DataError(f"{where} is damaged: its config is not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise DataError(f"{where} is damaged: its config is a JSON {type(config).__name__}, not an object")
    names = [k for k in members if not k.startswith("__fastnn_")]
    if expect is None:
        shapes: Mapping[str, tuple[int, ...] | None] = dict.fromkeys(names)
    else:
        try:
            shapes = expect(config)
        except KeyError as exc:
            raise DataError(f"{where} holds an invalid config: no entry {exc}") from exc
        except (TypeError, ValueError, RecursionError) as exc:  # ConfigError is a ValueError
            raise DataError(f"{where} holds an invalid config: {exc}") from exc
        missing = [n for n in shapes if n not in members]
        unexpected = [n for n in names if n not in shapes]
        if missing or unexpected:
            raise DataError(f"{where} does not match the model: missing {missing}, unexpected {unexpected}")
    # Every header before any data: a member that lies about its size is found before anything is allocated.
    plans = {name: _plan_member(zf, members[name], where, _ARRAY_KINDS, shape) for name, shape in shapes.items()}
    arrays = {name: _read_planned(zf, members[name], where, plan) for name, plan in plans.items()}
    return config, arrays


_Plan = tuple[tuple[int, ...], bool, np.dtype, int]


def _plan_member(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str, kinds: str, shape: tuple[int, ...] | None
) -> _Plan:
    """(shape, fortran_order, dtype, header bytes) of a member's .npy header, checked against `kinds`, `shape`
    and the zip entry's declared uncompressed size; reads the header only (at most a few KiB)."""
    what = f"{where} member {info.filename!r}"
    with zf.open(info) as member:
        f = _Capped(member, _HEADER_BYTES)
        try:
            major, minor = np.lib.format.read_magic(f)
            if (major, minor) == (1, 0):
                got_shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif (major, minor) == (2, 0):
                got_shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"unsupported .npy format version {major}.{minor}")
        except (ValueError, TypeError, SyntaxError, RecursionError) as exc:
            # Bad magic, a header longer than _HEADER_BYTES or unparsable, an object dtype (pickle).
            raise DataError(f"{what} has no valid .npy header: {exc}") from exc
        header = f.consumed
    if any(d < 0 for d in got_shape):
        raise DataError(f"{what} has a negative dimension in its shape {tuple(got_shape)}")
    if dtype.hasobject or dtype.fields is not None or dtype.kind not in kinds:
        raise DataError(f"{what} has dtype {dtype}, expected one of the kinds {kinds!r} (object arrays are refused)")
    if shape is not None and tuple(got_shape) != tuple(shape):
        raise DataError(f"{what} has shape {tuple(got_shape)}, the config implies {tuple(shape)}")
    nbytes = math.prod(got_shape) * dtype.itemsize
    if info.file_size != header + nbytes:
        raise DataError(
            f"{what} declares {info.file_size} bytes, but its header (shape {tuple(got_shape)}, {dtype}) "
            f"implies {header + nbytes}"
        )
    return tuple(got_shape), bool(fortran), dtype, header


def _read_planned(zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str, plan: _Plan) -> np.ndarray:
    """The member's array: exactly the bytes its checked header declares (zipfile checks the CRC at the end),
    read in chunks into the array itself, so a large array costs its own size and no copy."""
    shape, fortran, dtype, header = plan
    nbytes = math.prod(shape) * dtype.itemsize
    try:
        out = np.empty(nbytes, dtype=np.uint8)
    except (MemoryError, ValueError) as exc:
        raise DataError(f"{where} member {info.filename!r} needs {nbytes} bytes, more than this machine has") from exc
    view, got = memoryview(out), 0
    with zf.open(info) as f:
        f.read(header)
        while got < nbytes:
            chunk = f.read(min(nbytes - got, 1 << 24))
            if not chunk:
                break
            view[got : got + len(chunk)] = chunk
            got += len(chunk)
        if got != nbytes or f.read(1):
            raise DataError(f"{where} member {info.filename!r} is truncated: {got} of {nbytes} data bytes")
    return out.view(dtype).reshape(shape, order="F" if fortran else "C")


def _read_member(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, where: str, kinds: str, shape: tuple[int, ...] | None, cap: int
) -> np.ndarray:
    """A small metadata member: refused when its zip entry declares more than `cap` bytes, before reading."""
    if info.file_size > cap:
        raise DataError(
            f"{where} member {info.filename!r} declares {info.file_size} bytes, more than the {cap} a fastnn "
            f"checkpoint's metadata takes"
        )
    return _read_planned(zf, info, where, _plan_member(zf, info, where, kinds, shape))


class _Capped:
    """A read-only view of a stream that refuses to read past `cap` bytes: an .npy header declares its own
    length (up to 4 GiB in format 2.0), and numpy reads all of it before checking it against its own limit."""

    def __init__(self, f: Any, cap: int) -> None:
        self._f, self._cap, self.consumed = f, cap, 0

    def read(self, n: int = -1) -> bytes:
        if n < 0 or self.consumed + n > self._cap:
            raise ValueError(f"the .npy header is longer than {self._cap} bytes")
        data = self._f.read(n)
        self.consumed += len(data)
        return data
