"""fastnn.cuda.nvrtc on the CPU: compiling to CUBIN, errors with the log, the disk cache, every native kernel."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from fastnn._errors import ConfigError
from fastnn.cuda import nvrtc
from fastnn.cuda._loader import NvrtcError

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


def _entries(cache: Path) -> list[Path]:
    """The cache folder's files other than its HMAC key."""
    return [p for p in cache.iterdir() if p.name != ".key"]


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


@pytest.mark.bindings
def test_nvrtc_version():
    major, minor = nvrtc.nvrtc_version()
    assert major >= 12 and minor >= 0


@pytest.mark.bindings
@pytest.mark.parametrize("arch", ARCHS)
def test_compile_source_gives_cubin(arch, tmp_path):
    (tmp_path / "helper.cuh").write_text(HELPER)
    cubin = nvrtc.compile_source(KERNEL, "k.cu", arch, include_dirs=[tmp_path])
    assert cubin.startswith(ELF) and len(cubin) > 1000


@pytest.mark.bindings
def test_cubins_differ_by_arch(tmp_path):
    (tmp_path / "helper.cuh").write_text(HELPER)
    assert nvrtc.compile_source(KERNEL, "k.cu", "sm_80", include_dirs=[tmp_path]) != nvrtc.compile_source(
        KERNEL, "k.cu", "sm_90", include_dirs=[tmp_path]
    )


@pytest.mark.bindings
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


@pytest.mark.bindings
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


@pytest.mark.bindings
def test_compile_native_caches_on_disk(kernels, cache, compiles):
    first = nvrtc.compile_native("k.cu", "sm_90")
    assert first.startswith(ELF)
    assert len(compiles) == 1
    entries = _entries(cache)
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


def test_cache_key_is_pinned():
    """The key names the CUBINs already on users' disks: a refactoring that changed it would silently recompile
    every kernel once and leave the old entries behind. Change this value only together with SCHEMA_VERSION."""
    headers = {"a.cuh": b"A", "b.cuh": b""}
    key = nvrtc.cache_key("k.cu", b"src", headers, "sm_90", ("--use_fast_math", "-lineinfo"), (12, 9))
    assert nvrtc.SCHEMA_VERSION == 2
    assert key == "9aac852580f9d5586cc1bd0c4cd2346d74dfa9925fa94f49e4910881d078ca5c"


@pytest.mark.bindings
def test_changed_options_arch_or_header_recompile(kernels, cache, compiles):
    nvrtc.compile_native("k.cu", "sm_90")
    nvrtc.compile_native("k.cu", "sm_90", options=["--use_fast_math"])
    nvrtc.compile_native("k.cu", "sm_80")
    assert len(compiles) == 3
    (kernels / "helper.cuh").write_text(HELPER.replace("2.0f", "3.0f"))
    nvrtc.compile_native("k.cu", "sm_90")
    assert len(compiles) == 4
    assert len(_entries(cache)) == 4


@pytest.mark.bindings
@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_corrupt_cache_entry_is_recompiled(kernels, cache, compiles, damage):
    good = nvrtc.compile_native("k.cu", "sm_90")
    (entry,) = _entries(cache)
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


@pytest.mark.bindings
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


@pytest.mark.bindings
def test_compile_native_error_carries_log(kernels, cache):
    (kernels / "bad.cu").write_text('#include "helper.cuh"\nextern "C" __global__ void k() { nope(); }\n')
    with pytest.raises(NvrtcError) as info:
        nvrtc.compile_native("bad.cu", "sm_90")
    assert "nope" in info.value.log
    assert not cache.exists() or not _entries(cache)  # failures are not cached


# ---------------------------------------------------------------------------------------------------------------
# The real kernels in native/
# ---------------------------------------------------------------------------------------------------------------


def test_native_dir_holds_the_kernels():
    directory = nvrtc.native_dir()
    assert (directory / "common.cuh").is_file()
    names = {p.name for p in nvrtc.native_sources()}
    assert names, f"no *.cu kernel files in {directory}"
    assert {"gather.cu", "loss.cu", "update.cu", "epoch.cu"} <= names


@pytest.mark.bindings
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("path", nvrtc.native_sources(), ids=lambda p: p.name)
def test_every_native_kernel_compiles(path, arch, cache):
    cubin = nvrtc.compile_native(path.name, arch)
    assert cubin.startswith(ELF)


