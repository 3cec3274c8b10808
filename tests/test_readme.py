"""The README's quick start runs as written on a CPU-only install (cuda-bindings made unimportable)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from _data import fashion_dir, where

README = Path(__file__).resolve().parents[1] / "README.md"

#: Run before a block: make every `cuda` module unimportable, as on `pip install fastnn-cuda` without an extra.
NO_CUDA = """
import importlib.abc, sys
class _NoCuda(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "cuda" or name.startswith("cuda."):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, _NoCuda())
"""


def quick_start_blocks() -> list[str]:
    text = README.read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_CUDA + code], capture_output=True, text=True, env=env,
                          cwd=README.parent, timeout=600)  # fmt: skip


def test_the_quick_start_has_the_two_blocks():
    blocks = quick_start_blocks()
    assert len(blocks) == 2 and "fastnn.Trainer" in blocks[0] and "fastnn.sklearn" in blocks[1]


def test_quick_start_trainer_runs_on_a_cpu_only_install():
    folder = fashion_dir()
    if folder is None:
        pytest.skip(f"Fashion-MNIST not found in {where()}: the quick start would download it")
    env = dict(os.environ, FASTNN_DATA=str(folder))  # where the block's load() looks first
    out = _run(quick_start_blocks()[0], env)
    assert out.returncode == 0, out.stderr
    accuracy = float(re.search(r"'accuracy': ([0-9.]+)", out.stdout).group(1))
    assert accuracy > 0.83, out.stdout  # the README says "about 0.85"
    assert "training on the CPU" in out.stderr and 'pip install "fastnn-cuda[cu12]"' in out.stderr  # what to install


def test_quick_start_sklearn_runs_on_a_cpu_only_install():
    pytest.importorskip("sklearn")
    out = _run(quick_start_blocks()[1], dict(os.environ))
    assert out.returncode == 0, out.stderr
    assert float(out.stdout.strip().splitlines()[-1]) > 0.95, out.stdout  # the README says "about 0.97"
    assert "ConvergenceWarning" not in out.stderr, out.stderr  # max_iter=50 is enough: it stops on tol
