"""An office document or web page through the pipeline: a render worker checks and converts
it with docling (`ocrd/office/`), each of its pictures goes through the engine as a page
would (a slot of the page budget each, retried as pages are), and the engine's text is put
in the picture's place in the DoclingDocument the outputs are written from.

The pictures are the document's pages as far as progress, metrics and the summary go: a
document without pictures has none, and costs the engine nothing.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from PIL import Image

from ocrd.backoff import Backoff
from ocrd.config import OutputKind
from ocrd.documents.schedule import Ticket
from ocrd.domain import (
    DocumentFailed,
    DocumentResult,
    PageImage,
    PageInfo,
    PageResult,
    PageText,
    Stage,
)
from ocrd.engines import EngineError
from ocrd.office.pictures import with_picture_text
from ocrd.office.read import OfficePicture, OfficeRead
from ocrd.output.page import assemble_page
from ocrd.render import SourceFile
from ocrd.text.markdown import page_markdown

if TYPE_CHECKING:
    from ocrd.documents.pipeline import DocumentContext, Pipeline

PDF_NOT_MADE = (
    "no searchable PDF for a {format} document: it has no pages to lay text over (a "
    "searchable PDF is a scan's or a PDF's own pages with their text); its Markdown, "
    "docling JSON and chunks are written"
)
UNREAD_PICTURES = (
    "pictures the engine did not read: past the 50 read a document or its pixel budget, or "
    "in a format ocrd does not decode (SVG, TIFF, BMP, a picture linked from outside); their "
    "places show <!-- image --> without text (docs/outputs.md)"
)
POINTS_PER_PIXEL = 0.75  # a picture's size in points, as at 96 dpi on screen


@dataclass
class _Pictures:
    """One document's pictures on their way through the engine."""

    pipeline: Pipeline
    document: DocumentContext
    ticket: Ticket

    async def read(self, number: int, picture: OfficePicture) -> PageResult:
        """Picture `number` (1-based): the engine's page for it, retried as a page is."""
        settings, log = self.document.settings, self.document.log
        prompt = settings.prompt
        try:
            text = await self._engine_text(number, picture)
        finally:  # the engine has read it: its file is not needed again
            if picture.file is not None:
                await asyncio.to_thread(picture.file.unlink, missing_ok=True)
        info = PageInfo(number, (picture.width, picture.height), *_points(picture))
        result = assemble_page(info, text, prompt)
        self.ticket.page_done()
        self.document.progress.page_done()
        log.info(
            "picture.recognised",
            page=number,
            picture=picture.ref,
            size=f"{picture.width}x{picture.height}",
            finish_reason=result.finish_reason,
            prompt=prompt.value,
            seconds=round(text.seconds, 3),
        )
        for callback in self.pipeline.on_page_done:
            callback(result)
        return result

    async def _engine_text(self, number: int, picture: OfficePicture) -> PageText:
        pipeline, settings = self.pipeline, self.document.settings
        waits = Backoff(pipeline.retry_backoff_seconds, attempts=pipeline.page_retries).delays()
        attempt = 0
        while True:
            attempt += 1
            page = _image(number, picture)
            try:
                return await pipeline.engine.recognise(
                    PageImage(
                        number, page.image, page.width_pt, page.height_pt, model=settings.model
                    ),
                    settings.prompt,
                    pipeline.budget.priority(self.ticket),
                )
            except EngineError as error:
                delay = next(waits, None) if error.retryable else None
                if delay is None:
                    raise EngineError(
                        f"picture {number} ({picture.ref}) failed in the engine: {error}",
                        page=number,
                    ) from error
                self.document.log.warning(
                    "page.engine_error", page=number, attempt=attempt, error=str(error)
                )
                await asyncio.sleep(delay)


def _points(picture: OfficePicture) -> tuple[float, float]:
    return picture.width * POINTS_PER_PIXEL, picture.height * POINTS_PER_PIXEL


def _image(number: int, picture: OfficePicture) -> PageImage:
    """The picture's image, only now (its slot of the budget taken) read from its file:
    PIL reads the header, the pixels when the engine asks for them."""
    image: Image.Image
    if picture.file is not None:
        image = Image.open(picture.file, formats=("PPM",))
    else:
        image = Image.frombytes("RGB", (picture.width, picture.height), picture.pixels)
    return PageImage(number, image, *_points(picture))


async def read_pictures(
    pipeline: Pipeline, document: DocumentContext, pictures: tuple[OfficePicture, ...]
) -> list[PageResult]:
    """The engine's page for each picture, in order, many at a time within the budget."""
    budget = pipeline.budget
    pages = _Pictures(pipeline, document, budget.ticket(len(pictures), document.arrival))
    tasks = []
    async with asyncio.TaskGroup() as group:
        for number, picture in enumerate(pictures, start=1):
            await budget.acquire(pages.ticket)
            try:
                task = group.create_task(pages.read(number, picture))
            except BaseException:
                budget.release(pages.ticket)
                raise
            task.add_done_callback(lambda _: budget.release(pages.ticket))
            tasks.append(task)
    return [task.result() for task in tasks]


def holds_nothing(read: OfficeRead) -> bool:
    """Whether docling found no text, table or picture in it."""
    docling = read.docling
    return not (docling.get("texts") or docling.get("tables") or docling.get("pictures"))


async def convert_office(
    pipeline: Pipeline, document: DocumentContext, source: SourceFile
) -> DocumentResult:
    """The document converted, its pictures read; DocumentFailed where it holds nothing.
    The worker writes the pictures into the scratch folder, removed with what is left."""
    folder = document.scratch / f"pictures-{secrets.token_hex(8)}"
    try:
        return await _convert(pipeline, document, source, folder)
    finally:
        await asyncio.to_thread(shutil.rmtree, folder, True)


async def _convert(
    pipeline: Pipeline, document: DocumentContext, source: SourceFile, folder: Path
) -> DocumentResult:
    started, settings, log = time.monotonic(), document.settings, document.log
    read = await pipeline.renderers.office(source, folder)
    document.progress.pages = len(read.pictures)
    log.info(
        "document.opened",
        format=source.format.value,
        files=1,
        pictures=len(read.pictures),
        pictures_unread=read.unread_pictures,
    )
    if holds_nothing(read):
        raise DocumentFailed(
            Stage.render,
            f"the {source.format.value} document holds no text, table or picture: nothing "
            "to convert",
            error_type="EmptyDocument",
            code="no_pages",
        )
    pages = await read_pictures(pipeline, document, read.pictures)
    texts = {
        picture.ref: page_markdown(page.blocks, settings.tables)
        for picture, page in zip(read.pictures, pages, strict=True)
    }
    docling = read.docling
    if texts:
        docling = await asyncio.to_thread(with_picture_text, read.docling, texts)
    result = DocumentResult(source.format, pages, time.monotonic() - started, docling=docling)
    if read.unread_pictures:  # a receipt after 50 icons: its place shows no text
        result.pictures_unread = read.unread_pictures
        log.warning("document.pictures_unread", count=read.unread_pictures, reason=UNREAD_PICTURES)
    if OutputKind.pdf in settings.outputs:
        result.pdf_not_made = PDF_NOT_MADE.format(format=source.format.value)
        log.warning("document.pdf_not_made", reason=result.pdf_not_made)
    return result
