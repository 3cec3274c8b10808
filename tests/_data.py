"""Where tests find Fashion-MNIST: where `fastnn.datasets` looks (root, $FASTNN_DATA, ~/.cache/fastnn, Debian's
package), then the repository's shared data folder."""

from __future__ import annotations

from pathlib import Path

import fastnn
from fastnn import DataError

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "fashion-mnist"


def fashion_mnist():
    """(x_train, y_train, x_test, y_test) from the first folder holding valid files, or None (never downloads)."""
    folder = fashion_dir()
    return None if folder is None else fastnn.datasets.load("fashion-mnist", root=folder, download=False)


def fashion_dir() -> Path | None:
    """The first folder holding valid Fashion-MNIST files, or None."""
    for folder in [*fastnn.datasets.search_dirs("fashion-mnist"), SHARED]:
        if folder.is_dir():
            try:
                fastnn.datasets.load("fashion-mnist", root=folder, download=False)
            except DataError:
                continue
            return folder
    return None


def where() -> str:
    """The folders searched, for skip messages."""
    return ", ".join(str(f) for f in [*fastnn.datasets.search_dirs("fashion-mnist"), SHARED])
