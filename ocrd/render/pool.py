"""The daemon's side of rendering: a fixed set of worker processes, each taken for one
request at a time, with a time limit on every request.

Each worker keeps a few sources open, so a document never holds a renderer while it waits
for page slots: any worker renders any page, preferring one that has the file open. Page
pixels come back through a buffer the worker and the daemon share (no pickling of
megabytes through a pipe).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import mmap
import multiprocessing
import os
import secrets
import shutil
import socket
import tempfile
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from PIL import Image

from ocrd.config import RenderSettings
from ocrd.domain import Figure, InputFormat, PageImage, TextLayer
from ocrd.handoff import WaitingLine
from ocrd.office.read import OfficeRead
from ocrd.output.searchable import SearchablePdfResult
from ocrd.render.errors import RenderError, RenderFailure
from ocrd.render.pixels import HANDED_OVER_BYTES
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
    Region,
    RenderedPage,
    RenderFailed,
    RenderLimits,
    RenderPage,
    Reply,
    Request,
    SourceKey,
    TextLayerRead,
    WriteSearchablePdf,
)
from ocrd.render.separators import SeparatorRules
from ocrd.render.wire import exchange as exchanged
from ocrd.render.worker import OPEN_SOURCES_PER_WORKER, worker_main

WORKER_START_SECONDS = 60.0
R = TypeVar("R", bound=Reply)


@dataclass(frozen=True)
class SourceFile:
    """One input file of a document, as the render workers know it."""

    path: Path
    format: InputFormat
    settings: RenderSettings
    root: Path | None = None  # no link is followed below this folder (a claim's)

    @property
    def key(self) -> SourceKey:
        root = str(self.root) if self.root is not None else None
        return SourceKey(str(self.path), self.format, self.settings, root)


def _shared_folder() -> str:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()


class RenderWorker:
    """One child process, the sources it has open, and the buffer it hands pixels in.

    A request and its reply go through the child's socket on the event loop (`wire.py`),
    each exchange run to its end even when the task that asked was cancelled meanwhile, and
    the next request sent only after it; a request that runs out of time kills the child,
    which is started again (in the worker's thread: starting it blocks) for the next one.
    """

    def __init__(self, limits: RenderLimits, buffer_bytes: int) -> None:
        self.limits = limits
        self.buffer_bytes = buffer_bytes
        # Mirrors the child's cache of open files, with their page counts where asked.
        self.open: OrderedDict[SourceKey, int | None] = OrderedDict()
        self._context = multiprocessing.get_context("spawn")
        self._process: multiprocessing.process.BaseProcess | None = None
        self._sock: socket.socket | None = None  # the daemon's end, non-blocking
        self._exchange: asyncio.Task[Reply] | None = None  # the request in the child now
        self._buffer: mmap.mmap | None = None
        self._killed = False  # by kill(): replace it even if the kernel has not reaped it yet
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="render-wait")

    # In the worker's thread:

    def ensure_started(self) -> None:
        alive = self._process is not None and self._process.is_alive()
        if alive and self._sock is not None and not self._killed:
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
                target=worker_main,
                args=(child, self.limits, path),
                daemon=True,
                name="ocrd-render",
            )
            process.start()
            child.close()
            parent.send(Ping())  # answered once the child has imported and mapped
            parent.recv()
            sock = socket.socket(fileno=os.dup(parent.fileno()))
            parent.close()
            sock.setblocking(False)  # read on the event loop from now on
        finally:
            os.unlink(path)  # both sides hold the mapping; nothing is left behind
        self._process, self._sock, self._buffer = process, sock, buffer

    def _cleanup(self) -> None:
        if self._process is not None:
            if self._process.is_alive():
                self._process.kill()
            self._process.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
        if self._buffer is not None:
            self._buffer.close()
        self._process = self._sock = self._buffer = None

    def pixels(self, number: int, page: RenderedPage) -> PageImage:
        """The page's image: its file, opened (PIL reads the header, the engine sends the
        file itself), or copied out of the shared buffer before the next page."""
        image: Image.Image
        size = (page.width, page.height)
        if page.file is not None:
            image = Image.open(page.file, formats=("PPM",))
        elif page.payload is None:
            assert self._buffer is not None
            with memoryview(self._buffer)[: page.size] as pixels:
                image = Image.frombytes("RGB", size, pixels, "raw", page.layout)
        else:
            image = Image.frombytes("RGB", size, page.payload, "raw", page.layout)
        return PageImage(number, image, page.width_pt, page.height_pt, page.blank, page.separator)

    # On the event loop:

    async def request(
        self, request: Request, reply: type[R], what: str, seconds: float | None = None
    ) -> R:
        """Send `request` and wait for its reply of type `reply`, within the time limit (a
        page's, unless `seconds` says). A request about a file this child has not open
        opens it there first, with a page's time limit for the opening added: one exchange
        instead of two."""
        page = getattr(request, "page", None)
        limit = seconds or self.limits.page_timeout_seconds
        key: SourceKey | None = getattr(request, "source", None)
        if key is not None and key not in self.open and not isinstance(request, Open):
            limit += self.limits.page_timeout_seconds
            what = f"opening the document and {what}"
        try:
            if not self._running():  # starting a process is not the document's time
                async with asyncio.timeout(WORKER_START_SECONDS):
                    await self._started()
            async with asyncio.timeout(limit):  # in this task: no task of its own to start
                answer = await self._call(request)
        except TimeoutError:
            self.kill()
            raise RenderError(
                f"{what} took longer than {limit:g} s and was stopped",
                page=page,
                code=RenderFailure.timeout,
            ) from None
        except (EOFError, ConnectionError, OSError):
            code = self._process.exitcode if self._process else None
            self.kill()
            raise RenderError(
                f"the renderer crashed on {what} (exit code {code})",
                page=page,
                code=RenderFailure.crashed,
            ) from None
        if key is not None:
            self._mirror(key, answer)
        if isinstance(answer, RenderFailed):
            raise RenderError(answer.message, page=answer.page, code=answer.code)
        if not isinstance(answer, reply):
            raise TypeError(f"a renderer answered {type(answer).__name__} to {request!r}")
        return answer

    def _mirror(self, key: SourceKey, answer: Reply) -> None:
        """Follow the child's cache of open files: a request for `key` answered puts it
        last (the child's least recently used goes first). After a failure, which may have
        been the opening, the source is forgotten here: should the child still have it, a
        later request only gets the opening's time besides its own."""
        pages = self.open.pop(key, None)
        if isinstance(answer, RenderFailed):
            return
        self.open[key] = answer.pages if isinstance(answer, Opened) else pages
        while len(self.open) > OPEN_SOURCES_PER_WORKER:
            self.open.popitem(last=False)

    async def _started(self) -> None:
        """The child ready for a request: the reply to an earlier one (whose asker was
        cancelled) read, and a child started in the worker's thread where none runs."""
        if self._exchange is not None and not self._exchange.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._exchange)
        if not self._running():
            await asyncio.get_running_loop().run_in_executor(self._thread, self.ensure_started)

    async def _call(self, request: Request) -> Reply:
        await self._started()
        assert self._sock is not None
        exchange = asyncio.ensure_future(exchanged(self._sock, request))
        exchange.add_done_callback(_seen)
        self._exchange = exchange
        reply: Reply = await asyncio.shield(exchange)  # run to its end, whoever waits
        return reply

    def _running(self) -> bool:
        """Whether the child looks ready, seen from the event loop: then a request goes
        straight to `_call`, no thread involved. Should the child die meanwhile, `_call`
        starts another within the request's own time limit."""
        process = self._process
        return (
            process is not None
            and self._sock is not None
            and not self._killed
            and (process.is_alive())
        )

    async def open_source(self, key: SourceKey) -> int:
        """Open a source here and count its pages: the first request's time limit is for
        opening alone, and its pages then prefer this worker."""
        pages = self.open.get(key)
        if pages is None:  # not open, or opened by a page whose request did not count them
            pages = (await self.request(Open(key), Opened, "opening the document")).pages
        else:
            self.open.move_to_end(key)
        if pages < 1:
            raise RenderError("the document has no pages", code=RenderFailure.no_pages)
        return pages

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self._thread, self.ensure_started)

    def forget(self, path: Path) -> None:
        """Remove a page file (or a pictures folder) the child was asked to write, once it
        is done with the request (it may still write after the task that asked was
        cancelled)."""
        exchange = self._exchange
        if exchange is None or exchange.done():
            self._thread.submit(_remove_quietly, path)
        else:
            exchange.add_done_callback(lambda _: self._thread.submit(_remove_quietly, path))

    def kill(self) -> None:
        """Stop the child now (from the event loop); its thread cleans up before the next."""
        self.open.clear()
        self._killed = True
        process = self._process
        if process is not None and process.is_alive():
            process.kill()

    def shutdown(self) -> None:
        self.kill()
        if self._exchange is not None and not self._exchange.done():
            self._exchange.cancel()  # its socket is closed below: no reply is waited for
        self._thread.submit(self._cleanup)
        self._thread.shutdown(wait=True, cancel_futures=True)


