"""The render worker process: answers the daemon's requests (`protocol.py`) one at a time,
with an address-space limit, keeping a few sources open.

Whatever a source does (MuPDF's own errors, running out of memory) comes back as a
`RenderFailed` reply saying what happened to which page; only a crash or a hang ends the worker,
and the daemon's side (`pool.py`) notices that and starts another.
"""

from __future__ import annotations

import mmap
import multiprocessing.connection
import resource
import signal
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from ocrd.config import PdfLines
from ocrd.domain import InputFormat, TextLayer
from ocrd.files.writes import write_scratch_file
from ocrd.office.limits import DEFAULT_LIMITS, OfficeRefused
from ocrd.office.read import OfficeRead, read_office
from ocrd.output.linefind import LineFinder
from ocrd.output.searchable import (
    PdfSettings,
    SearchablePdfError,
    SearchablePdfResult,
    write_searchable_pdf,
)
from ocrd.render.errors import RenderError, RenderFailure
from ocrd.render.image import RasterSource
from ocrd.render.pdf import PdfSource
from ocrd.render.protocol import (
    CutFigures,
    FiguresCut,
    OfficeConverted,
    Open,
    Opened,
    PdfWritten,
    Ping,
    ReadOffice,
    ReadTextLayer,
    RenderedPage,
    RenderFailed,
    RenderLimits,
    RenderPage,
    Reply,
    Request,
    SourceKey,
    TextLayerRead,
    WorkerReady,
    WriteSearchablePdf,
    page_of,
)

OPEN_SOURCES_PER_WORKER = 4
MAX_FINDINGS_SHOWN = 3
Source = PdfSource | RasterSource


class _Worker:
    def __init__(self, limits: RenderLimits, buffer: mmap.mmap) -> None:
        self.limits = limits
        self.buffer = buffer
        self.sources: OrderedDict[SourceKey, Source] = OrderedDict()
        # Find the lines of pages whose model gave no positions, as the inbox's
        # `pdf_lines` asks (each loads RapidOCR's models on its first use).
        self.line_finders = {
            PdfLines.read: LineFinder(read=True),
            PdfLines.detect: LineFinder(read=False),
        }

    def source(self, key: SourceKey) -> Source:
        """The open source for `key`, opened now if this worker does not have it (it may
        have been restarted since); the least recently used is closed beyond the limit."""
        if key in self.sources:
            self.sources.move_to_end(key)
            return self.sources[key]
        kind = PdfSource if key.format is InputFormat.pdf else RasterSource
        root = Path(key.root) if key.root is not None else None
        self.sources[key] = kind(Path(key.path), key.settings, self.limits, root)
        while len(self.sources) > OPEN_SOURCES_PER_WORKER:
            self.sources.popitem(last=False)
        return self.sources[key]

    def serve(self, request: Request) -> Reply:
        match request:
            case Ping():
                return WorkerReady()
            case Open(source=key):
                return Opened(self.source(key).page_count)
            case RenderPage(source=key, page=page, separators=separators, page_file=file):
                if file is None:
                    return self.source(key).render(page, self.buffer, separators)
                rendered = self.source(key).render(page, self.buffer, separators, "RGB")
                return self.write_page_file(rendered, file)
            case ReadTextLayer(source=key, page=page, running_lines=running_lines):
                source = self.source(key)
                if not isinstance(source, PdfSource):
                    return TextLayerRead(TextLayer(False, "an image has no text layer"))
                return TextLayerRead(source.text_layer(page, running_lines))
            case CutFigures(source=key, page=page, boxes=boxes, dpi=dpi, folder=folder):
                return FiguresCut(self.source(key).figures(page, boxes, dpi, folder, request.names))
            case WriteSearchablePdf():
                return PdfWritten(self.searchable_pdf(request))
            case ReadOffice(source=key, pictures_folder=folder):
                return OfficeConverted(self.office(key, folder))
        raise TypeError(f"not a render request: {request!r}")

    def write_page_file(self, page: RenderedPage, path: Path) -> RenderedPage:
        """The page's pixels written to `path` as a PPM file; where that fails (a full
        tmpfs), they stay where they are and travel as before."""

        def write(out: BinaryIO) -> None:
            out.write(f"P6\n{page.width} {page.height}\n255\n".encode())
            if page.payload is not None:
                out.write(page.payload)
            else:
                with memoryview(self.buffer)[: page.size] as pixels:
                    out.write(pixels)

        if not write_scratch_file(path, write):
            return page
        return replace(page, payload=None, file=path)

    def office(self, key: SourceKey, pictures_folder: Path | None) -> OfficeRead:
        """An office document or web page, checked and converted (never opened as a source
        kept open: it is read once); its pictures written into `pictures_folder`."""
        root = Path(key.root) if key.root is not None else None
        max_pixels = self.limits.max_page_pixels
        try:
            return read_office(
                Path(key.path), key.format, root, DEFAULT_LIMITS, max_pixels, pictures_folder
            )
        except OfficeRefused as error:
            raise RenderError(str(error), code=RenderFailure(error.code.value)) from None

    def searchable_pdf(self, request: WriteSearchablePdf) -> SearchablePdfResult:
        try:
            return write_searchable_pdf(
                request.files,
                request.order,
                request.pages,
                request.target,
                PdfSettings(
                    request.archive,
                    request.passwords,
                    root=request.root,
                    line_finder=self.line_finders.get(request.lines),  # `off`: none
                ),
            )
        except SearchablePdfError as error:
            findings = "; ".join(error.findings[:MAX_FINDINGS_SHOWN])
            detail = f" (PDF/A findings: {findings})" if findings else ""
            raise RenderError(f"the searchable PDF: {error}{detail}") from None

    def answer(self, request: Request) -> Reply:
        try:
            return self.serve(request)
        except RenderError as error:
            return RenderFailed(str(error), error.page, error.code)
        except Exception as error:  # MemoryError, MuPDF's own errors, anything else
            return self.failure(error, page_of(request))

    def failure(self, error: Exception, page: int | None) -> RenderFailed:
        import pymupdf

        # MuPDF reports a failed allocation as a system error (its "malloc ... failed").
        if isinstance(error, MemoryError | pymupdf.mupdf.FzErrorSystem):
            where = f"page {page}" if page else "the document"
            message = (
                f"rendering {where} needs more than the {self.limits.memory_limit_mb} MB "
                "a renderer may use (pipeline.render_memory_limit_mb)"
            )
            return RenderFailed(message, page, RenderFailure.out_of_memory)
        return RenderFailed(f"{type(error).__name__}: {error}", page, RenderFailure.error)


def worker_main(
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
    worker = _Worker(limits, buffer)
    while True:
        try:
            request = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return
        conn.send(worker.answer(request))
