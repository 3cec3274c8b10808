"""Run-time compilation of the kernels in native/ with NVRTC, to CUBIN for the exact GPU, cached on disk.

CUBIN (SASS) rather than PTX: the driver loads it without a JIT step, and the cache makes the NVRTC cost
(about a second per file) a one-time one. The NVRTC wheels ship no headers on the include path (not even
<cstdint> or <cuda_fp16.h>), so kernel sources must be self-contained apart from native/*.cuh.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import ConfigError, DeviceUnavailable, FastnnError
from ._loader import INSTALL_HINT, NvrtcError

__all__ = [
    "SCHEMA_VERSION",
    "cache_dir",
    "cache_key",
    "compile_native",
    "compile_source",
    "native_dir",
    "native_sources",
    "nvrtc_version",
]

#: Bump when the cache file layout or the compile options fastnn adds change: old entries are then ignored.
SCHEMA_VERSION = 1

_ARCH = re.compile(r"sm_\d{2,3}[af]?")
_MAGIC = b"FASTNN-CUBIN\n"  # cache file: magic, sha256 hex of the cubin, "\n", the cubin


def _nvrtc() -> Any:
    """cuda.bindings.nvrtc, or DeviceUnavailable with the fix."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise DeviceUnavailable(f"cuda-bindings is not importable ({exc}); fix: {INSTALL_HINT}") from exc
    return nvrtc


def _call(fn: Any, *args: Any, what: str, log: str = "") -> Any:
    """Call an NVRTC binding and unwrap `(status, *values)`; NvrtcError names the status."""
    nvrtc = _nvrtc()
    try:
        result = fn(*args)
    except RuntimeError as exc:  # cuda-bindings raises this when libnvrtc cannot be found or loaded
        raise DeviceUnavailable(f"the NVRTC library cannot be loaded ({exc}); fix: {INSTALL_HINT}") from exc
    status, *values = result
    if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(int(status), nvrtc.nvrtcResult(int(status)).name, what, log)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the loaded NVRTC library.

    Raises:
        DeviceUnavailable: NVRTC cannot be loaded.
    """
    nvrtc = _nvrtc()
    major, minor = _call(nvrtc.nvrtcVersion, what="nvrtcVersion")
    return int(major), int(minor)


def _check_arch(arch: str) -> None:
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise ConfigError(f"arch must look like 'sm_90' (a real architecture, for a CUBIN), got {arch!r}")


def compile_source(
    source: str,
    name: str,
    arch: str,
    options: Sequence[str] = (),
    include_dirs: Sequence[Path] = (),
) -> bytes:
    """Compile CUDA C++ `source` to a CUBIN for exactly `arch` (e.g. "sm_90"), with -std=c++17.

    Args:
        name: the file name used in diagnostics.
        options: extra NVRTC options, e.g. ("--use_fast_math",); none are added silently.
        include_dirs: directories searched by #include "...".
    Raises:
        NvrtcError: compilation failed; `.log` (and the message) hold the full program log.
        ConfigError: `arch` is not an sm_XX architecture.
    """
    _check_arch(arch)
    nvrtc = _nvrtc()
    args = [f"--gpu-architecture={arch}", "-std=c++17"]
    args += [f"--include-path={Path(d)}" for d in include_dirs]
    args += list(options)
    encoded = [a.encode() for a in args]
    prog = _call(
        nvrtc.nvrtcCreateProgram, source.encode(), name.encode(), 0, [], [], what=f"nvrtcCreateProgram({name})"
    )
    try:
        try:
            _call(nvrtc.nvrtcCompileProgram, prog, len(encoded), encoded, what=f"compiling {name} for {arch}")
        except NvrtcError as exc:
            raise NvrtcError(exc.status, exc.status_name, exc.what, _program_log(prog)) from None
        size = _call(nvrtc.nvrtcGetCUBINSize, prog, what="nvrtcGetCUBINSize")
        cubin = b" " * int(size)
        _call(nvrtc.nvrtcGetCUBIN, prog, cubin, what="nvrtcGetCUBIN")
    finally:
        _call(nvrtc.nvrtcDestroyProgram, prog, what="nvrtcDestroyProgram")
    return cubin


def _program_log(prog: Any) -> str:
    """The compiler's log for `prog` (errors and warnings), without the trailing NUL."""
    nvrtc = _nvrtc()
    size = _call(nvrtc.nvrtcGetProgramLogSize, prog, what="nvrtcGetProgramLogSize")
    log = b" " * int(size)
    _call(nvrtc.nvrtcGetProgramLog, prog, log, what="nvrtcGetProgramLog")
    return log.rstrip(b"\0").decode(errors="replace")


