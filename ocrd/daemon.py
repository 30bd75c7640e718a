"""The daemon's lifecycle, top to bottom: check, start the engine, announce, serve, drain, stop.

Data flows one way through it: watch (a file becomes ready), claim (it moves into the work
area), convert (render and recognise), write (Markdown into the outbox) and settle (the
original into done/ or failed/).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from ocrd.claim import Claim, WorkArea
from ocrd.config import Config, InboxConfig
from ocrd.engines import Engine, EngineDeadError, choose_engine, create_engine
from ocrd.files import remove_stale_temporaries
from ocrd.log import FilteringBoundLogger, get_logger
from ocrd.notify import SystemdNotifier
from ocrd.page import PageJournal
from ocrd.pipeline import DocumentFailed, DocumentResult, DocumentSettings, Pipeline
from ocrd.settle import Settler
from ocrd.watch import InboxWatcher, SettleTracker

T = TypeVar("T")

EXIT_OK = 0
EXIT_FATAL = 70  # EX_SOFTWARE: systemd restarts the unit
EXIT_CONFIG = 78  # EX_CONFIG: the unit does not restart (RestartPreventExitStatus=78)

TICK_SECONDS = 0.5
POISON_ATTEMPTS = 2  # attempts that never finished: the daemon died during each
HEALTH_CHECK_SECONDS = 2.0
STORAGE_RETRY_FIRST_SECONDS = 1.0
STORAGE_RETRY_MAX_SECONDS = 60.0


def still_growing(inbox: InboxConfig) -> DocumentFailed:
    return DocumentFailed(
        "detect",
        f"the file was still being written {inbox.max_settle_wait_seconds:g} s after it "
        "appeared, so it was never complete; drop it in again once it is written "
        "(or raise the inbox's max_settle_wait_seconds)",
        error_type="StillGrowing",
    )


def poisoned(attempts: int) -> DocumentFailed:
    return DocumentFailed(
        "crash",
        f"crashed the daemon twice: the daemon or its engine died while this file was being "
        f"processed ({attempts} attempts), so it was set aside to keep other files moving; "
        "check the log around its earlier attempts, then drop it into the inbox again",
        error_type="PoisonDocument",
    )


class StartupError(Exception):
    """The daemon cannot start with this configuration; one line per problem."""


def check_folders(config: Config, create: bool = True) -> list[str]:
    """Problems with the configured folders, each a line saying which folder and why."""
    problems: list[str] = []
    inboxes = [inbox.path for inbox in config.inboxes]
    for inbox in config.inboxes:
        if not inbox.path.is_dir():
            problems.append(f"inbox {inbox.path} does not exist or is not a folder; create it")
            continue
        if not os.access(inbox.path, os.W_OK | os.X_OK):
            problems.append(
                f"inbox {inbox.path} is not writable by this user (files are moved out of it)"
            )
        for role in ("outbox", "done", "failed", "work"):
            folder: Path = getattr(inbox, role)
            for watched in inboxes:
                if folder == watched or folder.is_relative_to(watched):
                    problems.append(
                        f"{role} folder {folder} lies inside the watched inbox {watched}; "
                        "move it out, or ocrd would read its own output"
                    )
            if not folder.exists() and create and folder.parent.is_dir():
                with contextlib.suppress(OSError):
                    folder.mkdir()
            if not folder.is_dir():
                if create or not folder.parent.is_dir():
                    problems.append(f"{role} folder {folder} does not exist; create it")
            elif not os.access(folder, os.W_OK | os.X_OK):
                problems.append(f"{role} folder {folder} is not writable by this user")
        if inbox.work.is_dir() and inbox.work.stat().st_dev != inbox.path.stat().st_dev:
            problems.append(
                f"work folder {inbox.work} is on another filesystem than inbox {inbox.path}; "
                "claiming needs an atomic rename, so put it on the same filesystem"
            )
    return problems


class Throughput:
    """Pages per second over a recent window, for the status line."""

    def __init__(self, window_seconds: float = 60.0) -> None:
        self.window = window_seconds
        self._times: deque[float] = deque()

    def add(self, *_: object) -> None:
        self._times.append(time.monotonic())

    def pages_per_second(self) -> float:
        cutoff = time.monotonic() - self.window
        while self._times and self._times[0] < cutoff:
            self._times.popleft()
        return len(self._times) / self.window


@dataclass
class Inbox:
    """One configured inbox and the parts that serve it."""

    config: InboxConfig
    work: WorkArea
    tracker: SettleTracker
    settler: Settler
    settings: DocumentSettings
    watcher: InboxWatcher | None = None


@dataclass
class Job:
    inbox: Inbox
    path: Path | None = None  # a ready file in the inbox, still to be claimed
    claim: Claim | None = None  # or a claim recovered from the work area
    failure: DocumentFailed | None = None  # known to fail before it is read


class Daemon:
    def __init__(self, config: Config, engine_kind: str | None = None) -> None:
        self.config = config
        self.engine_kind = engine_kind
        self.log = get_logger()
        self.notifier = SystemdNotifier()
        self.throughput = Throughput()
        self.exit_code = EXIT_OK
        self.storage_fault: str | None = None
        self.inboxes: list[Inbox] = []
        self.engine: Engine | None = None
        self.pipeline: Pipeline | None = None
        self._stop = asyncio.Event()
        self._jobs: deque[Job] = deque()
        self._queued: set[Path] = set()
        self._documents: set[asyncio.Task[None]] = set()
        self._document_slots = asyncio.Semaphore(config.pipeline.max_documents_in_flight)

    # --- lifecycle ---------------------------------------------------------------------

    async def run(self) -> int:
        try:
            self.check()
        except StartupError as error:
            for line in str(error).splitlines():
                self.log.error("startup.refused", reason=line)
            return EXIT_CONFIG
        self.install_signal_handlers()
        try:
            await self.start_engine()
            self.start_inboxes()
            self.notifier.ready(self.status_line())
            self.log.info("daemon.ready", inboxes=[str(i.config.path) for i in self.inboxes])
            await self.serve()
        finally:
            await self.drain()
            await self.stop()
        return self.exit_code

    def check(self) -> None:
        problems = check_folders(self.config)
        if problems:
            raise StartupError("\n".join(problems))

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.request_stop, signum)

    def request_stop(self, signum: int | None = None) -> None:
        if not self._stop.is_set():
            name = signal.Signals(signum).name if signum else None
            self.log.info("daemon.stopping", signal=name, documents_in_flight=len(self._documents))
            self._stop.set()

    async def start_engine(self) -> None:
        engine_config = self.config.engine
        if self.engine_kind:
            engine_config = engine_config.model_copy(update={"kind": self.engine_kind})
        choice = choose_engine(engine_config)
        self.log.info("engine.selected", engine=choice.kind, reason=choice.reason)
        self.notifier.status(f"loading the {choice.kind} engine")
        started = time.monotonic()
        self.engine = create_engine(engine_config, choice.kind)
        await self.engine.start()
        self.log.info(
            "engine.ready", engine=choice.kind, seconds=round(time.monotonic() - started, 1)
        )
        self.pipeline = Pipeline.create(self.engine, self.config.pipeline)
        self.pipeline.on_page_done.append(self.throughput.add)

    def start_inboxes(self) -> None:
        assert self.engine is not None
        loop = asyncio.get_running_loop()
        for config in self.config.inboxes:
            inbox = Inbox(
                config=config,
                work=WorkArea(config.path, config.work),
                tracker=SettleTracker(config),
                settler=Settler(config, self.engine.name),
                settings=DocumentSettings.of(config),
            )
            for folder in (config.outbox, config.done, config.failed):
                if folder.is_dir():
                    remove_stale_temporaries(folder)
            for claim in inbox.work.recover():
                self.log.info("document.recovered", doc=claim.id, path=claim.state.relative_path)
                self._jobs.append(Job(inbox, claim=claim))
            inbox.watcher = InboxWatcher(config, loop, inbox.tracker.observe)
            inbox.watcher.start()
            self.log.info("inbox.watching", inbox=str(config.path), polling=config.polling)
            self.inboxes.append(inbox)

    async def serve(self) -> None:
        loops = [
            self._every(TICK_SECONDS, self.collect_ready_files),
            self._every(self.config.pipeline.rescan_interval_seconds, self.rescan),
            self._every(self.config.pipeline.status_interval_seconds, self.report_status),
            self._every(HEALTH_CHECK_SECONDS, self.check_engine),
            self.dispatch(),
        ]
        interval = self.notifier.watchdog_interval
        if interval:
            loops.append(self._every(interval, self.notifier.watchdog))
        tasks = [asyncio.create_task(loop) for loop in loops]
        try:
            await self._stop.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def drain(self) -> None:
        """No new files; in-flight documents get the grace period, the rest stay claimed."""
        self.notifier.stopping(f"draining {len(self._documents)} documents")
        for inbox in self.inboxes:
            if inbox.watcher is not None:
                inbox.watcher.stop()
        if self._documents:
            grace = self.config.pipeline.shutdown_grace_seconds
            _, pending = await asyncio.wait(self._documents, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def stop(self) -> None:
        if self.pipeline is not None:
            self.pipeline.renderers.shutdown()
        if self.engine is not None:
            await self.engine.stop()
        self.log.info("daemon.stopped", exit_code=self.exit_code)

    # --- serving -----------------------------------------------------------------------

    @staticmethod
    async def _every(seconds: float, action: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(seconds)
            outcome = action()
            if inspect.isawaitable(outcome):
                await outcome

    async def check_engine(self) -> None:
        assert self.engine is not None
        try:
            await self.engine.check_health()
        except EngineDeadError as error:
            self.engine_died(error)

    def engine_died(self, error: EngineDeadError) -> None:
        self.log.error(
            "engine.dead",
            error=str(error),
            action="exiting so that systemd restarts ocrd; claimed files stay in the work area",
        )
        self.exit_code = EXIT_FATAL
        self._stop.set()

    def collect_ready_files(self) -> None:
        for inbox in self.inboxes:
            for ready in inbox.tracker.ready():
                if ready.path in self._queued:
                    continue
                self._queued.add(ready.path)
                failure = still_growing(inbox.config) if ready.still_growing else None
                self._jobs.append(Job(inbox, path=ready.path, failure=failure))

    def rescan(self) -> None:
        for inbox in self.inboxes:
            if inbox.watcher is not None:
                inbox.watcher.rescan()

    def status_line(self) -> str:
        fault = f"STORAGE FAULT, retrying: {self.storage_fault}; " if self.storage_fault else ""
        for inbox in self.inboxes:
            if inbox.watcher is not None and inbox.watcher.missing:
                fault += f"INBOX MISSING: {inbox.config.path}; "
        waiting = len(self._jobs) + sum(len(inbox.tracker) for inbox in self.inboxes)
        pages = self.pipeline.pages_in_flight if self.pipeline else 0
        return fault + (
            f"{waiting} waiting, {len(self._documents)} documents ({pages} pages) in flight, "
            f"{self.throughput.pages_per_second():.2f} pages/s"
        )

    def report_status(self) -> None:
        self.notifier.status(self.status_line())

    async def dispatch(self) -> None:
        """Claim ready files and start their documents, as many at once as configured."""
        while True:
            if not self._jobs:
                await asyncio.sleep(TICK_SECONDS / 5)
                continue
            await self._document_slots.acquire()
            job = self._jobs.popleft()
            claim = job.claim or self._claim(job)
            if claim is None:
                self._document_slots.release()
                continue
            task = asyncio.create_task(self.process(job.inbox, claim, job.failure))
            self._documents.add(task)
            task.add_done_callback(self._document_finished)

    def _claim(self, job: Job) -> Claim | None:
        assert job.path is not None
        self._queued.discard(job.path)
        try:
            claim = job.inbox.work.claim(job.path)
        except OSError as error:
            self.log.error("file.claim_failed", path=str(job.path), error=str(error))
            return None
        if claim is None:
            self.log.info("file.vanished", path=str(job.path), reason="gone before it was claimed")
            return None
        self.log.info(
            "document.claimed",
            doc=claim.id,
            path=claim.state.relative_path,
            inbox=str(job.inbox.config.path),
        )
        return claim

    def _document_finished(self, task: asyncio.Task[None]) -> None:
        self._documents.discard(task)
        self._document_slots.release()
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, EngineDeadError):
            self.engine_died(error)
        elif error is not None:
            self.log.error("document.crashed", error=repr(error))

    async def process(
        self, inbox: Inbox, claim: Claim, failure: DocumentFailed | None = None
    ) -> None:
        """One claimed document from its work folder to done/ or failed/."""
        log = get_logger(doc=claim.id, path=claim.state.relative_path)
        resumed = await self._settle(lambda: inbox.settler.resume(claim), log)
        if resumed is not None:
            log.info("document.settled", outcome=resumed.outcome, resumed=True)
            return
        started = time.monotonic()
        if failure is None and claim.state.attempts >= POISON_ATTEMPTS:
            failure = poisoned(claim.state.attempts)
        if failure is not None:
            await self._settle(lambda: self._fail(inbox, claim, failure, started, log), log)
            return
        log.info("document.started", attempt=claim.start_attempt())
        try:
            outcome = await self._convert(inbox, claim, log)
            if not claim.path.exists():
                self._vanished(inbox, claim, log)
            elif isinstance(outcome, DocumentFailed):
                await self._settle(lambda: self._fail(inbox, claim, outcome, started, log), log)
            else:
                await self._settle(lambda: self._succeed(inbox, claim, outcome, started, log), log)
        except asyncio.CancelledError:
            claim.state.attempts -= 1  # a clean shutdown is not a crash
            claim.save()
            log.warning("document.interrupted", action="left in the work area for the next start")
            raise

    def _vanished(self, inbox: Inbox, claim: Claim, log: FilteringBoundLogger) -> None:
        """Someone deleted the original from the work area: there is nothing to settle."""
        log.warning(
            "document.vanished",
            reason="the original was deleted from the work area while it was processed",
            action="no output is written for it",
        )
        claim.release()

    async def _convert(
        self, inbox: Inbox, claim: Claim, log: FilteringBoundLogger
    ) -> DocumentResult | DocumentFailed:
        assert self.pipeline is not None
        try:
            journal = PageJournal(claim.journal)
            return await self.pipeline.convert(
                claim.path, inbox.settings, claim.scratch, log, journal
            )
        except DocumentFailed as failure:
            return failure
        except (EngineDeadError, asyncio.CancelledError):
            raise
        except Exception as error:  # a bug in ocrd must cost one document, not the daemon
            log.exception("document.internal_error")
            return DocumentFailed("internal", repr(error), None, type(error).__name__)

    async def _settle(self, action: Callable[[], T], log: FilteringBoundLogger) -> T:
        """Run a settlement step; storage faults (disk full, read-only, missing folder) are
        retried with backoff, the original safe in the work area, until they clear."""
        delay = STORAGE_RETRY_FIRST_SECONDS
        while True:
            try:
                value = action()
            except OSError as error:
                self.storage_fault = str(error)
                log.error(
                    "storage.fault",
                    error=str(error),
                    retry_in_seconds=delay,
                    action="the original stays in the work area; ocrd retries until this clears",
                )
                self.report_status()
                await asyncio.sleep(delay)
                delay = min(delay * 2, STORAGE_RETRY_MAX_SECONDS)
                continue
            if self.storage_fault is not None:
                log.info("storage.recovered")
                self.storage_fault = None
            return value

    def _succeed(
        self,
        inbox: Inbox,
        claim: Claim,
        result: DocumentResult,
        started: float,
        log: FilteringBoundLogger,
    ) -> None:
        try:
            settlement = inbox.settler.done(claim, result, inbox.settings)
        except OSError:
            raise
        except Exception as error:  # a bug in writing costs this document only
            log.exception("document.internal_error", stage="write")
            failure = DocumentFailed("write", repr(error), None, type(error).__name__)
            self._fail(inbox, claim, failure, started, log)
            return
        pages = len(result.pages)
        log.info(
            "document.finished",
            outcome="done",
            pages=pages,
            seconds=round(result.seconds, 3),
            pages_per_second=round(pages / result.seconds, 3) if result.seconds else None,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
            finish_reasons=result.finish_reasons(),
            unfinished_pages=result.unfinished_pages,
            retried_pages=result.retried_pages,
            markdown=settlement.markdown,
            original=settlement.original,
        )

    def _fail(
        self,
        inbox: Inbox,
        claim: Claim,
        failure: DocumentFailed,
        started: float,
        log: FilteringBoundLogger,
    ) -> None:
        settlement = inbox.settler.failed(claim, failure)
        log.warning(
            "document.finished",
            outcome="failed",
            stage=failure.stage,
            page=failure.page,
            reason=failure.message,
            seconds=round(time.monotonic() - started, 3),
            original=settlement.original,
            error_report=settlement.error_report,
        )
