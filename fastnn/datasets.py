"""MNIST-family datasets: the IDX file format, finding the files on disk, and a checked download.

`load("mnist")` / `load("fashion-mnist")` looks for the four standard IDX files (gzipped or raw) in
`root`, `$FASTNN_DATA`, `$FASTNN_DATA/<name>`, `~/.cache/fastnn/<name>` and `/usr/share/datasets/<name>`
(where Debian's `dataset-fashion-mnist` puts Fashion-MNIST), in that order; failing that it downloads
them into `root` or `~/.cache/fastnn/<name>` ($XDG_CACHE_HOME/fastnn/<name> where that is set: _cachedir.base_dir),
checking each file's size and sha256, and writing each
through a temporary file in the same folder and `os.replace`, so an interrupted download leaves nothing
half-written. Mirrors can be replaced with `mirrors=` or `$FASTNN_DATASET_MIRRORS`.

The two datasets share their file names, so local files are verified too: each file's size (before reading)
and sha256 (before decompressing) must be the named dataset's, gzipped or not; the result's `folder` says
which folder was used. `verify=False` reads any MNIST-layout files (your own data) unchecked, with each IDX
header checked against the expected dims and UNVERIFIED_MAX_ROWS before any data is read.

Verified files are also kept decoded in `$FASTNN_DATASET_CACHE_DIR` (default `~/.cache/fastnn/decoded`), one entry
per content, bounded by $FASTNN_DATASET_CACHE_MAX_MB: the next load of the same unchanged files memory-maps them
from there instead of verifying and decompressing them again (_decoded.py says when an entry is trusted);
`fastnn cache clear` empties it.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import _cachedir, _decoded
from ._errors import ConfigError, DataError
from ._idx import READ_IDX_MAX_BYTES, PathLike, parse_idx, read_idx, write_idx  # noqa: F401  (read_idx's default)

__all__ = [
    "DATASETS",
    "DOWNLOAD_MIN_RATE",
    "DatasetSpec",
    "RemoteFile",
    "download",
    "load",
    "read_idx",
    "search_dirs",
    "write_idx",
]


# ---------------------------------------------------------------------------------------------------
# The datasets: file names, checksums, mirrors.
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteFile:
    """One downloadable file: its name on the mirrors (gzipped), sha256 and size in bytes; the same of its
    uncompressed form where known (a folder may hold either); and its IDX dims where known."""

    name: str
    sha256: str
    size: int
    raw_sha256: str | None = None
    raw_size: int | None = None
    dims: tuple[int, ...] | None = None

    @property
    def stem(self) -> str:
        """The name without `.gz`: a folder may hold either form."""
        return self.name.removesuffix(".gz")


@dataclass(frozen=True)
class DatasetSpec:
    """An MNIST-layout dataset: the four files (train images, train labels, test images, test labels)."""

    name: str
    files: tuple[RemoteFile, RemoteFile, RemoteFile, RemoteFile]
    mirrors: tuple[str, ...]
    classes: int = 10
    apt_package: str | None = None


# sha256 and sizes of the MNIST gz files as served by the mirrors below; the same values are published
# in torchvision-derived code and in many independent projects (checked by hand, not downloaded here).
# The uncompressed files' sha256 are those published by independent projects that verify raw MNIST (two
# agreeing sources); Fashion-MNIST's were computed from the gz files whose sha256 are given below.
_MNIST = DatasetSpec(
    name="mnist",
    files=(
        RemoteFile(
            "train-images-idx3-ubyte.gz",
            "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
            9912422,
            "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            47040016,
            (60000, 28, 28),
        ),
        RemoteFile(
            "train-labels-idx1-ubyte.gz",
            "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
            28881,
            "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            60008,
            (60000,),
        ),
        RemoteFile(
            "t10k-images-idx3-ubyte.gz",
            "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
            1648877,
            "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            7840016,
            (10000, 28, 28),
        ),
        RemoteFile(
            "t10k-labels-idx1-ubyte.gz",
            "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
            4542,
            "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
            10008,
            (10000,),
        ),
    ),
    mirrors=(
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
    ),
)

# Fashion-MNIST (Zalando Research, MIT licence): the gz files of the GitHub release, identical to what
# Debian's dataset-fashion-mnist installs.
_FASHION_MNIST = DatasetSpec(
    name="fashion-mnist",
    files=(
        RemoteFile(
            "train-images-idx3-ubyte.gz",
            "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
            26421856,
            "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
            47040016,
            (60000, 28, 28),
        ),
        RemoteFile(
            "train-labels-idx1-ubyte.gz",
            "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
            29491,
            "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
            60008,
            (60000,),
        ),
        RemoteFile(
            "t10k-images-idx3-ubyte.gz",
            "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
            4422079,
            "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
            7840016,
            (10000, 28, 28),
        ),
        RemoteFile(
            "t10k-labels-idx1-ubyte.gz",
            "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
            5125,
            "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
            10008,
            (10000,),
        ),
    ),
    mirrors=(
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",  # plain http: the sha256 check guards it
        "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
    ),
    apt_package="dataset-fashion-mnist",
)

#: Known datasets by name.
DATASETS: dict[str, DatasetSpec] = {spec.name: spec for spec in (_MNIST, _FASHION_MNIST)}

#: Where Debian's dataset packages install their files (a module attribute so tests can move it).
SYSTEM_DATA_DIR = Path("/usr/share/datasets")

#: Mirror override: base URLs separated by commas or whitespace; `{name}` is replaced by the dataset name.
MIRRORS_ENV = "FASTNN_DATASET_MIRRORS"

#: Slowest average download rate accepted (bytes/s) once `timeout` seconds have passed: a mirror that falls
#: behind is abandoned for the next one, so a file of S bytes takes at most about timeout + S / this per mirror
#: (16 KiB/s: MNIST's largest file in 10 minutes). Lower it for a slower link.
DOWNLOAD_MIN_RATE = 16 * 1024


#: Largest number of rows an unverified (verify=False) MNIST-layout file may declare: 1,000,000 images are
#: 784 MB. A header declaring more is refused before any data is read (raise it here for larger data sets).
UNVERIFIED_MAX_ROWS = 1_000_000


def _spec(name: str) -> DatasetSpec:
    if not isinstance(name, str):
        raise ConfigError(f"name must be a dataset name (a str), got {name!r}; known: {', '.join(sorted(DATASETS))}")
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; known: {', '.join(sorted(DATASETS))}")
    return DATASETS[name]


def _cache_dir(name: str) -> Path:
    """Where `name` is downloaded by default: $XDG_CACHE_HOME/fastnn/<name>, else ~/.cache/fastnn/<name> (with no
    home directory, a temporary folder of this process, said in one warning)."""
    return _cachedir.base_dir() / name


def _check_root(root: object, what: str = "root") -> None:
    if root is not None and (isinstance(root, bool) or not isinstance(root, (str, os.PathLike))):
        raise ConfigError(f"{what} must be a folder (str or os.PathLike) or None, got {root!r}")


def _check_flag(name: str, value: object) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name} must be True or False, got {value!r}")
    return bool(value)


#: The origin of the one folder searched for every dataset: its files are told apart by their checksums.
_SHARED_ORIGIN = "$FASTNN_DATA"


def _candidates(name: str, root: PathLike | None) -> list[tuple[Path | None, str]]:
    """(folder, where it came from) in search order; folder None where an env var is unset."""
    _check_root(root)
    out: list[tuple[Path | None, str]] = []
    if root is not None:
        out.append((Path(root).expanduser(), "root argument"))
    env = os.environ.get("FASTNN_DATA", "")
    if env:
        out += [(Path(env).expanduser(), "$FASTNN_DATA"), (Path(env).expanduser() / name, "$FASTNN_DATA/<name>")]
    else:
        out.append((None, "$FASTNN_DATA (not set)"))
    out += [(_cache_dir(name), "cache"), (SYSTEM_DATA_DIR / name, "system (Debian dataset packages)")]
    return out


def search_dirs(name: str, root: PathLike | None = None) -> list[Path]:
    """The folders `load(name, root)` looks in, in order."""
    _spec(name)
    return [d for d, _ in _candidates(name, root) if d is not None]


def _find(folder: Path, spec: DatasetSpec) -> tuple[list[Path | None], str]:
    """Each of the four files in `folder` (the .gz form first, then raw) or None; and a note for errors."""
    if not folder.is_dir():
        return [None] * 4, "no such folder" if not folder.exists() else "not a folder"
    found: list[Path | None] = []
    for f in spec.files:
        gz, raw = folder / f.name, folder / f.stem
        found.append(gz if gz.is_file() else raw if raw.is_file() else None)
    missing = [f.stem for f, p in zip(spec.files, found) if p is None]
    if len(missing) == len(spec.files):
        note = "none of the 4 files"
    else:
        note = "all 4 files" if not missing else f"missing {', '.join(missing)} (.gz or raw)"
    return found, note


# ---------------------------------------------------------------------------------------------------
# Download.
# ---------------------------------------------------------------------------------------------------


def _mirrors(spec: DatasetSpec, mirrors: Sequence[str] | None) -> list[str]:
    if mirrors is None:
        env = os.environ.get(MIRRORS_ENV, "").replace(",", " ").split()
        mirrors = env or spec.mirrors
    elif isinstance(mirrors, str):
        raise ConfigError(f"mirrors must be a sequence of base URLs, got the string {mirrors!r}")
    elif not isinstance(mirrors, Sequence) or not all(isinstance(m, str) for m in mirrors):
        raise ConfigError(f"mirrors must be a sequence of base URLs (str), got {mirrors!r}")
    urls = [m.replace("{name}", spec.name) for m in mirrors]
    return [u if u.endswith("/") else u + "/" for u in urls]


def download(
    name: str, dest: PathLike | None = None, *, mirrors: Sequence[str] | None = None, timeout: float = 30.0
) -> Path:
    """Download the dataset's files missing from `dest` (default `~/.cache/fastnn/<name>`); returns `dest`.

    Each file is tried on each mirror in turn; `timeout` (seconds) bounds every network wait, and a mirror
    sending less than DOWNLOAD_MIN_RATE bytes/s on average after the first `timeout` seconds is abandoned for
    the next (so a file takes at most about timeout + size / DOWNLOAD_MIN_RATE seconds per mirror). Files
    already in `dest` are verified (size and sha256) first: success means all four files are the named dataset's.

    Raises:
        ConfigError: unknown name, `dest` not a folder path, or mirrors not a sequence of URLs.
        DataError: a file already in `dest` is corrupt or another dataset's (it is left for you to remove),
            or some file could not be had from any mirror (the message lists every attempt).
    """
    spec = _spec(name)
    _check_root(dest, "dest")
    return _download(spec, Path(dest).expanduser() if dest is not None else _cache_dir(name), mirrors, timeout)


def _check_timeout(timeout: float) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise ConfigError(f"timeout must be a finite number of seconds > 0, got {timeout!r}")


def _download(spec: DatasetSpec, folder: Path, mirrors: Sequence[str] | None, timeout: float) -> Path:
    _check_timeout(timeout)
    urls = _mirrors(spec, mirrors)
    if not urls:
        raise DataError(f"no mirrors to download {spec.name} from (mirrors={mirrors!r}, ${MIRRORS_ENV})")
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create the download folder {folder}: {e.strerror or e}") from None
    try:
        _fetch_missing(spec, folder, urls, timeout)
    except BaseException:
        if created:  # a failed first download leaves no empty folder behind (rmdir refuses a non-empty one)
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise
    return folder


def _fetch_missing(spec: DatasetSpec, folder: Path, urls: list[str], timeout: float) -> None:
    # The network stack (urllib.request, http.client, email, ssl, socket) is imported here, not with fastnn: it was
    # about a quarter of what `import fastnn` added to numpy's import, and only a download needs it.
    import http.client

    from ._download import fetch as _fetch

    found, _ = _find(folder, spec)
    for rf, have in zip(spec.files, found):
        if have is not None:
            try:
                _verified_bytes(have, rf, spec)
            except DataError as e:
                raise DataError(f"{e}\nRemove {have} to download it again.") from None
            continue
        errors = []
        for base in urls:
            url = base + rf.name
            try:
                _fetch(url, folder / rf.name, rf.size, rf.sha256, timeout, DOWNLOAD_MIN_RATE)
                break
            except (OSError, ValueError, http.client.HTTPException) as e:
                # OSError: refused connections, socket timeouts, HTTP errors (URLError); ValueError: bad URLs
                # and our own size/sha256/too-slow DataError; HTTPException: broken or incomplete responses.
                errors.append(f"{url}: {e}")
        else:
            raise DataError(f"download of {rf.name} into {folder} failed:\n    " + "\n    ".join(errors))


# ---------------------------------------------------------------------------------------------------
# Verification: a local file is the named dataset's file only if its size and sha256 say so.
# ---------------------------------------------------------------------------------------------------


class _OtherDataset(DataError):
    """A file that is not the named dataset's; `other` names the known dataset it belongs to, if any."""

    def __init__(self, message: str, other: str | None) -> None:
        super().__init__(message)
        self.other = other


