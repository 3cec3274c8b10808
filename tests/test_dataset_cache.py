"""The decoded dataset cache (fastnn/_decoded.py): a verified dataset is memory-mapped from the cache on the next
load and reaches fit without a copy; a changed source, a damaged or foreign entry and an untrusted folder are never
trusted (the files are verified and decoded again)."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import fastnn
from fastnn import _cachedir, _decoded, datasets
from fastnn._data import check_inputs
from fastnn._errors import DataError

STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
HOUR_AGO = time.time_ns() - 3600 * 10**9
posix = pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership")


def make(folder: Path, compress: bool = True, seed: int = 0) -> tuple[datasets.DatasetSpec, list[np.ndarray]]:
    """Four IDX files in `folder`, last written an hour ago, and a spec with their published checksums."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    arrays = [rng.integers(0, 256, (12, 28, 28), dtype=np.uint8), rng.integers(0, 10, 12, dtype=np.uint8),
              rng.integers(0, 256, (5, 28, 28), dtype=np.uint8), rng.integers(0, 10, 5, dtype=np.uint8)]  # fmt: skip
    files = []
    for stem, arr in zip(STEMS, arrays):
        raw = bytes([0, 0, 8, arr.ndim]) + np.asarray(arr.shape, ">u4").tobytes() + arr.tobytes()
        gz = gzip.compress(raw, mtime=0)
        path = folder / (stem + (".gz" if compress else ""))
        path.write_bytes(gz if compress else raw)
        os.utime(path, ns=(HOUR_AGO, HOUR_AGO))
        files.append(
            datasets.RemoteFile(stem + ".gz", hashlib.sha256(gz).hexdigest(), len(gz), hashlib.sha256(raw).hexdigest(),
                                len(raw), arr.shape)  # fmt: skip
        )
    return datasets.DatasetSpec("mnist", tuple(files), ("http://127.0.0.1:9/",)), arrays


