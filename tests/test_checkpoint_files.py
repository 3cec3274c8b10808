"""Checkpoint files that are hostile, damaged or written under failing disks.

The bombs are small on disk; the tests count the bytes zipfile hands out, so a regression that decompresses
them shows as a failed assertion, not as a machine out of memory."""

from __future__ import annotations

import errno
import io
import json
import math
import os
import pickle
import stat
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fastnn import MLP, SGD, ConfigError, DataError, Trainer
from fastnn import _checkpoint as ckpt

D, C = 6, 3


@pytest.fixture
def good(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, D)).astype(np.float32), rng.integers(0, C, 32)
    t = Trainer(MLP([D, 5, C]), SGD(lr=0.1, momentum=0.9), batch_size=16, device="cpu")
    t.fit(x, y, epochs=1)
    path = tmp_path / "good.npz"
    t.save(path)
    return path


@pytest.fixture
def bytes_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A running total of the decompressed bytes zipfile hands out (one element, updated in place)."""
    total = [0]
    real = zipfile.ZipExtFile.read

    def counting(self, n=-1):
        data = real(self, n)
        total[0] += len(data)
        return data

    monkeypatch.setattr(zipfile.ZipExtFile, "read", counting)
    return total


def _npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    f = io.BytesIO()
    np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": shape})
    return f.getvalue()


def _members(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as z:
        return {n: z.read(n) for n in z.namelist()}


def _write(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _npy(value: np.ndarray) -> bytes:
    f = io.BytesIO()
    np.save(f, value)
    return f.getvalue()


def _rejected(path: Path, *words: str) -> DataError:
    with pytest.raises(DataError) as info:
        Trainer.load(path, device="cpu")
    for w in (str(path), *words):
        assert w in str(info.value), f"{w!r} not in: {info.value}"
    return info.value


# ---- item 5: zip bombs -------------------------------------------------------------------------------------


def test_bomb_without_marker_is_refused_before_decompressing(tmp_path: Path, bytes_read: list[int]) -> None:
    # 64 MiB of zeros deflate to ~64 KiB; today's loader inflated every member before looking for the marker.
    bomb = _write(tmp_path / "bomb.npz", {"w.npy": _npy_header((16 << 20,)) + bytes(64 << 20)})
    assert bomb.stat().st_size < 1 << 20
    _rejected(bomb, "not a fastnn checkpoint", "marker")
    assert bytes_read[0] < 1 << 16


def test_bomb_beside_a_valid_marker_is_refused_from_its_header(
    good: Path, tmp_path: Path, bytes_read: list[int]
) -> None:
    members = _members(good)
    members["0.weight.npy"] = _npy_header((16 << 20,)) + bytes(64 << 20)
    bytes_read[0] = 0
    _rejected(_write(tmp_path / "bomb.npz", members), "'0.weight.npy'", "(16777216,)", "(5, 6)")
    assert bytes_read[0] < 1 << 16


@pytest.mark.parametrize("name", ["extra.npy", "evil.bin", "0.weight.npy.bak"])
def test_bomb_under_an_unexpected_name_beside_a_valid_marker(
    good: Path, tmp_path: Path, bytes_read: list[int], name: str
) -> None:
    members = _members(good)
    members[name] = _npy_header((16 << 20,)) + bytes(64 << 20)
    bytes_read[0] = 0
    _rejected(_write(tmp_path / "bomb.npz", members), "unexpected", repr(name.removesuffix(".npy")))
    assert bytes_read[0] < 1 << 16  # refused by its name, never inflated


def test_member_declaring_4_tb_is_a_dataerror_not_memoryerror(good: Path, tmp_path: Path) -> None:
    members = _members(good)
    members["0.weight.npy"] = _npy_header((1 << 40,)) + bytes(64)  # 4 TiB of float32 declared, 64 bytes present
    bomb = _write(tmp_path / "4tb.npz", members)
    _rejected(bomb, "'0.weight.npy'", str((1 << 40,)))
    # Without a config to compare with, the header still disagrees with the zip entry's declared size.
    with pytest.raises(DataError, match=r"declares \d+ bytes, but its header .* implies 4398046511\d+"):
        ckpt.load(bomb)


def test_member_whose_zip_size_disagrees_with_its_header(good: Path, tmp_path: Path) -> None:
    members = _members(good)
    members["0.bias.npy"] += bytes(1000)  # right shape, trailing bytes the header does not account for
    _rejected(_write(tmp_path / "trailing.npz", members), "'0.bias.npy'", "declares", "implies")


def test_oversized_npy_header_is_not_read(good: Path, tmp_path: Path, bytes_read: list[int]) -> None:
    members = _members(good)
    # A format 2.0 header claiming 64 MiB of header text (spaces deflate to almost nothing).
    members["0.bias.npy"] = b"\x93NUMPY\x02\x00" + (64 << 20).to_bytes(4, "little") + b" " * (64 << 20)
    bytes_read[0] = 0
    _rejected(_write(tmp_path / "header.npz", members), "'0.bias.npy'", "header")
    assert bytes_read[0] < 1 << 20


def test_config_member_bomb_is_refused_by_its_declared_size(
    good: Path, tmp_path: Path, bytes_read: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ckpt, "_CONFIG_MEMBER_BYTES", 1 << 20)  # the real cap is 128 MiB: too slow to build here
    members = _members(good)
    members["__fastnn_config__.npy"] = _npy(np.array(" " * (1 << 20)))  # 4 MiB as UTF-32
    bytes_read[0] = 0
    _rejected(_write(tmp_path / "config.npz", members), "__fastnn_config__", "declares")
    assert bytes_read[0] < 1 << 16


@pytest.mark.parametrize(
    "version, words",
    [(np.array(-1), ["version -1"]), (np.array(1.0), ["__fastnn_version__", "float64"]), (np.array("1"), ["<U1"])],
)
def test_version_of_the_wrong_type_or_sign(good: Path, tmp_path: Path, version: np.ndarray, words: list[str]) -> None:
    members = _members(good)
    members["__fastnn_version__.npy"] = _npy(version)
    _rejected(_write(tmp_path / "version.npz", members), *words)


def test_deeply_nested_config_is_a_dataerror(good: Path, tmp_path: Path) -> None:
    members = _members(good)
    members["__fastnn_config__.npy"] = _npy(np.array("[" * 100000))
    _rejected(_write(tmp_path / "nested.npz", members), "config", "nested")


def test_config_not_an_object(good: Path, tmp_path: Path) -> None:
    members = _members(good)
    members["__fastnn_config__.npy"] = _npy(np.array(json.dumps([1, 2])))
    _rejected(_write(tmp_path / "list.npz", members), "config", "list")


def test_good_file_reads_exactly(good: Path) -> None:
    t = Trainer.load(good, device="cpu")
    config, arrays = ckpt.load(good)
    assert config["epoch"] == t.epoch == 1
    for k, v in t.state_dict().items():
        np.testing.assert_array_equal(arrays[k], v)
        assert arrays[k].flags.writeable


# ---- item 10: arguments and failing disks ------------------------------------------------------------------


def test_save_and_load_of_none_are_configerrors(good: Path) -> None:
    t = Trainer.load(good, device="cpu")
    for call in (lambda: t.save(None), lambda: Trainer.load(None, device="cpu"), lambda: t.save(5)):
        with pytest.raises(ConfigError, match="an os.PathLike or a binary file object, got (None|5)"):
            call()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EIO])
def test_disk_errors_during_save_name_the_target_and_keep_the_cause(
    good: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    t = Trainer.load(good, device="cpu")
    before = good.read_bytes()

    def failing_fsync(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(ckpt.os, "fsync", failing_fsync)
    with pytest.raises(DataError) as info:
        t.save(good)
    assert str(good) in str(info.value) and errno.errorcode[code] in str(info.value)
    assert isinstance(info.value.__cause__, OSError) and info.value.__cause__.errno == code
    monkeypatch.undo()
    assert good.read_bytes() == before
    assert sorted(p.name for p in good.parent.iterdir()) == ["good.npz"]


def test_254_character_file_name(good: Path) -> None:
    t = Trainer.load(good, device="cpu")
    path = good.parent / ("c" * 250 + ".npz")
    t.save(path)
    assert Trainer.load(path, device="cpu").epoch == 1
    too_long = good.parent / ("c" * 256 + ".npz")
    with pytest.raises(DataError, match="ENAMETOOLONG") as info:
        t.save(too_long)
    assert str(too_long) in str(info.value)


# ---- item 14: mode and durability ---------------------------------------------------------------------------


def test_resave_keeps_a_private_mode(good: Path) -> None:
    t = Trainer.load(good, device="cpu")
    good.chmod(0o600)
    t.save(good)
    assert stat.S_IMODE(good.stat().st_mode) == 0o600
    good.chmod(0o640)
    t.save(good)
    assert stat.S_IMODE(good.stat().st_mode) == 0o640


def test_folder_is_fsynced_after_the_rename(good: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    t = Trainer.load(good, device="cpu")
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def spy_fsync(fd: int) -> None:
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def spy_replace(src, dst) -> None:
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "fsync", spy_fsync)
    monkeypatch.setattr(ckpt.os, "replace", spy_replace)
    t.save(good)
    assert events == ["fsync file", "replace", "fsync dir"]


# ---- evaluation results are reports: a NaN one is saved as it is ----------------------------------------------


def _nan_evaluating(t: Trainer, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make `t`'s engine score every evaluation set NaN, as a GPU does on inputs that overflow its float16
    operands (the NumPy engine evaluates in float64, where finite float32 inputs cannot overflow)."""
    monkeypatch.setattr(t._engine, "evaluate", lambda x, y: (math.nan, math.nan))