def _expected(path: Path, rf: RemoteFile) -> tuple[str | None, int | None, str]:
    """(sha256, size, form) the file at `path` must have: the .gz's, or the uncompressed file's."""
    if path.name == rf.name:
        return rf.sha256, rf.size, "gzipped"
    return rf.raw_sha256, rf.raw_size, "uncompressed"


def _owner(rf: RemoteFile, gz: bool, size: int, digest: str | None) -> str | None:
    """The known dataset whose file of `rf`'s name has this size (and digest, when given), if any."""
    for spec in DATASETS.values():
        for f in spec.files:
            want_size, want_sha = (f.size, f.sha256) if gz else (f.raw_size, f.raw_sha256)
            if f.stem == rf.stem and want_size == size and (digest is None or want_sha == digest):
                return spec.name
    return None


def _verified_bytes(path: Path, rf: RemoteFile, spec: DatasetSpec) -> bytes:
    """The bytes of `path` after checking its size (before reading) and sha256 against `spec`'s file."""
    sha, size, form = _expected(path, rf)
    if sha is None or size is None:
        raise DataError(
            f"{path}: no known sha256 of {spec.name}'s {form} {rf.stem}, so it cannot be verified; use the "
            f"{rf.name} file, or verify=False (examples: --no-verify) to load it unchecked"
        )
    gz = path.name == rf.name
    try:
        have = path.stat().st_size
        if have != size and _owner(rf, gz, have, None) is None:  # not worth reading: no known file has this size
            raise _OtherDataset(
                f"{path} is not {spec.name}'s {rf.stem}: {have} bytes, expected {size} (corrupt, truncated, or "
                f"other data: verify=False, or --no-verify in the examples, loads your own MNIST-layout files)",
                None,
            )
        data = path.read_bytes()
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest == sha and len(data) == size:
        return data
    other = _owner(rf, gz, len(data), digest)
    if other is not None:
        raise _OtherDataset(
            f"{path} is {other}'s {rf.stem}, not {spec.name}'s (sha256 {digest}): load it as {other!r}", other
        )
    raise _OtherDataset(
        f"{path} is not {spec.name}'s {rf.stem}: sha256 {digest}, expected {sha} (corrupt, or other data: "
        f"verify=False, or --no-verify in the examples, loads your own MNIST-layout files)",
        None,
    )


