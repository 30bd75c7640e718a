"""Rendering: a document's pages as RGB images, one page at a time, in worker processes.

PDF parsing is the dangerous part of the pipeline (hostile files hang, crash or eat memory),
so every document is opened in a child process with an address-space limit, and each page
must come back within a time limit or the child is killed. The parent receives raw RGB
pixels and wraps them as a PIL image: no encode/decode round trip on the way to the engine.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import resource
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from PIL import Image

from ocrd.config import PipelineConfig

WORKER_START_SECONDS = 60.0


class InputFormat(StrEnum):
    pdf = "pdf"
    tiff = "tiff"
    png = "png"
    jpeg = "jpeg"


class RenderError(Exception):
    """A document or one of its pages could not be rendered; the message is for users."""

    def __init__(self, message: str, page: int | None = None) -> None:
        super().__init__(message)
        self.page = page


@dataclass(frozen=True)
class RenderLimits:
    """Limits of a render worker process, the same for every document."""

    max_page_pixels: int = 50_000_000
    memory_limit_mb: int = 4096
    page_timeout_seconds: float = 120.0

    @classmethod
    def of(cls, config: PipelineConfig) -> RenderLimits:
        return cls(
            config.max_page_pixels,
            config.render_memory_limit_mb,
            config.page_render_timeout_seconds,
        )


@dataclass(frozen=True)
class RenderSettings:
    """How one document's pages are rasterised: resolution is what the engine pays for."""

    dpi: int = 144
    max_image_side: int = 2048
    passwords: tuple[str, ...] = ()  # tried in turn on an encrypted PDF


@dataclass(frozen=True)
class PageImage:
    number: int  # 1-based
    image: Image.Image
    width_pt: float  # the page's size in PDF points (72 per inch), for mapping boxes back
    height_pt: float


_SIGNATURES: tuple[tuple[bytes, InputFormat], ...] = (
    (b"\x89PNG\r\n\x1a\n", InputFormat.png),
    (b"\xff\xd8\xff", InputFormat.jpeg),
    (b"II*\x00", InputFormat.tiff),
    (b"MM\x00*", InputFormat.tiff),
    (b"II+\x00", InputFormat.tiff),  # BigTIFF
    (b"MM\x00+", InputFormat.tiff),
)


def detect_format(path: Path) -> InputFormat:
    """Recognise an input by its first bytes, never by its name."""
    with path.open("rb") as handle:
        head = handle.read(1024)
    if not head:
        raise RenderError("the file is empty (0 bytes)")
    for signature, fmt in _SIGNATURES:
        if head.startswith(signature):
            return fmt
    if b"%PDF-" in head:  # the PDF header may follow a few bytes of junk
        return InputFormat.pdf
    raise RenderError(
        f"not a PDF, TIFF, PNG or JPEG file (it starts with {head[:8]!r}); "
        "ocrd recognises inputs by their content, not by their name"
    )


# --- the child process ------------------------------------------------------------------


class _PdfSource:
    def __init__(self, path: Path, settings: RenderSettings, limits: RenderLimits) -> None:
        import pymupdf

        self.settings = settings
        self.limits = limits
        try:
            self.doc = pymupdf.open(path, filetype="pdf")
        except Exception as error:  # MuPDF raises its own types for broken files
            detail = str(error).replace(str(path), path.name)
            raise RenderError(f"the PDF is damaged beyond repair (MuPDF: {detail})") from None
        if self.doc.needs_pass and not self._unlock():
            tried = len(settings.passwords)
            raise RenderError(
                f"encrypted, no password matched (tried {tried} from the inbox's 'passwords'"
                " list); add its password there and drop the file in again"
            )
        self.page_count = self.doc.page_count
        if self.page_count == 0:
            raise RenderError("no pages: the PDF is empty or its page tree is damaged")

    def _unlock(self) -> bool:
        return any(self.doc.authenticate(password) for password in ("", *self.settings.passwords))

    def render(self, number: int) -> tuple[int, int, bytes, float, float]:
        import pymupdf

        page = self.doc.load_page(number - 1)
        rect = page.rect
        longest = max(rect.width, rect.height)
        if longest <= 0:
            raise RenderError(f"page {number} has no area", page=number)
        full = self.settings.dpi / 72
        width, height = round(rect.width * full), round(rect.height * full)
        if width * height > self.limits.max_page_pixels:
            raise RenderError(
                f"page {number} is {width}x{height} px at {self.settings.dpi} DPI, over the limit "
                f"of {self.limits.max_page_pixels} pixels (pipeline.max_page_pixels)",
                page=number,
            )
        zoom = min(full, self.settings.max_image_side / longest)
        pixmap = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), alpha=False, colorspace="rgb")
        return pixmap.width, pixmap.height, bytes(pixmap.samples), rect.width, rect.height


class _RasterSource:
    def __init__(self, path: Path, settings: RenderSettings, limits: RenderLimits) -> None:
        Image.MAX_IMAGE_PIXELS = limits.max_page_pixels
        self.settings = settings
        self.limits = limits
        try:
            self.image = Image.open(path)
        except Image.DecompressionBombError:
            raise RenderError(
                f"the image is over the limit of {limits.max_page_pixels} pixels"
            ) from None
        except Exception as error:
            raise RenderError(f"cannot open the image: {error}") from None
        self.page_count = getattr(self.image, "n_frames", 1)

    def render(self, number: int) -> tuple[int, int, bytes, float, float]:
        self.image.seek(number - 1)
        width, height = self.image.size
        if width * height > self.limits.max_page_pixels:
            raise RenderError(
                f"page {number} is {width}x{height} px, over the limit of "
                f"{self.limits.max_page_pixels} pixels",
                page=number,
            )
        dpi = float(self.image.info.get("dpi", (72, 72))[0] or 72)  # may be a fraction
        frame = self.image.convert("RGB")
        scale = min(1.0, self.settings.max_image_side / max(width, height))
        if scale < 1.0:
            size = (max(1, round(width * scale)), max(1, round(height * scale)))
            frame = frame.resize(size, Image.Resampling.LANCZOS)
        return frame.width, frame.height, frame.tobytes(), width * 72.0 / dpi, height * 72.0 / dpi


