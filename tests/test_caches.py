"""Where fastnn's caches live (XDG_CACHE_HOME, no home directory at all), their bounds, and `fastnn cache`."""

from __future__ import annotations

import os
import shutil
import stat
import time
from pathlib import Path

import pytest
from test_dataset_cache import make

from fastnn import _cachedir, _decoded, datasets
from fastnn.__main__ import main
from fastnn.cuda import nvrtc

_ENVS = ("FASTNN_CACHE_DIR", "FASTNN_DATASET_CACHE_DIR", "XDG_CACHE_HOME", "FASTNN_DATA", "FASTNN_CACHE_MAX_MB",
         "FASTNN_DATASET_CACHE_MAX_MB")  # fmt: skip


@pytest.fixture
def clean(monkeypatch, tmp_path) -> Path:
    """No fastnn variables; HOME is tmp_path/home."""
    for name in _ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_xdg_cache_home_is_honoured(clean, monkeypatch):
    xdg = clean / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    assert nvrtc.cache_dir() == xdg / "fastnn" / "kernels"
    assert _decoded.cache_dir() == xdg / "fastnn" / "decoded"
    assert datasets._cache_dir("mnist") == xdg / "fastnn" / "mnist"  # downloads
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/xdg")  # the XDG spec: a relative path is ignored
    assert nvrtc.cache_dir() == clean / "home" / ".cache" / "fastnn" / "kernels"


def _no_home(monkeypatch) -> None:
    """What Python does with HOME unset for a uid with no passwd entry (a container's arbitrary uid)."""

    def home(cls):
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(Path, "home", classmethod(home))
    monkeypatch.setattr(_cachedir, "_temporary", [])  # as in a fresh process


def test_no_home_directory_caches_in_a_private_temporary_folder_with_one_warning(clean, monkeypatch):
    """Every kernel compile and datasets.load(root=...) raised a raw RuntimeError: no GPU engine could be built."""
    _no_home(monkeypatch)
    with pytest.warns(RuntimeWarning, match=r"no home directory .* for this process only; set XDG_CACHE_HOME") as w:
        kernels = nvrtc.cache_dir()
        decoded = _decoded.cache_dir()
    assert len(w) == 1 and kernels.parent == decoded.parent  # one warning, one root for both
    root = kernels.parent
    assert root.is_dir() and stat.S_IMODE(root.stat().st_mode) == 0o700 and root.stat().st_uid == os.geteuid()
    assert nvrtc._trusted_dir() == kernels and len(nvrtc._cache_secret(kernels)) == 32  # a usable kernel cache
    spec, arrays = make(clean / "data")
    monkeypatch.setitem(datasets.DATASETS, "mnist", spec)
    out = datasets.load("mnist", root=clean / "data", download=False)
    assert (out[1] == arrays[1]).all() and len(list(decoded.glob("*.idx"))) == 4
    monkeypatch.setenv("XDG_CACHE_HOME", str(clean / "xdg"))  # the fix the warning names
    assert nvrtc.cache_dir() == clean / "xdg" / "fastnn" / "kernels"


@pytest.fixture
def data(clean, monkeypatch):
    """The decoded cache in tmp_path/cache; `mnist` replaced by a small dataset in tmp_path/a."""
    cache = clean / "cache"
    monkeypatch.setenv(_decoded.CACHE_ENV, str(cache))
    spec, arrays = make(clean / "a")
    monkeypatch.setitem(datasets.DATASETS, "mnist", spec)
    return cache


def _idx(cache: Path) -> int:
    return len(list(cache.glob("*.idx")))


def test_copies_of_a_dataset_share_one_entry(data, clean):
    """Keyed by path, each per-job scratch copy kept a full decoded copy (55 MB for MNIST), filling a home quota."""
    datasets.load("mnist", root=clean / "a", download=False)
    for job in range(3):
        shutil.copytree(clean / "a", clean / f"job{job}", copy_function=shutil.copy2)
        datasets.load("mnist", root=clean / f"job{job}", download=False)
    assert _idx(data) == 4
    mapped = datasets.load("mnist", root=clean / "a", download=False)[0]  # every copy still hits
    assert Path(mapped.filename).parent == data


