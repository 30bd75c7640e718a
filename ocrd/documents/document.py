"""One claimed document, from its work folder to done/ or failed/: the state machine.

    claimed ─▶ settlement planned earlier? ─▶ finish it ───────────────────────▶ settled
       │
       ├─▶ known to fail (still growing, set aside as poison) ─────────▶ failed/
       └─▶ convert ─▶ result ─▶ done/ (named as given, safe, flat) ───▶ settled
                 │          └─ no name works, or writing fails ────────▶ failed/
                 └─▶ DocumentFailed ────────────────────────────────────▶ failed/

Which document to blame when the engine dies is `ocrd/crashes.py`'s rule; this module
records the evidence and asks for the verdict.

Storage: every settlement step runs in a thread. Errors that clear by themselves (disk
full, read-only, stale share, folder missing) are retried with backoff while the original
waits in the work area; a name the target refuses is tried again as a safe name, then as a
flat one; what no name fixes fails the document with a reason naming folder and file.

Whatever goes wrong while settling one document costs that document only: it goes to
failed/ with the reason, and if even that cannot be done it stays claimed, listed as
needing an operator, and the daemon goes on.

A claim this daemon no longer holds (its lease ended and another daemon may have taken it
over, `ocrd/instances.py`) ends its document at once, wherever it is, without writing
anything more for it: `document.given_up`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ocrd.backoff import Backoff
from ocrd.config import DocumentOptions, InboxConfig
from ocrd.documents import crashes, failures
from ocrd.documents.pipeline import Pipeline, Progress
from ocrd.documents.sources import SourceKind, Sources, job_snapshot
from ocrd.domain import DocumentFailed, DocumentResult, DocumentSummary, Outcome, Stage
from ocrd.engines import EngineDeadError
from ocrd.files.dropped import printable
from ocrd.files.storage import Fault, classify, describe
from ocrd.intake.claim import Claim, ClaimLost, Naming, Settlement
from ocrd.intake.tasks import TaskOptions
from ocrd.log import FilteringBoundLogger, get_logger
from ocrd.output.page import PageJournal
from ocrd.output.settle import Settler
from ocrd.output.write import OutputFiles
from ocrd.status import DocumentProgress, eta

T = TypeVar("T")

STORAGE_RETRY = Backoff(first=1.0, cap=60.0)
JOB_CHANGES_TOLERATED = 1  # a scan job that changes while converted is converted once more


@dataclass(frozen=True)
class Route:
    """What a document takes from its inbox when it starts: where it goes, and how it is
    recognised and written (a reload changes the route of documents not yet started)."""

    config: InboxConfig
    settler: Settler
    options: DocumentOptions  # `auto` resolved for the engine in use
    pages: tuple[int, int] | None = None  # a task's page range: only these pages

    @classmethod
    def of(cls, config: InboxConfig, engine: str, task: TaskOptions | None = None) -> Route:
        """The inbox's route; for a task of the docling-serve API, with its options."""
        if task is not None:
            config = task.inbox_settings(config)
        pages = task.pages if task is not None else None
        return cls(config, Settler(config, engine), config.for_engine(engine), pages)


@dataclass
class InFlight:
    """A document being processed, for status reports."""

    doc: str
    inbox: str
    path: str
    progress: Progress
    alone: bool

    def report(self, now: float) -> DocumentProgress:
        progress = self.progress
        return DocumentProgress(
            doc=self.doc,
            path=printable(self.path),
            pages=progress.pages or None,
            pages_done=progress.done,
            seconds=round(now - progress.started, 1),
            eta_seconds=eta(progress.pages, progress.done, now - progress.started),
            alone=self.alone,
        )


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


