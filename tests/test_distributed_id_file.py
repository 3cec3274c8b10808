"""The NCCL id file of distributed.init(id_file=...), with real files, links and FIFOs in a temporary folder: rank 0
never writes through a planted link and leaves a 0600 file; the other ranks read only a regular file of their user
that no one else may write, never block on a FIFO or a device, and every bad path is a ConfigError naming id_file."""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fastnn import distributed
from fastnn._errors import ConfigError

UID = bytes(range(128))  # what rank 0's nccl.unique_id() returns here (zeros included, as in a real id)


@pytest.fixture
def fake_uid(monkeypatch):
    """Rank 0's id, made without starting NCCL's bootstrap."""
    from fastnn.cuda import nccl

    monkeypatch.setattr(nccl, "unique_id", lambda: UID)
    return UID


def _write_own_id(path: Path, mode: int = 0o600) -> None:
    path.write_text(UID.hex())
    path.chmod(mode)


def test_rank_0_writes_a_private_file_and_never_through_a_planted_link(tmp_path, fake_uid):
    """Another user plants, in the shared folder, a link named as rank 0's temporary file (the old name was
    predictable: `.<name>.<pid>.tmp`) to one of the victim's files; rank 0 must not write the id into it. The id
    file is 0600 whatever the umask, owned by this user, and the other ranks read it back."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = tmp_path / "nccl.id"
    with pytest.raises(ConfigError, match="rank 0 did not write the NCCL id within 0.2 s"):
        distributed._exchange_file(path, 1, timeout=0.2)  # nothing there yet: the other ranks wait, then give up
    planted = tmp_path / f".{path.name}.{os.getpid()}.tmp"
    planted.symlink_to(victim)
    old_umask = os.umask(0)  # a permissive umask must not make the id readable by others
    try:
        assert distributed._exchange_file(path, 0, timeout=5) == UID
    finally:
        os.umask(old_umask)
    assert victim.read_text() == "precious"
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()
    assert path.read_text() == UID.hex()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([victim.name, planted.name, path.name])
    assert distributed._exchange_file(path, 1, timeout=5) == UID


def test_rank_0_replaces_a_link_at_id_file_instead_of_writing_through_it(tmp_path, fake_uid):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    path = tmp_path / "nccl.id"
    path.symlink_to(victim)
    distributed._exchange_file(path, 0, timeout=5)
    assert victim.read_text() == "precious" and not path.is_symlink()
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600


@pytest.mark.parametrize("case", ["group-writable", "other-writable", "another user's"])
def test_other_ranks_refuse_an_id_file_someone_else_could_have_written(tmp_path, monkeypatch, case):
    """An id written by someone else would make the ranks join that person's bootstrap (who then receives every
    gradient): refused at once, naming the path, owner and mode."""
    path = tmp_path / "nccl.id"
    _write_own_id(path, {"group-writable": 0o620, "other-writable": 0o602}.get(case, 0o600))
    if case == "another user's":
        if os.geteuid() == 0:
            os.chown(path, 4321, 4321)
        else:  # only root can give a file away: this user is made someone else instead
            me = os.geteuid()
            monkeypatch.setattr(os, "geteuid", lambda: me + 1)
    st = os.lstat(path)
    with pytest.raises(ConfigError) as info:
        distributed._exchange_file(path, 1, timeout=30)
    message = str(info.value)
    assert f"id_file {str(path)!r} is owned by uid {st.st_uid}" in message, message
    assert f"with mode {stat.S_IMODE(st.st_mode):04o}: refused" in message, message


# Run in a child process: the old code blocked forever on a FIFO and read /dev/zero until memory ran out, so the
# child is given a time limit and a memory limit (set after its imports) rather than taking this process down.
_READ_IN_CHILD = textwrap.dedent(
    """
    import resource, sys, time
    from pathlib import Path
    from fastnn import distributed
    size = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
    resource.setrlimit(resource.RLIMIT_AS, (size + 2**30, size + 2**30))
    start = time.monotonic()
    try:
        distributed._exchange_file(Path(sys.argv[1]), 1, float(sys.argv[2]))
        print("returned")
    except BaseException as exc:
        print(f"{type(exc).__name__}: {exc}")
    print(f"{time.monotonic() - start:.3f}")
    """
)


def _read_as_rank_1(path: Path, timeout: float) -> tuple[str, float]:
    """(the outcome, seconds taken) of rank 1 reading `path` in a child process, or a test failure if it blocks."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1]), *sys.path]))
    try:
        done = subprocess.run([sys.executable, "-c", _READ_IN_CHILD, str(path), str(timeout)], env=env,
                              capture_output=True, text=True, timeout=timeout + 30)  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"rank 1 was still blocked on {path} {timeout + 30:g} s into a timeout of {timeout:g} s")
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2, (done.stdout, done.stderr)
    return lines[0], float(lines[1])


