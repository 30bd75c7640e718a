"""One claimed document, from its work folder to done/ or failed/: the state machine.

    claimed ─▶ (settlement planned earlier?) ─▶ finish it ─────────────────────▶ settled
       │
       ├─▶ known to fail (still growing, poison) ────────────────▶ failed/
       └─▶ attempt ─▶ convert ─▶ result ─▶ done/ (names as given, safe, flat) ─▶ settled
                          │          └─ no name works ─────────▶ failed/
                          └─▶ DocumentFailed ──────────────────▶ failed/

Crash accounting counts evidence only: when the engine dies with a page of a document in
it, the document's claim records that page before the daemon exits. A document so struck
runs alone from then on; if the engine dies again with its page in it, it is set aside as
poison (at most two deaths). A daemon killed from outside (SIGKILL, a reboot) is no
evidence against anything in flight: those documents simply resume.

Whatever goes wrong while settling one document costs that document only: it goes to
failed/ with the reason, and if even that cannot be done it stays claimed, listed as
needing an operator, and the daemon goes on.

Storage: every settlement step runs in a thread. Errors that clear by themselves (disk
full, read-only, stale share, folder missing) are retried with backoff while the original
waits in the work area; a name the target refuses is tried again as a safe name, then as a
flat one; what no name fixes fails the document with a reason naming folder and file.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from ocrd.claim import Claim, Settlement, WorkArea
from ocrd.collate import Collator
from ocrd.config import InboxConfig
from ocrd.domain import (
    DocumentFailed,
    DocumentResult,
    DocumentSettings,
    DocumentSummary,
    Outcome,
    Stage,
)
from ocrd.dropped import printable
from ocrd.engines import EngineDeadError
from ocrd.log import FilteringBoundLogger, get_logger
from ocrd.page import PageJournal
from ocrd.pipeline import Pipeline, Progress
from ocrd.settle import Naming, Settler
from ocrd.sources import Sources
from ocrd.storage import Fault, classify, describe
from ocrd.watch import InboxWatcher, SettleTracker

T = TypeVar("T")

STORAGE_RETRY_FIRST_SECONDS = 1.0
STORAGE_RETRY_MAX_SECONDS = 60.0


@dataclass(frozen=True)
class Blocked:
    """A ready file ocrd's user cannot move out: why, what a person should do, since when."""

    reason: str
    fix: str
    since: float  # wall clock


@dataclass
class Inbox:
    """One configured inbox and the parts that serve it."""

    config: InboxConfig
    work: WorkArea
    tracker: SettleTracker
    settler: Settler
    settings: DocumentSettings
    watcher: InboxWatcher | None = None
    collator: Collator | None = None  # with `collate: true`: a fronts file waiting
    blocked: dict[Path, Blocked] = field(default_factory=dict)


@dataclass
class InFlight:
    """A document being processed, for status reports."""

    doc: str
    inbox: str
    path: str
    progress: Progress
    started_at: float  # wall-clock seconds
    alone: bool


class StorageRefused(Exception):
    """The target refuses this file or its name; retrying the same step cannot help."""

    def __init__(self, error: OSError, fault: Fault) -> None:
        super().__init__(describe(error))
        self.error = error
        self.fault = fault


@dataclass
class StorageHealth:
    fault: str | None = None
    since: float = 0.0  # wall-clock seconds


def still_growing(inbox: InboxConfig) -> DocumentFailed:
    return DocumentFailed(
        Stage.detect,
        f"the file was still being written {inbox.max_settle_wait_seconds:g} s after it "
        "appeared, so it was never complete; drop it in again once it is written "
        "(or raise the inbox's max_settle_wait_seconds)",
        error_type="StillGrowing",
    )


POISON_DEATHS = 2  # engine deaths with a page of the document in it