def _nan_evaluation(monkeypatch: pytest.MonkeyPatch) -> tuple[Trainer, tuple[np.ndarray, np.ndarray]]:
    """A trainer whose second epoch's evaluation loss is NaN; training itself is on ordinary data."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(48, D)).astype(np.float32), rng.integers(0, C, 48)
    t = Trainer(MLP([D, 5, C]), SGD(lr=0.1, momentum=0.9), batch_size=16, device="cpu")
    t.fit(x, y, epochs=1, eval_data=(x, y))
    with monkeypatch.context() as m:
        _nan_evaluating(t, m)
        t.fit(x, y, epochs=1, eval_data=(x, y))
    assert math.isfinite(t.history[0]["eval_loss"]) and math.isnan(t.history[1]["eval_loss"])
    return t, (x, y)


def test_a_nan_evaluation_loss_is_saved_and_loaded_as_it_is(tmp_path: Path, monkeypatch) -> None:
    """save() refused such a trainer for the rest of its life ("history[1]['eval_loss'] must be None or a finite
    number"): evaluation results are reports, not training state."""
    t, (x, y) = _nan_evaluation(monkeypatch)
    path = tmp_path / "m.npz"
    t.save(path)
    text = _members(path)["__fastnn_config__.npy"]
    config, _ = ckpt.load(path)
    assert [r["eval_loss"] for r in config["history"]][1] == "nan"  # strict JSON: no bare NaN in the file
    assert b"NaN" not in text
    loaded = Trainer.load(path, device="cpu")
    assert loaded.history == t.history and math.isnan(loaded.history[1]["eval_loss"])
    assert (loaded.epoch, loaded.step) == (t.epoch, t.step) == (2, 6)
    for name, value in t._engine.get_state().items():
        np.testing.assert_array_equal(loaded._engine.get_state()[name], value, err_msg=name)
    t.fit(x, y, epochs=1)  # and both go on alike
    loaded.fit(x, y, epochs=1)
    np.testing.assert_array_equal(loaded.state_dict()["0.weight"], t.state_dict()["0.weight"])
    # The encoding refuses what fastnn does not write: other strings, and a bare NaN token.
    for tampered in ("NaN", "banana", math.nan, -1.0):
        config["history"][1]["eval_loss"] = tampered
        members = _members(path)
        members["__fastnn_config__.npy"] = _npy(np.array(json.dumps(config)))
        _rejected(_write(tmp_path / "bad.npz", members), "history[1]['eval_loss']", repr(tampered))


def test_a_fitted_estimator_with_a_nan_evaluation_pickles(tmp_path: Path, monkeypatch) -> None:
    """Pickling an estimator saves its trainer: a NaN evaluation loss broke joblib and GridSearchCV(n_jobs>1)."""
    pytest.importorskip("sklearn")
    from sklearn.exceptions import ConvergenceWarning

    from fastnn.sklearn import MLPClassifier

    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(48, 32)).astype(np.float32), rng.integers(0, C, 48)
    clf = MLPClassifier(hidden_layer_sizes=(5,), max_iter=2, batch_size=16, device="cpu")
    with pytest.warns(ConvergenceWarning):
        clf.fit(x, y)
    with monkeypatch.context() as m:
        _nan_evaluating(clf.trainer_, m)
        clf.trainer_.fit(x, clf._encode(y), epochs=1, eval_data=(x, clf._encode(y)))
    copy = pickle.loads(pickle.dumps(clf))
    assert copy.trainer_.history == clf.trainer_.history and math.isnan(copy.trainer_.history[-1]["eval_loss"])
    np.testing.assert_array_equal(copy.predict_proba(x), clf.predict_proba(x))


