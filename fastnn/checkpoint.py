"""Checkpoint files: one .npz holding a format marker and version, the trainer's config as JSON, and arrays.

Arrays are the engine's state as `Engine.get_state` names it (parameters "0.weight", ..., optimizer
state "opt.<state>.<param>"). Files are written atomically and read without pickle, so loading a
file never runs code from it.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .datasets import _temp_beside
from .errors import DataError

__all__ = ["FORMAT", "VERSION", "load", "save"]

FORMAT = "fastnn-checkpoint"
#: Bumped when the layout changes incompatibly; `load` refuses files newer than it knows.
VERSION = 1

_FORMAT_KEY = "__fastnn_format__"
_VERSION_KEY = "__fastnn_version__"
_CONFIG_KEY = "__fastnn_config__"


def save(path: str | os.PathLike[str], config: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Write `config` (JSON-serialisable) and `arrays` to `path`: a temp file in the same folder, then os.replace.

    A crash or error midway leaves any existing file at `path` untouched and no temp file behind. The
    file gets the umask's permissions (not mkstemp's 0600), like any file the user writes.

    Raises:
        DataError: `path`'s folder does not exist, or `path` is a folder (nothing is written).
    """
    path = Path(path)
    parent = path.parent
    if not parent.is_dir():
        raise DataError(f"cannot save checkpoint {str(path)!r}: its folder {str(parent)!r} does not exist")
    if path.is_dir():
        raise DataError(f"cannot save checkpoint {str(path)!r}: it is a folder")
    payload: dict[str, np.ndarray] = {
        _FORMAT_KEY: np.array(FORMAT),
        _VERSION_KEY: np.array(VERSION, dtype=np.int64),
        _CONFIG_KEY: np.array(json.dumps(config)),
    }
    for name, arr in arrays.items():
        if name.startswith("__fastnn_"):
            raise ValueError(f"array name {name!r} is reserved for the checkpoint format")
        payload[name] = np.asarray(arr)
    tmp = _temp_beside(path)  # same folder, so os.replace is an atomic rename
    try:
        with open(tmp, "xb") as f:
            np.savez(f, **payload)
            f.flush()
            os.fsync(f.fileno())  # the data is on disk before the rename makes it visible
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(config, arrays) of a checkpoint written by `save`.

    Raises:
        DataError: the file is missing, not an .npz, not a fastnn checkpoint, or from a newer format.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"checkpoint {str(path)!r} does not exist or is not a file")
    try:
        npz = np.load(path, allow_pickle=False)
        if not isinstance(npz, np.lib.npyio.NpzFile):
            raise DataError(f"{str(path)!r} is not a fastnn checkpoint: it holds one .npy array, not an .npz archive")
        with npz:
            files = {k: npz[k] for k in npz.files}
    except DataError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise DataError(f"{str(path)!r} is not a fastnn checkpoint: cannot read it as .npz ({exc})") from exc
    if _FORMAT_KEY not in files or str(files[_FORMAT_KEY]) != FORMAT:
        raise DataError(f"{str(path)!r} is not a fastnn checkpoint: it has no {FORMAT!r} marker")
    try:
        version = int(files[_VERSION_KEY])
        config = json.loads(str(files[_CONFIG_KEY]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"checkpoint {str(path)!r} is damaged: {exc!r}") from exc
    if version > VERSION:
        raise DataError(
            f"checkpoint {str(path)!r} has format version {version}, newer than this fastnn reads ({VERSION}); "
            f"upgrade fastnn"
        )
    arrays = {k: v for k, v in files.items() if not k.startswith("__fastnn_")}
    return config, arrays
