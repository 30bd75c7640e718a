"""Rendering: pages as RGB images, and figures cut from the source, in worker processes.

PDF parsing is the dangerous part of the pipeline (hostile files hang, crash or eat memory),
so documents are opened only in child processes with an address-space limit, and every
request must come back within a time limit or the child is killed.

Each worker keeps a few documents open, so a document never holds a renderer while it waits
for page slots: any worker renders any page, preferring one that has the document open.
Page pixels come back through a buffer the worker and the daemon share (no pickling of
megabytes through a pipe); figures are cut from the source at full resolution and written
as PNG files by the worker, so encoding them costs the daemon's event loop nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import multiprocessing
import multiprocessing.connection
import os
import resource
import secrets
import signal
import tempfile
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from ocrd.config import PipelineConfig
from ocrd.domain import Figure, InputFormat, PageImage, RenderSettings, TextLayer
from ocrd.dropped import NotRegularFile, open_regular, opened
from ocrd.grounding import Block, Box

WORKER_START_SECONDS = 60.0
OPEN_DOCUMENTS_PER_WORKER = 4
FIGURE_PNG_LEVEL = 3  # zlib level for figure files: much faster than 6, a few % larger


class RenderError(Exception):
    """A document or one of its pages could not be rendered; the message is for users, the
    code (empty, unsupported, damaged, encrypted, no_pages, too_large, image, timeout,
    crashed, out_of_memory, error) for metrics."""

    def __init__(self, message: str, page: int | None = None, code: str = "error") -> None:
        super().__init__(message)
        self.page = page
        self.code = code


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


_SIGNATURES: tuple[tuple[bytes, InputFormat], ...] = (
    (b"\x89PNG\r\n\x1a\n", InputFormat.png),
    (b"\xff\xd8\xff", InputFormat.jpeg),
    (b"II*\x00", InputFormat.tiff),
    (b"MM\x00*", InputFormat.tiff),
    (b"II+\x00", InputFormat.tiff),  # BigTIFF
    (b"MM\x00+", InputFormat.tiff),
)


def not_a_file(error: NotRegularFile) -> RenderError:
    return RenderError(
        f"not a regular file ({error.strerror}); ocrd reads only files dropped as they are",
        code="unsupported",
    )


def detect_format(path: Path) -> InputFormat:
    """Recognise an input by its first bytes, never by its name. Only a regular file is
    opened (never through a link, never blocking on a FIFO)."""
    try:
        with opened(path) as handle:
            head = handle.read(1024)
    except NotRegularFile as error:
        raise not_a_file(error) from None
    if not head:
        raise RenderError("the file is empty (0 bytes)", code="empty")
    for signature, fmt in _SIGNATURES:
        if head.startswith(signature):
            return fmt
    if b"%PDF-" in head:  # the PDF header may follow a few bytes of junk
        return InputFormat.pdf
    raise RenderError(
        f"not a PDF, TIFF, PNG or JPEG file (it starts with {head[:8]!r}); "
        "ocrd recognises inputs by their content, not by their name",
        code="unsupported",
    )


# --- the child process ------------------------------------------------------------------

Region = tuple[float, float, float, float]  # a part of a page as fractions (0..1) of it
# width, height, bytes of pixels, the pixels if they did not fit the shared buffer, page
# size in points, blank
Rendered = tuple[int, int, int, bytes | None, float, float, bool]

BLANK_MARGIN = 0.03  # scanner edges and punch holes are not content
BLANK_CONTRAST = 80  # ink is this much darker than the paper (bleed-through is not)
BLANK_TILE = 16  # pixels a side
BLANK_TILE_INK = 0.05  # a tile with this share of ink holds content
BLANK_MAX_TILES = 0  # one tile of ink is content (a page number); specks of dust are not

EMBEDDED_COVER = 0.9  # an embedded image covering this much of a figure's box supplies it

MIN_TEXT_LAYER_CHARACTERS = 50
MAX_BAD_GLYPHS = 0.02  # share of unmapped or private-use characters in a usable layer
MIN_LETTER_SHARE = 0.7  # real text is 83 to 100 % letters and digits; unmapped fonts ~50 %
MAX_INVISIBLE_TEXT = 0.5  # more is an OCR layer laid under a scan by an older tool
MAX_IMAGE_COVER = 0.5  # more of the page under images: a scan, or a page made of pictures


def looks_blank(pixels: memoryview | bytes, width: int, height: int) -> bool:
    """Whether an RGB page is blank at this resolution: no tile of it holds ink that stands
    out from the paper. Bleed-through, paper tone, specks and scanner edges do not count;
    a few words or a page number do. Pillow's C code only: a few ms a page."""
    gray = Image.frombuffer("RGB", (width, height), pixels, "raw", "RGB", 0, 1).convert("L")
    dx, dy = int(width * BLANK_MARGIN), int(height * BLANK_MARGIN)
    inner = gray.crop((dx, dy, width - dx, height - dy)).reduce(2)
    if inner.width < BLANK_TILE or inner.height < BLANK_TILE:
        return True
    paper = _percentile(inner.histogram(), 0.9)
    ink = inner.point(lambda value: 255 if value < paper - BLANK_CONTRAST else 0)
    share = ink.reduce(BLANK_TILE // 2).histogram()  # each tile's share of ink, 0..255
    return sum(share[int(BLANK_TILE_INK * 255) + 1 :]) <= BLANK_MAX_TILES


def _percentile(histogram: list[int], share: float) -> int:
    """The value below which `share` of a histogram's pixels lie."""
    wanted, seen = share * sum(histogram), 0
    for value, count in enumerate(histogram):
        seen += count
        if seen >= wanted:
            return value
    return 255


def _judge_text_layer(page: Any) -> tuple[bool, str]:
    """Whether a PDF page's text layer can stand in for recognising its pixels."""
    text = page.get_text("text")
    characters = [c for c in text if not c.isspace()]
    if len(characters) < MIN_TEXT_LAYER_CHARACTERS:
        return False, "little or no text"
    bad = sum(1 for c in characters if c == "\ufffd" or "\ue000" <= c <= "\uf8ff" or c < " ")
    letters = sum(1 for c in characters if c.isalnum())
    if bad / len(characters) > MAX_BAD_GLYPHS or letters / len(characters) < MIN_LETTER_SHARE:
        return False, "garbled text: its glyphs do not map to the letters shown"
    spans = page.get_texttrace()
    total = sum(len(span["chars"]) for span in spans) or 1
    invisible = sum(len(span["chars"]) for span in spans if span["type"] == 3)
    if invisible / total > MAX_INVISIBLE_TEXT:
        return False, "invisible text: an OCR layer from another tool"
    area = page.rect.get_area() or 1.0
    covered = sum(
        (page.rect & info["bbox"]).get_area() for info in page.get_image_info()
    )  # overlapping images may count twice: erring towards recognising the pixels
    if covered / area > MAX_IMAGE_COVER:
        return False, "images cover most of the page (a scan, or a page made of pictures)"
    return True, "born-digital text layer"


def _hand_over(pixels: memoryview | bytes, buffer: mmap.mmap) -> tuple[int, bytes | None]:
    """Put a page's pixels where the daemon reads them: the shared buffer if they fit."""
    size = len(pixels)
    if size <= len(buffer):
        buffer[:size] = pixels
        return size, None
    return size, bytes(pixels)


def _write_png(image: Image.Image, path: Path) -> None:
    """Write durably under a temporary name first: a killed worker never leaves a torn
    figure, and the daemon can link the file into the outbox without copying it."""
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("wb") as handle:
        image.save(handle, format="PNG", compress_level=FIGURE_PNG_LEVEL)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


class _PdfSource:
    def __init__(self, path: Path, settings: RenderSettings, limits: RenderLimits) -> None:
        import pymupdf

        self.settings = settings
        self.limits = limits
        try:
            fd = open_regular(path)
        except NotRegularFile as error:
            raise not_a_file(error) from None
        try:  # MuPDF opens the file the descriptor holds: what was checked is what is read
            self.doc = pymupdf.open(f"/proc/self/fd/{fd}", filetype="pdf")
        except Exception as error:  # MuPDF raises its own types for broken files
            detail = str(error).replace(f"/proc/self/fd/{fd}", path.name)
            raise RenderError(
                f"the PDF is damaged beyond repair (MuPDF: {detail})", code="damaged"
            ) from None
        finally:
            os.close(fd)
        if self.doc.needs_pass and not self._unlock():
            tried = len(settings.passwords)
            raise RenderError(
                f"encrypted, no password matched (tried {tried} from the inbox's 'passwords'"
                " list); add its password there and drop the file in again",
                code="encrypted",
            )
        self.page_count = self.doc.page_count
        if self.page_count == 0:
            raise RenderError(
                "no pages: the PDF is empty or its page tree is damaged", code="no_pages"
            )

    def _unlock(self) -> bool:
        return any(self.doc.authenticate(password) for password in ("", *self.settings.passwords))

    def render(self, number: int, buffer: mmap.mmap) -> Rendered:
        import pymupdf

        page = self.doc.load_page(number - 1)
        rect = page.rect
        longest = max(rect.width, rect.height)
        if longest <= 0:
            raise RenderError(f"page {number} has no area", page=number, code="damaged")
        full = self.settings.dpi / 72
        width, height = round(rect.width * full), round(rect.height * full)
        if width * height > self.limits.max_page_pixels:
            raise RenderError(
                f"page {number} is {width}x{height} px at {self.settings.dpi} DPI, over the limit "
                f"of {self.limits.max_page_pixels} pixels (pipeline.max_page_pixels)",
                page=number,
                code="too_large",
            )
        zoom = min(full, self.settings.max_image_side / longest)
        pixmap = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), alpha=False, colorspace="rgb")
        # samples_mv points into the pixmap's memory: copy while the pixmap is alive.
        blank = looks_blank(pixmap.samples_mv, pixmap.width, pixmap.height)
        size, payload = _hand_over(pixmap.samples_mv, buffer)
        return pixmap.width, pixmap.height, size, payload, rect.width, rect.height, blank

    def text_layer(self, number: int, running_lines: bool = True) -> TextLayer:
        """The page's own text as Markdown, if it is good enough to stand in for OCR;
        without `running_lines`, what the layout model finds to be page headers and
        footers is left out."""
        page = self.doc.load_page(number - 1)
        rect = page.rect
        zoom = min(
            self.settings.dpi / 72, self.settings.max_image_side / max(rect.width, rect.height)
        )
        image_size = (round(rect.width * zoom), round(rect.height * zoom))
        usable, reason = _judge_text_layer(page)
        if not usable:
            return TextLayer(False, reason, image_size=image_size)
        import pymupdf4llm

        markdown = pymupdf4llm.to_markdown(
            self.doc, pages=[number - 1], use_ocr=False, show_progress=False,
            header=running_lines, footer=running_lines,
        )  # fmt: skip
        blocks = tuple(
            Block("text", (Box.from_pixels(x0 - rect.x0, y0 - rect.y0, x1 - rect.x0,
                                           y1 - rect.y0, rect.width, rect.height),), text.strip())
            for x0, y0, x1, y1, text, _, kind in page.get_text("blocks")
            if kind == 0 and text.strip()
        )  # fmt: skip
        return TextLayer(
            True, reason, markdown.strip(), blocks, image_size, (rect.width, rect.height)
        )

    def figures(
        self, number: int, boxes: Sequence[Region], dpi: float, folder: Path, names: Sequence[str]
    ) -> list[Figure]:
        """Each box cut from the embedded image that covers it, at the image's own resolution
        where that is at least `dpi` (a scan's or a photo's original pixels); otherwise the
        box rendered on its own at `dpi` (lower only where the pixel limit says)."""
        import pymupdf

        page = self.doc.load_page(number - 1)
        rect = page.rect
        images = page.get_image_info(xrefs=True)
        cuts = []
        for (x1, y1, x2, y2), name in zip(boxes, names, strict=True):
            clip = pymupdf.Rect(
                rect.x0 + x1 * rect.width,
                rect.y0 + y1 * rect.height,
                rect.x0 + x2 * rect.width,
                rect.y0 + y2 * rect.height,
            )
            cut = self._embedded(clip, images, dpi, folder / name)
            cuts.append(cut or self._rendered(page, clip, dpi, folder / name))
        return cuts

    def _rendered(self, page: Any, clip: Any, dpi: float, path: Path) -> Figure:
        import pymupdf

        rect = page.rect
        zoom = dpi / 72
        pixels = clip.width * clip.height * zoom * zoom
        if pixels > self.limits.max_page_pixels:
            zoom *= (self.limits.max_page_pixels / pixels) ** 0.5
        matrix = pymupdf.Matrix(zoom, zoom)
        pixmap = page.get_pixmap(matrix=matrix, clip=clip, alpha=False, colorspace="rgb")
        image = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples_mv)
        _write_png(image, path)
        box = (
            round((clip.x0 - rect.x0) * zoom),
            round((clip.y0 - rect.y0) * zoom),
            round((clip.x1 - rect.x0) * zoom),
            round((clip.y1 - rect.y0) * zoom),
        )
        return Figure(path, image.width, image.height, box, round(zoom * 72, 2))

    def _embedded(
        self, clip: Any, images: list[dict[str, Any]], dpi: float, path: Path
    ) -> Figure | None:
        """The figure from an upright embedded image covering most of `clip`, if the image
        is at least `dpi`; its box is in the image's own pixels. None otherwise."""
        import pymupdf

        for info in images:
            a, b, c, d = info["transform"][:4]
            bbox = pymupdf.Rect(info["bbox"])
            if not info.get("xref") or b or c or a <= 0 or d <= 0 or bbox.is_empty:
                continue  # inline, rotated, skewed or mirrored: rendering is safer
            if (bbox & clip).get_area() < EMBEDDED_COVER * clip.get_area():
                continue
            scale_x, scale_y = info["width"] / bbox.width, info["height"] / bbox.height
            if min(scale_x, scale_y) * 72 < dpi:
                continue  # coarser than rendering at `dpi`
            if info["width"] * info["height"] > self.limits.max_page_pixels:
                continue
            try:
                pixmap = _rgb(pymupdf.Pixmap(self.doc, info["xref"]))
            except (RuntimeError, ValueError):  # a stencil mask, an odd colour space
                continue
            if pixmap is None or (pixmap.width, pixmap.height) != (info["width"], info["height"]):
                continue
            inside = clip & bbox
            box = (
                round((inside.x0 - bbox.x0) * scale_x),
                round((inside.y0 - bbox.y0) * scale_y),
                round((inside.x1 - bbox.x0) * scale_x),
                round((inside.y1 - bbox.y0) * scale_y),
            )
            image = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples_mv)
            crop = image.crop(box)
            _write_png(crop, path)
            return Figure(path, crop.width, crop.height, box, round(scale_x * 72, 2))
        return None


