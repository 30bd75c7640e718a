"""How a page's pixels travel to an OpenAI-compatible server: as a file, or in the request.

A server on this machine (a replica ocrd started) reads the page from a private folder on a
tmpfs: ocrd writes it there as an uncompressed PPM (a header and the pixels: about 2 ms of
CPU for a 1.5 megapixel page) and sends a `file://` URL, which `vllm serve` reads with
`--allowed-local-media-path`. A remote server must get the pixels in the request: a PNG data
URL (lossless; about 27 ms of CPU for such a page at zlib level 1; both measured by
`benchmarks/replicas.py transport`). The file lives from hand-over until the answer, so its
pixels are not held in the daemon's memory while the page waits for a replica.
"""

from __future__ import annotations

import base64
import contextlib
import io
import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from ocrd.log import get_logger


def png_data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)  # lossless; speed over size on a LAN
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclass
class PageMedia:
    """One page ready to be sent: the URL a server loads it from, and its file if any."""

    url: str
    path: Path | None = None

    def release(self) -> None:
        if self.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.path = None


def private_runtime_folder(prefix: str = "ocrd-engine-") -> Path:
    """A new folder only this user may enter (0700), on a tmpfs where there is one:
    /dev/shm (usually half the memory), then $RUNTIME_DIRECTORY (systemd's
    RuntimeDirectory=), $XDG_RUNTIME_DIR, then the temporary folder."""
    candidates = [
        "/dev/shm",
        os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0],
        os.environ.get("XDG_RUNTIME_DIR", ""),
    ]
    for candidate in candidates:
        if candidate and os.path.isdir(candidate) and os.access(candidate, os.W_OK | os.X_OK):
            return Path(tempfile.mkdtemp(prefix=prefix, dir=candidate))
    return Path(tempfile.mkdtemp(prefix=prefix))


class PageFiles:
    """Pages written for local servers into `folder` (their --allowed-local-media-path)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._names = itertools.count(1)
        self._fallback_logged = False
        self.log = get_logger()

    def write(self, image: Image.Image) -> PageMedia:
        """The page as a file the servers read; a PNG data URL if the folder is full."""
        path = self.folder / f"page-{next(self._names)}.ppm"
        try:
            image.save(path, format="PPM")
        except OSError as error:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            if not self._fallback_logged:
                self._fallback_logged = True
                self.log.warning(
                    "engine.page_files_failed",
                    folder=str(self.folder),
                    error=str(error),
                    action="pages travel as PNG inside the request instead (more CPU)",
                )
            return PageMedia(png_data_url(image))
        return PageMedia(path.as_uri(), path)

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
