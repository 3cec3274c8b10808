"""cuBLASLt's autotuning choices on disk (fastnn/cuda/autotune_cache.py), on the CPU: the key, the round trip
through Matmul.autotune, stale and corrupt entries, and the kernel cache's ownership rules. cuBLASLt is faked: a
plan is a Matmul whose heuristic candidates are set by hand, and the timing is a stub that counts its calls."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

from fastnn.cuda import autotune_cache, nvrtc
from fastnn.cuda import cublaslt as lt

H100 = SimpleNamespace(name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), sm_count=132)
STREAM = SimpleNamespace(device=H100)


def algo(tag: int) -> lt._Algo:
    a = lt._Algo()
    for i in range(8):
        a.data[i] = tag * 1000 + i
    return a


def fake_plan(tags=(1, 2, 3, 4), **over) -> lt.Matmul:
    """A Matmul as __init__ would leave it, without cuBLASLt: heuristic candidates `tags`, the first selected."""
    plan = object.__new__(lt.Matmul)
    fields = dict(
        m=1024, n=128, k=784, transa=True, transb=False, ab_type=lt.DataType.R_16F, cd_type=lt.DataType.R_16F,
        compute=lt.ComputeType.COMPUTE_32F, lda=784, ldb=784, ldc=1024, epilogue=lt.Epilogue.RELU_AUX_BIAS,
        aux_ld=1024, device_scalars=False, max_algos=16, min_alignment=256, sm_count_target=0,
        workspace=SimpleNamespace(nbytes=32 << 20),
    )  # fmt: skip
    fields.update(over)
    plan.__dict__.update(fields)
    plan._algos = [algo(t) for t in tags]
    plan.select(0)
    return plan


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(directory))
    monkeypatch.setattr(lt, "version", lambda: 120903)
    return directory


@pytest.fixture
def timings(monkeypatch) -> list[int]:
    """Each timing run's plan tag list; the stub picks the candidate tagged 3 (else the last) at 0.25 ms."""
    runs: list[int] = []

    def timed(self, a, b, c, d, stream, bias, aux, alpha, beta, repeats):
        tags = [a.data[0] // 1000 for a in self._algos]
        runs.append(tags)
        self.select(tags.index(3) if 3 in tags else len(tags) - 1)
        return 0.25

    monkeypatch.setattr(lt.Matmul, "_time_candidates", timed)
    return runs


def tune(plan: lt.Matmul, **kw) -> float:
    return plan.autotune(256, 512, 0, 768, STREAM, **kw)


def entries(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.cublaslt"))


# ---------------------------------------------------------------------------------------------------------------
# The key
# ---------------------------------------------------------------------------------------------------------------


def key_of(plan=None, gpu=H100, version=120903, beta=0.0, c_is_d=True, repeats=20) -> str:
    plan = plan or fake_plan()
    return autotune_cache.entry_key(
        plan, autotune_cache.gpu_identity(gpu), version, beta=beta, c_is_d=c_is_d, repeats=repeats
    )


def test_key_is_pinned():
    """The key names the choices already on users' disks: a refactoring that changed it would silently time every
    plan again and leave the old entries behind. Change this value only together with SCHEMA_VERSION."""
    assert autotune_cache.SCHEMA_VERSION == 1
    assert key_of() == "1c62eba73271cff540c514c155bfbe057e9336f277be3f5628c6141b41f779e4"


def test_key_is_stable_and_names_every_input():
    base = key_of()
    assert base == key_of() and len(base) == 64 and int(base, 16) >= 0
    changed = {
        "gpu name": key_of(gpu=SimpleNamespace(**{**vars(H100), "name": "NVIDIA H200"})),
        "compute capability": key_of(gpu=SimpleNamespace(**{**vars(H100), "compute_capability": (8, 0)})),
        "SM count (MIG)": key_of(gpu=SimpleNamespace(**{**vars(H100), "sm_count": 16})),
        "library version": key_of(version=120904),
        "beta": key_of(beta=1.0),
        "C is not D": key_of(c_is_d=False),
        "repeats": key_of(repeats=5),
        "workspace": key_of(fake_plan(workspace=SimpleNamespace(nbytes=4 << 20))),
    }
    plan_values = {
        "m": 1025, "n": 64, "k": 785, "transa": False, "transb": True, "ab_type": lt.DataType.R_32F,
        "cd_type": lt.DataType.R_32F, "compute": lt.ComputeType.COMPUTE_16F, "lda": 800, "ldb": 800, "ldc": 1032,
        "epilogue": lt.Epilogue.RELU_BIAS, "aux_ld": 1032, "device_scalars": True, "max_algos": 1,
        "min_alignment": 16, "sm_count_target": 120,
    }  # fmt: skip
    assert set(plan_values) == set(autotune_cache.PLAN_FIELDS)
    changed.update({name: key_of(fake_plan(**{name: value})) for name, value in plan_values.items()})
    assert all(k != base for k in changed.values()), [n for n, k in changed.items() if k == base]
    assert len(set(changed.values())) == len(changed)


# ---------------------------------------------------------------------------------------------------------------
# The round trip through Matmul.autotune
# ---------------------------------------------------------------------------------------------------------------


def test_a_second_plan_selects_the_cached_choice_without_timing(cache, timings):
    first = fake_plan()
    assert tune(first) == 0.25 and first.algo_index == 2 and len(timings) == 1
    assert len(entries(cache)) == 1
    second = fake_plan()  # a new process's plan: same shape, same heuristic candidates
    assert tune(second) == 0.25
    assert second.algo_index == 2 and bytes(second._algo) == bytes(algo(3))
    assert len(timings) == 1  # not timed again


def test_another_shape_or_call_is_timed(cache, timings):
    tune(fake_plan())
    tune(fake_plan(n=64))
    tune(fake_plan(), beta=1.0)
    assert len(timings) == 3 and len(entries(cache)) == 3


def test_reordered_candidates_select_the_same_algorithm(cache, timings):
    tune(fake_plan((1, 2, 3, 4)))
    plan = fake_plan((3, 4, 1, 2))
    tune(plan)
    assert plan.algo_index == 0 and bytes(plan._algo) == bytes(algo(3)) and len(timings) == 1


def test_an_algorithm_the_heuristic_no_longer_returns_is_timed_again(cache, timings):
    tune(fake_plan((1, 2, 3, 4)))
    plan = fake_plan((1, 2, 4, 5))  # a new library: candidate 3 is gone
    tune(plan)
    assert len(timings) == 2 and bytes(plan._algo) == bytes(algo(5))
    third = fake_plan((1, 2, 4, 5))  # the entry was rewritten with the new choice
    tune(third)
    assert len(timings) == 2 and bytes(third._algo) == bytes(algo(5))


# ---------------------------------------------------------------------------------------------------------------
# Corrupt entries and the trust rules
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # truncated
        lambda data: data[:-3] + bytes([data[-3] ^ 1]) + data[-2:],  # one bit of the payload flipped
        lambda data: b"",  # empty
        lambda data: b"not a cache entry at all",
    ],
    ids=["truncated", "bit-flip", "empty", "garbage"],
)
def test_a_damaged_entry_is_timed_again_and_rewritten(cache, timings, damage):
    tune(fake_plan())
    (entry,) = entries(cache)
    entry.write_bytes(damage(entry.read_bytes()))
    plan = fake_plan()
    tune(plan)
    assert len(timings) == 2 and plan.algo_index == 2
    tune(fake_plan())
    assert len(timings) == 2  # the rewritten entry is used


