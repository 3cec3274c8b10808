"""Checkpoint surgery for the tests that feed `Trainer.load` a damaged file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np


def rewrite(src: Path, dst: Path, edit: Callable[[dict, dict], None]) -> Path:
    """Copy checkpoint src to dst with `edit(config, arrays)` applied, bypassing the format's own writer."""
    with np.load(src) as npz:
        files = dict(npz.items())
    config = json.loads(str(files["__fastnn_config__"]))
    arrays = {k: v for k, v in files.items() if not k.startswith("__fastnn_")}
    meta = {k: v for k, v in files.items() if k.startswith("__fastnn_")}
    edit(config, arrays)
    meta["__fastnn_config__"] = np.array(json.dumps(config))
    np.savez(dst, **meta, **arrays)
    return dst
