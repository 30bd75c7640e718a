"""One claimed document, from its work folder to done/ or failed/: the state machine.

    claimed ─▶ settlement planned earlier? ─▶ finish it ───────────────────────▶ settled
       │
       ├─▶ known to fail (still growing, set aside as poison) ─────────▶ failed/
       └─▶ convert ─▶ result ─▶ done/ (named as given, safe, flat) ───▶ settled
                 │          └─ no name works, or writing fails ────────▶ failed/
                 └─▶ DocumentFailed ────────────────────────────────────▶ failed/

Which document to blame when the engine dies is `crashes.py`'s rule; this module records
the evidence and asks for the verdict. Settling (`settling.py`) takes the result to done/
or failed/, waiting out storage faults; whatever goes wrong while settling one document
costs that document only.

A claim this daemon no longer holds (its lease ended and another daemon may have taken it
over, `ocrd/sharing/instances.py`) ends its document at once, wherever it is, without writing
anything more for it: `document.given_up`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from ocrd.config import DocumentOptions
from ocrd.documents import crashes, failures
from ocrd.documents.pipeline import DocumentContext, Pipeline, Progress
from ocrd.documents.route import Route
from ocrd.documents.settling import Finished, OriginalVanished, Settling, given_up
from ocrd.documents.sources import Inputs, SourceKind, Sources, job_snapshot, read_inputs
from ocrd.domain import DocumentFailed, DocumentResult, Stage
from ocrd.engines import EngineDeadError
from ocrd.files.dropped import printable
from ocrd.intake.claim import Claim
from ocrd.log import FilteringBoundLogger, get_logger
from ocrd.output.page import PageJournal
from ocrd.sharing.tenure import ClaimLost
from ocrd.status import DocumentProgress, eta

JOB_CHANGES_TOLERATED = 1  # a scan job that changes while converted is converted once more
# A stop that comes while a document settles lets it finish this long (file moves, its
# summary, its hooks told): only a storage fault, whose retries wait, takes longer.
SETTLE_ON_STOP_SECONDS = 10.0


@dataclass
class InFlight:
    """A document being processed, for status reports."""

    doc: str
    inbox: str
    path: str
    progress: Progress
    alone: bool
    model: str | None = None

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
            model=self.model,
        )


class DocumentRunner:
    """Runs claimed documents through the pipeline and settles them."""

    def __init__(
        self,
        pipeline: Pipeline,
        on_finished: Sequence[Finished] = (),
        on_storage_fault: Sequence[Callable[[str], None]] = (),
    ) -> None:
        """`on_finished` is told of every settled document, `on_storage_fault` of each
        storage fault met while settling (see `Settling`)."""
        self.pipeline = pipeline
        self.in_flight: dict[str, InFlight] = {}
        self.settling = Settling(on_finished, on_storage_fault)
        # What the settling keeps, reached here by the parts that report it.
        self.storage = self.settling.storage
        self.stuck = self.settling.stuck
        self.on_finished = self.settling.on_finished
        self.on_storage_fault = self.settling.on_storage_fault

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
            given_up(lost, log)
        except Exception as error:  # a bug in ocrd, met while settling
            log.exception("document.internal_error", stage=Stage.settle.value)
            await self.settling.set_aside(route, claim, error, log)

    async def _run(
        self,
        route: Route,
        claim: Claim,
        failure: DocumentFailed | None,
        alone: bool,
        log: FilteringBoundLogger,
    ) -> None:
        if claim.state.settlement is not None:  # planned by an earlier attempt: finish it
            resumed = await self.settling.step(lambda: route.settler.resume(claim), route, log)
            if resumed is not None:
                log.info("document.settled", outcome=resumed.outcome, resumed=True)
                return
        started = time.monotonic()
        failure = failure or crashes.verdict(claim)
        if failure is not None:
            await self.settling.fail(route, claim, failure, started, log)
            return
        journal = PageJournal(claim.journal, claim.check_held)
        attempt = await asyncio.to_thread(claim.start_attempt)
        log.info("document.started", attempt=attempt, alone=alone, model=route.options.model)
        progress = Progress()
        self.in_flight[claim.id] = InFlight(
            claim.id,
            str(route.config.path),
            claim.state.relative_path,
            progress,
            alone,
            route.options.model,
        )
        try:
            outcome = await self._convert(route, claim, log, progress, started, journal)
            claim.check_held()  # an original gone from a claim taken over did not vanish
            await _to_its_end(self._settle(route, claim, outcome, started, log))
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
                given_up(ClaimLost("this daemon's lease on its work area ended"), log)
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
        journal: PageJournal,
    ) -> DocumentResult | DocumentFailed:
        """Convert the claim from its sources as read when its attempt begins (a scan job
        that changed meanwhile is listed and read anew for each further try)."""
        try:
            (sources, before), first = await asyncio.to_thread(
                _begun, claim, journal, route.options
            )
            read: Inputs | None = first  # the next try of a changed job reads them anew
            for attempt in range(1, JOB_CHANGES_TOLERATED + 2):
                document = DocumentContext(
                    sources,
                    route.options,
                    claim.scratch,
                    log,
                    journal,
                    progress,
                    arrival,
                    route.pages,
                    read,
                )
                result = await self.pipeline.convert(document)
                if sources.kind is not SourceKind.folder:  # nothing a scanner adds to
                    return result
                if await asyncio.to_thread(_snapshot_again, sources) == before:
                    return result
                log.warning(  # a scanner went on writing into the job after it was taken
                    "document.job_changed",
                    attempt=attempt,
                    action="converted again from its first page",
                )
                await asyncio.to_thread(claim.journal.unlink, missing_ok=True)
                (sources, before), read = await asyncio.to_thread(_listed, claim), None
            return failures.job_kept_changing(JOB_CHANGES_TOLERATED + 1)
        except DocumentFailed as failure:
            return failure
        except (EngineDeadError, asyncio.CancelledError, ClaimLost):
            raise
        except Exception as error:  # a bug in ocrd must cost one document, not the daemon
            log.exception("document.internal_error")
            return failures.internal(error)

    async def _settle(
        self,
        route: Route,
        claim: Claim,
        outcome: DocumentResult | DocumentFailed,
        started: float,
        log: FilteringBoundLogger,
    ) -> None:
        """The outcome to done/ or failed/; nothing where the original vanished meanwhile."""
        try:
            if isinstance(outcome, DocumentFailed):
                if not await asyncio.to_thread(claim.path.exists):
                    raise OriginalVanished(claim.id)
                await self.settling.fail(route, claim, outcome, started, log)
            else:  # asks whether the original is there in its first step
                await self.settling.succeed(route, claim, outcome, started, log)
        except OriginalVanished:
            await asyncio.to_thread(self._vanished, claim, log)

    @staticmethod
    def _vanished(claim: Claim, log: FilteringBoundLogger) -> None:
        """Someone deleted the original from the work area: there is nothing to settle."""
        log.warning(
            "document.vanished",
            reason="the original was deleted from the work area while it was processed",
            action="no output is written for it",
        )
        claim.release()


Snapshot = tuple[tuple[str, int, int], ...]  # a scan job's files: path, size, mtime
Listed = tuple[Sources, Snapshot]
Begun = tuple[Listed, Inputs]  # what an attempt read before its first page


def _begun(claim: Claim, journal: PageJournal, settings: DocumentOptions) -> Begun:
    """The claim's sources listed and read, in one thread hop (an error reading them is
    the conversion's, raised where it handles its errors)."""
    listed = _listed(claim)
    return listed, read_inputs(listed[0], journal, settings, claim.scratch)


def _listed(claim: Claim) -> Listed:
    """The claim's sources and a scan job's snapshot."""
    sources = Sources.of(claim.path, claim.companion_paths, claim.folder)
    return sources, _snapshot(sources)


def _snapshot_again(sources: Sources) -> Snapshot:
    """A scan job listed anew, and its snapshot (what a scanner added since)."""
    return _snapshot(sources.again())


def _snapshot(sources: Sources) -> Snapshot:
    """A scan job's files as they are now; nothing to compare for a single file."""
    return job_snapshot(sources) if sources.kind is SourceKind.folder else ()


async def _to_its_end(settling: Coroutine[Any, Any, None]) -> None:
    """Settle a converted document even if the daemon stops meanwhile (then re-raise the
    cancellation): stopped between its steps, a document would be in done/ with no summary
    logged and no hook told. Past SETTLE_ON_STOP_SECONDS it is stopped, its claim kept."""
    task = asyncio.ensure_future(settling)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task}, timeout=SETTLE_ON_STOP_SECONDS)
        task.cancel()  # nothing, where it has ended
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task  # its error, if any, is the stop's to pass over: the claim stays
        raise
