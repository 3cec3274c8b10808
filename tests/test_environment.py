"""Mixed CUDA installations are detected from package metadata and explained; `fastnn --version`."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

import fastnn
from fastnn._environment import cuda_packages


def _dists(*pairs):
    return lambda: [SimpleNamespace(metadata={"Name": n}, version=v) for n, v in pairs]


CU12 = [("cuda-bindings", "12.9.1"), ("nvidia-cublas-cu12", "12.9.1.4"), ("nvidia-cudnn-cu12", "9.10.2.21"),
        ("nvidia-cuda-nvrtc-cu12", "12.9.86")]  # fmt: skip
CU13 = [("cuda-bindings", "13.0.2"), ("nvidia-cublas", "13.1.0.3"), ("nvidia-cudnn-cu13", "9.13.0.50"),
        ("nvidia-cuda-nvrtc", "13.0.88")]  # fmt: skip


@pytest.mark.parametrize("pairs", [CU12, CU13, [("numpy", "2.0")]], ids=["cu12", "cu13", "cpu-only"])
def test_coherent_installations_have_no_problem(pairs):
    pk = cuda_packages(_dists(*pairs))
    assert pk.problem() is None
    assert "mixed" not in pk.summary()


def test_torch_beside_cu12_is_explained():
    """torch (CUDA 13) replaced cuda-bindings 12 with 13 and added CUDA 13 libraries beside the CUDA 12 wheels."""
    pairs = [("cuda-bindings", "13.0.2"), *CU12[1:], ("nvidia-cublas", "13.1.0.3"), ("nvidia-cuda-nvrtc", "13.0.88")]
    problem = cuda_packages(_dists(*pairs)).problem()
    assert problem is not None
    for words in ("mixed CUDA installation", "cuda-bindings 13.0.2 (CUDA 13)", "nvidia-cublas-cu12 12.9.1.4 (CUDA 12)",
                  'pip install -e ".[cu13]"', "pip uninstall nvidia-cublas-cu12"):  # fmt: skip
        assert words in problem, (words, problem)


def test_bindings_12_with_cuda_13_libraries_say_pin_the_bindings():
    pairs = [("cuda-bindings", "12.9.1"), *CU13[1:]]
    assert 'pip install "cuda-bindings>=12,<13"' in cuda_packages(_dists(*pairs)).problem()


def test_version_flag():
    out = subprocess.run([sys.executable, "-m", "fastnn", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"fastnn {fastnn.__version__}"


@pytest.mark.bindings
def test_info_has_one_line_per_row_and_reports_the_packages():
    from fastnn._info import info_lines

    lines, _ = info_lines()
    assert all("\n" not in line for line in lines)
    assert any(line.startswith("CUDA packages:") for line in lines)
