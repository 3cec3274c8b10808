"""fastnn.cuda.nvrtc on the CPU: compiling to CUBIN, errors with the log, the disk cache, every native kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastnn.cuda import nvrtc
from fastnn.cuda._loader import NvrtcError
from fastnn.errors import ConfigError

ELF = b"\x7fELF"
ARCHS = ("sm_80", "sm_90")

KERNEL = r"""
#include "helper.cuh"
extern "C" __global__ void scale(float* y, float a, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = twice(a) * y[i];
}
"""
HELPER = "__device__ inline float twice(float x) { return 2.0f * x; }\n"


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    directory = tmp_path / "cache"
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(directory))
    return directory


@pytest.fixture
def kernels(tmp_path, monkeypatch) -> Path:
    """A stand-in native/ with one kernel and one header."""
    directory = tmp_path / "native"
    directory.mkdir()
    (directory / "k.cu").write_text(KERNEL)
    (directory / "helper.cuh").write_text(HELPER)
    monkeypatch.setattr(nvrtc, "native_dir", lambda: directory)
    return directory


@pytest.fixture
def compiles(monkeypatch) -> list[tuple]:
    """Records every real NVRTC compilation made through compile_source."""
    calls: list[tuple] = []
    real = nvrtc.compile_source

    def counting(source, name, arch, options=(), include_dirs=()):
        calls.append((name, arch, tuple(options)))
        return real(source, name, arch, options, include_dirs)

    monkeypatch.setattr(nvrtc, "compile_source", counting)
    return calls


def test_nvrtc_version():
    major, minor = nvrtc.nvrtc_version()
    assert major >= 12 and minor >= 0


@pytest.mark.parametrize("arch", ARCHS)
def test_compile_source_gives_cubin(arch, tmp_path):
    (tmp_path / "helper.cuh").write_text(HELPER)
    cubin = nvrtc.compile_source(KERNEL, "k.cu", arch, include_dirs=[tmp_path])
    assert cubin.startswith(ELF) and len(cubin) > 1000


def test_cubins_differ_by_arch(tmp_path):
    (tmp_path / "helper.cuh").write_text(HELPER)
    assert nvrtc.compile_source(KERNEL, "k.cu", "sm_80", include_dirs=[tmp_path]) != nvrtc.compile_source(
        KERNEL, "k.cu", "sm_90", include_dirs=[tmp_path]
    )


def test_syntax_error_raises_with_the_full_log():
    source = 'extern "C" __global__ void broken(float* y) { y[0] = undefined_name; }'
    with pytest.raises(NvrtcError) as info:
        nvrtc.compile_source(source, "broken.cu", "sm_90")
    err = info.value
    assert err.status_name == "NVRTC_ERROR_COMPILATION"
    assert err.status == 6
    assert "broken.cu" in err.log and "undefined_name" in err.log and "error" in err.log
    assert str(err).startswith("compiling broken.cu for sm_90 failed: NVRTC_ERROR_COMPILATION (6)")
    assert err.log.strip() in str(err)


def test_cxx17_always_and_fast_math_only_on_request():
    source = r"""
    #if __cplusplus < 201703L
    #error "not C++17"
    #endif
    #if __USE_FAST_MATH__
    #error "fast math was not asked for"
    #endif
    extern "C" __global__ void k(float* y) { y[0] = 1.0f; }
    """
    assert nvrtc.compile_source(source, "k.cu", "sm_90").startswith(ELF)
    with pytest.raises(NvrtcError, match="fast math was not asked for"):
        nvrtc.compile_source(source, "k.cu", "sm_90", options=["--use_fast_math"])


@pytest.mark.parametrize("arch", ["compute_90", "sm90", "90", "", "sm_90 -G"])
def test_bad_arch_is_config_error(arch):
    with pytest.raises(ConfigError, match="arch"):
        nvrtc.compile_source("", "k.cu", arch)


def test_cache_dir_default_and_override(monkeypatch, tmp_path):
    monkeypatch.delenv("FASTNN_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert nvrtc.cache_dir() == tmp_path / ".cache" / "fastnn" / "kernels"
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(tmp_path / "elsewhere"))
    assert nvrtc.cache_dir() == tmp_path / "elsewhere"


def test_compile_native_caches_on_disk(kernels, cache, compiles):
    first = nvrtc.compile_native("k.cu", "sm_90")
    assert first.startswith(ELF)
    assert len(compiles) == 1
    entries = list(cache.iterdir())
    assert len(entries) == 1 and entries[0].suffix == ".cubin"  # no temp files left behind
    second = nvrtc.compile_native("k.cu", "sm_90")
    assert second == first
    assert len(compiles) == 1  # served from the cache: NVRTC not called


def test_cache_key_covers_arch_options_source_headers_and_version():
    base = ("k.cu", b"src", {"a.cuh": b"A"}, "sm_90", ("--use_fast_math",), (12, 9))
    key = nvrtc.cache_key(*base)
    assert len(key) == 64 and key == nvrtc.cache_key(*base)
    variants = [
        ("j.cu", *base[1:]),
        (base[0], b"src2", *base[2:]),
        (*base[:2], {"a.cuh": b"B"}, *base[3:]),
        (*base[:2], {"a.cuh": b"A", "b.cuh": b""}, *base[3:]),
        (*base[:3], "sm_80", *base[4:]),
        (*base[:4], (), base[5]),
        (*base[:4], ("--use_fast_math", "-lineinfo"), base[5]),
        (*base[:5], (13, 0)),
    ]
    keys = {nvrtc.cache_key(*v) for v in variants}
    assert len(keys) == len(variants) and key not in keys


def test_changed_options_arch_or_header_recompile(kernels, cache, compiles):
    nvrtc.compile_native("k.cu", "sm_90")
    nvrtc.compile_native("k.cu", "sm_90", options=["--use_fast_math"])
    nvrtc.compile_native("k.cu", "sm_80")
    assert len(compiles) == 3
    (kernels / "helper.cuh").write_text(HELPER.replace("2.0f", "3.0f"))
    nvrtc.compile_native("k.cu", "sm_90")
    assert len(compiles) == 4
    assert len(list(cache.iterdir())) == 4


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_corrupt_cache_entry_is_recompiled(kernels, cache, compiles, damage):
    good = nvrtc.compile_native("k.cu", "sm_90")
    (entry,) = cache.iterdir()
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[-100] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    else:
        data = bytearray(b"\x7fELF" + bytes(200))
    entry.write_bytes(bytes(data))
    assert nvrtc.compile_native("k.cu", "sm_90") == good
    assert len(compiles) == 2
    assert nvrtc.compile_native("k.cu", "sm_90") == good  # the entry was repaired
    assert len(compiles) == 2


def test_unwritable_cache_degrades_to_no_cache(kernels, tmp_path, monkeypatch, compiles):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(blocker / "kernels"))  # mkdir fails even for root
    first = nvrtc.compile_native("k.cu", "sm_90")
    second = nvrtc.compile_native("k.cu", "sm_90")
    assert first == second and first.startswith(ELF)
    assert len(compiles) == 2


@pytest.mark.parametrize("filename", ["missing.cu", "helper.cuh", "../k.cu", "sub/k.cu"])
def test_compile_native_rejects_unknown_files(kernels, cache, filename):
    with pytest.raises(ConfigError, match="no kernel file"):
        nvrtc.compile_native(filename, "sm_90")


def test_compile_native_error_carries_log(kernels, cache):
    (kernels / "bad.cu").write_text('#include "helper.cuh"\nextern "C" __global__ void k() { nope(); }\n')
    with pytest.raises(NvrtcError) as info:
        nvrtc.compile_native("bad.cu", "sm_90")
    assert "nope" in info.value.log
    assert not cache.exists() or not list(cache.iterdir())  # failures are not cached


# ---------------------------------------------------------------------------------------------------------------
# The real kernels in native/
# ---------------------------------------------------------------------------------------------------------------


def test_native_dir_holds_the_kernels():
    directory = nvrtc.native_dir()
    assert (directory / "common.cuh").is_file()
    names = {p.name for p in nvrtc.native_sources()}
    assert names, f"no *.cu kernel files in {directory}"
    assert {"gather.cu", "loss.cu", "update.cu"} <= names


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", nvrtc.native_sources(), ids=lambda p: p.name)
def test_every_native_kernel_compiles(path, arch, cache):
    cubin = nvrtc.compile_native(path.name, arch)
    assert cubin.startswith(ELF)
