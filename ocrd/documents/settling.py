"""Settling a document: its result (or its failure) taken to done/ or failed/ through the
output stage's Settler, each step in a thread. Errors that clear by themselves (disk full,
read-only, stale share, folder missing) are retried with backoff while the original waits
in the work area; a name the target refuses is tried again as a safe name, then as a flat
one; what no name fixes fails the document with a reason naming folder and file; a claim
that cannot be settled even as a failure stays where it is, listed for an operator. Told
of every settled document: `on_finished` (hooks, metrics, the status page)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from ocrd.backoff import Backoff
from ocrd.config import InboxConfig
from ocrd.documents import failures
from ocrd.documents.route import Route
from ocrd.domain import DocumentFailed, DocumentResult, DocumentSummary, Outcome, Stage
from ocrd.files.dropped import printable
from ocrd.files.storage import Fault, classify, describe
from ocrd.intake.claim import Claim, Naming, Settlement
from ocrd.log import FilteringBoundLogger
from ocrd.output.write import OutputFiles
from ocrd.sharing.tenure import ClaimLost

T = TypeVar("T")

STORAGE_RETRY = Backoff(first=1.0, cap=60.0)


class StorageRefused(Exception):
    """The target refuses this file or its name; retrying the same step cannot help."""

    def __init__(self, error: OSError, fault: Fault) -> None:
        super().__init__(describe(error))
        self.error = error
        self.fault = fault


class OriginalVanished(Exception):
    """The original was deleted from the work area while it was processed: there is
    nothing to settle."""


@dataclass
class StorageHealth:
    fault: str | None = None
    since: float = 0.0  # wall-clock seconds


def given_up(lost: ClaimLost, log: FilteringBoundLogger) -> None:
    log.warning(
        "document.given_up",
        reason=str(lost),
        action="nothing more is written for it here; the daemon that took the claim "
        "over (or this one, with a new lease) finishes it",
    )


# Told of a settled document, with its inbox's settings as they were when it started.
Finished = Callable[[InboxConfig, DocumentSummary], None]


class Settling:
    """Settles documents, and keeps what an operator must know of that: the storage fault
    being waited out, and the claims that could not be settled at all."""

    def __init__(
        self,
        on_finished: Sequence[Finished] = (),
        on_storage_fault: Sequence[Callable[[str], None]] = (),
    ) -> None:
        """`on_finished` is told of every settled document, with its inbox's settings as
        they were when it started (hooks, metrics, the status page); `on_storage_fault` of
        each storage fault met while settling."""
        self.storage = StorageHealth()
        # Claims that could not be settled even as failures, by id: what an operator must
        # look at (they stay in the work area until the next start).
        self.stuck: dict[str, str] = {}
        self.on_finished = list(on_finished)
        self.on_storage_fault = list(on_storage_fault)

    async def succeed(
        self,
        route: Route,
        claim: Claim,
        result: DocumentResult,
        started: float,
        log: FilteringBoundLogger,
    ) -> None:
        """Take the result to done/; OriginalVanished, nothing written, where the original
        is gone from the work area (asked in the first step's thread hop, not one of its
        own)."""
        looked = False

        def settle(naming: Naming) -> Settlement:
            nonlocal looked
            if not looked:
                if not claim.path.exists():
                    raise OriginalVanished(claim.id)
                looked = True
            return route.settler.done(claim, result, route.options, naming)

        try:
            settlement = await self._with_naming_fallback(settle, route, log)
        except StorageRefused as refused:
            if refused.fault is Fault.owner_refused:
                self._stuck(claim, str(refused), log)
                return
            failure = (
                failures.refused_everywhere(refused.error)
                if refused.fault is Fault.name_refused
                else failures.file_refused(refused.error)
            )
            await self.fail(route, claim, failure, started, log)
            return
        except (ClaimLost, OriginalVanished):
            raise
        except Exception as error:  # a bug in writing costs this document only
            log.exception("document.internal_error", stage=Stage.write.value)
            await self.fail(route, claim, failures.unwritable(error), started, log)
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
        summary.pdf_not_made = result.pdf_not_made
        summary.pictures_unread = result.pictures_unread
        if result.split is not None:  # where it was cut, and each part's files
            summary.separators = result.split.separator_fields()
            if len(markdowns) > 1:
                summary.parts = [
                    {"markdown": str(m), "pages": list(pages), **({"pdf": str(p)} if pdfs else {})}
                    for m, pages, p in zip(
                        markdowns, result.split.parts, pdfs or markdowns, strict=True
                    )
                ]
        self._finished(route, summary, log)

    async def fail(
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
            settlement = await self.step(lambda: plan(Naming.flat), route, log, permanent_too=True)
        summary = self._summary(route, claim, Outcome.failed, started, settlement)
        summary.stage, summary.page, summary.reason = failure.stage, failure.page, failure.message
        summary.code = failure.code
        summary.error_report = settlement.error_report
        self._finished(route, summary, log)

    async def set_aside(
        self, route: Route, claim: Claim, error: Exception, log: FilteringBoundLogger
    ) -> None:
        """After an unexpected error while settling: failed/ under a flat, safe name; if
        even that fails, the claim stays where it is, listed for an operator."""
        failure = failures.unsettled(error)
        try:
            settlement = await self.step(
                lambda: route.settler.failed(claim, failure, Naming.flat), route, log
            )
        except ClaimLost as lost:
            given_up(lost, log)
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
                return await self.step(functools.partial(plan, naming), route, log)
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
            model=route.options.model,
        )

    def _finished(self, route: Route, summary: DocumentSummary, log: FilteringBoundLogger) -> None:
        event = summary.event()
        if summary.outcome is Outcome.done:
            log.info("document.finished", **event)
        else:
            log.warning("document.finished", **event)
        for listener in self.on_finished:
            listener(route.config, summary)

    async def step(
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