def _rgb(pixmap: Any) -> Any:
    """The pixmap as plain RGB, or None where it holds no colours (a mask)."""
    import pymupdf

    if pixmap.colorspace is None:
        return None
    if pixmap.alpha:
        pixmap = pymupdf.Pixmap(pixmap, 0)
    if pixmap.colorspace.n != 3:
        pixmap = pymupdf.Pixmap(pymupdf.csRGB, pixmap)
    return pixmap


class _RasterSource:
    def __init__(self, path: Path, settings: RenderSettings, limits: RenderLimits) -> None:
        Image.MAX_IMAGE_PIXELS = limits.max_page_pixels
        self.settings = settings
        self.limits = limits
        try:
            self.image = Image.open(os.fdopen(open_regular(path), "rb"))
        except NotRegularFile as error:
            raise not_a_file(error) from None
        except Image.DecompressionBombError:
            raise RenderError(
                f"the image is over the limit of {limits.max_page_pixels} pixels", code="too_large"
            ) from None
        except Exception as error:
            raise RenderError(f"cannot open the image: {error}", code="image") from None
        self.page_count = getattr(self.image, "n_frames", 1)

    def _frame(self, number: int) -> Image.Image:
        self.image.seek(number - 1)
        width, height = self.image.size
        if width * height > self.limits.max_page_pixels:
            raise RenderError(
                f"page {number} is {width}x{height} px, over the limit of "
                f"{self.limits.max_page_pixels} pixels",
                page=number,
                code="too_large",
            )
        return self.image.convert("RGB")

    def _dpi(self) -> float:
        return float(self.image.info.get("dpi", (72, 72))[0] or 72)  # may be a fraction

    def render(self, number: int, buffer: mmap.mmap) -> Rendered:
        frame = self._frame(number)
        width, height = frame.size
        dpi = self._dpi()
        scale = min(1.0, self.settings.max_image_side / max(width, height))
        if scale < 1.0:
            size = (max(1, round(width * scale)), max(1, round(height * scale)))
            frame = frame.resize(size, Image.Resampling.LANCZOS)
        pixels = frame.tobytes()
        blank = looks_blank(pixels, frame.width, frame.height)
        size, payload = _hand_over(pixels, buffer)
        return (
            frame.width, frame.height, size, payload, width * 72.0 / dpi, height * 72.0 / dpi,
            blank,
        )  # fmt: skip

    def figures(
        self, number: int, boxes: Sequence[Region], dpi: float, folder: Path, names: Sequence[str]
    ) -> list[Figure]:
        """Crops of the original pixels: a scan's figures at the resolution it was scanned."""
        frame = self._frame(number)
        width, height = frame.size
        cuts = []
        for (x1, y1, x2, y2), name in zip(boxes, names, strict=True):
            box = (round(x1 * width), round(y1 * height), round(x2 * width), round(y2 * height))
            crop = frame.crop(box)
            _write_png(crop, folder / name)
            cuts.append(Figure(folder / name, crop.width, crop.height, box, self._dpi()))
        return cuts


