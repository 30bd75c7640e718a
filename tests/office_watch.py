"""What the office attacks watch from outside the daemon: files that must never be opened
(inotify), a web server that must get no request, the memory of the daemon's processes.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import http.server
import os
import signal
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

IN_ACCESS = 0x001
IN_OPEN = 0x020
_EVENT = struct.Struct("iIII")


class OpenWatch:
    """inotify on the secret files: every open or read of one, by any process, is seen."""

    def __init__(self, paths: list[Path]) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self._paths: dict[int, Path] = {}
        for path in paths:
            wd = self._libc.inotify_add_watch(self._fd, str(path).encode(), IN_OPEN | IN_ACCESS)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
            self._paths[wd] = path
        self.opened: list[Path] = []

    def read(self) -> list[Path]:
        """The secret files opened since the watch began."""
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return list(self.opened)
            offset = 0
            while offset < len(data):
                wd, _mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size + length
                self.opened.append(self._paths[wd])

    def clear(self) -> None:
        self.read()
        self.opened.clear()

    def close(self) -> None:
        os.close(self._fd)


class _Recorder(http.server.BaseHTTPRequestHandler):
    def _record(self) -> None:
        self.server.requests.append(f"{self.command} {self.path}")  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()

    do_GET = do_POST = do_HEAD = _record

    def log_message(self, format: str, *args: object) -> None:
        pass


class CountingServer:
    """A local web server a hostile document points at; it must get no request."""

    def __init__(self) -> None:
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
        self._server.requests = []  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def requests(self) -> list[str]:
        return list(self._server.requests)  # type: ignore[attr-defined]

    def clear(self) -> None:
        self._server.requests.clear()  # type: ignore[attr-defined]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _children(pid: int) -> list[int]:
    found = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found += [int(c) for c in handle.read().split()]
    return found


def process_tree(pid: int) -> list[int]:
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += _children(current)
    return tree


def rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class MemoryWatch:
    """Samples the resident memory of the daemon and of each process under it. A child
    past `kill_above` is killed (the machine is shared; the test fails on the peak anyway)."""

    pid: int
    kill_above: int
    peaks: dict[int, int] = field(default_factory=dict)  # pid -> highest RSS seen
    killed: list[int] = field(default_factory=list)

    @contextlib.contextmanager
    def sampling(self, interval: float = 0.1) -> Iterator[MemoryWatch]:
        self.peaks.clear()
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                for pid in process_tree(self.pid):
                    rss = rss_bytes(pid)
                    self.peaks[pid] = max(self.peaks.get(pid, 0), rss)
                    if pid != self.pid and rss > self.kill_above:
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
                        self.killed.append(pid)
                time.sleep(interval)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()

    @property
    def daemon_peak(self) -> int:
        return self.peaks.get(self.pid, 0)

    @property
    def child_peak(self) -> int:
        return max((v for k, v in self.peaks.items() if k != self.pid), default=0)


# ---- the secrets, and what a person reads ----------------------------------------------------


def png_with(text: str) -> bytes:
    """A 1x1 PNG carrying `text` in a tEXt chunk: a picture a reader would gladly embed."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return len(body).to_bytes(4, "big") + kind + body + crc.to_bytes(4, "big")

    header = (1).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    pixels = zlib.compress(b"\x00\xff\x00\x00")
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"tEXt", b"Comment\x00" + text.encode())
        + chunk(b"IDAT", pixels)
        + chunk(b"IEND", b"")
    )


def plant_secrets(folders: list[Path], secret: str) -> list[Path]:
    """secret.png in each folder, readable by ocrd's user."""
    planted = []
    for folder in folders:
        path = folder / "secret.png"
        path.write_bytes(png_with(secret))
        os.chmod(path, 0o644)
        planted.append(path)
    return planted


def holds_secret(content: bytes, secret: str) -> bool:
    """The secret, as it is, or inside a base64 data: URL of the secret picture."""
    if secret.encode() in content:
        return True
    picture = base64.b64encode(png_with(secret))
    return picture[:40] in content


def the_watches_see(opened: OpenWatch, server: CountingServer, secrets: list[Path]) -> None:
    """The instruments work: an open of each secret file, and a request, are seen."""
    for path in secrets:
        path.read_bytes()
    assert sorted(set(opened.read())) == sorted(secrets)
    assert httpx.get(f"{server.url}/probe", timeout=10).status_code == 200
    assert server.requests == ["GET /probe"]
    opened.clear()
    server.clear()


@dataclass(frozen=True)
class Ending:
    name: str
    outcome: str  # done or failed
    reason: str  # failed: the report's message
    markdown: str  # done: the Markdown


def readable(reason: str) -> bool:
    """A reason a person can act on: a sentence, no traceback, no control characters."""
    return (
        20 <= len(reason) <= 2000
        and " " in reason
        and "Traceback" not in reason
        and not any(ord(c) < 32 and c not in "\n\t" for c in reason)
    )
