"""Render and recognise one document, many documents at a time.

Pages go to the engine one by one as soon as they are rendered, so the engine's continuous
batching sees pages from every document in flight. A global budget of page slots bounds
how many pages are rendered but not yet recognised, so memory does not grow with a
document's length or with the backlog. Results come back in page order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path

from ocrd.config import InboxConfig, PipelineConfig, PromptMode
from ocrd.engines import Engine, EngineDeadError, EngineError, PageText
from ocrd.log import FilteringBoundLogger, get_logger
from ocrd.page import PageJournal, PageResult, assemble_page, better
from ocrd.render import (
    InputFormat,
    PageImage,
    RenderError,
    RenderLimits,
    RenderPool,
    RenderSettings,
    detect_format,
)

_INBOX_DEFAULTS = InboxConfig.model_fields


@dataclass(frozen=True)
class DocumentSettings:
    """How one document is recognised and written: an inbox's per-document options."""

    prompt: PromptMode = PromptMode.layout
    render: RenderSettings = field(default_factory=RenderSettings)
    page_separator: str = _INBOX_DEFAULTS["page_separator"].default
    unfinished_pages: str = "done"  # or "failed": where a document with unfinished pages goes
    retry_unfinished: bool = True
    tables: str = "markdown"
    figures: bool = True
    layout_file: bool = False
    keep_raw: bool = False
    strip_headers_footers: bool = False

    @classmethod
    def of(cls, inbox: InboxConfig) -> DocumentSettings:
        copied = {f.name: getattr(inbox, f.name) for f in fields(cls) if f.name != "render"}
        render = RenderSettings(inbox.dpi, inbox.max_image_side, inbox.passwords)
        return cls(**copied, render=render)


class DocumentFailed(Exception):
    """The document cannot be converted; it goes to failed/ with this reason."""

    def __init__(
        self, stage: str, message: str, page: int | None = None, error_type: str = ""
    ) -> None:
        super().__init__(message)
        self.stage = stage
        self.page = page
        self.error_type = error_type or type(self).__name__

    @property
    def message(self) -> str:
        return str(self)


