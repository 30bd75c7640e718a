"""Render and recognise one document, many documents at a time.

Pages go to the engine one by one as soon as they are rendered, so the engine's continuous
batching sees pages from every document in flight. A page holds a slot of the shared page
budget from before it is rendered until the engine has answered; slots go to documents by
the schedule in `ocrd/documents/schedule.py`, which lets a short document past a long one. A slot is
given back in its page task's done-callback, which runs on every path, also for a task
cancelled before its first step. Results come back in page order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ocrd.backoff import Backoff
from ocrd.config import (
    BlankPages,
    DocumentOptions,
    OutputKind,
    PdfLines,
    PdfText,
    PipelineConfig,
    PromptMode,
    UnfinishedPages,
)
from ocrd.documents import failures
from ocrd.documents.figures import cut_figures, say_figures_left_out
from ocrd.documents.office import convert_office
from ocrd.documents.schedule import PageBudget, Ticket
from ocrd.documents.sources import Inputs, PageRef, SourceKind, Sources, page_order, read_inputs
from ocrd.domain import (
    OFFICE_FORMATS,
    DocumentResult,
    InputFormat,
    PageImage,
    PageResult,
    PageSource,
    PageText,
    SeparatorMark,
    Split,
)
from ocrd.engines import Engine, EngineError
from ocrd.log import FilteringBoundLogger, get_logger
from ocrd.output.page import (
    PageJournal,
    assemble_page,
    better,
    blank_page,
    separator_page,
    text_layer_page,
    without_text,
    yields_nothing,
)
from ocrd.render import RenderError, RenderLimits, RenderPool, SourceFile
from ocrd.render.analysis import NO_TEXT_LAYER
from ocrd.render.protocol import WriteSearchablePdf
from ocrd.render.separators import SeparatorRules, split_pages

PDF_SECONDS_PER_PAGE = 1.0  # a searchable PDF's time limit, beside a page's
PDF_ARCHIVE_SECONDS_PER_PAGE = 5.0  # PDF/A may go through Ghostscript
# Finding the lines of a page whose model gives no positions (BENCHMARKS.md, "Searchable
# PDFs: where the words lie"): reading them took up to 10 s of CPU on a dense page.
LINE_SECONDS_PER_PAGE = {PdfLines.read: 20.0, PdfLines.detect: 5.0, PdfLines.off: 0.0}


class Progress:
    """A document's progress as the pipeline sees it, for status reports."""

    def __init__(self) -> None:
        self.pages = 0  # known once the document is open
        self.done = 0
        self.started = time.monotonic()

    def page_done(self) -> None:
        self.done += 1


@dataclass
class DocumentContext:
    """One document handed down the pipeline: where its pages come from, the inbox's
    settings for it, where its figures and PDFs are made, and what the caller follows it
    by (its log, journal and progress, when it arrived, the pages wanted)."""

    sources: Sources
    settings: DocumentOptions
    scratch: Path  # figures are cut here as pages come back, searchable PDFs written here
    log: FilteringBoundLogger
    journal: PageJournal | None = None  # pages found in it are taken from it; new ones added
    progress: Progress = field(default_factory=Progress)
    arrival: float | None = None  # when it arrived, for the page schedule
    pages: tuple[int, int] | None = None  # a task's page range; the pages keep their numbers
    read: Inputs | None = None  # its inputs, where the caller read them already

    @classmethod
    def of(
        cls, source: Path | Sources, settings: DocumentOptions, scratch: Path
    ) -> DocumentContext:
        """A document from a file or from sources, logged under its first file's path."""
        sources = source if isinstance(source, Sources) else Sources((source,))
        log = get_logger(path=str(sources.files[0] if sources.files else source))
        return cls(sources, settings, scratch, log)

    @property
    def figures(self) -> Path | None:
        """Where figures are cut to; None: no figures."""
        return self.scratch if self.settings.figures else None


@dataclass
class _Run:
    """One document's pages on their way through the pipeline."""

    pages: list[PageRef]  # where each page (1-based, by index + 1) comes from
    settings: DocumentOptions
    figures: Path | None  # where figures are cut to; None: no figures
    log: FilteringBoundLogger
    journal: PageJournal | None
    ticket: Ticket
    progress: Progress
    separators: SeparatorRules | None  # with split_on: what makes a separator sheet

    def journal_for_page(self) -> PageJournal | None:
        """The journal a page just recognised goes to; none for the last page to be
        recognised: the document settles next, and a crash before that costs that page
        again, where journaling it would cost a new file (a one-page document's only one)
        and a thread hop each document."""
        return self.journal if self.progress.done < self.progress.pages else None

    def sent(self, page: PageImage) -> PageImage:
        """The page, for the engine of the model its inbox chose."""
        return replace(page, model=self.settings.model)