def _launched_kernels() -> dict[str, set[str]]:
    """The kernels the graph engine launches, by file: every precision's loss (cross-entropy and a regression's
    squared error, each unweighted and weighted), gather and update variants, a weighted fit's gather_weights, and
    the epoch-end kernels."""
    from fastnn.engine.graph import kernels
    from fastnn.engine.plan import precision_spec

    names: dict[str, set[str]] = {"loss.cu": set(), "gather.cu": set(), "update.cu": set(), "epoch.cu": set()}
    for precision in ("mixed", "fp16", "fp32"):
        spec = precision_spec(precision)
        names["loss.cu"] |= {spec.loss_kernel, spec.mse_kernel}
        names["update.cu"] |= {spec.update_kernel} | {spec.update_gather_kernel(src) for src in ("u8", "f32")}
        names["gather.cu"] |= {f"gather_{src}_{spec.gather_kernel_suffix}" for src in ("u8", "f32")}
        names["loss.cu"] |= {kernels.weighted_loss_kernel(spec, regression) for regression in (False, True)}
    names["gather.cu"].add("gather_weights")  # a weighted fit's (kernels.weighted_files)
    names["epoch.cu"] |= {"cast_f32_f16", "check_state", "snapshot", "history_stage", "advance"}
    return names


@pytest.mark.bindings
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("filename", ["gather.cu", "loss.cu", "update.cu", "epoch.cu"])
def test_every_kernel_the_graph_engine_launches_is_in_its_compiled_file(filename, arch, cache):
    """Each name is an extern "C" symbol of the cubin (the ELF string table holds it NUL-terminated)."""
    cubin = nvrtc.compile_native(filename, arch)
    missing = sorted(n for n in _launched_kernels()[filename] if n.encode() + b"\0" not in cubin)
    assert not missing, missing


# ---------------------------------------------------------------------------------------------------------------
# Issue 8: buffers NVRTC writes into (item 9), and a cache that is trusted only when it should be (item 8)
# ---------------------------------------------------------------------------------------------------------------

REPO = Path(__file__).resolve().parent.parent

_EMPTY_LOG = r"""
from cuda.bindings import nvrtc as nv
from fastnn.cuda import nvrtc
prog = nvrtc._call(nv.nvrtcCreateProgram, b'extern "C" __global__ void k(float* y) { y[0] = 1; }', b"k.cu", 0, [], [],
                   what="create")
nvrtc._call(nv.nvrtcCompileProgram, prog, 1, [b"--gpu-architecture=sm_90"], what="compile")
assert nvrtc._program_log(prog) == "", "a clean compile has an empty log"
print(list(bytes([32])), b"a b".split(bytes([32])))
"""


