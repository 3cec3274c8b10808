"""fastnn.datasets: IDX read/write, corrupt files, the search order, and the checked download (no internet:
a local http.server on 127.0.0.1 stands in for the mirrors)."""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import http.server
import os
import socket
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from fastnn import _download, datasets
from fastnn._errors import ConfigError, DataError

REPO = Path(__file__).resolve().parent.parent
STEMS = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def make_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8), rng.integers(0, 10, size=n, dtype=np.uint8)


def make_dataset(folder: Path, n_train: int = 50, n_test: int = 20, compress: bool = True, seed: int = 0) -> tuple:
    """Write the four IDX files into `folder`; returns (x_train, y_train, x_test, y_test) as written."""
    folder.mkdir(parents=True, exist_ok=True)
    x, y = make_split(n_train, seed)
    xt, yt = make_split(n_test, seed + 1)
    suffix = ".gz" if compress else ""
    for stem, arr in zip(STEMS, (x, y, xt, yt)):
        datasets.write_idx(folder / (stem + suffix), arr, compress=compress)
    return x, y, xt, yt


def spec_for(folder: Path, name: str = "mnist") -> datasets.DatasetSpec:
    """A DatasetSpec whose checksums and sizes are those of the gz files in `folder`."""
    files = []
    for stem in STEMS:
        data = (folder / (stem + ".gz")).read_bytes()
        files.append(datasets.RemoteFile(stem + ".gz", hashlib.sha256(data).hexdigest(), len(data)))
    return datasets.DatasetSpec(name=name, files=tuple(files), mirrors=("http://127.0.0.1:9/never/",))


def closed_port() -> int:
    """A local port nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No real data anywhere: HOME, FASTNN_DATA, the system folder and the mirrors all point at nothing."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("FASTNN_DATA", raising=False)
    monkeypatch.setenv(datasets.MIRRORS_ENV, f"http://127.0.0.1:{closed_port()}/")
    monkeypatch.setattr(datasets, "SYSTEM_DATA_DIR", tmp_path / "system")
    return tmp_path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve(handler_factory):
    """An HTTP server on 127.0.0.1 in a thread; yields its base URL and stops by itself on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler_factory)
    server.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def file_server(directory: Path):
    class Handler(_QuietHandler):
        def do_GET(self) -> None:
            self.server.requests.append(self.path)
            super().do_GET()

    return serve(partial(Handler, directory=str(directory)))


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


# ---------------------------------------------------------------------------------------------------
# IDX format
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize(
    "array",
    [
        np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28),
        np.array([3, 1, 4, 1, 5], dtype=np.uint8),
        np.array([[-7, 2**20], [5, -(2**31)]], dtype=np.int32),
        np.array([[1.5, -2.25, np.pi]], dtype=np.float32),
        np.array([1e300, -0.0], dtype=np.float64),
        np.array([-3, 3], dtype=np.int16),
        np.array([-128, 127], dtype=np.int8),
    ],
    ids=["u8-3d", "u8-1d", "i32", "f32", "f64", "i16", "i8"],
)
def test_idx_roundtrip(tmp_path, array, compress):
    path = tmp_path / "a.idx"
    datasets.write_idx(path, array, compress=compress)
    head = path.read_bytes()[:4]
    if compress:
        assert head[:2] == b"\x1f\x8b"
    else:
        assert head[:2] == b"\0\0" and head[3] == array.ndim
    out = datasets.read_idx(path)
    assert out.dtype == array.dtype.newbyteorder("=") and out.dtype.isnative
    assert out.shape == array.shape
    np.testing.assert_array_equal(out, array)
    assert out.flags.writeable
    assert leftovers(tmp_path) == ["a.idx"]  # the atomic write leaves no temporary file


def test_idx_header_is_big_endian_mnist_layout(tmp_path):
    datasets.write_idx(tmp_path / "x", np.zeros((3, 28, 28), np.uint8), compress=False)
    raw = (tmp_path / "x").read_bytes()
    assert raw[:16] == bytes([0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 28, 0, 0, 0, 28])
    assert len(raw) == 16 + 3 * 784


def test_gzip_detected_by_magic_not_name(tmp_path):
    a = np.arange(10, dtype=np.uint8)
    datasets.write_idx(tmp_path / "plain-name", a, compress=True)
    datasets.write_idx(tmp_path / "looks.gz", a, compress=False)
    np.testing.assert_array_equal(datasets.read_idx(tmp_path / "plain-name"), a)
    np.testing.assert_array_equal(datasets.read_idx(tmp_path / "looks.gz"), a)


