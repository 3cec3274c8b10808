"""cuBLASLt's autotuning choices kept on disk, so a new process runs the algorithm it timed before instead of
timing every heuristic candidate again (at h = 1024 and 8192 that timing was most of a warm fit's set-up).

An entry maps (GPU, cuBLASLt version, plan, call) to the chosen candidate's 64 algorithm bytes as cuBLASLt's
heuristic returned them, and its time. It is used only when the heuristic still returns those exact bytes for the
plan; the bytes themselves are never handed to cuBLASLt, only the heuristic's own candidate that equals them. A
new library, driver or GPU whose candidates differ makes the entry stale: the plan is timed again and the entry
rewritten. Entries live beside the compiled kernels (`nvrtc.cache_dir()`, $FASTNN_CACHE_DIR) under the same trust
rules: the folder owned by this user and closed to others, each entry sealed with the per-user key; an entry that
fails any check is ignored and rewritten, and an untrusted folder means no cache (every process autotunes).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path
from typing import Any

from .._cachedir import digest
from . import nvrtc

__all__ = ["SCHEMA_VERSION", "Choice", "entry_key", "gpu_identity", "lookup", "store"]

#: Bump when the key's fields or the entry's layout change: old entries are then never read.
SCHEMA_VERSION = 1
_SUFFIX = ".cublaslt"
_ALGO_BYTES = 64  # sizeof(cublasLtMatmulAlgo_t)

#: The Matmul attributes that decide which candidates the heuristic returns and how fast each runs.
PLAN_FIELDS = (
    "m", "n", "k", "transa", "transb", "ab_type", "cd_type", "compute", "lda", "ldb", "ldc", "epilogue", "aux_ld",
    "device_scalars", "max_algos", "min_alignment", "sm_count_target",
)  # fmt: skip


@dataclass(frozen=True)
class Choice:
    """A cached choice: the index of the candidate to select (in this process's heuristic list) and its time."""

    index: int
    ms: float


def gpu_identity(device: Any) -> str:
    """The GPU as far as timing goes: its name, compute capability and SM count (a MIG slice has fewer SMs)."""
    major, minor = device.compute_capability
    return f"{device.name} sm_{major}{minor} {device.sm_count} SMs"


def _text(value: Any) -> str:
    return f"{value.name}={int(value)}" if isinstance(value, IntEnum) else repr(value)


def entry_key(plan: Any, gpu: str, version: int, *, beta: float, c_is_d: bool, repeats: int) -> str:
    """sha256 (hex) of what a timing depends on: schema, GPU, cuBLASLt version, the plan, and the call (whether C
    is read, whether it is D, how many repeats were timed)."""
    fields = [f"schema {SCHEMA_VERSION}", f"gpu {gpu}", f"cublasLt {version}"]
    fields += [f"{name} {_text(getattr(plan, name))}" for name in PLAN_FIELDS]
    fields += [f"workspace {plan.workspace.nbytes}", f"beta0 {beta == 0}", f"c_is_d {c_is_d}", f"repeats {repeats}"]
    return digest(fields)


def _folder() -> tuple[Path, bytes] | None:
    """(folder, per-user key) of the trusted kernel cache, or None when it cannot be trusted (no cache then)."""
    directory = nvrtc._trusted_dir()
    secret = nvrtc._cache_secret(directory) if directory is not None else None
    return None if directory is None or secret is None else (directory, secret)


def lookup(key: str, candidates: list[bytes]) -> Choice | None:
    """The cached choice for `key` if its entry is intact, sealed with this user's key and names an algorithm that
    is still among `candidates` (the heuristic's, in order); else None (the plan must be timed)."""
    where = _folder()
    if where is None:
        return None
    directory, secret = where
    payload = nvrtc._read_cache(directory / f"{key}{_SUFFIX}", secret)
    if payload is None:
        return None
    try:
        entry = json.loads(payload)
        algo, ms = bytes.fromhex(entry["algo"]), float(entry["ms"])
    except (ValueError, TypeError, KeyError):  # bad JSON, bad hex, a field missing or of the wrong type
        return None
    if len(algo) != _ALGO_BYTES or not math.isfinite(ms) or ms <= 0 or algo not in candidates:
        return None
    return Choice(candidates.index(algo), ms)


def store(key: str, algo: bytes, ms: float) -> None:
    """Record the timed choice for `key` (atomically, sealed); nothing happens when the cache is not trusted."""
    where = _folder()
    if where is None:
        return
    directory, secret = where
    payload = json.dumps({"algo": algo.hex(), "ms": ms}).encode()
    nvrtc._write_cache(directory / f"{key}{_SUFFIX}", payload, secret)