@dataclass
class DocumentResult:
    format: InputFormat
    pages: list[PageResult]
    seconds: float

    @property
    def prompt_tokens(self) -> int:
        return sum(page.text.prompt_tokens for page in self.pages)

    @property
    def completion_tokens(self) -> int:
        return sum(page.text.completion_tokens for page in self.pages)

    @property
    def unfinished_pages(self) -> list[int]:
        """Numbers of pages the engine stopped before their end (token limit, loop)."""
        return [page.number for page in self.pages if page.unfinished]

    @property
    def retried_pages(self) -> list[int]:
        return [page.number for page in self.pages if page.retried]

    def finish_reasons(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for page in self.pages:
            counts[page.finish_reason] = counts.get(page.finish_reason, 0) + 1
        return counts


class Pipeline:
    def __init__(
        self,
        engine: Engine,
        renderers: RenderPool,
        max_pages_in_flight: int,
        page_retries: int = 0,
        retry_backoff_seconds: float = 0.0,
    ) -> None:
        self.engine = engine
        self.renderers = renderers
        self.page_retries = page_retries
        self.retry_backoff_seconds = retry_backoff_seconds
        self._page_slots = asyncio.Semaphore(max_pages_in_flight)
        self.pages_in_flight = 0
        self.on_page_done: list[Callable[[PageText], None]] = []  # e.g. the throughput meter

    @classmethod
    def create(cls, engine: Engine, config: PipelineConfig) -> Pipeline:
        pool = RenderPool(config.render_workers, RenderLimits.of(config))
        return cls(
            engine,
            pool,
            config.max_pages_in_flight,
            config.page_retries,
            config.page_retry_backoff_seconds,
        )

    async def convert(
        self,
        path: Path,
        settings: DocumentSettings,
        scratch: Path,
        log: FilteringBoundLogger | None = None,
        journal: PageJournal | None = None,
    ) -> DocumentResult:
        """Render and recognise every page of `path`; raises DocumentFailed with the reason.

        Figure crops are written to `scratch` as pages come back, not kept in memory. Pages
        found in `journal` are taken from it; each newly recognised page is added to it.
        """
        log = log or get_logger(path=str(path))
        started = time.monotonic()
        try:
            fmt = detect_format(path)
        except RenderError as error:
            raise DocumentFailed("detect", str(error), error_type="UnsupportedInput") from None
        except OSError as error:
            raise DocumentFailed("detect", f"cannot read the file: {error.strerror}") from None
        try:
            pages = await self._render_and_recognise(path, fmt, settings, scratch, log, journal)
        except BaseExceptionGroup as group:
            raise _document_failure(group) from None
        result = DocumentResult(fmt, pages, time.monotonic() - started)
        if result.unfinished_pages and settings.unfinished_pages == "failed":
            raise DocumentFailed(
                "recognise",
                f"{_describe_unfinished(result)}; the inbox's unfinished_pages setting is "
                "'failed' (set it to 'done' to keep such text with a marker)",
                result.unfinished_pages[0],
                "UnfinishedPages",
            )
        return result

    async def _render_and_recognise(
        self,
        path: Path,
        fmt: InputFormat,
        settings: DocumentSettings,
        scratch: Path,
        log: FilteringBoundLogger,
        journal: PageJournal | None,
    ) -> list[PageResult]:
        figures = scratch if settings.figures else None
        done = journal.load(figures) if journal else {}
        results: dict[int, PageResult] = {}
        tasks: dict[int, asyncio.Task[PageResult]] = {}
        async with asyncio.TaskGroup() as group, self.renderers.worker() as renderer:
            count = await renderer.open(path, fmt, settings.render)
            resumed = [number for number in done if number <= count]
            log.info("document.opened", format=str(fmt), pages=count, resumed_pages=len(resumed))
            for number in range(1, count + 1):
                if number in done:
                    results[number] = done[number]
                    continue
                await self._page_slots.acquire()
                try:
                    page = await renderer.render(number)
                except BaseException:
                    self._page_slots.release()
                    raise
                task = self._recognise(page, settings, figures, log, journal)
                tasks[number] = group.create_task(task)
        results.update((number, task.result()) for number, task in tasks.items())
        return [results[number] for number in sorted(results)]

    async def _recognise(
        self,
        page: PageImage,
        settings: DocumentSettings,
        figures: Path | None,
        log: FilteringBoundLogger,
        journal: PageJournal | None = None,
    ) -> PageResult:
        """One page through the engine; an unfinished layout page gets one plain-text retry."""
        self.pages_in_flight += 1
        try:
            prompt = settings.prompt
            text = await self._engine_text(page, prompt, log)
            result = assemble_page(page, text, prompt, figures)
            if result.unfinished and settings.retry_unfinished and prompt is PromptMode.layout:
                log.info(
                    "page.retrying",
                    page=page.number,
                    finish_reason=result.finish_reason,
                    prompt=PromptMode.text.value,
                )
                retry = await self._engine_text(page, PromptMode.text, log)
                if better(text, retry) is retry:
                    result = assemble_page(page, retry, PromptMode.text, figures, retried=True)
                else:
                    result.retried = True
        finally:
            self.pages_in_flight -= 1
            self._page_slots.release()
        log.info(
            "page.recognised",
            page=page.number,
            size=f"{page.image.width}x{page.image.height}",
            finish_reason=result.finish_reason,
            prompt=result.prompt.value,
            retried=result.retried,
            prompt_tokens=result.text.prompt_tokens,
            completion_tokens=result.text.completion_tokens,
            seconds=round(result.text.seconds, 3),
            engine_interval=result.text.engine_interval,
        )
        if journal is not None:
            journal.append(result)
        for callback in self.on_page_done:
            callback(result.text)
        return result

    async def _engine_text(
        self, page: PageImage, prompt: PromptMode, log: FilteringBoundLogger
    ) -> PageText:
        """The engine's text for a page; a failed request is retried with backoff."""
        delay = self.retry_backoff_seconds
        for attempt in range(1, self.page_retries + 2):
            try:
                return await self.engine.recognise(page, prompt)
            except EngineError as error:
                if attempt > self.page_retries:
                    raise EngineError(
                        f"page {page.number} failed in the engine {attempt} times; last: {error}",
                        page=page.number,
                    ) from error
                log.warning(
                    "page.engine_error",
                    page=page.number,
                    attempt=attempt,
                    error=str(error),
                    retry_in_seconds=delay,
                )
                await asyncio.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")


def _leaves(group: BaseExceptionGroup) -> list[BaseException]:
    found: list[BaseException] = []
    for error in group.exceptions:
        found.extend(_leaves(error) if isinstance(error, BaseExceptionGroup) else [error])
    return found


def _document_failure(group: BaseExceptionGroup) -> BaseException:
    """The one error that decides a document's fate; a dead engine outranks everything."""
    errors = _leaves(group)
    for error in errors:
        if isinstance(error, EngineDeadError):
            return error
    error = errors[0]
    if isinstance(error, RenderError):
        return DocumentFailed("render", str(error), error.page, "RenderError")
    if isinstance(error, EngineError):
        return DocumentFailed("recognise", str(error), error.page, "EngineError")
    return error  # a bug in ocrd: let it surface with its traceback


def _describe_unfinished(result: DocumentResult) -> str:
    reasons = sorted({result.pages[n - 1].finish_reason for n in result.unfinished_pages})
    numbers = ", ".join(str(n) for n in result.unfinished_pages)
    return f"page {numbers} did not finish (finish reason: {', '.join(reasons)})"