def _raw_idx(array: np.ndarray) -> bytes:
    head = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
    return head + array.astype(np.uint8).tobytes()


GOOD = _raw_idx(np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28))


def _flip_middle(data: bytes) -> bytes:
    b = bytearray(data)
    for i in range(len(b) // 2, len(b) // 2 + 8):
        b[i] ^= 0xFF
    return bytes(b)


@pytest.mark.parametrize(
    ("content", "what"),
    [
        (b"", "too short"),
        (b"\0\0", "too short"),
        (b"\x01\x02\x08\x03" + GOOD[4:], "not an IDX file"),
        (b"PK\x03\x04" + GOOD[4:], "not an IDX file"),
        (b"\0\0\x07\x03" + GOOD[4:], "unknown IDX type code 0x07"),
        (b"\0\0\x08\x00", "0 dimensions"),
        (GOOD[:10], "truncated"),
        (GOOD[:-1], "truncated"),
        (GOOD + b"\0", "trailing data"),
        (gzip.compress(GOOD, mtime=0)[:-20], "gzip"),
        (gzip.compress(GOOD, mtime=0)[:12], "gzip"),
        (_flip_middle(gzip.compress(GOOD, mtime=0)), "gzip"),
        (gzip.compress(GOOD[:-5], mtime=0), "truncated"),
        (gzip.compress(GOOD + b"xyz", mtime=0), "trailing data"),
        (gzip.compress(b"\x01\x02\x08\x03" + GOOD[4:], mtime=0), "not an IDX file"),
    ],
    ids=[
        "empty",
        "two-bytes",
        "bad-magic",
        "zip-file",
        "bad-type",
        "zero-dims",
        "truncated-dims",
        "raw-short-payload",
        "raw-trailing",
        "gz-cut-trailer",
        "gz-cut-header",
        "gz-corrupt",
        "gz-short-payload",
        "gz-trailing",
        "gz-bad-magic",
    ],
)
def test_corrupt_idx_raises_naming_file(tmp_path, content, what):
    path = tmp_path / "broken-idx3-ubyte"
    path.write_bytes(content)
    with pytest.raises(DataError) as e:
        datasets.read_idx(path)
    assert str(path) in str(e.value)
    assert what in str(e.value)


def test_huge_claimed_dims_fail_fast(tmp_path):
    """A header claiming (2**32-1)**2 * 28 bytes of data is refused from its header, not a MemoryError."""
    head = bytes([0, 0, 8, 3]) + np.array([2**32 - 1, 2**32 - 1, 28], ">u4").tobytes()
    for compress in (True, False):
        path = tmp_path / f"huge{int(compress)}"
        body = head + bytes(1000)
        path.write_bytes(gzip.compress(body, mtime=0) if compress else body)
        with pytest.raises(DataError, match="more than the 4294967296 allowed"):
            datasets.read_idx(path)
        with pytest.raises(DataError, match="truncated"):
            datasets.read_idx(path, max_bytes=None)


def test_written_files_follow_umask(tmp_path):
    old = os.umask(0o022)
    try:
        datasets.write_idx(tmp_path / "x.gz", np.zeros(3, np.uint8))
    finally:
        os.umask(old)
    assert (tmp_path / "x.gz").stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600: data folders are shared


def test_missing_file_raises_dataerror(tmp_path):
    with pytest.raises(DataError, match="nope"):
        datasets.read_idx(tmp_path / "nope")


@pytest.mark.parametrize(
    "array",
    [np.zeros(3, np.int64), np.zeros(3, np.uint16), np.array(5, np.uint8), np.zeros(2, np.complex64)],
    ids=["int64", "uint16", "0-d", "complex"],
)
def test_write_idx_rejects_unrepresentable(tmp_path, array):
    with pytest.raises(DataError, match="write_idx"):
        datasets.write_idx(tmp_path / "x", array)
    assert leftovers(tmp_path) == []


# ---------------------------------------------------------------------------------------------------
# load: files on disk
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("compress", [True, False])
def test_load_from_root(isolated, compress):
    root = isolated / "data"
    x, y, xt, yt = make_dataset(root, compress=compress)
    out = datasets.load("mnist", root=root, download=False, verify=False)
    assert [a.shape for a in out] == [(50, 784), (50,), (20, 784), (20,)]
    assert [a.dtype for a in out] == [np.uint8, np.int64, np.uint8, np.int64]
    np.testing.assert_array_equal(out[0], x.reshape(50, 784))
    np.testing.assert_array_equal(out[1], y)
    np.testing.assert_array_equal(out[2], xt.reshape(20, 784))
    np.testing.assert_array_equal(out[3], yt)


def test_load_mixed_gz_and_raw(isolated):
    root = isolated / "data"
    x, y, xt, yt = make_dataset(root, compress=True)
    (root / "t10k-labels-idx1-ubyte.gz").unlink()
    datasets.write_idx(root / "t10k-labels-idx1-ubyte", yt, compress=False)
    np.testing.assert_array_equal(datasets.load("mnist", root=root, download=False, verify=False)[3], yt)


def test_unknown_name_lists_known(isolated):
    with pytest.raises(ConfigError) as e:
        datasets.load("cifar-10", root=isolated)
    assert "cifar-10" in str(e.value) and "mnist" in str(e.value) and "fashion-mnist" in str(e.value)


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), "30", True])
def test_bad_timeout_is_configerror(isolated, timeout):
    make_dataset(isolated / "data")
    with pytest.raises(ConfigError, match="timeout"):
        datasets.load("mnist", root=isolated / "data", timeout=timeout)