# ---------------------------------------------------------------------------------------------------
# Load.
# ---------------------------------------------------------------------------------------------------


class Loaded(tuple):
    """(x_train, y_train, x_test, y_test) as `load` returns them, plus `folder`: where the files were read."""

    folder: Path

    def __new__(cls, arrays: tuple[np.ndarray, ...], folder: Path | None = None) -> Loaded:  # None: unpickling
        self = super().__new__(cls, arrays)
        self.folder = folder
        return self


def _dims(rf: RemoteFile, verified: bool) -> tuple[int | None, ...]:
    """The dims a file must declare: the known ones when verified, else (N, 28, 28) or (N,) with any N."""
    if verified and rf.dims is not None:
        return rf.dims
    return (None, 28, 28) if "images" in rf.stem else (None,)


def _read_file(path: Path, rf: RemoteFile, spec: DatasetSpec, blob: bytes | None) -> np.ndarray:
    """One IDX file: its dims are the known ones when verified (`blob` given), else (N, 28, 28) or (N,) with
    N at most UNVERIFIED_MAX_ROWS; the header is checked before the data is read."""
    row = 28 * 28 if "images" in rf.stem else 1
    return parse_idx(path, blob, np.uint8, _dims(rf, blob is not None), UNVERIFIED_MAX_ROWS * row)