@pytest.fixture
def setup(tmp_path, monkeypatch):
    """(source folder, cache folder, the arrays written, verifications): MNIST replaced by a small synthetic one."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FASTNN_DATA", raising=False)
    cache = tmp_path / "cache"
    monkeypatch.setenv(_decoded.CACHE_ENV, str(cache))
    source = tmp_path / "data"
    spec, arrays = make(source)
    monkeypatch.setitem(datasets.DATASETS, "mnist", spec)
    verified: list[str] = []
    real = datasets._verified_bytes

    def counting(path, rf, spec):
        verified.append(path.name)
        return real(path, rf, spec)

    monkeypatch.setattr(datasets, "_verified_bytes", counting)
    return source, cache, arrays, verified


def load(source: Path):
    return datasets.load("mnist", root=source, download=False)


def check(out, arrays) -> None:
    """`out` holds what was written: x as (N, 784) uint8, y as int64."""
    np.testing.assert_array_equal(out[0], arrays[0].reshape(-1, 784))
    np.testing.assert_array_equal(out[1], arrays[1].astype(np.int64))
    np.testing.assert_array_equal(out[2], arrays[2].reshape(-1, 784))
    np.testing.assert_array_equal(out[3], arrays[3].astype(np.int64))
    assert out[0].dtype == np.uint8 and out[1].dtype == np.int64


def entry(cache: Path, source: Path, stem: str) -> Path:
    """The cached IDX file of `stem` (keyed by its decoded content: the same for every source folder)."""
    rf = datasets.DATASETS["mnist"].files[STEMS.index(stem)]
    return cache / f"{_decoded.entry_key('mnist', stem, rf.raw_sha256)}.idx"


# ---------------------------------------------------------------------------------------------------------------
# The round trip
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False], ids=["gz", "raw"])
def test_the_next_load_maps_the_cache_and_fit_gets_it_without_a_copy(setup, tmp_path, monkeypatch, compress):
    source, cache, arrays, verified = setup
    if not compress:
        spec, arrays = make(tmp_path / "raw", compress=False)
        monkeypatch.setitem(datasets.DATASETS, "mnist", spec)
        source = tmp_path / "raw"
    check(load(source), arrays)
    assert len(verified) == 4 and len(list(cache.glob("*.idx"))) == 4
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in cache.iterdir())
    out = load(source)
    check(out, arrays)
    assert len(verified) == 4  # nothing read, verified or decompressed again
    x = out[0]
    assert isinstance(x, np.memmap) and Path(x.filename).parent == cache
    assert x.flags.c_contiguous and x.flags.writeable  # copy-on-write: writable, and the file never changes
    assert check_inputs(x, 784, gpu=True) is x  # fit's conversion hands the mapping on as is: no copy, no new view
    before = Path(x.filename).read_bytes()
    x[0, 0] ^= 0xFF
    assert Path(x.filename).read_bytes() == before
    check(load(source), arrays)


def test_a_source_changed_since_it_was_verified_is_verified_again(setup):
    source, cache, arrays, verified = setup
    load(source)
    path = source / "t10k-labels-idx1-ubyte.gz"
    os.utime(path, ns=(HOUR_AGO + 10**9, HOUR_AGO + 10**9))  # touched: same bytes, a new mtime
    check(load(source), arrays)
    assert verified[4:] == ["t10k-labels-idx1-ubyte.gz"]
    check(load(source), arrays)
    assert len(verified) == 5  # recorded again


def test_a_corrupt_source_replaced_with_the_old_size_and_mtime_is_caught(setup):
    source, cache, arrays, verified = setup
    load(source)
    path = source / "t10k-labels-idx1-ubyte.gz"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    tmp = path.with_name("new")
    tmp.write_bytes(bytes(data))
    os.utime(tmp, ns=(HOUR_AGO, HOUR_AGO))
    os.replace(tmp, path)  # the same size and mtime: only the inode tells
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte: sha256"):
        load(source)


def test_a_source_written_just_now_is_recorded_only_later(setup):
    """A write within RACY_NS of the verification could be followed by another in the same mtime tick."""
    source, cache, arrays, verified = setup
    now = time.time_ns()
    for p in source.iterdir():
        os.utime(p, ns=(now, now))
    load(source)
    assert list(cache.glob("*")) == []
    for p in source.iterdir():
        os.utime(p, ns=(HOUR_AGO, HOUR_AGO))
    load(source)
    load(source)
    assert len(verified) == 8 and len(list(cache.glob("*.idx"))) == 4


def test_a_source_changed_while_it_was_read_is_not_recorded(setup, monkeypatch):
    source, cache, arrays, verified = setup
    real = datasets._verified_bytes

    def touching(path, rf, spec):
        data = real(path, rf, spec)
        os.utime(path, ns=(HOUR_AGO + 10**9, HOUR_AGO + 10**9))
        return data

    monkeypatch.setattr(datasets, "_verified_bytes", touching)
    check(load(source), arrays)
    assert list(cache.glob("*")) == []


def test_verify_false_is_not_cached(setup):
    source, cache, arrays, verified = setup
    check(datasets.load("mnist", root=source, download=False, verify=False), arrays)
    assert not cache.exists() or list(cache.iterdir()) == []


def test_decoded_bytes_that_are_not_the_published_ones_are_not_recorded(setup, monkeypatch):
    source, cache, arrays, verified = setup
    spec = datasets.DATASETS["mnist"]
    wrong = datasets.RemoteFile(**{**vars(spec.files[3]), "raw_sha256": "0" * 64})
    changed = datasets.DatasetSpec("mnist", (*spec.files[:3], wrong), spec.mirrors)
    monkeypatch.setitem(datasets.DATASETS, "mnist", changed)
    check(load(source), arrays)
    assert len(list(cache.glob("*.idx"))) == 3


@posix
def test_the_entry_key_is_pinned():
    """The key names the entries already on users' disks: a refactoring that changed it would silently decode
    every dataset again and leave the old entries behind. Change this value only together with SCHEMA_VERSION."""
    assert _decoded.SCHEMA_VERSION == 2  # 2: by content (1 held the source's real path)
    key = _decoded.entry_key("mnist", "train-images", "ab" * 32)
    assert key == "8d7d82f6dd27751d80eaef6d5566f376681cb69a906219952c0a4e21a51e308a"


# ---------------------------------------------------------------------------------------------------------------
# Damaged or foreign entries: rebuilt, never trusted
# ---------------------------------------------------------------------------------------------------------------


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-1])


def _same_size_new_content(path: Path) -> None:
    """Rewritten in place (same inode) with other bytes of the same size, a second later."""
    mtime = path.stat().st_mtime_ns
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(mtime + 10**9, mtime + 10**9))  # as a later write would leave it, on any clock granularity


def _same_size_same_mtime(path: Path) -> None:
    """Replaced by other bytes of the same size, the mtime set back: only the inode tells."""
    st = path.stat()
    tmp = path.with_name("x")
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    tmp.write_bytes(bytes(data))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)


def _open_to_others(path: Path) -> None:
    path.chmod(0o666)


def _symlink_elsewhere(path: Path) -> None:
    target = path.with_name("elsewhere")
    os.replace(path, target)
    path.symlink_to(target)


def _record_symlinked(path: Path) -> None:
    record = path.with_suffix(".json")
    target = record.with_name("elsewhere.json")
    os.replace(record, target)
    record.symlink_to(target)


def _short_payload_recorded(path: Path) -> None:
    """A payload shorter than its header declares, with the record updated to match (size, mtime, inode)."""
    path.write_bytes(path.read_bytes()[:-1])
    _update_record(path)


def _garbage_record(path: Path) -> None:
    path.with_suffix(".json").write_text("{not json")


def _record_of_another_key(path: Path) -> None:
    record = path.with_suffix(".json")
    data = json.loads(record.read_text())
    data["key"] = "0" * 64
    record.write_text(json.dumps(data))


def _record_claims_another_checksum(path: Path) -> None:
    record = path.with_suffix(".json")
    data = json.loads(record.read_text())
    data["entry"]["sha256"] = "1" * 64
    record.write_text(json.dumps(data))


def _record_open_to_others(path: Path) -> None:
    path.with_suffix(".json").chmod(0o622)


def _wrong_header(path: Path) -> None:
    """An entry whose header declares other dims, with the record updated to match it (size, mtime, inode)."""
    data = bytearray(path.read_bytes())
    data[3] = 2  # 2 dims instead of 1 (labels) / 3 (images)
    path.write_bytes(bytes(data))
    _update_record(path)


def _update_record(path: Path) -> None:
    record = path.with_suffix(".json")
    rec = json.loads(record.read_text())
    st = path.stat()
    rec["entry"].update(size=st.st_size, mtime_ns=st.st_mtime_ns, ino=st.st_ino)
    record.write_text(json.dumps(rec))


def _removed(path: Path) -> None:
    path.unlink()


DAMAGE = [_truncate, _same_size_new_content, _same_size_same_mtime, _open_to_others, _symlink_elsewhere,
          _garbage_record, _record_of_another_key, _record_claims_another_checksum, _record_open_to_others,
          _wrong_header, _short_payload_recorded, _record_symlinked, _removed]  # fmt: skip


@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__.strip("_") for d in DAMAGE])
@pytest.mark.parametrize("stem", ["train-images-idx3-ubyte", "t10k-labels-idx1-ubyte"])
def test_a_damaged_entry_is_rebuilt_not_trusted(setup, damage, stem):
    source, cache, arrays, verified = setup
    load(source)
    path = entry(cache, source, stem)
    assert path.is_file()
    damage(path)
    check(load(source), arrays)
    assert verified[4:] == [stem + ".gz"]  # that file alone was verified and decoded again
    check(load(source), arrays)
    assert len(verified) == 5  # and the rebuilt entry is trusted


@posix
def test_an_entry_owned_by_another_user_is_rebuilt(setup, monkeypatch):
    source, cache, arrays, verified = setup
    load(source)
    uid = os.geteuid()
    monkeypatch.setattr(_cachedir, "refusal", lambda directory: None)  # the folder passes; the files do not
    monkeypatch.setattr(os, "geteuid", lambda: uid + 1)
    check(load(source), arrays)
    assert len(verified) == 8


# ---------------------------------------------------------------------------------------------------------------
# Untrusted or unusable cache folders: no cache
# ---------------------------------------------------------------------------------------------------------------


@posix
def test_a_cache_folder_open_to_others_is_not_used(setup):
    source, cache, arrays, verified = setup
    load(source)
    cache.chmod(0o777)
    _cachedir._warned.discard((cache, "dataset cache"))
    with pytest.warns(RuntimeWarning, match="not using the dataset cache .* writable by its group and others"):
        check(load(source), arrays)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per folder
        check(load(source), arrays)
    assert len(verified) == 12


@posix
def test_a_cache_folder_owned_by_another_user_is_not_used(setup, monkeypatch):
    source, cache, arrays, verified = setup
    load(source)
    uid = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: uid + 1)
    _cachedir._warned.discard((cache, "dataset cache"))
    with pytest.warns(RuntimeWarning, match=f"owned by uid {uid}"):
        check(load(source), arrays)
    assert len(verified) == 8


def test_an_unusable_cache_location_still_loads(setup, tmp_path, monkeypatch):
    source, cache, arrays, verified = setup
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(_decoded.CACHE_ENV, str(blocker / "cache"))
    check(load(source), arrays)
    check(load(source), arrays)
    assert len(verified) == 8


# ---------------------------------------------------------------------------------------------------------------
# Mapped arrays in fit
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_fit_takes_a_memory_map_as_it_is(tmp_path, dtype):
    """No copy and no new view object: the GPU engines know the data they already hold by the array object."""
    x = np.memmap(tmp_path / "x", dtype=dtype, mode="w+", shape=(40, 784))
    x[:] = np.random.default_rng(0).integers(0, 256, x.shape)
    assert check_inputs(x, 784, gpu=True) is x and check_inputs(x, 784) is x
    y = np.arange(40) % 10
    trainer = fastnn.Trainer(fastnn.MLP([784, 8, 10]), device="cpu", batch_size=16, precision="fp32")
    history = trainer.fit(x, y, epochs=2)
    assert len(history) == 2 and np.isfinite(history["train_loss"]).all()


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["graph", "fused"])
def test_a_mapped_dataset_is_uploaded_once_across_fits(tmp_path, monkeypatch, engine):
    from fastnn.engine.graph.resources import Resources

    x = np.memmap(tmp_path / "x", dtype=np.uint8, mode="w+", shape=(512, 784))
    x[:] = np.random.default_rng(0).integers(0, 256, x.shape)
    y = np.arange(512) % 10
    uploads: list[int] = []
    real = Resources.upload  # every upload of the graph, fused and grid engines (GraphEngine.upload included)

    def counting(self, dst, array):
        if getattr(array, "nbytes", 0) == x.nbytes:
            uploads.append(array.nbytes)
        return real(self, dst, array)

    monkeypatch.setattr(Resources, "upload", counting)
    with fastnn.Trainer(fastnn.MLP([784, 32, 10]), device="cuda", batch_size=64, engine=engine) as trainer:
        trainer.fit(x, y, epochs=1)
        first = len(uploads)
        trainer.fit(x, y, epochs=1)
    assert first >= 1 and len(uploads) == first  # the second fit found the mapped x resident


def test_the_suite_decodes_into_a_folder_of_its_own(tmp_path_factory):
    """conftest's session fixture: what the tests decode goes to this session's temporary folder, never the user's
    ~/.cache/fastnn/decoded (unless the user named a folder with FASTNN_DATASET_CACHE_DIR before the run)."""
    where = _decoded.cache_dir()
    if where.is_relative_to(tmp_path_factory.getbasetemp()):
        return
    assert where != _cachedir.base_dir().absolute() / "decoded", "the tests decode into the user's own cache"
    pytest.skip(f"the user named {where} with {_decoded.CACHE_ENV} before the run: the suite keeps it")