def test_mirrors_as_string_is_configerror(isolated):
    make_dataset(isolated / "data")
    with pytest.raises(ConfigError, match="mirrors"):
        datasets.load("mnist", root=isolated / "data", mirrors="http://127.0.0.1/")


def test_count_mismatch(isolated):
    root = isolated / "data"
    make_dataset(root)
    datasets.write_idx(root / "train-labels-idx1-ubyte.gz", np.zeros(49, np.uint8))
    with pytest.raises(DataError) as e:
        datasets.load("mnist", root=root, download=False, verify=False)
    assert "50 images" in str(e.value) and "49 labels" in str(e.value)
    assert "train-labels-idx1-ubyte.gz" in str(e.value)


def test_images_not_28x28(isolated):
    root = isolated / "data"
    make_dataset(root)
    datasets.write_idx(root / "t10k-images-idx3-ubyte.gz", np.zeros((20, 28, 27), np.uint8))
    with pytest.raises(DataError, match=r"t10k-images-idx3-ubyte\.gz.*28, 28"):
        datasets.load("mnist", root=root, download=False, verify=False)


def test_label_out_of_range(isolated):
    root = isolated / "data"
    make_dataset(root)
    datasets.write_idx(root / "t10k-labels-idx1-ubyte.gz", np.full(20, 10, np.uint8))
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte\.gz.*label 10"):
        datasets.load("mnist", root=root, download=False, verify=False)


def test_corrupt_file_in_found_folder_is_reported_not_skipped(isolated, monkeypatch):
    root = isolated / "data"
    make_dataset(root)
    make_dataset(isolated / "env", n_train=12)
    monkeypatch.setenv("FASTNN_DATA", str(isolated / "env"))
    path = root / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataError, match=str(path)):
        datasets.load("mnist", root=root, download=False, verify=False)


def test_search_order(isolated, monkeypatch):
    """root, then $FASTNN_DATA, $FASTNN_DATA/<name>, ~/.cache/fastnn/<name>, /usr/share/datasets/<name>;
    told apart by each folder's distinct training-set size (synthetic files, so read unverified)."""
    env = isolated / "env"
    places = {
        "root": (isolated / "root", 11),
        "env": (env, 12),
        "env-name": (env / "mnist", 13),
        "cache": (isolated / "home" / ".cache" / "fastnn" / "mnist", 14),
        "system": (isolated / "system" / "mnist", 15),
    }
    for i, (folder, n) in enumerate(places.values()):
        make_dataset(folder, n_train=n, seed=10 * i)
    monkeypatch.setenv("FASTNN_DATA", str(env))

    def n_train(**kw) -> int:
        return len(datasets.load("mnist", download=False, verify=False, **kw)[1])

    assert datasets.search_dirs("mnist", root=isolated / "root") == [f for f, _ in places.values()]
    assert n_train(root=isolated / "root") == 11
    # Unverified, the top of $FASTNN_DATA is skipped: it may hold either dataset under the same names.
    assert n_train() == 13
    with monkeypatch.context() as m:
        m.setitem(datasets.DATASETS, "mnist", spec_for(env))
        assert len(datasets.load("mnist", download=False)[1]) == 12  # verified, it is searched first
    for stem in STEMS:
        (env / (stem + ".gz")).unlink()
    assert n_train() == 13
    monkeypatch.delenv("FASTNN_DATA")
    assert n_train() == 14
    for stem in STEMS:
        (places["cache"][0] / (stem + ".gz")).unlink()
    assert n_train() == 15
    # A root without the files is passed over, not fatal.
    assert n_train(root=isolated / "empty-root") == 15