# ---------------------------------------------------------------------------------------------------------------
# The kernels shipped with fastnn, and the on-disk cache
# ---------------------------------------------------------------------------------------------------------------


def native_dir() -> Path:
    """Directory of the kernel sources: the installed package fastnn.native, else the repository's native/.

    Raises:
        FastnnError: neither exists (a broken install).
    """
    try:
        spec = importlib.util.find_spec("fastnn.native")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            if Path(location).is_dir():
                return Path(location)
    repo_native = Path(__file__).resolve().parents[2] / "native"
    if repo_native.is_dir():
        return repo_native
    raise FastnnError(f"fastnn's kernel sources are missing (no fastnn.native package, no {repo_native}); reinstall")


def native_sources() -> list[Path]:
    """Every kernel file (*.cu) in native_dir(), sorted by name."""
    return sorted(native_dir().glob("*.cu"))


def cache_dir() -> Path:
    """Where compiled kernels are kept: $FASTNN_CACHE_DIR, else ~/.cache/fastnn/kernels."""
    override = os.environ.get("FASTNN_CACHE_DIR")
    return Path(override) if override else Path.home() / ".cache" / "fastnn" / "kernels"


def cache_key(
    filename: str, source: bytes, headers: dict[str, bytes], arch: str, options: Sequence[str], version: tuple[int, int]
) -> str:
    """sha256 (hex) of everything a CUBIN depends on: schema, file, source, every header, arch, options, NVRTC."""
    h = hashlib.sha256()

    def field(data: bytes) -> None:  # length-prefixed, so no two different inputs hash the same stream
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)

    field(f"schema {SCHEMA_VERSION}".encode())
    field(filename.encode())
    field(source)
    for name in sorted(headers):
        field(name.encode())
        field(headers[name])
    field(arch.encode())
    field(len(options).to_bytes(8, "little"))
    for option in options:
        field(option.encode())
    field(f"nvrtc {version[0]}.{version[1]}".encode())
    return h.hexdigest()


def _read_cache(path: Path) -> bytes | None:
    """The cached CUBIN at `path` if present and intact (its stored sha256 matches), else None."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(_MAGIC)
    if not data.startswith(_MAGIC) or len(data) < head + 65 or data[head + 64 : head + 65] != b"\n":
        return None
    digest, cubin = data[head : head + 64], data[head + 65 :]
    if not cubin or hashlib.sha256(cubin).hexdigest().encode() != digest:
        return None
    return cubin


def _write_cache(path: Path, cubin: bytes) -> None:
    """Store `cubin` atomically (temp file + os.replace); an unwritable cache is silently skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".cubin")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + hashlib.sha256(cubin).hexdigest().encode() + b"\n" + cubin)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError:
        pass


def compile_native(filename: str, arch: str, options: Sequence[str] = ()) -> bytes:
    """The CUBIN of native/<filename> for `arch`, from the disk cache or compiled (with native/ on the include path).

    Raises:
        ConfigError: no such kernel file, or a bad arch.
        NvrtcError: the source does not compile (with the log).
    """
    _check_arch(arch)
    directory = native_dir()
    path = directory / filename
    if Path(filename).name != filename or path.suffix != ".cu" or not path.is_file():
        available = ", ".join(p.name for p in native_sources()) or "none"
        raise ConfigError(f"no kernel file {filename!r} in {directory} (available: {available})")
    source = path.read_bytes()
    headers = {p.name: p.read_bytes() for p in sorted(directory.glob("*.cuh"))}
    options = tuple(options)
    key = cache_key(filename, source, headers, arch, options, nvrtc_version())
    entry = cache_dir() / f"{key}.cubin"
    cubin = _read_cache(entry)
    if cubin is None:
        cubin = compile_source(source.decode(), filename, arch, options, include_dirs=(directory,))
        _write_cache(entry, cubin)
    return cubin