def _split(
    spec: DatasetSpec, paths: list[Path], arrays: list[np.ndarray], split: int
) -> tuple[np.ndarray, np.ndarray]:
    """Split 0 (train) or 1 (test) as x uint8 (N, 784) and y int64 (N,), after the consistency checks."""
    images_path, labels_path = paths[2 * split], paths[2 * split + 1]
    x, y = arrays[2 * split], arrays[2 * split + 1]
    classes = spec.classes
    if x.shape[0] != y.shape[0]:
        raise DataError(f"{images_path} holds {x.shape[0]} images but {labels_path} holds {y.shape[0]} labels")
    if y.size and int(y.max()) >= classes:
        raise DataError(f"{labels_path}: label {int(y.max())} is outside [0, {classes})")
    return x.reshape(x.shape[0], 28 * 28), y.astype(np.int64)


def load(
    name: str,
    root: PathLike | None = None,
    download: bool = True,
    *,
    mirrors: Sequence[str] | None = None,
    timeout: float = 30.0,
    verify: bool = True,
) -> Loaded:
    """Load an MNIST-family dataset as (x_train, y_train, x_test, y_test): x uint8 (N, 784), y int64 (N,).

    The result unpacks as that tuple and has a `folder` attribute: where the files were read from. A verified load
    of files verified before and unchanged since returns x as copy-on-write memory maps of the decoded cache
    (writable; writes stay in this process).

    Args:
        name: "mnist" or "fashion-mnist".
        root: a folder to look in first, and to download into (default `~/.cache/fastnn/<name>`).
        download: fetch the files from the mirrors when no folder holds all four.
        mirrors: base URLs replacing the built-in mirrors (also `$FASTNN_DATASET_MIRRORS`).
        timeout: seconds for each network wait; also the grace before DOWNLOAD_MIN_RATE applies, so a mirror
            dripping bytes is given up after about `timeout` seconds (see `download`).
        verify: check every file's size and sha256 against the named dataset's before using it (the two
            datasets share file names); the top of `$FASTNN_DATA` may hold either, and a folder there holding
            the other dataset's files is passed over. False reads any MNIST-layout files (your own data), up to
            UNVERIFIED_MAX_ROWS rows per file, and skips the top of `$FASTNN_DATA` (only checksums could tell
            which dataset it holds).

    Raises:
        ConfigError: unknown name, or an argument of the wrong type.
        DataError: files corrupt, inconsistent, or (verify=True) not the named dataset's; or absent everywhere
            and not downloadable (one message listing every place looked and how to provide the files).
    """
    spec = _spec(name)
    _check_root(root)
    download = _check_flag("download", download)
    verify = _check_flag("verify", verify)
    _check_timeout(timeout)
    _mirrors(spec, mirrors)  # a bad mirrors argument is an error even when the files are found locally
    report = []
    for folder, origin in _candidates(name, root):
        if folder is None:
            report.append(f"  {origin}")
            continue
        if origin == _SHARED_ORIGIN and not verify:
            # This folder may hold either dataset under the same file names: only checksums can tell.
            report.append(f"  {folder} ({origin}): not searched with verify=False (it may hold either dataset)")
            continue
        found, note = _find(folder, spec)
        if all(p is not None for p in found):
            try:
                return _load_found(spec, folder, found, verify)
            except _OtherDataset as e:
                if origin != _SHARED_ORIGIN or e.other is None:
                    raise DataError(str(e)) from None
                report.append(f"  {folder} ({origin}): holds {e.other}'s files, not {name}'s")
                continue
        report.append(f"  {folder} ({origin}): {note}")

    dest = Path(root).expanduser() if root is not None else _cache_dir(name)
    if download:
        try:
            folder = _download(spec, dest, mirrors, timeout)
        except DataError as e:
            failure = str(e)
        else:
            found, _ = _find(folder, spec)
            return _load_found(spec, folder, found, True)
    else:
        failure = "download=False: no download attempted"
    names = ", ".join(f.name for f in spec.files)
    ways = [
        f"put the four files ({names}; gzipped or not) in one folder and pass root=FOLDER "
        f"(examples: --data FOLDER) or set FASTNN_DATA=FOLDER",
    ]
    if spec.apt_package:
        ways.append(f"on Debian/Ubuntu: apt-get install {spec.apt_package} (installs to {SYSTEM_DATA_DIR / name})")
    ways.append(f"allow the download (download=True, network access to the mirrors or ${MIRRORS_ENV})")
    raise DataError(
        f"dataset {name!r} not found. Looked in:\n"
        + "\n".join(report)
        + f"\n{failure}\nTo provide the files:\n"
        + "\n".join(f"  - {w}" for w in ways)
    )