def test_partial_folder_is_skipped_and_reported(isolated):
    root = isolated / "data"
    make_dataset(root)
    (root / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError) as e:
        datasets.load("mnist", root=root, download=False)
    assert "missing t10k-labels-idx1-ubyte" in str(e.value)


def test_absent_and_offline_gives_one_clear_error(isolated):
    root = isolated / "absent"
    with pytest.raises(DataError) as e:
        datasets.load("fashion-mnist", root=root, timeout=5)
    msg = str(e.value)
    for place in (
        root,
        isolated / "home" / ".cache" / "fastnn" / "fashion-mnist",
        isolated / "system" / "fashion-mnist",
    ):
        assert str(place) in msg
    assert "$FASTNN_DATA" in msg
    assert "Connection refused" in msg or "refused" in msg.lower()
    assert "root=" in msg and "FASTNN_DATA=" in msg and "apt-get install dataset-fashion-mnist" in msg
    assert not root.exists()  # the failed download created nothing


def test_absent_no_download_says_so(isolated):
    with pytest.raises(DataError) as e:
        datasets.load("mnist", download=False)
    assert "download=False" in str(e.value)
    assert str(isolated / "home" / ".cache" / "fastnn" / "mnist") in str(e.value)
    assert not (isolated / "home").exists()


# ---------------------------------------------------------------------------------------------------
# load: download from a local server
# ---------------------------------------------------------------------------------------------------


def test_download_into_root(isolated, monkeypatch):
    served = isolated / "served"
    x, y, xt, yt = make_dataset(served)
    monkeypatch.setitem(datasets.DATASETS, "mnist", spec_for(served))
    root = isolated / "dl"
    with file_server(served) as (url, server):
        out = datasets.load("mnist", root=root, mirrors=[url + "/"], timeout=5)
        assert sorted(server.requests) == sorted(f"/{s}.gz" for s in STEMS)
        # Second load finds the files: no more requests.
        datasets.load("mnist", root=root, mirrors=[url], timeout=5)
        assert len(server.requests) == 4
    np.testing.assert_array_equal(out[0], x.reshape(-1, 784))
    np.testing.assert_array_equal(out[3], yt)
    assert leftovers(root) == sorted(s + ".gz" for s in STEMS)
    for stem in STEMS:
        assert (root / (stem + ".gz")).read_bytes() == (served / (stem + ".gz")).read_bytes()


def test_download_via_env_mirrors_into_cache_with_fallback(isolated, monkeypatch):
    served = isolated / "served"
    make_dataset(served / "mnist")
    monkeypatch.setitem(datasets.DATASETS, "mnist", spec_for(served / "mnist"))
    with file_server(served) as (url, server):
        # The first mirror 404s; the second holds the files under /<name>/.
        monkeypatch.setenv(datasets.MIRRORS_ENV, f"{url}/missing/, {url}/{{name}}")
        out = datasets.load("mnist", timeout=5)
        assert len(server.requests) == 8
    cache = isolated / "home" / ".cache" / "fastnn" / "mnist"
    assert leftovers(cache) == sorted(s + ".gz" for s in STEMS)
    assert out[0].shape == (50, 784)


def test_download_only_missing_files(isolated, monkeypatch):
    served = isolated / "served"
    make_dataset(served)
    monkeypatch.setitem(datasets.DATASETS, "mnist", spec_for(served))
    root = isolated / "dl"
    make_dataset(root)
    (root / "t10k-images-idx3-ubyte.gz").unlink()
    with file_server(served) as (url, server):
        datasets.download("mnist", root, mirrors=[url], timeout=5)
        assert server.requests == ["/t10k-images-idx3-ubyte.gz"]


def test_wrong_checksum_raises_and_leaves_nothing(isolated, monkeypatch):
    served = isolated / "served"
    make_dataset(served)
    spec = spec_for(served)
    bad = datasets.RemoteFile(spec.files[0].name, "0" * 64, spec.files[0].size)
    monkeypatch.setitem(datasets.DATASETS, "mnist", datasets.DatasetSpec("mnist", (bad, *spec.files[1:]), ()))
    root = isolated / "dl"
    with file_server(served) as (url, _), pytest.raises(DataError) as e:
        datasets.load("mnist", root=root, mirrors=[url], timeout=5)
    assert "sha256 mismatch" in str(e.value) and "train-images-idx3-ubyte.gz" in str(e.value)
    assert leftovers(root) == []