@pytest.mark.parametrize(
    "payload",
    [b"{", b'{"algo": "zz", "ms": 1}', b'{"algo": "00", "ms": 1}', b'{"ms": 1}', b'{"algo": 3, "ms": 1}',
     b"[]", b"{\"algo\": \"" + bytes(algo(3)).hex().encode() + b"\", \"ms\": -1}",
     b"{\"algo\": \"" + bytes(algo(3)).hex().encode() + b"\", \"ms\": NaN}"],
    ids=["json", "hex", "length", "missing", "type", "list", "negative-ms", "nan-ms"],
)  # fmt: skip
def test_a_well_sealed_but_malformed_entry_is_not_trusted(cache, timings, payload):
    tune(fake_plan())
    (entry,) = entries(cache)
    directory = nvrtc._trusted_dir()
    nvrtc._write_cache(entry, payload, nvrtc._cache_secret(directory))
    tune(fake_plan())
    assert len(timings) == 2


def test_an_entry_sealed_with_another_users_key_is_ignored(cache, timings, tmp_path, monkeypatch):
    tune(fake_plan())
    (entry,) = entries(cache)
    other = tmp_path / "other"
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(other))
    nvrtc._trusted_dir()
    nvrtc._cache_secret(other)  # a folder with its own key
    shutil.copy(entry, other / entry.name)  # the entry copied from elsewhere: its seal does not verify here
    tune(fake_plan())
    assert len(timings) == 2


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership")
def test_a_group_writable_cache_folder_is_not_used(cache, timings):
    tune(fake_plan())
    cache.chmod(0o770)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the kernel cache's one warning about the folder
        tune(fake_plan())
        before = {p.name: p.read_bytes() for p in entries(cache)}
        tune(fake_plan(n=64))
    assert len(timings) == 3  # the entry was not read, and the new choice was not written
    assert {p.name: p.read_bytes() for p in entries(cache)} == before


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership")
def test_a_cache_folder_owned_by_another_user_is_not_used(cache, timings, monkeypatch):
    tune(fake_plan())
    uid = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: uid + 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        tune(fake_plan())
    assert len(timings) == 2


def test_no_cache_when_the_folder_cannot_be_made(tmp_path, monkeypatch, timings):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(lt, "version", lambda: 120903)
    tune(fake_plan())
    tune(fake_plan())
    assert len(timings) == 2