@pytest.mark.parametrize("kind", ["FIFO", "/dev/zero", "link to /dev/zero", "link to a good id file"])
def test_other_ranks_never_block_on_a_fifo_or_device_at_id_file(tmp_path, kind):
    """Only a regular file is opened (checked with lstat before, fstat after a non-blocking open) and at most an
    id's worth of it is read: a FIFO or a device is refused at once instead of blocking past the timeout."""
    path = tmp_path / "nccl.id"
    if kind == "FIFO":
        os.mkfifo(path, 0o600)
    elif kind == "/dev/zero":
        path = Path("/dev/zero")
    elif kind == "link to /dev/zero":
        path.symlink_to("/dev/zero")
    else:
        good = tmp_path / "good.id"
        _write_own_id(good)
        path.symlink_to(good)
    what = {"FIFO": "a FIFO", "/dev/zero": "a character device"}.get(kind, "a symbolic link")
    outcome, seconds = _read_as_rank_1(path, timeout=20)
    assert outcome.startswith(f"ConfigError: id_file {str(path)!r} is {what}: refused"), outcome
    assert seconds < 10, seconds  # refused, not waited out


def test_other_ranks_refuse_a_file_longer_than_an_id(tmp_path):
    path = tmp_path / "nccl.id"
    _write_own_id(path)
    with open(path, "a") as f:
        f.write("0" * 10**6)
    with pytest.raises(ConfigError, match=rf"id_file {str(path)!r} holds more than an NCCL id \(256 hex digits\)"):
        distributed._exchange_file(path, 1, timeout=30)


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("case", ["missing folder", "a file as folder", "a folder"])
def test_a_bad_id_file_path_is_a_config_error_naming_it_and_leaves_nothing(tmp_path, fake_uid, rank, case):
    """A path no rank could use is refused at once on every rank, with a ConfigError naming id_file (not a raw
    FileNotFoundError or IsADirectoryError, nor a wait until the timeout), and rank 0 leaves no temporary file."""
    if case == "missing folder":
        path, expected = tmp_path / "absent" / "nccl.id", f"its folder {str(tmp_path / 'absent')!r} does not exist"
    elif case == "a file as folder":
        (tmp_path / "plain").write_text("")
        path, expected = tmp_path / "plain" / "nccl.id", f"its folder {str(tmp_path / 'plain')!r} is not a folder"
    else:
        path, expected = tmp_path / "nccl.id", "is a folder"
        path.mkdir()
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as info:
        distributed._exchange_file(path, rank, timeout=30)
    assert f"id_file {str(path)!r}" in str(info.value) and expected in str(info.value), str(info.value)
    assert sorted(tmp_path.rglob("*")) == before


def test_an_unreadable_id_file_is_a_config_error_naming_it(tmp_path, monkeypatch):
    path = tmp_path / "nccl.id"
    _write_own_id(path, 0o200)
    if os.geteuid() == 0:  # root reads any file: the refusal the kernel gives other users is given here
        real_open = os.open

        def refusing(name, *args, **kwargs):
            if Path(name) == path:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(name))
            return real_open(name, *args, **kwargs)

        monkeypatch.setattr(os, "open", refusing)
    with pytest.raises(ConfigError, match=rf"id_file {str(path)!r}: EACCES \(Permission denied\)"):
        distributed._exchange_file(path, 1, timeout=30)


def test_rank_0_leaves_no_temporary_file_when_the_rename_fails(tmp_path, fake_uid, monkeypatch):
    """A failure after the temporary file exists (a file system gone read-only, full) removes it again."""
    path = tmp_path / "nccl.id"

    def read_only(*args):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(os, "replace", read_only)
    with pytest.raises(ConfigError, match=rf"id_file {str(path)!r}: EROFS \(Read-only file system\)"):
        distributed._exchange_file(path, 0, timeout=30)
    assert list(tmp_path.iterdir()) == []