def test_wrong_size_raises_and_leaves_nothing(isolated, monkeypatch):
    served = isolated / "served"
    make_dataset(served)
    spec = spec_for(served)
    rf = spec.files[1]
    monkeypatch.setitem(
        datasets.DATASETS,
        "mnist",
        datasets.DatasetSpec("mnist", (spec.files[0], rf.__class__(rf.name, rf.sha256, 5), *spec.files[2:]), ()),
    )
    root = isolated / "dl"
    make_dataset(root)
    (root / "train-labels-idx1-ubyte.gz").unlink()
    with file_server(served) as (url, _), pytest.raises(DataError, match="expected 5"):
        datasets.download("mnist", root, mirrors=[url], timeout=5)
    assert "train-labels-idx1-ubyte.gz" not in leftovers(root)
    assert not any(name.endswith(".part") for name in leftovers(root))


def _broken_server(mode: str, release: threading.Event):
    """Serves every file with a full Content-Length, then sends half and hangs up ('cut') or stalls ('stall')."""

    class Handler(_QuietHandler):
        def do_GET(self) -> None:
            body = b"\x1f\x8b" + b"x" * 4000
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            if mode == "stall":
                release.wait(timeout=10)  # bounded: the test's teardown releases it much sooner

    return serve(Handler)


@pytest.mark.parametrize("mode", ["cut", "stall"])
def test_interrupted_download_leaves_nothing(isolated, monkeypatch, mode):
    rf = datasets.RemoteFile("train-images-idx3-ubyte.gz", "0" * 64, 4002)
    files = (rf, *(datasets.RemoteFile(s + ".gz", "0" * 64, 4002) for s in STEMS[1:]))
    monkeypatch.setitem(datasets.DATASETS, "mnist", datasets.DatasetSpec("mnist", files, ()))
    root = isolated / "dl"
    release = threading.Event()
    try:
        with _broken_server(mode, release) as (url, _), pytest.raises(DataError) as e:
            datasets.load("mnist", root=root, mirrors=[url], timeout=0.5)
    finally:
        release.set()
    assert "train-images-idx3-ubyte.gz" in str(e.value)
    if mode == "cut":
        assert "2001" in str(e.value) or "ncomplete" in str(e.value)
    else:  # the read's own timeout or the minimum rate, whichever comes first
        assert "timed out" in str(e.value) or "too slow" in str(e.value)
    assert not root.exists() or leftovers(root) == []


def test_keyboard_interrupt_mid_download_leaves_nothing(isolated, monkeypatch):
    """An interrupt while bytes are arriving removes the temporary file and writes no final file."""

    class Response:
        headers: dict = {}
        chunks = 0

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            pass

        def read(self, n: int) -> bytes:
            Response.chunks += 1
            if Response.chunks > 1:
                raise KeyboardInterrupt
            return b"\x1f\x8b" + b"\0" * 100

    monkeypatch.setattr(_download, "_open", lambda *a, **k: Response())
    root = isolated / "dl"
    root.mkdir()
    with pytest.raises(KeyboardInterrupt):
        datasets.download("mnist", root, mirrors=["http://example.invalid/"], timeout=5)
    assert Response.chunks == 2
    assert leftovers(root) == []