@pytest.mark.bindings
def test_empty_program_log_does_not_write_into_shared_bytes():
    """An empty log is one NUL byte; read into b" " * 1 it overwrote CPython's shared b" " (in a subprocess:
    the failure would corrupt the test process)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", _EMPTY_LOG], capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[32] [b'a', b'b']"


def test_relative_cache_dir_is_resolved_once(monkeypatch, tmp_path):
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    monkeypatch.setenv("FASTNN_CACHE_DIR", "relative-cache-for-this-test")
    monkeypatch.chdir(first)
    assert nvrtc.cache_dir() == first / "relative-cache-for-this-test"
    monkeypatch.chdir(second)
    assert nvrtc.cache_dir() == first / "relative-cache-for-this-test"  # not moved by the chdir
    assert nvrtc.cache_dir().is_absolute()


@pytest.mark.bindings
def test_new_cache_is_private(kernels, cache, compiles):
    nvrtc.compile_native("k.cu", "sm_90")
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    key = cache / ".key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.stat().st_size == 32
    (entry,) = _entries(cache)
    assert stat.S_IMODE(entry.stat().st_mode) & 0o077 == 0


@pytest.mark.bindings
@pytest.mark.parametrize("mode", [0o770, 0o777, 0o757], ids=oct)
def test_cache_writable_by_others_is_not_used(kernels, cache, compiles, mode):
    cache.mkdir(mode=0o700)
    cache.chmod(mode)
    with pytest.warns(RuntimeWarning, match=f"not using the kernel cache {cache}: it is writable by .*{mode:04o}"):
        first = nvrtc.compile_native("k.cu", "sm_90")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per folder, not per kernel
        assert nvrtc.compile_native("k.cu", "sm_90") == first
    assert len(compiles) == 2  # compiled in memory both times
    assert list(cache.iterdir()) == []  # nothing read from or written to it, not even a key


@pytest.mark.bindings
def test_cache_owned_by_another_user_is_not_used(kernels, cache, compiles, monkeypatch):
    cache.mkdir(mode=0o700)
    uid = cache.stat().st_uid
    monkeypatch.setattr(nvrtc.os, "geteuid", lambda: uid + 1)
    with pytest.warns(RuntimeWarning, match=f"owned by uid {uid}, not by this user"):
        nvrtc.compile_native("k.cu", "sm_90")
    assert len(compiles) == 1 and list(cache.iterdir()) == []


@pytest.mark.bindings
def test_planted_cubin_with_a_recomputed_digest_is_not_trusted(kernels, cache, compiles):
    good = nvrtc.compile_native("k.cu", "sm_90")
    (entry,) = _entries(cache)
    planted = b"\x7fELF planted machine code" + bytes(100)
    head = entry.read_bytes().split(b"\n", 1)[0] + b"\n"
    entry.write_bytes(head + hashlib.sha256(planted).hexdigest().encode() + b"\n" + planted)
    assert nvrtc.compile_native("k.cu", "sm_90") == good
    assert len(compiles) == 2  # the planted entry was refused and replaced by a fresh compile
    assert planted not in entry.read_bytes()
    # The same attack against the old layout (digest, no key) is refused too.
    entry.write_bytes(b"FASTNN-CUBIN\n" + hashlib.sha256(planted).hexdigest().encode() + b"\n" + planted)
    assert nvrtc.compile_native("k.cu", "sm_90") == good and len(compiles) == 3


@pytest.mark.bindings
def test_key_file_that_others_can_read_is_not_used(kernels, cache, compiles):
    nvrtc.compile_native("k.cu", "sm_90")
    (cache / ".key").chmod(0o644)
    with pytest.warns(RuntimeWarning, match=r"its key .*\.key is open to others \(mode 0644\).*fix: remove"):
        nvrtc.compile_native("k.cu", "sm_90")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per folder
        nvrtc.compile_native("k.cu", "sm_90")
    assert len(compiles) == 3  # no trusted key: compiled in memory, the cache neither read nor written


# ---- the key and entries are written whole or not at all; a failing write never fails the compile -------------


def test_a_key_of_another_size_is_never_overwritten(cache):
    """A .key that fastnn did not write (its keys are written whole: one of another size is some other program's,
    or a folder of the user's that FASTNN_CACHE_DIR was pointed at) was replaced by 32 random bytes. It is left as
    it is: one warning, kernels compiled in memory."""
    cache.mkdir(mode=0o700)
    key = cache / ".key"
    key.write_bytes(b"k" * 16)
    key.chmod(0o600)
    with pytest.warns(RuntimeWarning, match=r"its key .*\.key holds 16 bytes, not 32: not a key fastnn wrote.*"
                                            r"compiling kernels in memory instead \(fix: remove"):  # fmt: skip
        assert nvrtc._cache_secret(cache) is None
    assert key.read_bytes() == b"k" * 16 and sorted(p.name for p in cache.iterdir()) == [".key"]
    key.unlink()  # what the warning says to do: the next process makes its own key
    assert len(nvrtc._cache_secret(cache)) == 32 and stat.S_IMODE(key.stat().st_mode) == 0o600


def _lstat_owned_by(monkeypatch, path: Path, uid: int) -> None:
    """os.lstat reports `path` (a link) as owned by `uid`; every other path as it is."""
    real = os.lstat

    def lstat(p, *args, **kwargs):
        st = real(p, *args, **kwargs)
        if os.fspath(p) != os.fspath(path):
            return st
        fields = list(st[:10])
        fields[4] = uid  # st_uid
        return os.stat_result(fields)

    monkeypatch.setattr(os, "lstat", lstat)


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX ownership")
def test_a_link_at_the_cache_root_owned_by_another_user_is_not_followed(tmp_path, monkeypatch):
    """A symlink planted in a shared scratch folder at $FASTNN_CACHE_DIR's name led into a folder of the victim's,
    which passed every check (the victim owns it): the link itself must be the user's."""
    victim = tmp_path / "victims-folder"
    victim.mkdir(mode=0o700)
    (victim / ".key").write_bytes(b"v" * 20)
    planted = tmp_path / "scratch-cache"
    planted.symlink_to(victim)
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(planted))
    _lstat_owned_by(monkeypatch, planted, os.geteuid() + 1)
    with pytest.warns(RuntimeWarning, match=rf"not using the kernel cache {planted}: it is a symbolic link owned "
                                            rf"by uid {os.geteuid() + 1}, not by this user"):  # fmt: skip
        assert nvrtc._trusted_dir() is None
    assert sorted(p.name for p in victim.iterdir()) == [".key"] and (victim / ".key").read_bytes() == b"v" * 20
    monkeypatch.undo()  # a link of the user's own (a cache moved to a bigger disk) is followed
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(planted))
    assert nvrtc._trusted_dir() == planted