class Pipeline:
    def __init__(
        self,
        engine: Engine,
        renderers: RenderPool,
        budget: PageBudget,
        page_retries: int = 0,
        retry_backoff_seconds: float = 0.0,
        on_page_done: Sequence[Callable[[PageResult], None]] = (),
    ) -> None:
        self.engine = engine
        self.renderers = renderers
        self.budget = budget
        self.page_retries = page_retries
        self.retry_backoff_seconds = retry_backoff_seconds
        self.on_page_done = list(on_page_done)  # throughput, metrics

    @classmethod
    def create(
        cls,
        engine: Engine,
        config: PipelineConfig,
        buffer_side: int = 2048,
        on_page_done: Sequence[Callable[[PageResult], None]] = (),
    ) -> Pipeline:
        """A pipeline sized for `engine` where the config says `auto`."""
        pool = RenderPool(
            config.render_workers_for(),
            RenderLimits.of(config),
            largest_side=buffer_side,
            page_folder=engine.page_folder,
        )
        budget = PageBudget(config.pages_in_flight_for(engine.max_concurrency))
        retries, backoff = config.page_retries, config.page_retry_backoff_seconds
        return cls(engine, pool, budget, retries, backoff, on_page_done)

    def retry_pages(self, retries: int, backoff_seconds: float) -> None:
        """How often a page the engine failed is tried again, and the first wait (a
        reload's new settings)."""
        self.page_retries = retries
        self.retry_backoff_seconds = backoff_seconds

    @property
    def pages_in_flight(self) -> int:
        return self.budget.in_flight

    async def convert(self, document: DocumentContext) -> DocumentResult:
        """Render and recognise every page of the document (a file, or the files of a scan
        job or a duplex pair), or only its page range; raises DocumentFailed with the
        reason."""
        settings, log = document.settings, document.log
        started = time.monotonic()
        read = document.read
        if read is None:  # given where the caller read them already, in a hop of its own
            read = await asyncio.to_thread(
                read_inputs, document.sources, document.journal, settings, document.scratch
            )
        files, skipped = read.files, read.skipped
        if skipped:
            log.warning("document.files_skipped", files=skipped, action="left out of the document")
        if not files:
            raise failures.no_pages_in_folder()
        root = document.sources.root
        inputs = [SourceFile(path, fmt, settings.render, root) for path, fmt in files]
        if inputs[0].format in OFFICE_FORMATS:  # one file: a folder's were left out
            try:
                return await convert_office(self, document, inputs[0])
            except (BaseExceptionGroup, RenderError) as error:
                raise failures.of(error) from None
        kind = document.sources.kind
        try:
            done_pages, refs = await self._pages(document, inputs, read.journal)
            split = split_document(done_pages, settings, kind)
            result = DocumentResult(inputs[0].format, done_pages, time.monotonic() - started, split)
            if result.unfinished_pages and settings.unfinished_pages is UnfinishedPages.failed:
                raise failures.unfinished(result)
            if nothing_read(result):
                raise failures.no_text(result)
            if OutputKind.pdf in settings.outputs:
                pdfs = searchable_pdfs(
                    self.renderers, result, inputs, refs, settings, document.scratch
                )
                result.pdfs = await pdfs
        except (BaseExceptionGroup, RenderError) as error:
            raise failures.of(error) from None
        if split is not None:
            log.info("document.split", **split.fields())
        return result

    async def _pages(
        self, document: DocumentContext, inputs: list[SourceFile], done: dict[int, PageResult]
    ) -> tuple[list[PageResult], list[PageRef]]:
        """The pages of `inputs`: those in `done` (the journal's) as they are, the rest
        rendered and recognised."""
        kind, settings, log = document.sources.kind, document.settings, document.log
        counts = [await _page_count(self.renderers, source, len(inputs) > 1) for source in inputs]
        refs = [PageRef(inputs[i], n) for i, n in page_order(counts, kind is SourceKind.duplex)]
        selected = document.pages
        first, last = selected or (1, len(refs))
        numbers = range(first, min(last, len(refs)) + 1)
        if not numbers:
            raise failures.no_pages_in_range(first, last, len(refs))
        count = len(numbers)
        resumed = {number: page for number, page in done.items() if number in numbers}
        progress = document.progress
        progress.pages, progress.done = count, len(resumed)
        log.info(
            "document.opened",
            format=str(inputs[0].format) if len(inputs) == 1 else kind.value,
            files=len(inputs),
            pages=len(refs),
            resumed_pages=len(resumed),
            **({"page_range": [first, last]} if selected else {}),
        )
        if kind is SourceKind.duplex and counts[0] != counts[-1]:
            log.warning(
                "document.duplex_unequal",
                fronts=counts[0],
                backs=counts[-1],
                action="pages interleaved as far as both go, the rest appended",
            )
        run = _Run(
            refs,
            settings,
            document.figures,
            log,
            document.journal,
            self.budget.ticket(count - len(resumed), document.arrival),
            progress,
            SeparatorRules.of(settings.split_on, settings.split_barcode)
            if settings.split_on
            else None,
        )
        tasks: dict[int, asyncio.Task[PageResult]] = {}
        async with asyncio.TaskGroup() as group:
            for number in numbers:
                if number in resumed:
                    continue
                await self.budget.acquire(run.ticket)
                try:
                    task = group.create_task(self._page(run, number))
                except BaseException:
                    self.budget.release(run.ticket)
                    raise
                task.add_done_callback(lambda _: self.budget.release(run.ticket))
                tasks[number] = task
        results = {**resumed, **{number: task.result() for number, task in tasks.items()}}
        return [results[number] for number in sorted(results)], refs

    async def _page(self, run: _Run, number: int) -> PageResult:
        """One page: from its own text layer where that is preferred and good; otherwise
        rendered and, unless blank, through the engine (an unfinished layout page gets one
        plain-text retry), its figures cut from the source; then journaled."""
        ref = run.pages[number - 1]
        looked = None
        try:
            # With split_on every page is rendered first: a separator sheet may carry a
            # text layer (the text under its barcode), and it must never reach the output.
            looked = await self._render(ref, number, run.separators) if run.separators else None
            mark = looked.separator if looked is not None else None
            result, refused, blank = None, None, False
            if looked is not None and mark is not None and mark.separates:
                result = separator_page(looked.info, run.settings.prompt, mark)
            if result is None:
                result, refused = await self._from_text_layer(run, ref, number)
            if result is None:
                page = looked or await self._render(ref, number)
                looked, blank = None, page.blank
                if page.blank and run.settings.blank_pages is not BlankPages.keep:
                    result = blank_page(page.info, run.settings.prompt)
                    self.renderers.discard(page)
                else:
                    # The pixels go to the engine and are not held here meanwhile: an
                    # engine that queues the page keeps only what it made of them.
                    rendered = [page]
                    del page
                    result = await self._recognise(rendered, ref, run)
            # Ink, or a text layer: content, from which some text must come, or the
            # document says which page gave none, and why.
            content = result.source is PageSource.engine and not blank
            if (content or refused) and yields_nothing(result):
                result.no_text = without_text(result, refused)
            result.separator = mark
            if run.figures is not None and result.source is PageSource.engine:
                await cut_figures(self.renderers, ref, result, run.settings, run.figures)
                say_figures_left_out(run.log, result, run.settings)
        except RenderError as error:
            if len({r.source for r in run.pages}) == 1:
                raise
            raise RenderError(  # say which of the files, and which page of the document
                f"{ref.source.path.name}: {error}", page=number, code=error.code
            ) from None
        finally:
            self.renderers.discard(looked)  # rendered to be looked at, not recognised
        run.ticket.page_done()
        run.progress.page_done()
        run.log.info(
            "page.recognised",
            page=number,
            size=f"{result.image_size[0]}x{result.image_size[1]}",
            finish_reason=result.finish_reason,
            prompt=result.prompt.value,
            retried=result.retried,
            prompt_tokens=result.text.prompt_tokens,
            completion_tokens=result.text.completion_tokens,
            seconds=round(result.text.seconds, 3),
            engine_interval=result.text.engine_interval,
            source=result.source.value,
            model=result.text.model,
        )
        if (journal := run.journal_for_page()) is not None:
            await asyncio.to_thread(journal.append, result)
        for callback in self.on_page_done:
            callback(result)
        return result

    async def _from_text_layer(
        self, run: _Run, ref: PageRef, number: int
    ) -> tuple[PageResult | None, str | None]:
        """The page from its PDF text layer, where the inbox prefers that and it is good;
        otherwise why a layer with text in it was not used (None: no layer to speak of)."""
        if run.settings.pdf_text is not PdfText.prefer or ref.source.format is not InputFormat.pdf:
            return None, None
        layer = await self.renderers.text_layer(
            ref.source, ref.number, running_lines=not run.settings.strip_headers_footers
        )
        if not layer.usable:
            run.log.debug("page.text_layer_refused", page=number, reason=layer.reason)
            return None, None if layer.reason == NO_TEXT_LAYER else layer.reason
        return text_layer_page(number, layer, run.settings.prompt), None

    async def _render(
        self, ref: PageRef, number: int, separators: SeparatorRules | None = None
    ) -> PageImage:
        """Page `number` of the document, rendered from its source page (and judged a
        separator sheet or not, with `separators`)."""
        page = await self.renderers.render(ref.source, ref.number, separators)
        return replace(page, number=number)

    async def _recognise(self, rendered: list[PageImage], ref: PageRef, run: _Run) -> PageResult:
        """The engine's page; `rendered` holds the page's pixels and is emptied as they are
        handed over (a retry renders the page again rather than keep them)."""
        info = rendered[0].info
        prompt = run.settings.prompt
        text = await self._engine_text(rendered, ref, info.number, prompt, run)
        result = assemble_page(info, text, prompt)
        if result.unfinished and run.settings.retry_unfinished and prompt is PromptMode.layout:
            run.log.info(
                "page.retrying",
                page=info.number,
                finish_reason=result.finish_reason,
                prompt=PromptMode.text.value,
            )
            retry = await self._engine_text(rendered, ref, info.number, PromptMode.text, run)
            if better(text, retry) is retry:
                return assemble_page(info, retry, PromptMode.text, retried=True)
            result.retried = True
        return result

    async def _engine_text(
        self, rendered: list[PageImage], ref: PageRef, number: int, prompt: PromptMode, run: _Run
    ) -> PageText:
        """The engine's text for a page; a failed request is retried with backoff."""
        waits = Backoff(self.retry_backoff_seconds, attempts=self.page_retries).delays()
        attempt = 0
        while True:
            attempt += 1
            try:  # no local name holds the pixels while the engine has them
                return await self.engine.recognise(
                    run.sent(rendered.pop() if rendered else await self._render(ref, number)),
                    prompt,
                    self.budget.priority(run.ticket),
                )
            except EngineError as error:
                delay = next(waits, None) if error.retryable else None
                if delay is None:
                    raise EngineError(
                        f"page {number} failed in the engine"
                        + (f" {attempt} times; last: {error}" if attempt > 1 else f": {error}"),
                        page=number,
                    ) from error
                run.log.warning(
                    "page.engine_error",
                    page=number,
                    attempt=attempt,
                    error=str(error),
                    retry_in_seconds=delay,
                )
                await asyncio.sleep(delay)