class DocumentRunner:
    """Runs claimed documents through the pipeline and settles them."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
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
        route: Route,
        claim: Claim,
        failure: DocumentFailed | None = None,
        alone: bool = False,
    ) -> None:
        """Take one claim to done/ or failed/. Raises only EngineDeadError (the daemon must
        restart the engine) and CancelledError (shutdown): anything else that goes wrong
        costs this document, never the daemon."""
        log = get_logger(doc=claim.id, path=printable(claim.state.relative_path))
        try:
            await self._run(route, claim, failure, alone, log)
        except (EngineDeadError, asyncio.CancelledError):
            raise
        except ClaimLost as lost:
            self._given_up(lost, log)
        except Exception as error:  # a bug in ocrd, met while settling
            log.exception("document.internal_error", stage=Stage.settle.value)
            await self._set_aside(route, claim, error, log)

    async def _run(
        self,
        route: Route,
        claim: Claim,
        failure: DocumentFailed | None,
        alone: bool,
        log: FilteringBoundLogger,
    ) -> None:
        resumed = await self._step(lambda: route.settler.resume(claim), route, log)
        if resumed is not None:
            log.info("document.settled", outcome=resumed.outcome, resumed=True)
            return
        started = time.monotonic()
        failure = failure or crashes.verdict(claim)
        if failure is not None:
            await self._fail(route, claim, failure, started, log)
            return
        attempt = await asyncio.to_thread(claim.start_attempt)
        log.info("document.started", attempt=attempt, alone=alone)
        progress = Progress()
        self.in_flight[claim.id] = InFlight(
            claim.id, str(route.config.path), claim.state.relative_path, progress, alone
        )
        try:
            outcome = await self._convert(route, claim, log, progress, started)
            claim.check_held()  # an original gone from a claim taken over did not vanish
            if not await asyncio.to_thread(claim.path.exists):
                await asyncio.to_thread(self._vanished, claim, log)
            elif isinstance(outcome, DocumentFailed):
                await self._fail(route, claim, outcome, started, log)
            else:
                await self._succeed(route, claim, outcome, started, log)
        except EngineDeadError as error:
            recorded = False
            with contextlib.suppress(ClaimLost):  # the engine's death outranks a lost claim
                recorded = await asyncio.to_thread(crashes.record, claim, error)
            if recorded:
                log.error(
                    "document.engine_died",
                    page=error.page,
                    deaths=len(claim.state.engine_deaths),
                    action="the document runs alone after the restart; a second death with "
                    "its page in the engine sets it aside",
                )
            raise
        except asyncio.CancelledError:
            if not claim.held:
                self._given_up(ClaimLost("this daemon's lease on its work area ended"), log)
            elif claim.folder.exists():
                log.warning(
                    "document.interrupted", action="left in the work area for the next start"
                )
            raise
        finally:
            self.in_flight.pop(claim.id, None)

    async def _convert(
        self,
        route: Route,
        claim: Claim,
        log: FilteringBoundLogger,
        progress: Progress,
        arrival: float,
    ) -> DocumentResult | DocumentFailed:
        try:
            for attempt in range(1, JOB_CHANGES_TOLERATED + 2):
                sources = await asyncio.to_thread(
                    Sources.of, claim.path, claim.companion_paths, claim.folder
                )
                before = await asyncio.to_thread(_snapshot, sources)
                result = await self.pipeline.convert(
                    sources,
                    route.options,
                    claim.scratch,
                    log,
                    PageJournal(claim.journal, claim.check_held),
                    progress,
                    arrival,
                    route.pages,
                )
                if await asyncio.to_thread(_snapshot, sources.again()) == before:
                    return result
                log.warning(  # a scanner went on writing into the job after it was taken
                    "document.job_changed",
                    attempt=attempt,
                    action="converted again from its first page",
                )
                await asyncio.to_thread(claim.journal.unlink, missing_ok=True)
            return failures.job_kept_changing(JOB_CHANGES_TOLERATED + 1)
        except DocumentFailed as failure:
            return failure
        except (EngineDeadError, asyncio.CancelledError, ClaimLost):
            raise
        except Exception as error:  # a bug in ocrd must cost one document, not the daemon
            log.exception("document.internal_error")
            return failures.internal(error)

    @staticmethod
    def _given_up(lost: ClaimLost, log: FilteringBoundLogger) -> None:
        log.warning(
            "document.given_up",
            reason=str(lost),
            action="nothing more is written for it here; the daemon that took the claim "
            "over (or this one, with a new lease) finishes it",
        )

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
        route: Route,
        claim: Claim,
        result: DocumentResult,
        started: float,
        log: FilteringBoundLogger,
    ) -> None:
        try:
            settlement = await self._with_naming_fallback(
                lambda naming: route.settler.done(claim, result, route.options, naming), route, log
            )
        except StorageRefused as refused:
            if refused.fault is Fault.owner_refused:
                self._stuck(claim, str(refused), log)
                return
            failure = (
                failures.refused_everywhere(refused.error)
                if refused.fault is Fault.name_refused
                else failures.file_refused(refused.error)
            )
            await self._fail(route, claim, failure, started, log)
            return
        except ClaimLost:
            raise
        except Exception as error:  # a bug in writing costs this document only
            log.exception("document.internal_error", stage=Stage.write.value)
            await self._fail(route, claim, failures.unwritable(error), started, log)
            return
        summary = self._summary(route, claim, Outcome.done, started, settlement)
        summary.pages = len(result.pages)
        summary.prompt_tokens = result.prompt_tokens
        summary.completion_tokens = result.completion_tokens
        summary.finish_reasons = result.finish_reasons()
        summary.unfinished_pages = result.unfinished_pages
        summary.retried_pages = result.retried_pages
        summary.text_layer_pages = result.text_layer_pages
        summary.blank_pages = result.blank_pages
        summary.pages_without_text = result.pages_without_text
        summary.markdown = settlement.markdown
        markdowns = settlement.markdowns()
        pdfs = [OutputFiles(m).pdf for m in markdowns] if result.pdfs else []
        summary.pdf = str(pdfs[0]) if pdfs else None
        if result.split is not None:  # where it was cut, and each part's files
            summary.separators = result.split.separator_fields()
            if len(markdowns) > 1:
                summary.parts = [
                    {"markdown": str(m), "pages": list(pages), **({"pdf": str(p)} if pdfs else {})}
                    for m, pages, p in zip(markdowns, result.split.parts, pdfs or markdowns,
                                           strict=True)
                ]  # fmt: skip
        self._finished(route, summary, log)

    async def _fail(
        self,
        route: Route,
        claim: Claim,
        failure: DocumentFailed,
        started: float,
        log: FilteringBoundLogger,
    ) -> None:
        def plan(naming: Naming) -> Settlement:
            return route.settler.failed(claim, failure, naming)

        try:
            settlement = await self._with_naming_fallback(plan, route, log)
        except StorageRefused as refused:
            if refused.fault is Fault.owner_refused:
                self._stuck(claim, str(refused), log)
                return
            # nothing else to try: wait for an operator, the original safe
            settlement = await self._step(
                lambda: plan(Naming.flat), route, log, permanent_too=True
            )
        summary = self._summary(route, claim, Outcome.failed, started, settlement)
        summary.stage, summary.page, summary.reason = failure.stage, failure.page, failure.message
        summary.code = failure.code
        summary.error_report = settlement.error_report
        self._finished(route, summary, log)

    async def _set_aside(
        self, route: Route, claim: Claim, error: Exception, log: FilteringBoundLogger
    ) -> None:
        """After an unexpected error while settling: failed/ under a flat, safe name; if
        even that fails, the claim stays where it is, listed for an operator."""
        failure = failures.unsettled(error)
        try:
            settlement = await self._step(
                lambda: route.settler.failed(claim, failure, Naming.flat), route, log
            )
        except ClaimLost as lost:
            self._given_up(lost, log)
            return
        except Exception as again:
            why = f"cannot be settled, not even as a failure: {type(again).__name__}: {again}"
            self._stuck(claim, why, log)
            return
        summary = self._summary(route, claim, Outcome.failed, time.monotonic(), settlement)
        summary.stage, summary.reason = failure.stage, failure.message
        summary.error_report = settlement.error_report
        self._finished(route, summary, log)

    def _stuck(self, claim: Claim, reason: str, log: FilteringBoundLogger) -> None:
        """A claim that cannot be settled now: listed for people, kept in the work area,
        taken up again at the next start; ocrd goes on with other files."""
        self.stuck[claim.id] = f"{printable(claim.state.relative_path)}: {reason}"
        log.error(
            "document.stuck",
            reason=reason,
            action="left in the work area for an operator; ocrd goes on with other files",
        )

    async def _with_naming_fallback(
        self, plan: Callable[[Naming], Settlement], route: Route, log: FilteringBoundLogger
    ) -> Settlement:
        """Settle under each naming in turn while the target refuses names; StorageRefused
        once it refuses the file whatever its name, or every naming."""
        for naming in Naming:
            try:
                return await self._step(functools.partial(plan, naming), route, log)
            except StorageRefused as error:
                if error.fault is not Fault.name_refused or naming is Naming.flat:
                    raise
                log.warning(
                    "storage.name_refused",
                    error=str(error),
                    naming=naming.value,
                    action=f"trying a {list(Naming)[list(Naming).index(naming) + 1].value} name",
                )
        raise AssertionError("unreachable: the flat naming raises or returns")

    def _summary(
        self,
        route: Route,
        claim: Claim,
        outcome: Outcome,
        started: float,
        settlement: Settlement,
    ) -> DocumentSummary:
        return DocumentSummary(
            doc=claim.id,
            inbox=str(route.config.path),
            path=printable(claim.state.relative_path),
            outcome=outcome,
            seconds=time.monotonic() - started,
            original=settlement.original,
            renamed=None if settlement.naming is Naming.original else settlement.naming.value,
            finished_at=time.time(),
        )

    def _finished(self, route: Route, summary: DocumentSummary, log: FilteringBoundLogger) -> None:
        event = summary.event()
        if summary.outcome is Outcome.done:
            log.info("document.finished", **event)
        else:
            log.warning("document.finished", **event)
        for listener in self.on_finished:
            listener(route.config, summary)

    async def _step(
        self,
        action: Callable[[], T],
        route: Route,
        log: FilteringBoundLogger,
        permanent_too: bool = False,
    ) -> T:
        """Run a settlement step in a thread. Transient storage faults are retried with
        backoff, the original safe in the work area, until they clear; a refused name or
        file raises StorageRefused (unless `permanent_too`: then it is waited out too)."""
        waits = STORAGE_RETRY.delays()
        while True:
            try:
                value = await _uninterrupted(action)
            except OSError as error:
                fault = classify(error, route.settler.roots)
                if fault is not Fault.transient and not permanent_too:
                    raise StorageRefused(error, fault) from error
                delay = next(waits)
                self._storage_fault(describe(error), delay, log)
                await asyncio.sleep(delay)
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


def _snapshot(sources: Sources) -> tuple[tuple[str, int, int], ...]:
    """A scan job's files as they are now; nothing to compare for a single file."""
    return job_snapshot(sources) if sources.kind is SourceKind.folder else ()
