"""`ocrd convert`: the daemon's pipeline, run once over files given on the command line.

Originals are only read. Each input gives `<out>/<name>.md`, or `<out>/<name>.error.json`
with the reason it failed. On a terminal each file gets a progress bar (pages done, pages
a second, time left); otherwise a plain line now and then, and one when a file is done.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path, PurePath
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, TextColumn
from rich.progress import Progress as RichProgress

from ocrd.config import DocumentOptions, EngineConfig, PipelineConfig
from ocrd.documents.pipeline import DocumentContext, Pipeline, Progress
from ocrd.domain import DocumentFailed
from ocrd.engines import EngineDeadError, choose_engine, create_engine
from ocrd.files import free_name
from ocrd.log import get_logger
from ocrd.output.settle import ERROR_SUFFIX, error_report, write_report
from ocrd.output.write import markdown_target, write_parts

REFRESH_SECONDS = 0.25
PLAIN_LINE_SECONDS = 5.0


class ProgressDisplay:
    """Each file's progress: rich bars on a terminal, plain lines elsewhere."""

    def __init__(self, terminal: bool, stream: TextIO = sys.stderr) -> None:
        self.terminal = terminal
        self.stream = stream
        self._files: dict[Path, tuple[Progress, Any]] = {}
        self._last_line: dict[Path, float] = {}
        self._bars: RichProgress | None = None
        if terminal:
            self._bars = RichProgress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.fields[pages]}"),
                TextColumn("{task.fields[rate]}"),
                TextColumn("{task.fields[left]}"),
                console=Console(file=stream),
                transient=False,
            )

    def __enter__(self) -> ProgressDisplay:
        if self._bars is not None:
            self._bars.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.refresh()
        if self._bars is not None:
            self._bars.stop()

    def track(self, path: Path) -> Progress:
        progress = Progress()
        task = None
        if self._bars is not None:
            task = self._bars.add_task(path.name, total=None, pages="", rate="", left="")
        self._files[path] = (progress, task)
        return progress

    def finish(self, path: Path, outcome: str) -> None:
        progress, task = self._files[path]
        if self._bars is not None:
            self._bars.update(
                task,
                completed=progress.done,
                total=progress.pages or 1,
                pages=_pages(progress),
                rate=outcome,
                left="",
            )
        else:
            self._line(path, progress, outcome)

    def refresh(self) -> None:
        now = time.monotonic()
        for path, (progress, task) in self._files.items():
            rate, left = _pace(progress, now)
            if self._bars is not None:
                if self._bars.tasks[task].finished:
                    continue
                self._bars.update(
                    task,
                    completed=progress.done,
                    total=progress.pages or None,
                    pages=_pages(progress),
                    rate=rate,
                    left=left,
                )
            elif (
                0 < progress.done < progress.pages
                and now - self._last_line.get(path, 0.0) >= PLAIN_LINE_SECONDS
            ):
                self._line(path, progress, f"{rate}, {left}")

    def _line(self, path: Path, progress: Progress, detail: str) -> None:
        self._last_line[path] = time.monotonic()
        pages = f"{progress.done}/{progress.pages}" if progress.pages else "?"
        print(f"{path.name}: page {pages}, {detail}", file=self.stream, flush=True)

    async def keep_refreshed(self) -> None:
        while True:
            await asyncio.sleep(REFRESH_SECONDS)
            self.refresh()


def _pages(progress: Progress) -> str:
    return f"{progress.done}/{progress.pages} pages" if progress.pages else "opening"


def _pace(progress: Progress, now: float) -> tuple[str, str]:
    """Pages a second so far, and the time left at that pace, as words."""
    seconds = now - progress.started
    if not progress.done or seconds <= 0:
        return "", ""
    rate = progress.done / seconds
    left = (progress.pages - progress.done) / rate if progress.pages else 0
    return f"{rate:.2f} pages/s", f"{left:.0f} s left"


async def convert_files(
    files: list[Path],
    out: Path,
    engine_config: EngineConfig,
    pipeline_config: PipelineConfig,
    options: DocumentOptions,
    terminal: bool = False,
) -> int:
    """Convert every file; the number of files that failed."""
    log = get_logger()
    choice = choose_engine(engine_config)
    log.info("engine.selected", engine=choice.kind, reason=choice.reason)
    engine = create_engine(engine_config, choice.kind)
    settings = options.for_engine(choice.kind)
    await engine.start()
    pipeline = Pipeline.create(engine, pipeline_config, settings.render.max_image_side)
    documents = asyncio.Semaphore(pipeline_config.documents_in_flight_for(engine.max_concurrency))
    out.mkdir(parents=True, exist_ok=True)

    display = ProgressDisplay(terminal)

    async def convert_one(path: Path) -> bool:
        progress = display.track(path)
        async with documents:
            with tempfile.TemporaryDirectory(prefix="ocrd-convert-") as scratch:
                try:
                    document = DocumentContext.of(path, settings, Path(scratch))
                    document.progress = progress
                    result = await pipeline.convert(document)
                except DocumentFailed as failure:
                    display.finish(path, "failed")
                    report = free_name(out / f"{path.stem}{ERROR_SUFFIX}")
                    write_report(report, error_report(failure, None, choice.kind, path))
                    log.warning(
                        "document.finished",
                        path=str(path),
                        outcome="failed",
                        stage=failure.stage,
                        page=failure.page,
                        reason=failure.message,
                        error_report=str(report),
                    )
                    return False
                target = markdown_target(out, PurePath(path.name))
                written = write_parts(result, settings, target, path.name)
        display.finish(path, "done")
        log.info(
            "document.finished",
            path=str(path),
            outcome="done",
            pages=len(result.pages),
            seconds=round(result.seconds, 3),
            finish_reasons=result.finish_reasons(),
            pages_without_text=result.pages_without_text,
            markdown=[str(m) for m in written] if len(written) > 1 else str(written[0]),
        )
        return True

    refresher = asyncio.create_task(display.keep_refreshed())
    try:
        with display:
            outcomes = await asyncio.gather(*(convert_one(path) for path in files))
    except EngineDeadError as error:
        log.error("engine.dead", error=str(error))
        return len(files)
    finally:
        refresher.cancel()
        pipeline.renderers.shutdown()
        await engine.stop()
    return outcomes.count(False)