_SHORT_WRITE = r"""
import resource, signal, sys, warnings
from pathlib import Path
from fastnn.cuda import nvrtc
nvrtc.native_dir = lambda: Path(sys.argv[1])
nvrtc.nvrtc_version()
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (16, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cubin = nvrtc.compile_native("k.cu", "sm_90")
print(cubin[:4] == b"\x7fELF", [str(w.message) for w in caught])
"""


@pytest.mark.bindings
def test_short_write_of_the_key_leaves_no_key(kernels, cache, compiles):
    """A process whose file size limit is 16 bytes: writing the 32-byte key stops halfway (a real short write,
    then EFBIG). It still compiles, warns once, and leaves no key behind, so the next process caches."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "FASTNN_CACHE_DIR": str(cache), "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run(
        [sys.executable, "-c", _SHORT_WRITE, str(kernels)], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0, r.stderr
    compiled, warned = r.stdout.strip().split(" ", 1)
    assert compiled == "True"
    assert "cannot write the kernel cache's key" in warned and "EFBIG" in warned and warned.count("fastnn:") == 1
    assert list(cache.iterdir()) == []  # no short key, no temporary file
    first = nvrtc.compile_native("k.cu", "sm_90")
    assert nvrtc.compile_native("k.cu", "sm_90") == first and len(compiles) == 1  # cached from now on


@pytest.fixture
def disk_full(monkeypatch):
    """disk_full(test): from now on every file opened for writing whose name passes `test` is /dev/full (ENOSPC)."""
    real_open, full = os.open, [lambda name: False]

    def open_(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR) and full[0](Path(os.fsdecode(path)).name):
            return real_open("/dev/full", os.O_WRONLY)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    return lambda test: full.__setitem__(0, test)


@pytest.mark.bindings
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_disk_full_writing_the_key_compiles_in_memory_with_one_warning(kernels, cache, compiles, disk_full):
    disk_full(lambda name: ".key" in name)
    with pytest.warns(RuntimeWarning, match=r"cannot write the kernel cache's key .*ENOSPC") as caught:
        first = nvrtc.compile_native("k.cu", "sm_90")  # the ENOSPC used to escape raw from here
    assert len(caught) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per folder
        assert nvrtc.compile_native("k.cu", "sm_90") == first
    assert len(compiles) == 2 and list(cache.iterdir()) == []
    disk_full(lambda name: False)  # space again: the key is made and the cache used
    nvrtc.compile_native("k.cu", "sm_90")
    assert nvrtc.compile_native("k.cu", "sm_90") == first and len(compiles) == 3
    assert (cache / ".key").stat().st_size == 32


@pytest.mark.bindings
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_disk_full_writing_an_entry_warns_once(kernels, cache, compiles, disk_full):
    disk_full(lambda name: ".cubin" in name)
    with pytest.warns(RuntimeWarning, match=rf"cannot write to the kernel cache {cache} .*ENOSPC.*not cached"):
        first = nvrtc.compile_native("k.cu", "sm_90")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per folder
        assert nvrtc.compile_native("k.cu", "sm_90", ("--use_fast_math",)) != first
    assert len(compiles) == 2 and _entries(cache) == []


@pytest.mark.bindings
@pytest.mark.parametrize("precision", ["mixed", "fp16", "fp32"])
@pytest.mark.parametrize("regression", [False, True], ids=["xent", "mse"])
def test_an_engine_compiles_only_the_gather_loss_and_update_kernels_it_launches(precision, regression, cache):
    """gather_file, loss_file and update_file (issue 41): the selected cubin holds what the precision launches and
    nothing else."""
    from fastnn.engine.graph import kernels
    from fastnn.engine.plan import precision_spec

    spec = precision_spec(precision)
    everything = _launched_kernels()
    wanted = {
        "gather.cu": {f"gather_{src}_{spec.gather_kernel_suffix}" for src in ("u8", "f32")},
        "loss.cu": {spec.mse_kernel if regression else spec.loss_kernel},
        "update.cu": {spec.update_kernel} | {spec.update_gather_kernel(src) for src in ("u8", "f32")},
    }
    files = [kernels.gather_file(spec), kernels.loss_file(spec, regression)]
    if not regression:  # the update is the same for either loss
        files.append(kernels.update_file(spec))
    for filename, options in files:
        cubin = nvrtc.compile_native(filename, "sm_90", options)
        assert {n for n in everything[filename] if n.encode() + b"\0" in cubin} == wanted[filename]