def _load_found(spec: DatasetSpec, folder: Path, found: list[Path | None], verify: bool) -> Loaded:
    """The four files of `folder`, each verified first when `verify` (all four before any is decompressed).

    Verified files are kept decoded in the dataset cache (_decoded.py): a file verified before and unchanged
    since is memory-mapped from there instead of being read, checked and decompressed again.
    """
    paths = [p for p in found if p is not None]
    if not verify:
        arrays = [_read_file(p, rf, spec, None) for p, rf in zip(paths, spec.files)]
        return Loaded((*_split(spec, paths, arrays, 0), *_split(spec, paths, arrays, 1)), folder)
    # By content: the published checksum of the decoded bytes (else the source's), so copies share an entry.
    keys = [_decoded.entry_key(spec.name, rf.stem, rf.raw_sha256 or _expected(p, rf)[0] or "")
            for p, rf in zip(paths, spec.files)]  # fmt: skip
    arrays = [_decoded.lookup(k, p, _dims(rf, True), rf.raw_sha256) for k, p, rf in zip(keys, paths, spec.files)]
    fresh = {}  # index -> (stat before reading, the time then, verified bytes): all verified before any is decoded
    for i, (p, rf) in enumerate(zip(paths, spec.files)):
        if arrays[i] is None:
            try:
                before = p.stat()
            except OSError:
                before = None  # _verified_bytes names the problem
            fresh[i] = (before, time.time_ns(), _verified_bytes(p, rf, spec))
    for i, (before, checked_ns, blob) in fresh.items():
        p, rf = paths[i], spec.files[i]
        arrays[i] = _read_file(p, rf, spec, blob)
        if before is not None:
            _decoded.store(keys[i], p, arrays[i], before, checked_ns, rf.raw_sha256)
    return Loaded((*_split(spec, paths, arrays, 0), *_split(spec, paths, arrays, 1)), folder)