Source = _PdfSource | _RasterSource
DocumentKey = tuple[str, InputFormat, RenderSettings]  # what it takes to open a document


def _source(key: DocumentKey, sources: OrderedDict[DocumentKey, Source], ctx: Any) -> Source:
    """The open document for `key`, opened now if this worker does not have it (it may have
    been restarted since); the least recently used is closed beyond the limit."""
    if key in sources:
        sources.move_to_end(key)
        return sources[key]
    path, fmt, settings = key
    source_type = _PdfSource if fmt == InputFormat.pdf else _RasterSource
    sources[key] = source_type(Path(path), settings, ctx.limits)
    while len(sources) > OPEN_DOCUMENTS_PER_WORKER:
        sources.popitem(last=False)
    return sources[key]


def _serve(request: tuple[Any, ...], sources: OrderedDict[DocumentKey, Source], ctx: Any) -> Any:
    kind = request[0]
    if kind == "ping":
        return None
    source = _source(request[1], sources, ctx)
    if kind == "open":
        return source.page_count
    if kind == "render":
        return source.render(request[2], ctx.buffer)
    if kind == "text":
        if not isinstance(source, _PdfSource):
            return TextLayer(False, "an image has no text layer")
        return source.text_layer(request[2], request[3])
    if kind == "figures":
        _, _, number, boxes, dpi, folder, names = request
        return source.figures(number, boxes, dpi, Path(folder), names)
    raise ValueError(f"unknown request {kind!r}")