class RenderPool:
    """A fixed set of render workers, each taken for one request at a time.

    A worker goes to the longest-waiting request, or where nobody waits, to the next request
    that comes, preferring a worker that already has that request's file open.
    """

    def __init__(
        self,
        size: int,
        limits: RenderLimits,
        largest_side: int = 2048,
        page_folder: Path | None = None,
    ):
        """Each worker shares a buffer with the daemon that holds a page of `largest_side`
        pixels a side (a larger one travels in its reply). With `page_folder` (where the
        engine reads pages from files) pages are rendered into files there, and the
        daemon's process never copies their pixels."""
        self.limits = limits
        self.page_folder = page_folder
        self._page_numbers = itertools.count(1)
        buffer_bytes = largest_side * largest_side * HANDED_OVER_BYTES
        self._workers = [RenderWorker(limits, buffer_bytes) for _ in range(size)]
        self._idle: list[RenderWorker] = list(self._workers)
        self._line: WaitingLine[RenderWorker, None] = WaitingLine(
            pass_on=lambda worker, _: self._give_back(worker)
        )

    @property
    def size(self) -> int:
        return len(self._workers)

    @property
    def busy(self) -> int:
        return len(self._workers) - len(self._idle)

    async def warm_up(self) -> None:
        """Start every worker now, so the first document does not wait for imports."""
        await asyncio.gather(*(worker.start() for worker in self._workers))

    def _give_back(self, worker: RenderWorker) -> None:
        if not self._line.hand_over(worker):
            self._idle.append(worker)

    async def _acquire(self, key: SourceKey | None) -> RenderWorker:
        if self._idle and not self._line:
            worker = next((w for w in self._idle if key in w.open), self._idle[0])
            self._idle.remove(worker)
            return worker
        return await self._line.wait(None)

    @asynccontextmanager
    async def _worker(self, source: SourceFile | None) -> AsyncIterator[RenderWorker]:
        worker = await self._acquire(source.key if source is not None else None)
        try:
            yield worker
        finally:
            self._give_back(worker)  # synchronous: a second cancellation cannot lose it

    async def open(self, source: SourceFile) -> int:
        """The file's page count; it stays open in a worker for its pages."""
        async with self._worker(source) as worker:
            return await worker.open_source(source.key)

    async def render(
        self, source: SourceFile, number: int, separators: SeparatorRules | None = None
    ) -> PageImage:
        """Page `number` of the file; with `separators`, also whether it separates. A page
        rendered into a file that is not handed to the engine must be `discard`ed."""
        file = None
        if self.page_folder is not None:
            file = self.page_folder / f"render-{os.getpid()}-{next(self._page_numbers)}.ppm"
        request = RenderPage(source.key, number, separators, file)
        async with self._worker(source) as worker:
            try:
                page = await worker.request(request, RenderedPage, f"page {number}")
            except BaseException:
                if file is not None:
                    worker.forget(file)
                raise
            return worker.pixels(number, page)

    def discard(self, page: PageImage | None) -> None:
        """A rendered page that does not go to the engine: its file (if any) is removed."""
        name = getattr(page.image, "filename", "") if page is not None else ""
        if page is not None and name and Path(name).parent == self.page_folder:
            page.image.close()
            _remove_quietly(Path(name))

    async def text_layer(
        self, source: SourceFile, number: int, running_lines: bool = True
    ) -> TextLayer:
        """Page `number`'s own text layer and whether it can stand in for recognition
        (without its running headers and footers unless `running_lines`)."""
        request = ReadTextLayer(source.key, number, running_lines)
        async with self._worker(source) as worker:
            reply = await worker.request(request, TextLayerRead, f"the text of page {number}")
            return reply.layer

    async def figures(
        self,
        source: SourceFile,
        number: int,
        boxes: Sequence[Region],
        dpi: float,
        folder: Path,
        names: Sequence[str],
    ) -> list[Figure]:
        """Cut `boxes` of a page out of the source at `dpi` into `folder` as PNG files."""
        folder.mkdir(parents=True, exist_ok=True)
        request = CutFigures(source.key, number, list(boxes), dpi, folder, list(names))
        async with self._worker(source) as worker:
            reply = await worker.request(request, FiguresCut, f"the figures of page {number}")
            return reply.figures

    async def searchable_pdf(
        self, request: WriteSearchablePdf, seconds: float
    ) -> SearchablePdfResult:
        """Write a searchable PDF (any worker), within `seconds`."""
        request.target.parent.mkdir(parents=True, exist_ok=True)
        async with self._worker(None) as worker:
            reply = await worker.request(request, PdfWritten, "the searchable PDF", seconds)
            return reply.result

    async def office(self, source: SourceFile, pictures_folder: Path | None = None) -> OfficeRead:
        """An office document or web page checked and converted by a worker (any), within
        a page's time limit (twice, with the opening: docling's first import is slow). Its
        pictures are written into `pictures_folder` (made here), where one is given: the
        daemon loads each only when the engine takes it."""
        if pictures_folder is not None:
            pictures_folder.mkdir(parents=True, exist_ok=True)
        request = ReadOffice(source.key, pictures_folder)
        async with self._worker(None) as worker:
            try:
                reply = await worker.request(request, OfficeConverted, "converting the document")
            except BaseException:
                if pictures_folder is not None:
                    worker.forget(pictures_folder)
                raise
            return reply.read

    def shutdown(self) -> None:
        for worker in self._workers:
            worker.shutdown()


def _seen(exchange: asyncio.Task[Reply]) -> None:
    """An exchange's error is its asker's to handle; one whose asker is gone (cancelled)
    was the worker's death, handled by the next request: not logged as never retrieved."""
    if not exchange.cancelled():
        exchange.exception()


def _remove_quietly(path: Path) -> None:
    """A page file, or a folder of an office document's pictures, removed."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
        return
    with contextlib.suppress(OSError):
        path.unlink()
