"""The IDX file format of the MNIST family, read and written: magic 00 00 <type code> <ndim>, then ndim big-endian
uint32 dims, then the data, row-major; gzipped or raw. Every header is checked before any data is read."""

from __future__ import annotations

import contextlib
import gzip
import io
import math
import os
import zlib
from pathlib import Path

import numpy as np

from . import _files
from ._errors import DataError

__all__ = ["READ_IDX_MAX_BYTES", "PathLike", "parse_idx", "read_idx", "write_idx"]

PathLike = str | os.PathLike

_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype("u1"),
    0x09: np.dtype("i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_CODES: dict[np.dtype, int] = {dt.newbyteorder("="): code for code, dt in _IDX_DTYPES.items()}
_GZIP_MAGIC = b"\x1f\x8b"


def _hex(data: bytes) -> str:
    return " ".join(f"{b:02x}" for b in data)


#: Largest payload `read_idx` reads unless told otherwise: a header is 8-1028 bytes, and a gzip stream of a
#: few megabytes can declare and inflate to gigabytes, so the declared size is checked before any data is read.
READ_IDX_MAX_BYTES = 1 << 32


def _read_exact(f, n: int, path: Path, what: str) -> bytes:
    """n bytes of `f`, or DataError naming the file, what was being read and how much was there."""
    # Grown chunk by chunk, not allocated at n: a header may claim more than the stream holds.
    buf = bytearray()
    while len(buf) < n:
        part = f.read(min(n - len(buf), 1 << 24))
        if not part:
            raise DataError(f"{path}: truncated IDX file: {what} needs {n} bytes but only {len(buf)} remain")
        buf += part
    return buf


def _read_idx_stream(
    f,
    path: Path,
    raw_size: int | None,
    dtype: np.dtype | None = None,
    dims: tuple[int | None, ...] | None = None,
    max_bytes: int | None = READ_IDX_MAX_BYTES,
) -> np.ndarray:
    head = f.read(4)
    if len(head) < 4:
        raise DataError(f"{path}: too short for an IDX file ({len(head)} bytes; the header alone is >= 8)")
    if head[:2] != b"\0\0":
        raise DataError(f"{path}: not an IDX file: magic bytes are {_hex(head)}, expected 00 00 <type> <ndim>")
    code, ndim = head[2], head[3]
    if code not in _IDX_DTYPES:
        known = ", ".join(f"0x{c:02x}" for c in _IDX_DTYPES)
        raise DataError(f"{path}: unknown IDX type code 0x{code:02x} (known: {known}; MNIST images use 0x08)")
    if ndim == 0:
        raise DataError(f"{path}: IDX header says 0 dimensions")
    got = tuple(int(d) for d in np.frombuffer(_read_exact(f, 4 * ndim, path, f"the {ndim} dims"), dtype=">u4"))
    file_dtype = _IDX_DTYPES[code]
    # Everything the header promises is checked against what the caller expects before any data is read.
    if dtype is not None and file_dtype.newbyteorder("=") != np.dtype(dtype):
        raise DataError(f"{path}: IDX data type is {file_dtype.name}, expected {np.dtype(dtype).name}")
    if dims is not None and (len(got) != len(dims) or any(e is not None and e != g for e, g in zip(dims, got))):
        want = "(" + ", ".join("N" if e is None else str(e) for e in dims) + ("," if len(dims) == 1 else "") + ")"
        raise DataError(f"{path}: IDX dims are {got}, expected {want}")
    payload = math.prod(got) * file_dtype.itemsize
    if max_bytes is not None and payload > max_bytes:
        raise DataError(
            f"{path}: IDX header declares dims {got} of {file_dtype.name} = {payload} bytes, more than the "
            f"{max_bytes} allowed for this file (nothing was read)"
        )
    header = 4 + 4 * ndim
    if raw_size is not None and raw_size != header + payload:
        # An uncompressed file's size is known up front: no need to read it to know it is wrong.
        raise DataError(
            f"{path}: IDX payload length mismatch: dims {got} of {file_dtype.name} need {payload} bytes after the "
            f"{header}-byte header, but the file holds {raw_size - header}"
            + (" (truncated)" if raw_size < header + payload else " (trailing data)")
        )
    data = _read_exact(f, payload, path, f"the data of dims {got} ({file_dtype.name})")
    if f.read(1):
        raise DataError(f"{path}: IDX payload length mismatch: trailing data after the {payload}-byte payload")
    return np.frombuffer(data, dtype=file_dtype).reshape(got).astype(file_dtype.newbyteorder("="), copy=False)


def read_idx(
    path: PathLike,
    *,
    dtype: np.dtype | str | None = None,
    dims: tuple[int | None, ...] | None = None,
    max_bytes: int | None = READ_IDX_MAX_BYTES,
) -> np.ndarray:
    """Read an IDX file (gzipped or raw, told apart by the gzip magic bytes 1f 8b) into a native-endian array.

    The header is checked before any data is read: against `dtype` and `dims` when given (None in `dims`
    accepts any size on that axis), and its declared payload against `max_bytes`; then exactly the declared
    bytes are read, and a stream that ends early or goes on is refused.

    Raises:
        DataError: the file is missing, truncated, not IDX, longer than its header says, or not as expected.
    """
    return parse_idx(Path(path), None, dtype, dims, max_bytes)


def parse_idx(
    path: Path,
    blob: bytes | None,
    dtype: np.dtype | str | None,
    dims: tuple[int | None, ...] | None,
    max_bytes: int | None,
) -> np.ndarray:
    """read_idx of `path`, or of `blob` (the file's bytes, already read and verified) when given."""
    try:
        with open(path, "rb") if blob is None else contextlib.nullcontext(io.BytesIO(blob)) as raw:
            if raw.read(2) == _GZIP_MAGIC:
                raw.seek(0)
                with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                    return _read_idx_stream(f, path, None, dtype, dims, max_bytes)
            raw.seek(0)
            size = len(blob) if blob is not None else os.fstat(raw.fileno()).st_size
            return _read_idx_stream(raw, path, size, dtype, dims, max_bytes)
    except (EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise DataError(f"{path}: corrupt or truncated gzip stream: {e}") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read IDX file: {e.strerror or e}") from None


def write_idx(path: PathLike, array: np.ndarray, compress: bool = True) -> None:
    """Write `array` as an IDX file (gzipped when `compress`), atomically.

    Raises:
        DataError: the dtype has no IDX type code (uint8, int8, int16, int32, float32, float64), or the
            shape does not fit the header (1 to 255 dims, each < 2**32).
    """
    array = np.asarray(array)
    native = array.dtype.newbyteorder("=")
    if native not in _IDX_CODES:
        raise DataError(
            f"write_idx: array dtype {array.dtype} has no IDX type code; use uint8, int8, int16, int32, "
            f"float32 or float64 (labels: .astype(np.uint8))"
        )
    if not 1 <= array.ndim <= 255 or any(d >= 2**32 for d in array.shape):
        raise DataError(f"write_idx: array shape {array.shape} does not fit an IDX header (1-255 dims, each < 2**32)")
    code = _IDX_CODES[native]
    header = bytes([0, 0, code, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    data = header + np.ascontiguousarray(array, dtype=_IDX_DTYPES[code]).tobytes()
    if compress:
        data = gzip.compress(data, mtime=0)  # mtime=0: the same array always gives the same bytes
    _files.write_bytes(path, data)  # the umask's mode, not mkstemp's 0600: a dataset folder may be shared