@dataclass
class _ChildContext:
    limits: RenderLimits
    buffer: mmap.mmap


def _worker_main(
    conn: multiprocessing.connection.Connection, limits: RenderLimits, buffer_path: str
) -> None:
    import pymupdf  # noqa: F401  (imported before the first request's clock starts)

    # Ctrl-C reaches the whole process group: the daemon decides when a renderer stops
    # (it kills it), so a stop never fails the page being rendered.
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    with open(buffer_path, "r+b") as handle:
        buffer = mmap.mmap(handle.fileno(), 0)
    limit = limits.memory_limit_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    context = _ChildContext(limits, buffer)
    sources: OrderedDict[DocumentKey, Source] = OrderedDict()
    while True:
        try:
            request = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        try:
            conn.send(("ok", _serve(request, sources, context)))
        except RenderError as error:
            conn.send(("error", str(error), error.page, error.code))
        except Exception as error:  # MemoryError, MuPDF's own errors, anything else
            page = request[2] if request[0] in ("render", "figures", "text") else None
            code = "error"
            if isinstance(error, MemoryError) or "malloc" in str(error):
                where = f"page {page}" if page else "the document"
                message = (
                    f"rendering {where} needs more than the {limits.memory_limit_mb} MB "
                    "a renderer may use (pipeline.render_memory_limit_mb)"
                )
                code = "out_of_memory"
            else:
                message = f"{type(error).__name__}: {error}"
            conn.send(("error", message, page, code))