def poisoned(pages: list[int]) -> DocumentFailed:
    if len(set(pages)) == 1:
        where = f"the engine crashed on page {pages[0]} twice"
    else:
        where = f"the engine crashed twice with this document's pages in it (pages {pages[0]} "
        where += f"and {pages[-1]}), the second time as the only document in flight"
    return DocumentFailed(
        Stage.crash,
        f"{where}, so it was set aside to keep other files moving; check the log around "
        "those crashes (and the engine's version), then drop it into the inbox again",
        page=pages[-1],
        error_type="PoisonDocument",
    )


def unsettled(error: BaseException) -> DocumentFailed:
    return DocumentFailed(
        Stage.internal,
        f"ocrd failed while settling this file ({type(error).__name__}: {error}); it was set "
        "aside under a safe name so that other files keep moving; please report this",
        error_type=type(error).__name__,
    )


def refused_everywhere(error: OSError) -> DocumentFailed:
    folder = Path(error.filename).parent if error.filename else "the output folder"
    name = Path(error.filename).name if error.filename else "?"
    return DocumentFailed(
        Stage.settle,
        f"{folder} refuses the file {name!r} under its own name, a safe name and a short one "
        f"({describe(error)}); the document was converted but cannot be stored there",
        error_type="StorageRefused",
    )


