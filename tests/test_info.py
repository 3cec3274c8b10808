"""`python -m fastnn info`, fastnn._device.cuda_status, and the rule that nothing above fastnn/cuda uses ctypes."""

from __future__ import annotations

import importlib.machinery
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from test_readme import NO_CUDA

import fastnn._device
from fastnn import _info as info
from fastnn.__main__ import main
from fastnn._device import cuda_status, require_cuda
from fastnn._errors import DeviceUnavailable

REPO = Path(__file__).resolve().parents[1]
USABLE, REASON = cuda_status()


def _lines(text: str) -> dict[str, str]:
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


@pytest.mark.bindings
def test_info_command_runs_and_reports():
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "fastnn", "info"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {k: v.strip() for k, v in _lines(proc.stdout).items()}
    for key in ("fastnn", "Python", "numpy", "cuda-bindings", "cuda-pathfinder", "Driver", "GPU"):
        assert key in rows, proc.stdout
    assert rows["fastnn"] == fastnn.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", rows["cuda-bindings"])
    assert re.match(r"\d+\.\d+\.\d+ at /.*libcublasLt", rows["cuBLASLt"]), rows["cuBLASLt"]
    assert re.match(r"\d+\.\d+\.\d+ at /.*libcudnn", rows["cuDNN"]), rows["cuDNN"]
    assert re.match(r"\d+\.\d+ at /.*libnvrtc", rows["NVRTC"]), rows["NVRTC"]
    # Optional: its version and path where installed, else that it is missing and which extra brings it.
    assert re.match(r"\d+\.\d+\.\d+ at /.*libnccl", rows["NCCL"]) or (
        rows["NCCL"].startswith("not installed") and "multi-cu12" in rows["NCCL"]
    ), rows["NCCL"]
    if USABLE:
        assert re.match(r"CUDA \d+\.\d+", rows["Driver"])
        assert "SMs" in rows["GPU"] and "sm_" in rows["GPU"]
    else:
        assert rows["GPU"].startswith("none: ")
        assert "Self-test" not in rows


def test_main_without_a_command_prints_help(capsys):
    assert main([]) == 2
    assert "info" in capsys.readouterr().out


def test_format_version():
    assert info.format_version(120903) == "12.9.3"
    assert info.format_version(92800) == "9.28.0"
    assert info.format_version(130100) == "13.1.0"


def _fake_selftest(monkeypatch, run):
    module = types.ModuleType("fastnn.cuda.selftest")
    module.__spec__ = importlib.machinery.ModuleSpec("fastnn.cuda.selftest", None)
    module.run_selftest = run
    monkeypatch.setitem(sys.modules, "fastnn.cuda.selftest", module)
    monkeypatch.setattr(fastnn._device, "cuda_status", lambda: (True, "Fake GPU"))


@pytest.mark.bindings
def test_selftest_line_is_printed(monkeypatch, capsys):
    _fake_selftest(monkeypatch, lambda: "GEMM + softmax ok (max error 1e-7)")
    assert info.run_info() == 0
    assert _lines(capsys.readouterr().out)["Self-test"].strip() == "GEMM + softmax ok (max error 1e-7)"


@pytest.mark.bindings
def test_failed_selftest_exits_1(monkeypatch, capsys):
    def boom() -> str:
        raise RuntimeError("softmax mismatch")

    _fake_selftest(monkeypatch, boom)
    assert info.run_info() == 1
    line = _lines(capsys.readouterr().out)["Self-test"]
    assert "FAILED" in line and "softmax mismatch" in line


def test_cuda_status_is_cached_and_consistent():
    assert cuda_status() is cuda_status()
    usable, reason = cuda_status()
    assert isinstance(usable, bool) and isinstance(reason, str) and reason
    if usable:
        require_cuda()
    else:
        with pytest.raises(DeviceUnavailable) as err:
            require_cuda()
        assert str(err.value) == reason


@pytest.mark.skipif(USABLE, reason="this machine has a usable GPU")
def test_cuda_status_without_gpu_says_why():
    assert USABLE is False
    assert "fix" in REASON or "nvidia-smi" in REASON


def test_cuda_status_never_raises(monkeypatch):
    def broken() -> tuple[bool, str]:
        raise ZeroDivisionError("unexpected")

    monkeypatch.setattr(fastnn._device, "_probe", broken)
    fastnn._device.cuda_status.cache_clear()
    try:
        usable, reason = fastnn._device.cuda_status()
        assert usable is False and "ZeroDivisionError" in reason
    finally:
        fastnn._device.cuda_status.cache_clear()


