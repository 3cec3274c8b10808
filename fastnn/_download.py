"""One file fetched over HTTP(S) within a deadline, into a temporary file renamed into place once checked.

`timeout` bounds each network wait (connecting, each read), as urllib's own timeout does; on top of it a
watchdog holds the whole transfer to a minimum average rate: t seconds after the request, at least
`min_rate * (t - timeout)` bytes must have arrived. A server dripping bytes (each within `timeout`) is thus
abandoned after about `timeout` seconds, and a file of S bytes takes at most about `timeout + S / min_rate`
seconds from one mirror. The watchdog, a thread, shuts the connection's socket down when the transfer falls
behind: that wakes a read blocked in it, in whatever phase (TLS handshake, headers, body) it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from . import _files
from ._errors import DataError

__all__ = ["fetch"]


class _Watchdog:
    """Shuts the transfer's socket down once fewer than `min_rate * (t - timeout)` bytes came in t seconds."""

    def __init__(self, timeout: float, min_rate: float) -> None:
        self.timeout, self.min_rate = timeout, min_rate
        self.start = time.monotonic()
        self.got = 0  #: bytes received so far (written by the downloading thread only)
        self.expired = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastnn-download-deadline", daemon=True)
        self._thread.start()

    def due(self) -> float:
        """The monotonic time by which more bytes must have arrived."""
        return self.start + self.timeout + self.got / self.min_rate

    def late(self) -> bool:
        return self.expired or time.monotonic() >= self.due()

    def watch(self, sock: socket.socket) -> None:
        """The socket to shut down when the transfer falls behind (the latest one: the TLS socket replaces
        the plain one it wraps)."""
        with self._lock:
            self._sock = sock
            expired = self.expired
        if expired:
            _shut(sock)

    def _run(self) -> None:
        while not self._done.wait(max(0.0, self.due() - time.monotonic())):
            if time.monotonic() >= self.due():
                with self._lock:
                    self.expired = True
                    sock = self._sock
                if sock is not None:
                    _shut(sock)
                return

    def close(self) -> None:
        self._done.set()
        self._thread.join()


def _shut(sock: socket.socket) -> None:
    # socket.socket's own shutdown even for an SSLSocket: it acts on the file descriptor alone, leaving the TLS
    # state to the thread blocked in it, which then sees the end of the stream.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _watched(http_class: type, watchdog: _Watchdog) -> type:
    """`http_class` (HTTPConnection or HTTPSConnection) registering each socket it opens with `watchdog`."""

    class Watched(http_class):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            create = getattr(self, "_create_connection", None)  # the plain socket, before any TLS handshake
            if create is not None:

                def create_and_watch(*a: Any, **k: Any) -> socket.socket:
                    sock = create(*a, **k)
                    watchdog.watch(sock)
                    return sock

                self._create_connection = create_and_watch

        def connect(self) -> None:
            super().connect()
            watchdog.watch(self.sock)

    return Watched


def _handler(base: type, watchdog: _Watchdog) -> urllib.request.BaseHandler:
    class Watching(base):  # type: ignore[misc, valid-type]
        def do_open(self, http_class: type, req: Any, **kwargs: Any) -> Any:
            return super().do_open(_watched(http_class, watchdog), req, **kwargs)

    return Watching()


def _open(url: str, timeout: float, watchdog: _Watchdog) -> Any:
    """urllib's response for `url`, its connections watched by `watchdog` (proxies and redirects as urlopen's)."""
    bases = [urllib.request.HTTPHandler]
    if hasattr(urllib.request, "HTTPSHandler"):  # Python built with ssl
        bases.append(urllib.request.HTTPSHandler)
    opener = urllib.request.build_opener(*(_handler(b, watchdog) for b in bases))
    return opener.open(urllib.request.Request(url, headers={"User-Agent": "fastnn"}), timeout=timeout)


def fetch(url: str, dest: Path, size: int, sha256: str, timeout: float, min_rate: float) -> None:
    """Download `url` into `dest` through a temporary file, checking size and sha256 before the rename.

    Raises:
        DataError: the server sent another size or content, or fell behind `min_rate` (see the module).
        OSError, http.client.HTTPException, ValueError: as urllib raises them (refused, timed out, bad URL).
    """
    watchdog = _Watchdog(timeout, min_rate)
    try:
        with _files.replacing(dest) as out:
            digest = hashlib.sha256()
            try:
                with _open(url, timeout, watchdog) as resp:
                    length = resp.headers.get("Content-Length")
                    if length is not None and length.isdigit() and int(length) != size:
                        raise DataError(f"server announces {length} bytes, expected {size}")
                    read = getattr(resp, "read1", resp.read)  # what has arrived, not a full 64 KiB: the rate counts
                    while watchdog.got <= size:  # bounded: one chunk past the expected size says "too large"
                        if watchdog.late():
                            break
                        chunk = read(1 << 16)
                        if not chunk:
                            break
                        watchdog.got += len(chunk)
                        digest.update(chunk)
                        out.write(chunk)
            except Exception:
                if not watchdog.late():
                    raise
            if watchdog.late() and watchdog.got < size:
                elapsed = time.monotonic() - watchdog.start
                raise DataError(
                    f"mirror too slow: {watchdog.got} of {size} bytes in {elapsed:.1f} s; fastnn needs "
                    f"{min_rate:g} bytes/s on average after the first {timeout:g} s (timeout={timeout:g}; "
                    f"fastnn.datasets.DOWNLOAD_MIN_RATE)"
                ) from None
            got = watchdog.got
            if got != size:
                raise DataError(f"received {got} bytes, expected {size}" + (" (interrupted?)" if got < size else ""))
            if digest.hexdigest() != sha256:
                raise DataError(f"sha256 mismatch: got {digest.hexdigest()}, expected {sha256}")
    finally:
        watchdog.close()