class Documents:
    """Runs claimed documents through the pipeline and settles them."""

    def __init__(self, pipeline: Pipeline, engine: str) -> None:
        self.pipeline = pipeline
        self.engine = engine
        self.storage = StorageHealth()
        self.in_flight: dict[str, InFlight] = {}
        # Claims that could not be settled even as failures, by id: what an operator must
        # look at (they stay in the work area until the next start).
        self.stuck: dict[str, str] = {}
        # Told of every settled document, with its inbox's settings as they were when it
        # started (hooks, metrics, the status page).
        self.on_finished: list[Callable[[InboxConfig, DocumentSummary], None]] = []
        self.on_storage_fault: list[Callable[[str], None]] = []

    async def run(
        self,
        inbox: Inbox,
        claim: Claim,
        failure: DocumentFailed | None = None,
        alone: bool = False,
    ) -> None:
        """Take one claim to done/ or failed/. Raises only EngineDeadError (the daemon must
        restart the engine) and CancelledError (shutdown): anything else that goes wrong
        costs this document, never the daemon."""
        log = get_logger(doc=claim.id, path=printable(claim.state.relative_path))
        try:
            await self._run(inbox, claim, failure, alone, log)
        except (EngineDeadError, asyncio.CancelledError):
            raise
        except Exception as error:  # a bug in ocrd, met while settling
            log.exception("document.internal_error", stage=Stage.settle.value)
            await self._set_aside(inbox, claim, error, log)

    async def _run(
        self,
        inbox: Inbox,
        claim: Claim,
        failure: DocumentFailed | None,
        alone: bool,
        log: FilteringBoundLogger,
    ) -> None:
        resumed = await self._step(lambda: inbox.settler.resume(claim), log)
        if resumed is not None:
            log.info("document.settled", outcome=resumed.outcome, resumed=True)
            return
        started = time.monotonic()
        if failure is None and len(claim.state.engine_deaths) >= POISON_DEATHS:
            failure = poisoned(claim.state.engine_deaths)
        if failure is not None:
            await self._fail(inbox, claim, failure, started, log)
            return
        attempt = await asyncio.to_thread(claim.start_attempt)
        log.info("document.started", attempt=attempt, alone=alone)
        progress = Progress()
        self.in_flight[claim.id] = InFlight(
            claim.id, str(inbox.config.path), claim.state.relative_path, progress, time.time(),
            alone,
        )  # fmt: skip
        try:
            outcome = await self._convert(inbox, claim, log, progress, started)
            if not await asyncio.to_thread(claim.path.exists):
                await asyncio.to_thread(self._vanished, claim, log)
            elif isinstance(outcome, DocumentFailed):
                await self._fail(inbox, claim, outcome, started, log)
            else:
                await self._succeed(inbox, claim, outcome, started, log)
        except EngineDeadError as error:
            if error.page is not None:  # evidence: it died with this document's page in it
                await asyncio.to_thread(claim.record_engine_death, error.page)
                log.error(
                    "document.engine_died",
                    page=error.page,
                    deaths=len(claim.state.engine_deaths),
                    action="the document runs alone after the restart; a second death with "
                    "its page in the engine sets it aside",
                )
            raise
        except asyncio.CancelledError:
            if claim.folder.exists():
                log.warning(
                    "document.interrupted", action="left in the work area for the next start"
                )
            raise
        finally:
            self.in_flight.pop(claim.id, None)

    async def _set_aside(
        self, inbox: Inbox, claim: Claim, error: Exception, log: FilteringBoundLogger
    ) -> None:
        """After an unexpected error while settling: failed/ under a flat, safe name; if
        even that fails, the claim stays where it is, listed for an operator."""
        failure = unsettled(error)
        try:
            settlement = await self._step(
                lambda: inbox.settler.failed(claim, failure, Naming.flat), log
            )
        except Exception as again:
            reason = f"cannot be settled, not even as a failure: {type(again).__name__}: {again}"
            self.stuck[claim.id] = f"{printable(claim.state.relative_path)} {reason}"
            log.error(
                "document.stuck",
                error=repr(again),
                action="left in the work area for an operator; ocrd goes on with other files",
            )
            return
        summary = self._summary(inbox, claim, Outcome.failed, time.monotonic(), settlement)
        summary.stage, summary.reason = failure.stage, failure.message
        summary.error_report = settlement.error_report
        self._finished(inbox, summary, log)

    async def _convert(
        self,
        inbox: Inbox,
        claim: Claim,
        log: FilteringBoundLogger,
        progress: Progress,
        arrival: float,
    ) -> DocumentResult | DocumentFailed:
        try:
            sources = await asyncio.to_thread(Sources.of, claim.path, claim.companion_paths)
            return await self.pipeline.convert(
                sources,
                inbox.settings,
                claim.scratch,
                log,
                PageJournal(claim.journal),
                progress,
                arrival,
            )
        except DocumentFailed as failure:
            return failure
        except (EngineDeadError, asyncio.CancelledError):
            raise
        except Exception as error:  # a bug in ocrd must cost one document, not the daemon
            log.exception("document.internal_error")
            return DocumentFailed(Stage.internal, repr(error), None, type(error).__name__)

    @staticmethod
    def _vanished(claim: Claim, log: FilteringBoundLogger) -> None:
        """Someone deleted the original from the work area: there is nothing to settle."""
        log.warning(
            "document.vanished",
            reason="the original was deleted from the work area while it was processed",
            action="no output is written for it",
        )
        claim.release()

    # --- settling --------------------------------------------------------------------------

    async def _succeed(
        self,
        inbox: Inbox,
        claim: Claim,
        result: DocumentResult,
        started: float,
        log: FilteringBoundLogger,
    ) -> None:
        refused: StorageRefused | None = None
        for naming in Naming:
            try:
                settlement = await self._step(
                    lambda n=naming: inbox.settler.done(claim, result, inbox.settings, n), log
                )
            except StorageRefused as error:
                refused = error
                if error.fault is Fault.file_refused:
                    break
                self._name_refused(error, naming, log)
                continue
            except Exception as error:  # a bug in writing costs this document only
                log.exception("document.internal_error", stage=Stage.write.value)
                failure = DocumentFailed(Stage.write, repr(error), None, type(error).__name__)
                await self._fail(inbox, claim, failure, started, log)
                return
            summary = self._summary(inbox, claim, Outcome.done, started, settlement)
            summary.pages = len(result.pages)
            summary.prompt_tokens = result.prompt_tokens
            summary.completion_tokens = result.completion_tokens
            summary.finish_reasons = result.finish_reasons()
            summary.unfinished_pages = result.unfinished_pages
            summary.retried_pages = result.retried_pages
            summary.text_layer_pages = result.text_layer_pages
            summary.blank_pages = result.blank_pages
            summary.markdown = settlement.markdown
            self._finished(inbox, summary, log)
            return
        assert refused is not None
        failure = (
            refused_everywhere(refused.error)
            if refused.fault is Fault.name_refused
            else DocumentFailed(
                Stage.settle,
                f"the outbox or done folder refuses this file: {refused}",
                error_type="StorageRefused",
            )
        )
        await self._fail(inbox, claim, failure, started, log)

    async def _fail(
        self,
        inbox: Inbox,
        claim: Claim,
        failure: DocumentFailed,
        started: float,
        log: FilteringBoundLogger,
    ) -> None:
        settlement = None
        for naming in Naming:
            try:
                settlement = await self._step(
                    lambda n=naming: inbox.settler.failed(claim, failure, n), log
                )
                break
            except StorageRefused as error:
                self._name_refused(error, naming, log)
        if settlement is None:  # nothing else to try: wait for an operator, original safe
            settlement = await self._step(
                lambda: inbox.settler.failed(claim, failure, Naming.flat), log, permanent_too=True
            )
        summary = self._summary(inbox, claim, Outcome.failed, started, settlement)
        summary.stage, summary.page, summary.reason = failure.stage, failure.page, failure.message
        summary.code = failure.code
        summary.error_report = settlement.error_report
        self._finished(inbox, summary, log)

    def _summary(
        self,
        inbox: Inbox,
        claim: Claim,
        outcome: Outcome,
        started: float,
        settlement: Settlement,
    ) -> DocumentSummary:
        naming = Naming(settlement.naming)
        return DocumentSummary(
            doc=claim.id,
            inbox=str(inbox.config.path),
            path=printable(claim.state.relative_path),
            outcome=outcome,
            seconds=time.monotonic() - started,
            original=settlement.original,
            renamed=None if naming is Naming.original else naming.value,
            finished_at=time.time(),
        )

    def _finished(self, inbox: Inbox, summary: DocumentSummary, log: FilteringBoundLogger) -> None:
        event = summary.event()
        if summary.outcome is Outcome.done:
            log.info("document.finished", **event)
        else:
            log.warning("document.finished", **event)
        for listener in self.on_finished:
            listener(inbox.config, summary)

    @staticmethod
    def _name_refused(error: StorageRefused, naming: Naming, log: FilteringBoundLogger) -> None:
        following = list(Naming)[list(Naming).index(naming) + 1 :]
        log.warning(
            "storage.name_refused",
            error=str(error),
            naming=naming.value,
            action=f"trying a {following[0].value} name" if following else "no name left to try",
        )

    async def _step(
        self, action: Callable[[], T], log: FilteringBoundLogger, permanent_too: bool = False
    ) -> T:
        """Run a settlement step in a thread. Transient storage faults are retried with
        backoff, the original safe in the work area, until they clear; a refused name or
        file raises StorageRefused (unless `permanent_too`: then it is waited out too)."""
        delay = STORAGE_RETRY_FIRST_SECONDS
        while True:
            try:
                value = await _uninterrupted(action)
            except OSError as error:
                fault = classify(error)
                if fault is not Fault.transient and not permanent_too:
                    raise StorageRefused(error, fault) from error
                self._storage_fault(describe(error), delay, log)
                await asyncio.sleep(delay)
                delay = min(delay * 2, STORAGE_RETRY_MAX_SECONDS)
                continue
            if self.storage.fault is not None:
                log.info("storage.recovered")
                self.storage.fault = None
            return value

    def _storage_fault(self, problem: str, delay: float, log: FilteringBoundLogger) -> None:
        if self.storage.fault is None:
            self.storage.since = time.time()
        self.storage.fault = problem
        log.error(
            "storage.fault",
            error=problem,
            retry_in_seconds=delay,
            action="the original stays in the work area; ocrd retries until this clears",
        )
        for listener in self.on_storage_fault:
            listener(problem)


async def _uninterrupted(action: Callable[[], T]) -> T:
    """Run blocking file work in a thread; if the caller is cancelled meanwhile, wait for the
    work to finish anyway, so that a half-done step never races the cleanup that follows."""
    task = asyncio.ensure_future(asyncio.to_thread(action))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise
