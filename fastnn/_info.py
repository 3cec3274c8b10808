"""`python -m fastnn info`: what fastnn finds here (versions, CUDA libraries, driver, GPU), for bug reports."""

from __future__ import annotations

import importlib
import importlib.util
import os
import platform
import re
import sys
from collections.abc import Callable
from typing import TextIO

from ._install import DISTRIBUTION, OTHER_PROJECT, installed_version, other_project_version, pip_install

__all__ = ["ENGINES", "engine_status", "format_version", "info_lines", "run_info"]

# (label, pathfinder name, fastnn.cuda module whose version() reads the library's own version number)
_LIBRARIES = (("cuBLASLt", "cublasLt", "cublaslt"), ("cuDNN", "cudnn", "cudnn"))
#: Every engine (engine/select.py's names, and the CPU's): its package or module and the class that imports its code.
ENGINES = (
    ("numpy", "fastnn.engine.numpy_engine", "NumpyEngine"),
    ("graph", "fastnn.engine.graph", "GraphEngine"),
    ("fused", "fastnn.engine.fused", "FusedEngine"),
    ("grid", "fastnn.engine.grid", "GridEngine"),
)


def format_version(number: int) -> str:
    """cuBLAS/cuDNN style major*10000 + minor*100 + patch as "major.minor.patch" (120903 -> "12.9.3")."""
    return f"{number // 10000}.{number // 100 % 100}.{number % 100}"


def _safe(fn: Callable[[], str], failed: str = "not found") -> str:
    """fn()'s text, or the failure in words: one broken probe must not hide the rest of the report."""
    try:
        return fn()
    except Exception as exc:
        return f"{failed}: {exc}"


def _package_version(module: str) -> str:
    return str(getattr(importlib.import_module(module), "__version__", "unknown"))


def _library(libname: str, module: str) -> str:
    from .cuda._loader import library_path

    path = library_path(libname)
    try:
        number = importlib.import_module(f"fastnn.cuda.{module}").version()
        version = format_version(number)
    except Exception as exc:
        version = f"version unknown ({exc})"
    return f"{version} at {path}"


def _nvrtc() -> str:
    from .cuda._loader import library_path
    from .cuda.nvrtc import nvrtc_version

    major, minor = nvrtc_version()
    return f"{major}.{minor} at {library_path('nvrtc')}"


def _nccl() -> str:
    """NCCL's version and path, or why not (optional: only fastnn.distributed needs it)."""
    from .cuda import nccl
    from .cuda._loader import library_path

    ok, what = nccl.available()
    return f"{nccl.version()} at {library_path('nccl')}" if ok else f"not installed (optional, multi-GPU): {what}"


def _driver() -> str:
    from .cuda.driver import driver_version

    number = driver_version()
    return f"CUDA {number // 1000}.{number % 1000 // 10}"


def _installed() -> str:
    """Which distribution provides fastnn and where it was imported from; the other project named `fastnn`
    on the package index, when installed, shares the import name and is named with the fix."""
    here = os.path.dirname(os.path.abspath(__file__))
    version = installed_version()
    line = f"{DISTRIBUTION} {version}" if version else f"{DISTRIBUTION} not installed (run from a source checkout)"
    line += f", imported from {here}"
    other = other_project_version()
    if other is not None:
        line += (
            f"; WARNING: {OTHER_PROJECT!r} {other} is installed too, another project that shares the import name "
            f"fastnn: pip uninstall {OTHER_PROJECT}, then {pip_install()}"
        )
    return line


def engine_status() -> tuple[str, bool]:
    """Each engine and whether it imports, in one line, and whether fastnn's own files are all there: an engine
    module missing from the installation (a wheel without fastnn/engine/grid/) is a broken install, while one that
    needs the CUDA packages (not installed: a CPU-only install) is not."""
    parts, complete = [], True
    for name, module, cls in ENGINES:
        try:
            getattr(importlib.import_module(module), cls)  # the packages import their engine on first use
            parts.append(f"{name} ok")
        except ImportError as exc:
            found = re.search(r"named '([^']+)'", str(exc))
            missing = exc.name or (found.group(1) if found else "")
            if missing.split(".")[0] in ("cuda", "nvidia"):
                parts.append(f"{name} needs the CUDA packages ({missing} is not installed)")
            else:  # fastnn's own module, or one it cannot name
                complete = False
                parts.append(f"{name} MISSING ({exc}; reinstall fastnn)")
        except Exception as exc:
            parts.append(f"{name} failed to import ({type(exc).__name__}: {exc})")
    return ", ".join(parts), complete


def _cuda_installed() -> bool:
    """Whether any CUDA package is installed: cuda-bindings importable, or a CUDA wheel in the metadata."""
    from ._environment import cuda_packages

    try:
        importlib.import_module("cuda.bindings")
        return True
    except ImportError:
        pass
    try:
        return bool(cuda_packages().majors)
    except Exception:
        return True  # unreadable metadata: report every probe rather than guess


def _gpu(usable: bool, reason: str) -> str:
    if not usable:
        return f"none: {reason}"
    from .cuda.driver import get_device

    dev = get_device(0)
    major, minor = dev.compute_capability
    memory = f"{dev.total_memory / 2**30:.1f} GiB"
    return f"{dev.name} (compute capability {major}.{minor}, {dev.arch}, {dev.sm_count} SMs, {memory})"


def info_lines() -> tuple[list[str], int]:
    """The report's lines and the exit code: 0 when it could report, 1 when an engine's module is missing from the
    installation or the GPU self-test failed."""
    import numpy

    from . import __version__
    from ._device import cuda_status
    from ._environment import cuda_packages

    rows = [
        ("fastnn", __version__),
        ("Installed", _safe(_installed, "unknown")),
        ("Python", f"{platform.python_version()} ({sys.executable})"),
        ("numpy", numpy.__version__),
    ]
    engines, complete = engine_status()
    rows.append(("Engines", engines))
    code = 0 if complete else 1
    if not _cuda_installed():  # one line, not a "No module named 'cuda'" per library probed
        rows.append(("CUDA", f"no CUDA packages installed: CPU only (the NumPy engine). For a GPU: "
                             f"{pip_install('cu12')}, or cu13 for a CUDA 13 driver"))  # fmt: skip
        rows.append(("GPU", "none (no CUDA packages)"))
        return _format(rows), code
    rows += [
        ("cuda-bindings", _safe(lambda: _package_version("cuda.bindings"), "not importable")),
        ("cuda-pathfinder", _safe(lambda: _package_version("cuda.pathfinder"), "not importable")),
    ]
    for label, libname, module in _LIBRARIES:
        rows.append((label, _safe(lambda libname=libname, module=module: _library(libname, module))))
    rows.append(("NVRTC", _safe(_nvrtc)))
    rows.append(("NCCL", _safe(_nccl)))
    rows.append(("CUDA packages", _safe(lambda: cuda_packages().summary(), "unreadable")))
    rows.append(("Driver", _safe(_driver, "none")))
    usable, reason = cuda_status()
    rows.append(("GPU", _safe(lambda: _gpu(usable, reason), "none")))
    if usable and importlib.util.find_spec("fastnn.cuda.selftest") is not None:
        try:
            from .cuda.selftest import run_selftest

            rows.append(("Self-test", run_selftest()))
        except Exception as exc:
            rows.append(("Self-test", f"FAILED: {type(exc).__name__}: {exc}"))
            code = 1
    return _format(rows), code


def _format(rows: list[tuple[str, str]]) -> list[str]:
    width = max(len(label) for label, _ in rows) + 1
    # One line per row: library and driver messages may hold line breaks of their own.
    return [f"{label + ':':<{width}} {' '.join(str(value).split())}" for label, value in rows]


def run_info(out: TextIO | None = None) -> int:
    """Print the report to `out` (stdout by default) and return the exit code."""
    lines, code = info_lines()
    stream = out or sys.stdout
    print("\n".join(lines), file=stream)
    stream.flush()  # a reader gone (`| head -1`) shows here, where the command line can catch it
    return code