async def _page_count(renderers: RenderPool, source: SourceFile, one_of_several: bool) -> int:
    """A file's page count; of a scan job's files, a failure names the file."""
    try:
        return await renderers.open(source)
    except RenderError as error:
        if not one_of_several:
            raise
        raise RenderError(f"{source.path.name}: {error}", code=error.code) from None


async def searchable_pdfs(
    renderers: RenderPool,
    result: DocumentResult,
    inputs: list[SourceFile],
    refs: list[PageRef],
    settings: DocumentOptions,
    scratch: Path,
) -> tuple[Path, ...]:
    """Each part's searchable PDF (the document's, if it is not split), written into
    `scratch` by a render worker, in order."""
    files = tuple((source.path, source.format) for source in inputs)
    made = []
    for index, part in enumerate(result.parts()):
        order = tuple(
            (inputs.index(refs[page.number - 1].source), refs[page.number - 1].number)
            for page in part.pages
        )
        target = scratch / f"part{index + 1}.pdf"
        target.unlink(missing_ok=True)  # left by an attempt that was killed
        request = WriteSearchablePdf(
            files,
            order,
            tuple(part.pages),
            target,
            settings.pdf_archive,
            settings.passwords,
            inputs[0].root,
            settings.pdf_lines,
        )
        per_page = PDF_ARCHIVE_SECONDS_PER_PAGE if settings.pdf_archive else PDF_SECONDS_PER_PAGE
        per_page += LINE_SECONDS_PER_PAGE[settings.pdf_lines]
        seconds = renderers.limits.page_timeout_seconds + len(order) * per_page
        await renderers.searchable_pdf(request, seconds)
        made.append(target)
    return tuple(made)


def nothing_read(result: DocumentResult) -> bool:
    """Whether pages with content gave no text, and no page gave any."""
    read = (
        page for page in result.pages if page.source in (PageSource.engine, PageSource.text_layer)
    )
    return bool(result.pages_without_text) and all(yields_nothing(page) for page in read)


def split_document(
    pages: list[PageResult], settings: DocumentOptions, kind: SourceKind
) -> Split | None:
    """Where the document is cut at its separator sheets (None without split_on);
    DocumentFailed if it is nothing but separators."""
    if not settings.split_on:
        return None
    marks = [
        page.separator or SeparatorMark(blank=page.source is PageSource.blank) for page in pages
    ]
    split = split_pages(
        marks, [kind.value for kind in settings.split_on], kind is SourceKind.duplex
    )
    if not split.parts:
        raise failures.only_separators(split)
    return split
