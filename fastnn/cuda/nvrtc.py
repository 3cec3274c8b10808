"""Run-time compilation of the kernels in native/ with NVRTC, to CUBIN for the exact GPU, cached on disk.

CUBIN (SASS) rather than PTX: the driver loads it without a JIT step, and the cache makes the NVRTC cost
(about a second per file) a one-time one. The NVRTC wheels ship no headers on the include path (not even
<cstdint> or <cuda_fp16.h>), so kernel sources must be self-contained apart from native/*.cuh.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib.util
import os
import re
import secrets
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import _files
from .._cachedir import base_dir, digest, evict, file_refusal, max_bytes, trusted_dir, warn_once
from .._errors import ConfigError, DeviceUnavailable, FastnnError
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
SCHEMA_VERSION = 2

_ARCH = re.compile(r"sm_\d{2,3}[af]?")
_MAGIC = b"FASTNN-CUBIN2\n"  # cache file: magic, HMAC-SHA256 hex of (entry name, cubin), "\n", the cubin
_KEY_FILE = ".key"  # the per-user HMAC key: 32 random bytes, mode 0600, inside the 0700 cache folder
_KEY_BYTES = 32
#: The kernel cache's bound in MiB (compiled kernels and cuBLASLt's choices together; _cachedir.DEFAULT_MAX_MB).
MAX_MB_ENV = "FASTNN_CACHE_MAX_MB"


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
        # NVRTC writes into this buffer: it must be mutable memory of our own, never a bytes object (immutable,
        # and b" " * n may even be an interpreter-wide shared constant).
        cubin = bytearray(int(size))
        _call(nvrtc.nvrtcGetCUBIN, prog, cubin, what="nvrtcGetCUBIN")
    finally:
        _call(nvrtc.nvrtcDestroyProgram, prog, what="nvrtcDestroyProgram")
    return bytes(cubin)


def _program_log(prog: Any) -> str:
    """The compiler's log for `prog` (errors and warnings), without the trailing NUL."""
    nvrtc = _nvrtc()
    size = _call(nvrtc.nvrtcGetProgramLogSize, prog, what="nvrtcGetProgramLogSize")
    # A mutable buffer NVRTC may write into: with an empty log (size 1), b" " * 1 would be CPython's shared
    # one-byte b" " object, and NVRTC's NUL would change every b" " in the process.
    log = bytearray(int(size))
    _call(nvrtc.nvrtcGetProgramLog, prog, log, what="nvrtcGetProgramLog")
    return bytes(log).rstrip(b"\0").decode(errors="replace")


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


_resolved_dirs: dict[str, Path] = {}  # $FASTNN_CACHE_DIR as set -> the absolute folder it meant at first use
_lock = threading.Lock()


def cache_dir() -> Path:
    """Where compiled kernels (and cuBLASLt's autotuning choices: autotune_cache.py) are kept: $FASTNN_CACHE_DIR,
    else $XDG_CACHE_HOME/fastnn/kernels, else ~/.cache/fastnn/kernels (with no home directory, a temporary folder
    of this process: `_cachedir.base_dir`); always absolute.

    A relative $FASTNN_CACHE_DIR is resolved against the working directory once, at its first use: a later
    os.chdir does not move the cache (nor make a process read kernels from a folder it did not choose).
    """
    override = os.environ.get("FASTNN_CACHE_DIR")
    if not override:
        return base_dir().absolute() / "kernels"
    with _lock:
        if override not in _resolved_dirs:
            _resolved_dirs[override] = Path(override).expanduser().absolute()
        return _resolved_dirs[override]


# Threat model of the on-disk cache. A cached CUBIN is machine code the driver loads into this process, so a
# file planted in the cache is code execution on the GPU with the process's memory mappings, and wrong
# results at best. The cache is trusted only when
#   - its folder is owned by the current user and not writable by group or others (else: one warning, and
#     kernels are compiled in memory, nothing read from or written to it), and
#   - each entry carries an HMAC-SHA256 of its name and bytes under a per-user random key kept in a 0600
#     file inside that folder. A plain digest caught corruption but not a planted CUBIN with a recomputed
#     digest; a MAC needs the key, which a writer who cannot read the folder (a cache restored from a shared
#     backup, a folder that was group-writable for a while, a copy from another account) does not have.
# Code running as the same user can read the key; it could equally edit fastnn itself: out of scope.


def _trusted_dir() -> Path | None:
    """cache_dir(), created 0700 if absent, when it passes the owner and mode checks; else None (warned once)."""
    return trusted_dir(cache_dir(), "kernel cache", "compiling kernels in memory instead", stacklevel=3)