# --- the parent side ----------------------------------------------------------------------


def _shared_folder() -> str:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()


class RenderWorker:
    """One child process, the documents it has open, and the buffer it hands pixels in.

    Requests go through one thread, so they are answered in order even when the task that
    asked was cancelled meanwhile; a request that runs out of time kills the child, which is
    started again for the next one.
    """

    def __init__(self, limits: RenderLimits, buffer_bytes: int) -> None:
        self.limits = limits
        self.buffer_bytes = buffer_bytes
        self.open: OrderedDict[DocumentKey, int] = OrderedDict()  # mirrors the child's cache
        self._context = multiprocessing.get_context("spawn")
        self._process: multiprocessing.process.BaseProcess | None = None
        self._conn: multiprocessing.connection.Connection | None = None
        self._buffer: mmap.mmap | None = None
        self._killed = False  # by kill(): replace it even if the kernel has not reaped it yet
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="render-wait")

    # In the worker's thread:

    def _ensure_started(self) -> None:
        alive = self._process is not None and self._process.is_alive()
        if alive and self._conn is not None and not self._killed:
            return
        self._killed = False
        self._cleanup()
        path = os.path.join(_shared_folder(), f"ocrd-render-{os.getpid()}-{secrets.token_hex(4)}")
        with open(path, "w+b") as handle:
            handle.truncate(self.buffer_bytes)
            buffer = mmap.mmap(handle.fileno(), self.buffer_bytes)
        try:
            parent, child = self._context.Pipe()
            process = self._context.Process(
                target=_worker_main,
                args=(child, self.limits, path),
                daemon=True,
                name="ocrd-render",
            )
            process.start()
            child.close()
            parent.send(("ping",))  # answered once the child has imported and mapped
            parent.recv()
        finally:
            os.unlink(path)  # both sides hold the mapping; nothing is left behind
        self._process, self._conn, self._buffer = process, parent, buffer

    def _cleanup(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(timeout=5)
        if self._conn is not None:
            self._conn.close()
        if self._buffer is not None:
            self._buffer.close()
        self._process = self._conn = self._buffer = None

    def _call(self, request: tuple[Any, ...]) -> Any:
        self._ensure_started()
        assert self._conn is not None
        self._conn.send(request)
        reply = self._conn.recv()
        if reply[0] == "error":
            raise RenderError(reply[1], page=reply[2], code=reply[3])
        if request[0] == "render":
            return self._page_image(request[2], reply[1])
        return reply[1]

    def _page_image(self, number: int, reply: tuple[Any, ...]) -> PageImage:
        width, height, size, payload, width_pt, height_pt, blank = reply
        if payload is None:
            assert self._buffer is not None
            with memoryview(self._buffer)[:size] as pixels:  # copied out before the next page
                image = Image.frombytes("RGB", (width, height), pixels)
        else:
            image = Image.frombytes("RGB", (width, height), payload)
        return PageImage(number, image, width_pt, height_pt, blank)

    # On the event loop:

    async def request(self, request: tuple[Any, ...], what: str, page: int | None) -> Any:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(  # starting a process is not the document's time
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
                code="timeout",
            ) from None
        except (EOFError, ConnectionError, OSError):
            code = self._process.exitcode if self._process else None
            self.kill()
            raise RenderError(
                f"the renderer crashed on {what} (exit code {code})", page=page, code="crashed"
            ) from None

    async def open_document(self, key: DocumentKey) -> int:
        """Open a document here (a page count): its first request's time limit is for
        opening alone, and its pages then prefer this worker."""
        if key in self.open:
            self.open.move_to_end(key)
            return self.open[key]
        pages = await self.request(("open", key), "opening the document", None)
        if pages < 1:
            raise RenderError("the document has no pages", code="no_pages")
        self.open[key] = pages
        while len(self.open) > OPEN_DOCUMENTS_PER_WORKER:
            self.open.popitem(last=False)
        return pages

    def kill(self) -> None:
        """Stop the child now (from the event loop); its thread cleans up before the next."""
        self.open.clear()
        self._killed = True
        process = self._process
        if process is not None and process.is_alive():
            process.kill()

    def shutdown(self) -> None:
        self.kill()
        self._thread.submit(self._cleanup)
        self._thread.shutdown(wait=True, cancel_futures=True)


@dataclass(frozen=True)
class Document:
    """A document as the render pool knows it."""

    path: Path
    format: InputFormat
    settings: RenderSettings

    @property
    def key(self) -> DocumentKey:
        return (str(self.path), self.format, self.settings)


class RenderPool:
    """A fixed set of render workers, each taken for one request at a time.

    A worker goes to the longest-waiting request, or where nobody waits, to the next request
    that comes, preferring a worker that already has that request's document open. Hand-off
    survives cancellation: a worker given to a request cancelled before it woke is passed on.
    """

    def __init__(self, size: int, limits: RenderLimits, buffer_bytes: int = 2048 * 2048 * 3):
        self.limits = limits
        self._workers = [RenderWorker(limits, buffer_bytes) for _ in range(size)]
        self._idle: list[RenderWorker] = list(self._workers)
        self._waiters: deque[asyncio.Future[RenderWorker]] = deque()

    @property
    def size(self) -> int:
        return len(self._workers)

    @property
    def busy(self) -> int:
        return len(self._workers) - len(self._idle)

    async def warm_up(self) -> None:
        """Start every worker now, so the first document does not wait for imports."""
        loop = asyncio.get_running_loop()
        await asyncio.gather(
            *(loop.run_in_executor(w._thread, w._ensure_started) for w in self._workers)
        )

    def _take(self, key: DocumentKey | None) -> RenderWorker:
        worker = next((w for w in self._idle if key in w.open), self._idle[0])
        self._idle.remove(worker)
        return worker

    def _give_back(self, worker: RenderWorker) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(worker)
                return
        self._idle.append(worker)

    async def _acquire(self, key: DocumentKey | None) -> RenderWorker:
        if self._idle and not self._waiters:
            return self._take(key)
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._give_back(waiter.result())  # handed over, but too late: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    @asynccontextmanager
    async def _worker(self, key: DocumentKey | None) -> AsyncIterator[RenderWorker]:
        worker = await self._acquire(key)
        try:
            yield worker
        finally:
            self._give_back(worker)  # synchronous: a second cancellation cannot lose it

    async def open(self, document: Document) -> int:
        """The document's page count; it stays open in a worker for its pages."""
        async with self._worker(document.key) as worker:
            return await worker.open_document(document.key)

    async def render(self, document: Document, number: int) -> PageImage:
        async with self._worker(document.key) as worker:
            await worker.open_document(document.key)
            return await worker.request(("render", document.key, number), f"page {number}", number)

    async def text_layer(
        self, document: Document, number: int, running_lines: bool = True
    ) -> TextLayer:
        """Page `number`'s own text layer and whether it can stand in for recognition
        (without its running headers and footers unless `running_lines`)."""
        request = ("text", document.key, number, running_lines)
        async with self._worker(document.key) as worker:
            await worker.open_document(document.key)
            return await worker.request(request, f"the text of page {number}", number)

    async def figures(
        self,
        document: Document,
        number: int,
        boxes: Sequence[Region],
        dpi: float,
        folder: Path,
        names: Sequence[str],
    ) -> list[Figure]:
        """Cut `boxes` of a page out of the source at `dpi` into `folder` as PNG files."""
        folder.mkdir(parents=True, exist_ok=True)
        request = ("figures", document.key, number, list(boxes), dpi, str(folder), list(names))
        async with self._worker(document.key) as worker:
            await worker.open_document(document.key)
            return await worker.request(request, f"the figures of page {number}", number)

    def worker_pids(self) -> list[int]:
        return [w._process.pid for w in self._workers if w._process and w._process.pid]

    def shutdown(self) -> None:
        for worker in self._workers:
            worker.shutdown()
