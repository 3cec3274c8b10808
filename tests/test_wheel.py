"""The built wheel holds exactly the source tree's package files and kernel sources.

A hand-kept package list once shipped a wheel without fastnn/engine/grid/ (engine="auto" then trained 2-4x slower
with no word). CI builds the wheel and the sdist (.ci/run) and passes the wheel as FASTNN_WHEEL; elsewhere this test
builds one from a copy of the tree (the copy keeps build/ and egg-info out of the checkout).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: What the build reads: the packages, the kernels, and the files pyproject.toml names.
_BUILD_INPUTS = ("fastnn", "native", "pyproject.toml", "setup.py", "README.md", "LICENSE")


def _source_files() -> set[str]:
    """The paths a wheel must hold, from the source tree: every module under fastnn/, its py.typed, and every
    native/*.cu and *.cuh as fastnn/native/ (pyproject.toml's package-dir)."""
    modules = {
        "fastnn/" + p.relative_to(REPO / "fastnn").as_posix()
        for p in (REPO / "fastnn").rglob("*.py")
        if "__pycache__" not in p.parts
    }
    kernels = {f"fastnn/native/{p.name}" for p in (REPO / "native").iterdir() if p.suffix in (".cu", ".cuh")}
    return modules | kernels | {"fastnn/py.typed"}


def _build_wheel(out: Path) -> Path:
    """A wheel built by pip from a copy of the build's inputs; skips (saying why) where none can be built."""
    src = out / "src"
    src.mkdir()
    for name in _BUILD_INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif (REPO / name).exists():
            shutil.copy2(REPO / name, src / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-q", "-w", str(out), str(src)]
    if _has_new_setuptools():  # no isolated build environment to download
        cmd.insert(4, "--no-build-isolation")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        pytest.skip("building a wheel took over 10 minutes here (no package index?); CI passes FASTNN_WHEEL")
    wheels = sorted(out.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        pytest.skip(f"no wheel could be built here (pip wheel: {(proc.stdout + proc.stderr)[-500:]}); "
                    "CI builds one and passes FASTNN_WHEEL")  # fmt: skip
    return wheels[0]


def _has_new_setuptools() -> bool:
    if importlib.util.find_spec("setuptools") is None:
        return False
    import setuptools

    return int(setuptools.__version__.split(".")[0]) >= 77  # pyproject.toml's build-system requirement


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("FASTNN_WHEEL")
    if given:  # CI's wheel: a path given must be there, never a skip
        assert Path(given).is_file(), f"FASTNN_WHEEL={given!r} is not a file"
        return Path(given)
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_holds_every_package_and_kernel_file(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        held = {n for n in zf.namelist() if n.startswith("fastnn/")}
    expected = _source_files()
    assert {"fastnn/engine/grid/__init__.py", "fastnn/native/grid.cuh"} <= expected  # the tree is what we think
    assert not expected - held, f"{wheel.name} lacks {sorted(expected - held)}"
    assert not held - expected, f"{wheel.name} holds files the source tree has not: {sorted(held - expected)}"


def test_every_source_folder_is_a_package() -> None:
    """The package list is found from the __init__.py files (setup.py): a folder of modules without one would be
    left out of the wheel."""
    folders = {p.parent for p in (REPO / "fastnn").rglob("*.py") if "__pycache__" not in p.parts}
    assert [str(f) for f in sorted(folders) if not (f / "__init__.py").is_file()] == []