def _read_secret(path: Path) -> tuple[bytes | None, str, bool]:
    """(key, why not, remake): the key at `path` when it can be trusted, else None, the reason, and whether
    making a new key is the cure (only when it is missing: a file of another size is not one fastnn wrote, since
    keys are written whole, and is never overwritten)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None, "is missing", True
    except OSError as exc:
        return None, f"cannot be opened ({exc.strerror or exc}; a link?)", False
    try:
        why = file_refusal(os.fstat(fd), private=True)
        if why is not None:
            return None, why, False
        key = os.read(fd, _KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(key) != _KEY_BYTES:
        return None, f"holds {len(key)} bytes, not {_KEY_BYTES}: not a key fastnn wrote, so it is left alone", False
    return key, "", False


def _cache_secret(directory: Path) -> bytes | None:
    """The per-user HMAC key in `directory`: made when missing (0600, whole or not at all), made anew when
    damaged; None with one warning when it cannot be had safely, and kernels are then compiled in memory."""
    path = directory / _KEY_FILE
    key, why, remake = _read_secret(path)
    if key is None and remake:
        try:  # a new key only appears whole: written to a temporary file, its length checked, then renamed
            _files.write_bytes(path, secrets.token_bytes(_KEY_BYTES), mode=0o600, exclusive=why == "is missing")
        except FileExistsError:
            pass  # another process made it first: use theirs
        except OSError as exc:
            message = f"cannot write the kernel cache's key {path} ({_files.reason(exc)})"
            warn_once(directory, "key", f"fastnn: {message}; compiling kernels in memory instead", stacklevel=3)
            return None
        key, why, _ = _read_secret(path)
    if key is None:
        message = f"not using the kernel cache {directory}: its key {path} {why}"
        fallback = f"compiling kernels in memory instead (fix: remove {path})"
        warn_once(directory, "key", f"fastnn: {message}; {fallback}", stacklevel=3)
    return key


def _mac(secret: bytes, name: str, cubin: bytes) -> bytes:
    """HMAC-SHA256 (hex) binding a cubin to its entry name, so an entry cannot be swapped for another either."""
    h = hmac.new(secret, digestmod=hashlib.sha256)
    h.update(len(name).to_bytes(8, "little") + name.encode())
    h.update(cubin)
    return h.hexdigest().encode()


def cache_key(
    filename: str, source: bytes, headers: dict[str, bytes], arch: str, options: Sequence[str], version: tuple[int, int]
) -> str:
    """sha256 (hex) of everything a CUBIN depends on: schema, file, source, every header, arch, options, NVRTC."""
    fields: list[str | bytes] = [f"schema {SCHEMA_VERSION}", filename, source]
    for name in sorted(headers):
        fields += [name, headers[name]]
    fields += [arch, len(options).to_bytes(8, "little"), *options, f"nvrtc {version[0]}.{version[1]}"]
    return digest(fields)


def _read_cache(path: Path, secret: bytes) -> bytes | None:
    """The cached CUBIN at `path` if present, intact and written with `secret` (its stored MAC matches), else None."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    head = len(_MAGIC)
    if not data.startswith(_MAGIC) or len(data) < head + 65 or data[head + 64 : head + 65] != b"\n":
        return None
    mac, cubin = data[head : head + 64], data[head + 65 :]
    if not cubin or not hmac.compare_digest(_mac(secret, path.name, cubin), mac):
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # recently used: the size bound evicts the least recently used entries first
    return cubin


def _write_cache(path: Path, cubin: bytes, secret: bytes) -> None:
    """Store `cubin` atomically, 0600, then evict the least recently used entries past $FASTNN_CACHE_MAX_MB; a failing
    write (disk full, read-only) warns once and is skipped: the kernel compiled fine, only the next process compiles
    it again."""
    try:
        _files.write_bytes(path, _MAGIC + _mac(secret, path.name, cubin) + b"\n" + cubin, mode=0o600)
        evict(path.parent, max_bytes(MAX_MB_ENV), keep=path.name.split(".")[0])
    except OSError as exc:
        warn_once(
            path.parent,
            "write",
            f"fastnn: cannot write to the kernel cache {path.parent} ({_files.reason(exc)}); kernels are compiled "
            f"but not cached",
            stacklevel=3,
        )


def compile_native(filename: str, arch: str, options: Sequence[str] = ()) -> bytes:
    """The CUBIN of native/<filename> for `arch`, from the disk cache or compiled (with native/ on the include path).

    The cache is used only when trusted (see the threat model above); otherwise the kernel is compiled in memory.

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
    cache = _trusted_dir()
    secret = _cache_secret(cache) if cache is not None else None
    if cache is None or secret is None:  # no trustworthy cache: compile in memory
        return compile_source(source.decode(), filename, arch, options, include_dirs=(directory,))
    entry = cache / f"{key}.cubin"
    cubin = _read_cache(entry, secret)
    if cubin is None:
        cubin = compile_source(source.decode(), filename, arch, options, include_dirs=(directory,))
        _write_cache(entry, cubin, secret)
    return cubin