def _dripping_server(release: threading.Event, where: str = "body", seconds: float = 3.0):
    """Answers every request slowly: one byte every 20 ms, each well within any socket timeout, in the headers
    or the body; it stops by itself after `seconds` (then ends the headers and the body) or when released."""

    class Handler(_QuietHandler):
        def do_GET(self) -> None:
            self.server.requests.append(self.path)
            drip = time.monotonic() + seconds
            try:
                self.wfile.write(b"HTTP/1.1 200 OK\r\n" + (b"X-Slow: " if where == "headers" else b"\r\n"))
                while time.monotonic() < drip and not release.is_set():
                    self.wfile.write(b"a" if where == "headers" else b"\0")
                    self.wfile.flush()
                    time.sleep(0.02)
                self.wfile.write(b"\r\n\r\n" if where == "headers" else b"")
            except OSError:  # the client hung up: what a download that gave up does
                pass
            self.close_connection = True

    return serve(Handler)


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_dripping_mirror_is_abandoned_after_the_timeout(isolated, monkeypatch, where):
    """timeout=0.3 used to bound each socket wait only: a byte every 20 ms kept one file going for as long as the
    server liked (here 3 s, then a short body). Now a mirror falls behind DOWNLOAD_MIN_RATE once `timeout` has
    passed, and the error names it."""
    files = tuple(datasets.RemoteFile(s + ".gz", "0" * 64, 4002) for s in STEMS)
    monkeypatch.setitem(datasets.DATASETS, "mnist", datasets.DatasetSpec("mnist", files, ()))
    root = isolated / "dl"
    release = threading.Event()
    try:
        with _dripping_server(release, where) as (slow, _), _dripping_server(release, where) as (slower, _):
            start = time.monotonic()
            with pytest.raises(DataError) as e:
                datasets.download("mnist", root, mirrors=[slow, slower], timeout=0.3)
            elapsed = time.monotonic() - start
    finally:
        release.set()
    message = str(e.value)
    assert elapsed < 2.5, f"two attempts took {elapsed:.1f} s"
    assert f"{slow}/train-images-idx3-ubyte.gz: mirror too slow" in message, message
    assert f"{slower}/train-images-idx3-ubyte.gz: mirror too slow" in message, message
    assert "timeout=0.3" in message and "bytes/s" in message
    assert not root.exists() or leftovers(root) == []


def test_a_dripping_mirror_gives_way_to_the_next(isolated, monkeypatch):
    """The next mirror is steady but slow (each file's transfer takes longer than the timeout): it is not cut
    off, the minimum rate being an average, while the dripping one is given up after about the timeout."""
    served = isolated / "served"
    x, *_ = make_dataset(served)
    monkeypatch.setitem(datasets.DATASETS, "mnist", spec_for(served))
    root = isolated / "dl"
    release, transfers = threading.Event(), []

    class Steady(_QuietHandler):
        def copyfile(self, source, outputfile) -> None:
            start = time.monotonic()
            while chunk := source.read(4096):  # 80 KiB/s: well above DOWNLOAD_MIN_RATE
                outputfile.write(chunk)
                outputfile.flush()
                time.sleep(0.05)
            transfers.append(time.monotonic() - start)

    try:
        with _dripping_server(release) as (slow, dripper), serve(partial(Steady, directory=str(served))) as (good, _):
            start = time.monotonic()
            out = datasets.load("mnist", root=root, mirrors=[slow, good], timeout=0.3)
            elapsed = time.monotonic() - start
    finally:
        release.set()
    assert len(dripper.requests) == 4  # each file tried there first
    assert max(transfers) > 0.3  # the largest file took longer than the timeout, and was not cut off
    assert elapsed < 6, f"{elapsed:.1f} s: the dripping mirror held each file for its whole 3 s"
    np.testing.assert_array_equal(out[0], x.reshape(-1, 784))
    assert leftovers(root) == sorted(s + ".gz" for s in STEMS)


def test_builtin_specs_are_well_formed():
    for name, spec in datasets.DATASETS.items():
        assert spec.name == name
        assert [f.stem for f in spec.files] == list(STEMS)
        for f in spec.files:
            assert len(f.sha256) == 64 and int(f.sha256, 16) >= 0 and f.size > 0
        assert spec.mirrors and all(m.startswith(("http://", "https://")) and m.endswith("/") for m in spec.mirrors)


# ---------------------------------------------------------------------------------------------------
# The real Fashion-MNIST, where present
# ---------------------------------------------------------------------------------------------------


def _real_fashion_mnist() -> Path | None:
    env = os.environ.get("FASTNN_DATA")
    places = [Path(env), Path(env) / "fashion-mnist"] if env else []
    places += [REPO.parent / "shared" / "data" / "fashion-mnist", Path("/usr/share/datasets/fashion-mnist")]
    for p in places:
        if all((p / (s + ".gz")).is_file() or (p / s).is_file() for s in STEMS):
            return p
    return None


@pytest.mark.skipif(
    _real_fashion_mnist() is None,
    reason="Fashion-MNIST absent ($FASTNN_DATA, ../shared/data/fashion-mnist, /usr/share/datasets/fashion-mnist)",
)
def test_real_fashion_mnist():
    folder = _real_fashion_mnist()
    x, y, xt, yt = datasets.load("fashion-mnist", root=folder, download=False)
    assert x.shape == (60000, 784) and xt.shape == (10000, 784)
    assert y.shape == (60000,) and yt.shape == (10000,)
    assert x.dtype == np.uint8 and y.dtype == np.int64
    assert y.min() == 0 and y.max() == 9 and yt.min() == 0 and yt.max() == 9
    # Fashion-MNIST is balanced: 6,000 training and 1,000 test images per class.
    assert np.bincount(y).tolist() == [6000] * 10 and np.bincount(yt).tolist() == [1000] * 10
    assert 0 < x.mean() < 255