def _worker_main(conn: multiprocessing.connection.Connection, limits: RenderLimits) -> None:
    import pymupdf  # noqa: F401  (imported before the first request's clock starts)

    limit = limits.memory_limit_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    source: _PdfSource | _RasterSource | None = None
    while True:
        try:
            request = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        try:
            if request[0] == "open":
                _, path, fmt, settings = request
                if fmt == InputFormat.pdf:
                    source = _PdfSource(Path(path), settings, limits)
                else:
                    source = _RasterSource(Path(path), settings, limits)
                conn.send(("ok", source.page_count))
            elif request[0] == "ping":
                conn.send(("ok", None))
            elif request[0] == "render":
                assert source is not None
                conn.send(("ok", source.render(request[1])))
            else:
                source = None
                conn.send(("ok", None))
        except RenderError as error:
            conn.send(("error", str(error), error.page))
        except Exception as error:  # MemoryError, MuPDF's own errors, anything else
            page = request[1] if request[0] == "render" else None
            if isinstance(error, MemoryError) or "malloc" in str(error):
                where = f"page {page}" if page else "the document"
                message = (
                    f"rendering {where} needs more than the {limits.memory_limit_mb} MB "
                    "a renderer may use (pipeline.render_memory_limit_mb)"
                )
            else:
                message = f"{type(error).__name__}: {error}"
            conn.send(("error", message, page))


# --- the parent side ----------------------------------------------------------------------


class RenderWorker:
    """One child process that holds one open document at a time."""

    def __init__(self, limits: RenderLimits) -> None:
        self.limits = limits
        self._context = multiprocessing.get_context("spawn")
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="render-wait")

    def _ensure_started(self) -> multiprocessing.connection.Connection:
        if self._process is None or not self._process.is_alive() or self._conn is None:
            self.kill()
            parent, child = self._context.Pipe()
            self._process = self._context.Process(
                target=_worker_main, args=(child, self.limits), daemon=True, name="ocrd-render"
            )
            self._process.start()
            child.close()
            self._conn = parent
            parent.send(("ping",))  # returns once the child has imported its libraries
            parent.recv()
        return self._conn

    def _call(self, request: tuple[Any, ...]) -> Any:
        conn = self._conn
        if conn is None or self._process is None or not self._process.is_alive():
            raise EOFError("the render process is gone")
        conn.send(request)
        reply = conn.recv()
        if reply[0] == "error":
            raise RenderError(reply[1], page=reply[2])
        return reply[1]

    async def _request(self, request: tuple[Any, ...], what: str, page: int | None) -> Any:
        loop = asyncio.get_running_loop()
        try:
            if request[0] == "open":  # starting a process is not the document's time
                await asyncio.wait_for(
                    loop.run_in_executor(self._thread, self._ensure_started), WORKER_START_SECONDS
                )
            return await asyncio.wait_for(
                loop.run_in_executor(self._thread, self._call, request),
                timeout=self.limits.page_timeout_seconds,
            )
        except TimeoutError:
            self.kill()
            raise RenderError(
                f"{what} took longer than {self.limits.page_timeout_seconds:g} s and was stopped",
                page=page,
            ) from None
        except (EOFError, ConnectionError, BrokenPipeError):
            code = self._process.exitcode if self._process else None
            self.kill()
            raise RenderError(
                f"the renderer crashed on {what} (exit code {code})", page=page
            ) from None

    async def open(self, path: Path, fmt: InputFormat, settings: RenderSettings) -> int:
        request = ("open", str(path), fmt, settings)
        pages = await self._request(request, "opening the document", None)
        if pages < 1:
            raise RenderError("the document has no pages")
        return pages

    async def render(self, number: int) -> PageImage:
        width, height, pixels, width_pt, height_pt = await self._request(
            ("render", number), f"page {number}", number
        )
        image = Image.frombuffer("RGB", (width, height), pixels, "raw", "RGB", 0, 1)
        return PageImage(number, image, width_pt, height_pt)

    async def close_document(self) -> None:
        if self._process is not None and self._process.is_alive():
            try:
                await self._request(("close",), "closing the document", None)
            except RenderError:
                self.kill()

    def kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None

    def shutdown(self) -> None:
        self.kill()
        self._thread.shutdown(wait=False, cancel_futures=True)


class RenderPool:
    """A fixed set of render workers; a document holds one while its pages are rendered."""

    def __init__(self, size: int, limits: RenderLimits) -> None:
        self._idle: asyncio.Queue[RenderWorker] = asyncio.Queue()
        self._workers = [RenderWorker(limits) for _ in range(size)]
        for worker in self._workers:
            self._idle.put_nowait(worker)

    @asynccontextmanager
    async def worker(self) -> AsyncIterator[RenderWorker]:
        worker = await self._idle.get()
        try:
            yield worker
        finally:
            await asyncio.shield(worker.close_document())
            self._idle.put_nowait(worker)

    def shutdown(self) -> None:
        for worker in self._workers:
            worker.shutdown()