def _long_lived(epochs: int) -> Trainer:
    """A CPU trainer whose history holds `epochs` records, as many small fits leave it (the counters agree)."""
    from fastnn._history import History

    t = Trainer(MLP([D, 5, C]), batch_size=16, device="cpu")
    rec = {"train_loss": 0.123456789, "train_accuracy": 0.5, "eval_loss": None, "eval_accuracy": None, "seconds": 0.01}
    t.history = History({**rec, "epoch": e} for e in range(1, epochs + 1))
    t.epoch, t.step = epochs, 2 * epochs
    return t


def test_save_never_writes_a_config_that_load_refuses(tmp_path: Path, monkeypatch) -> None:
    """Past ~220,000 epochs save replaced the last good checkpoint with one whose config member exceeded the reader's
    cap. A config too large to read back is refused before anything is written; the file at `path` is kept."""
    path = tmp_path / "m.npz"
    _long_lived(10).save(path)
    before = path.read_bytes()
    monkeypatch.setattr(ckpt, "_CONFIG_MEMBER_BYTES", 300_000)  # ~500 records of ~150 characters as UTF-32
    with pytest.raises(DataError, match=r"not saving checkpoint .*m\.npz'.*more than the 300000 load reads"):
        _long_lived(2000).save(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["m.npz"]
    Trainer.load(path, device="cpu")


def test_a_checkpoint_keeps_the_last_epochs_of_a_long_history(tmp_path: Path, monkeypatch) -> None:
    """History does not grow without bound in the file: it keeps the last SAVED_RECORDS epochs, and what it keeps
    loads (counters whole); the trainer in memory keeps all."""
    from fastnn import _history

    monkeypatch.setattr(_history, "SAVED_RECORDS", 50, raising=False)
    t = _long_lived(60)
    t.save(tmp_path / "m.npz")
    loaded = Trainer.load(tmp_path / "m.npz", device="cpu")
    assert loaded.history["epoch"] == list(range(11, 61)) and loaded.history == t.history[-50:]
    assert (loaded.epoch, loaded.step) == (60, 120) and len(t.history) == 60


def test_the_kept_history_always_fits_what_load_reads() -> None:
    """SAVED_RECORDS records of the longest JSON fastnn writes (every number at full precision, epoch 2**32),
    stored as UTF-32, fit the config member's cap with room for the rest of the config."""
    from fastnn._history import SAVED_RECORDS, encode_records

    small, large = 1.2345678901234567e-300, 1.2345678901234567e300
    worst = {"epoch": 2**32, "train_loss": small, "train_accuracy": 0.12345678901234568, "eval_loss": large,
             "eval_accuracy": 0.12345678901234568, "seconds": large}  # fmt: skip
    per_record = len(json.dumps(encode_records([worst] * 2))) / 2
    assert per_record > 200 and SAVED_RECORDS >= 10_000
    assert SAVED_RECORDS * per_record * 4 < ckpt._CONFIG_MEMBER_BYTES - (16 << 20)  # 16 MiB for the rest


def test_a_checkpoint_in_memory(tmp_path: Path) -> None:
    """save/load take a binary file object: an estimator's pickle goes through no folder."""
    t = _long_lived(3)
    buf = io.BytesIO()
    t.save(buf)
    t.save(tmp_path / "m.npz")
    assert buf.getvalue()[:2] == b"PK" and os.listdir(tmp_path) == ["m.npz"]
    loaded = Trainer.load(io.BytesIO(buf.getvalue()), device="cpu")
    assert loaded.history == t.history and (loaded.epoch, loaded.step) == (3, 6)
    with pytest.raises(DataError, match="is not a fastnn checkpoint"):
        Trainer.load(io.BytesIO(b"not a zip"), device="cpu")


def test_an_estimator_pickles_without_a_temporary_folder(tmp_path: Path, monkeypatch) -> None:
    """Pickling and unpickling wrote the whole model through the temporary folder: with that folder full or
    read-only, pickle raised a raw OSError. The checkpoint is made in memory (and so is partial_fit's change of
    batch size)."""
    pytest.importorskip("sklearn")
    import tempfile

    from fastnn.sklearn import MLPClassifier

    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(48, D)).astype(np.float32), rng.integers(0, C, 48)
    clf = MLPClassifier(hidden_layer_sizes=(5,), max_iter=2, batch_size="auto", device="cpu")
    clf.partial_fit(x, y, classes=np.arange(C))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-folder"))  # every temporary file fails
    with pytest.raises(OSError):
        tempfile.TemporaryDirectory()
    copy = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(copy.predict_proba(x), clf.predict_proba(x))
    clf.partial_fit(x[:10], y[:10])  # batch_size="auto": min(200, 10) rows a step, a new trainer from a checkpoint
    assert clf.trainer_.config.batch_size == 10