@pytest.mark.skipif(_real_fashion_mnist() is None, reason="Fashion-MNIST absent (see test_real_fashion_mnist)")
def test_real_fashion_mnist_is_not_mnist():
    """The two datasets share file names: asking for MNIST in a Fashion-MNIST folder is refused, naming both."""
    folder = _real_fashion_mnist()
    with pytest.raises(DataError, match="is fashion-mnist's train-images-idx3-ubyte, not mnist's"):
        datasets.load("mnist", root=folder, download=False)


# ---------------------------------------------------------------------------------------------------
# Issue 8: gzip bombs (item 6), the wrong dataset (item 7), arguments of the wrong type (item 10)
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def gzip_bytes_read(monkeypatch) -> list[int]:
    """A running total of the bytes GzipFile inflates and hands out (one element, updated in place)."""
    total = [0]
    real = gzip.GzipFile.read

    def counting(self, size=-1):
        data = real(self, size)
        total[0] += len(data)
        return data

    monkeypatch.setattr(gzip.GzipFile, "read", counting)
    return total


def _bomb(rows: int, zeros: int) -> bytes:
    """A small .gz whose IDX header declares `rows` images, followed by `zeros` bytes that deflate to ~nothing."""
    return gzip.compress(bytes([0, 0, 8, 3]) + np.array([rows, 28, 28], ">u4").tobytes() + bytes(zeros), mtime=0)


def test_gzip_bomb_is_refused_from_its_header(isolated, gzip_bytes_read):
    root = isolated / "data"
    make_dataset(root)
    bomb = root / "train-images-idx3-ubyte.gz"
    bomb.write_bytes(_bomb(datasets.UNVERIFIED_MAX_ROWS + 1, 64 << 20))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(DataError) as e:
        datasets.load("mnist", root=root, download=False, verify=False)
    assert str(bomb) in str(e.value) and f"({datasets.UNVERIFIED_MAX_ROWS + 1}, 28, 28)" in str(e.value)
    assert "nothing was read" in str(e.value)
    assert gzip_bytes_read[0] < 1 << 16  # the header only, not the 64 MiB behind it


def test_gzip_bomb_never_decompressed_when_verifying(isolated, monkeypatch, gzip_bytes_read):
    root = isolated / "data"
    make_dataset(root)
    monkeypatch.setitem(datasets.DATASETS, "mnist", spec_for(root))
    bomb = root / "train-images-idx3-ubyte.gz"
    bomb.write_bytes(_bomb(50, 64 << 20))  # declares what the spec's file has, then more data than it says
    with pytest.raises(DataError, match=f"{bomb} is not mnist's train-images-idx3-ubyte"):
        datasets.load("mnist", root=root, download=False)
    assert gzip_bytes_read[0] == 0


def test_stream_longer_than_its_header_fails_at_the_declared_end(tmp_path, gzip_bytes_read):
    path = tmp_path / "x.gz"
    path.write_bytes(_bomb(2, 64 << 20))  # declares 2 images, holds 64 MiB more
    with pytest.raises(DataError, match="trailing data"):
        datasets.read_idx(path)
    assert gzip_bytes_read[0] < 1 << 16


def test_header_checked_against_expected_dims_before_data(tmp_path, gzip_bytes_read):
    path = tmp_path / "x.gz"
    path.write_bytes(_bomb(2, 1 << 20))
    with pytest.raises(DataError, match=r"IDX dims are \(2, 28, 28\), expected \(N, 28, 27\)"):
        datasets.read_idx(path, dims=(None, 28, 27))
    with pytest.raises(DataError, match="IDX data type is uint8, expected float32"):
        datasets.read_idx(path, dtype=np.float32)
    assert gzip_bytes_read[0] < 64


def _two_datasets(isolated, monkeypatch) -> tuple[Path, Path]:
    """Two synthetic datasets standing in for MNIST and Fashion-MNIST, each with its files' real checksums."""
    a, b = isolated / "a", isolated / "b"
    make_dataset(a, n_train=11, seed=0)
    make_dataset(b, n_train=13, seed=5)
    monkeypatch.setitem(datasets.DATASETS, "mnist", spec_for(a, "mnist"))
    monkeypatch.setitem(datasets.DATASETS, "fashion-mnist", spec_for(b, "fashion-mnist"))
    return a, b