@pytest.mark.bindings
def test_cuda_status_reports_a_missing_library(monkeypatch):
    from fastnn.cuda import _loader, driver

    def missing(libname: str):
        raise DeviceUnavailable(f"cannot load NVIDIA library {libname!r}: gone; fix: {_loader.INSTALL_HINT}")

    monkeypatch.setattr(driver, "device_count", lambda: 1)
    monkeypatch.setattr(_loader, "load_library", missing)
    fastnn._device.cuda_status.cache_clear()
    try:
        usable, reason = fastnn._device.cuda_status()
        assert usable is False and "cublasLt" in reason and 'pip install -e ".[cu12]"' in reason
    finally:
        fastnn._device.cuda_status.cache_clear()


_LOADS_ONCE = """
import collections
import cuda.pathfinder._dynamic_libs.load_nvidia_dynamic_lib as pf
loads = collections.Counter()
real = pf._load_lib_no_cache
pf._load_lib_no_cache = lambda name: loads.update([name]) or real(name)
from fastnn.cuda import cublaslt, cudnn, driver
driver.device_count = lambda: 1  # no driver needed: the probe's library loading is what is counted
driver.device_name = lambda ordinal=0: "Fake GPU"
import fastnn._device
assert fastnn._device.cuda_status() == (True, "Fake GPU"), fastnn._device.cuda_status()
probed = dict(loads)
cublaslt._lib(); cudnn._lib()
from cuda.bindings import nvrtc
nvrtc.nvrtcVersion()
assert dict(loads) == probed and all(loads[n] == 1 for n in ("cublasLt", "cudnn", "nvrtc")), loads
"""


@pytest.mark.bindings
def test_the_probe_loads_each_library_once_and_the_engines_reuse_it():
    """issue 26: the libraries cuda_status loads (cuBLASLt, cuDNN, NVRTC) are the very ones the bindings then use,
    never found or opened a second time."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", _LOADS_ONCE], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr


#: `fastnn info` with no `cuda` module importable (test_readme's NO_CUDA) and no CUDA wheel in the metadata, as on
#: a CPU-only install.
_NO_CUDA = NO_CUDA + """
import fastnn._environment as e
e.cuda_packages = lambda *a: e.CudaPackages(None, ())
from fastnn.__main__ import main
sys.exit(main(["info"]))
"""


def test_info_without_cuda_packages_says_so_in_one_line():
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", _NO_CUDA], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("No module named") == 0, proc.stdout
    rows = {k: v.strip() for k, v in _lines(proc.stdout).items()}
    assert rows["CUDA"].startswith("no CUDA packages installed: CPU only")
    assert 'pip install -e ".[cu12]"' in rows["CUDA"]
    assert rows["GPU"] == "none (no CUDA packages)"
    assert rows["Engines"].startswith("numpy ok, graph needs the CUDA packages"), rows["Engines"]  # not MISSING
    assert "cuBLASLt" not in rows and "Driver" not in rows


def test_info_with_its_reader_gone_prints_no_traceback():
    """`fastnn info | head -1`: the pipe closes before the report is written."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "fastnn", "info"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)  # fmt: skip
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_info_says_which_distribution_and_where(monkeypatch):
    lines, _ = info.info_lines()
    row = _lines("\n".join(lines))["Installed"]
    assert "fastnn-cuda" in row and str(Path(fastnn.__file__).parent) in row  # the checkout, or the installed wheel
    monkeypatch.setattr(info, "other_project_version", lambda: "0.4.0")
    row = _lines("\n".join(info.info_lines()[0]))["Installed"]
    assert "'fastnn' 0.4.0 is installed too, another project" in row and "pip uninstall fastnn" in row


def test_info_lists_each_engine_and_calls_a_missing_one_a_broken_install(monkeypatch, capsys):
    """A wheel without fastnn/engine/grid/ trained without its grid engine and said nothing: `fastnn info` names
    each engine, whether it imports, and exits 1 when fastnn's own module is missing (reinstall)."""
    lines, code = info.info_lines()
    row = _lines("\n".join(lines))["Engines"]
    assert [part.split()[0] for part in row.strip().split(", ")] == ["numpy", "graph", "fused", "grid"], row
    assert "numpy ok" in row and "MISSING" not in row and code in (0, 1)  # 1: only a failed GPU self-test
    monkeypatch.setitem(sys.modules, "fastnn.engine.grid", None)  # its import raises ImportError naming it
    assert main(["info"]) == 1
    row = _lines(capsys.readouterr().out)["Engines"]
    assert "grid MISSING (" in row and "fastnn.engine.grid" in row and "reinstall fastnn" in row, row
    assert "numpy ok" in row