def test_an_entry_whose_sources_are_gone_is_dropped(data, clean, monkeypatch):
    datasets.load("mnist", root=clean / "a", download=False)
    shutil.rmtree(clean / "a")  # the job's scratch copy, deleted
    spec, _ = make(clean / "b", seed=1)  # another dataset's first load writes, and tidies
    monkeypatch.setitem(datasets.DATASETS, "mnist", spec)
    datasets.load("mnist", root=clean / "b", download=False)
    assert _idx(data) == 4 and len(list(data.glob("*.json"))) == 4


def test_the_dataset_cache_is_bounded(data, clean, monkeypatch):
    bound = 20_000  # about one small dataset's four entries (~15 KB)
    monkeypatch.setenv(_decoded.MAX_MB_ENV, str(bound / 2**20))
    datasets.load("mnist", root=clean / "a", download=False)
    spec, _ = make(clean / "b", seed=1)
    monkeypatch.setitem(datasets.DATASETS, "mnist", spec)
    datasets.load("mnist", root=clean / "b", download=False)
    entries, size = _cachedir.usage(data)
    assert size <= bound and 1 <= entries < 8
    newest = {_decoded.entry_key("mnist", rf.name.removesuffix(".gz"), rf.raw_sha256) for rf in spec.files}
    assert newest <= {p.stem for p in data.glob("*.idx")}  # the least recently used went first: the first load's


def test_the_kernel_cache_is_bounded_least_recently_used_first(clean, monkeypatch):
    cache = clean / "kernels"
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(cache))
    monkeypatch.setenv(nvrtc.MAX_MB_ENV, str(2500 / 2**20))  # room for two 1 KB entries
    folder = nvrtc._trusted_dir()
    secret = nvrtc._cache_secret(folder)
    paths = [folder / f"{c * 64}.cubin" for c in "abc"]
    nvrtc._write_cache(paths[0], b"x" * 1000, secret)
    nvrtc._write_cache(paths[1], b"y" * 1000, secret)
    past = time.time_ns() - 10**10
    for p in paths[:2]:
        os.utime(p, ns=(past, past))
    assert nvrtc._read_cache(paths[0], secret) == b"x" * 1000  # a hit: now the most recently used
    nvrtc._write_cache(paths[2], b"z" * 1000, secret)
    assert [p.exists() for p in paths] == [True, False, True]
    assert (folder / ".key").exists()  # not an entry: never evicted


def test_fastnn_cache_clear_removes_the_caches_entries_and_nothing_else(data, clean, monkeypatch, capsys):
    kernels = clean / "kernels"
    monkeypatch.setenv("FASTNN_CACHE_DIR", str(kernels))
    nvrtc._write_cache(nvrtc._trusted_dir() / f"{'d' * 64}.cubin", b"cubin", nvrtc._cache_secret(kernels))
    (kernels / f".{'e' * 64}.cublaslt.0123456789ab.tmp").write_bytes(b"left by a killed process")
    (kernels / "notes.txt").write_text("the user's own file")
    (kernels / f"{'f' * 64}").write_text("not a cache name")
    datasets.load("mnist", root=clean / "a", download=False)
    assert main(["cache"]) == 0
    shown = capsys.readouterr().out
    assert f"kernels:   {kernels}: 1 entries" in shown and f"datasets:  {data}: 4 entries" in shown
    assert main(["cache", "clear"]) == 0
    assert "removed 2 files" in capsys.readouterr().out
    assert sorted(p.name for p in kernels.iterdir()) == [".key", "f" * 64, "notes.txt"]
    assert list(data.iterdir()) == [] and (clean / "a").is_dir()  # the source data stays
    datasets.load("mnist", root=clean / "a", download=False)  # and the cache fills again
    assert _idx(data) == 4
