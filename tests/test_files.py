"""fastnn._files: atomic writes (a temporary file beside the target, length checked, renamed), on real files."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fastnn import _files


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_write_bytes_replaces_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "t.bin"
    target.write_bytes(b"old")
    _files.write_bytes(target, b"new content")
    assert target.read_bytes() == b"new content" and _names(tmp_path) == ["t.bin"]


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_modes(tmp_path, umask):
    old = os.umask(umask)
    try:
        _files.write_bytes(tmp_path / "shared", b"x")
        _files.write_bytes(tmp_path / "private", b"x", mode=0o600)
        (tmp_path / "kept").write_bytes(b"x")
        (tmp_path / "kept").chmod(0o640)
        _files.write_bytes(tmp_path / "kept", b"y", keep_mode=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE((tmp_path / "private").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "kept").stat().st_mode) == 0o640


def test_an_error_while_writing_keeps_the_old_file(tmp_path):
    target = tmp_path / "t.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError, match="midway"), _files.replacing(target) as f:
        f.write(b"half")
        raise RuntimeError("midway")
    assert target.read_bytes() == b"old" and _names(tmp_path) == ["t.bin"]


def test_exclusive_does_not_replace(tmp_path):
    target = tmp_path / "key"
    _files.write_bytes(target, b"first", exclusive=True)
    with pytest.raises(FileExistsError):
        _files.write_bytes(target, b"second", exclusive=True)
    assert target.read_bytes() == b"first" and _names(tmp_path) == ["key"]


def test_a_short_write_is_refused(tmp_path, monkeypatch):
    """The file on disk is shorter than what was written (a file system that lost the tail): nothing is renamed."""
    real_fstat = os.fstat

    def short_fstat(fd):
        st = real_fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return st
        fields = list(st[:10])
        fields[stat.ST_SIZE] -= 1
        return os.stat_result(fields)

    target = tmp_path / "t.bin"
    target.write_bytes(b"old")
    monkeypatch.setattr(os, "fstat", short_fstat)
    with pytest.raises(OSError, match="short write: 10 bytes on disk, 11 written"):
        _files.write_bytes(target, b"new content")
    monkeypatch.undo()
    assert target.read_bytes() == b"old" and _names(tmp_path) == ["t.bin"]


def test_a_planted_temporary_name_is_not_opened(tmp_path, monkeypatch):
    """The temporary file is created exclusively: a name already there (a symlink planted in a shared folder)
    is skipped, never followed or truncated."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    names = iter(["aaaaaaaaaaaa", "bbbbbbbbbbbb"])
    monkeypatch.setattr(_files.secrets, "token_hex", lambda n: next(names))
    (tmp_path / ".t.bin.aaaaaaaaaaaa.tmp").symlink_to(victim)
    _files.write_bytes(tmp_path / "t.bin", b"data")
    assert victim.read_bytes() == b"precious" and (tmp_path / "t.bin").read_bytes() == b"data"


def test_long_names_fit(tmp_path):
    target = tmp_path / ("n" * 250)
    _files.write_bytes(target, b"x")
    assert target.read_bytes() == b"x"


@pytest.mark.parametrize("kept", [0o600, 0o640])
def test_the_temporary_file_has_the_replaced_files_mode_from_its_creation(tmp_path, kept):
    """Saving over a private checkpoint wrote the new content into a 0644 temporary file and narrowed it only at the
    end: another user opening it meanwhile kept read access. The content is never more open than the file it
    replaces."""
    target = tmp_path / "private.npz"
    target.write_bytes(b"old")
    target.chmod(kept)
    old = os.umask(0o022)
    try:
        with _files.replacing(target, keep_mode=True) as f:
            (tmp,) = [p for p in tmp_path.iterdir() if p.name != target.name]
            assert stat.S_IMODE(tmp.stat().st_mode) == kept  # before any byte is written
            f.write(b"secret")
            assert stat.S_IMODE(tmp.stat().st_mode) == kept
    finally:
        os.umask(old)
    assert target.read_bytes() == b"secret" and stat.S_IMODE(target.stat().st_mode) == kept