def test_the_other_datasets_files_are_refused(isolated, monkeypatch):
    mnist, _ = _two_datasets(isolated, monkeypatch)
    with pytest.raises(DataError) as e:
        datasets.load("fashion-mnist", root=mnist, download=False)
    assert f"{mnist / 'train-images-idx3-ubyte.gz'} is mnist's train-images-idx3-ubyte, not fashion-mnist's" in str(
        e.value
    )


def test_top_of_fastnn_data_is_verified_and_the_other_dataset_skipped(isolated, monkeypatch):
    mnist, fashion = _two_datasets(isolated, monkeypatch)
    env = isolated / "env"
    make_dataset(env, n_train=11, seed=0)  # MNIST's files at the top, Fashion-MNIST's under fashion-mnist/
    make_dataset(env / "fashion-mnist", n_train=13, seed=5)
    monkeypatch.setenv("FASTNN_DATA", str(env))
    out = datasets.load("fashion-mnist", download=False)
    assert out.folder == env / "fashion-mnist" and len(out[1]) == 13
    out = datasets.load("mnist", download=False)
    assert out.folder == env and len(out[1]) == 11
    # With nothing else to fall back on, the message says why the top folder was passed over.
    for stem in STEMS:
        (env / "fashion-mnist" / (stem + ".gz")).unlink()
    with pytest.raises(DataError, match=f"{env} \\(\\$FASTNN_DATA\\): holds mnist's files, not fashion-mnist's"):
        datasets.load("fashion-mnist", download=False)


def test_corrupt_file_of_the_right_size_fails_its_checksum(isolated, monkeypatch):
    mnist, _ = _two_datasets(isolated, monkeypatch)
    path = mnist / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(_flip_middle(path.read_bytes()))
    with pytest.raises(DataError) as e:
        datasets.load("mnist", root=mnist, download=False)
    msg = str(e.value)
    assert f"{path} is not mnist's t10k-labels-idx1-ubyte: sha256" in msg and "verify=False" in msg


def test_raw_file_without_a_known_checksum_is_not_trusted(isolated, monkeypatch):
    mnist, _ = _two_datasets(isolated, monkeypatch)
    labels = datasets.read_idx(mnist / "t10k-labels-idx1-ubyte.gz")
    (mnist / "t10k-labels-idx1-ubyte.gz").unlink()
    datasets.write_idx(mnist / "t10k-labels-idx1-ubyte", labels, compress=False)
    with pytest.raises(DataError, match="cannot be verified"):
        datasets.load("mnist", root=mnist, download=False)
    np.testing.assert_array_equal(datasets.load("mnist", root=mnist, download=False, verify=False)[3], labels)


def test_download_does_not_report_success_over_a_corrupt_file(isolated, monkeypatch):
    mnist, _ = _two_datasets(isolated, monkeypatch)
    path = mnist / "train-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-3])
    with pytest.raises(DataError) as e:
        datasets.download("mnist", mnist, mirrors=["http://127.0.0.1:9/"], timeout=5)
    assert str(path) in str(e.value) and "Remove" in str(e.value)


def test_load_says_which_folder_it_used(isolated, monkeypatch):
    mnist, _ = _two_datasets(isolated, monkeypatch)
    out = datasets.load("mnist", root=mnist, download=False)
    assert out.folder == mnist
    x, y, xt, yt = out  # still unpacks as the 4-tuple
    assert x.shape == (11, 784)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(name=["mnist"]), ["name", "['mnist']"]),
        (dict(name="mnist", root=5), ["root", "5"]),
        (dict(name="mnist", mirrors=5), ["mirrors", "5"]),
        (dict(name="mnist", mirrors=[5]), ["mirrors", "[5]"]),
        (dict(name="mnist", download="no"), ["download", "'no'"]),
        (dict(name="mnist", verify="no"), ["verify", "'no'"]),
    ],
)
def test_arguments_of_the_wrong_type_are_configerrors(isolated, kwargs, words):
    with pytest.raises(ConfigError) as e:
        datasets.load(**kwargs)
    for w in words:
        assert w in str(e.value)


def test_download_dest_of_the_wrong_type(isolated):
    with pytest.raises(ConfigError, match="dest must be a folder .* got 5"):
        datasets.download("mnist", 5)
