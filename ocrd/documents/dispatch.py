"""Dispatching: ready files and recovered claims wait in line, and are claimed and started
as documents while there is room.

`Admission` is the room: at most `limit` documents at once, and a document struck by an
engine crash (`crashes.py`) runs alone, with nothing beside it. A document's place is given
back in its task's done-callback, which runs on every path (done, failed, cancelled before
its first step).

Nothing of an inbox is claimed or started while this daemon does not hold its lease on the
inbox's work area (`ocrd/sharing/instances.py`); when the lease is lost, `give_up` stops that
inbox's documents and drops its recovered claims from the line. Nor while the engine of the
inbox's model takes no pages (garbled, unreachable): its files wait in line, behind them the
other inboxes' go on. Where other daemons serve
the inbox too, a daemon claims a new file only while few of its documents wait for the
engine: a file it claimed and could not start soon would wait for it while another daemon
with room would already convert it.
"""

from __future__ import annotations

import asyncio
import errno
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ocrd.documents import crashes, failures
from ocrd.documents.document import DocumentRunner
from ocrd.documents.route import Route
from ocrd.domain import DocumentFailed, Stage
from ocrd.engines import EngineState
from ocrd.engines.models import model_health
from ocrd.files.dropped import printable
from ocrd.intake.claim import Claim
from ocrd.intake.claiming import Changed, NotClaimable
from ocrd.intake.inboxes import Inbox, Intake, Job, Waiting
from ocrd.log import get_logger
from ocrd.sharing.tenure import ClaimLost
from ocrd.uploads.receiving import upload_of
from ocrd.uploads.tasks import TaskRecordError, task_of

# Running out of descriptors or memory is the daemon's state, not the file's: try again.
RETRY_CLAIM_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC})
# Beside other daemons, documents of this one waiting for the engine (or still opening) at
# which it claims no new file: one keeps the engine's batch full (its pages take every free
# slot), a second lets a small file start beside a book.
SHARED_WAITING_DOCUMENTS = 2
# One round of claiming takes at most this long, so that the main loop goes on ticking
# (the watchdog, the status) while documents that fail at once keep making room.
DISPATCH_SECONDS = 0.5


class Admission:
    """How many documents may run at once, and whether one must run alone."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running: set[asyncio.Task[None]] = set()
        self._alone: asyncio.Task[None] | None = None

    def resize(self, limit: int) -> None:
        """A new limit (a reload, a fleet that grew or shrank); documents running stay."""
        self.limit = limit

    def admits(self, alone: bool) -> bool:
        if self._alone is not None or len(self.running) >= self.limit:
            return False
        return not (alone and self.running)

    def admit(self, task: asyncio.Task[None], alone: bool) -> None:
        self.running.add(task)
        if alone:
            self._alone = task
        task.add_done_callback(self._release)

    def _release(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        if task is self._alone:
            self._alone = None


def runs_alone(job: Job) -> bool:
    """A recovered claim struck by an engine crash runs with no other document."""
    return job.claim is not None and crashes.runs_alone(job.claim)


def known_failure(job: Job) -> DocumentFailed | None:
    """Why a job fails before it is read, if it does."""
    if job.still_growing:
        return failures.still_growing(job.inbox.config.max_settle_wait_seconds)
    if job.unreadable:
        return DocumentFailed(Stage.detect, job.unreadable, error_type="UnreadableJob")
    return None


class DocumentDispatcher:
    def __init__(
        self,
        intake: Intake,
        runner: DocumentRunner,
        admission: Admission,
        on_crash: Callable[[BaseException], None],
        shared: Callable[[Inbox], bool],
        stopping: asyncio.Event,
    ) -> None:
        """`on_crash` is told of a document task that ended with an exception (a dead
        engine, or a bug that escaped the document's state machine); `shared` says whether
        other live daemons serve an inbox too; once `stopping` is set nothing more is
        claimed or started (claiming ends the moment it is set)."""
        self.intake = intake
        self.runner = runner
        self.admission = admission
        self.on_crash = on_crash
        self.shared = shared
        self.stopping = stopping
        self.jobs: deque[Job] = deque()
        self.documents: dict[asyncio.Task[None], tuple[Inbox, Claim]] = {}
        self.log = get_logger()

    def add(self, jobs: list[Job]) -> None:
        self.jobs.extend(jobs)

    async def dispatch(self) -> None:
        """Claim and start documents while there is room; the line keeps its order, so a
        document that must run alone waits for the others to finish. Jobs of an inbox whose
        lease is not held now wait (behind them, the others go on)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + DISPATCH_SECONDS
        while not self.stopping.is_set() and loop.time() < until:
            index = next((i for i, job in enumerate(self.jobs) if self._may_start(job)), None)
            if index is None or not self.admission.admits(runs_alone(self.jobs[index])):
                return
            job = self.jobs[index]
            del self.jobs[index]
            claim = job.claim or await self._claim(job)
            if claim is None:
                continue
            alone = runs_alone(job)
            route, failure = await self._route(job, claim)
            task = asyncio.create_task(self.runner.run(route, claim, failure, alone))
            self.admission.admit(task, alone)
            self.documents[task] = (job.inbox, claim)
            task.add_done_callback(self._finished)

    async def _route(self, job: Job, claim: Claim) -> tuple[Route, DocumentFailed | None]:
        """The claim's route: its inbox's, with its task's options where it is a task of
        the docling-serve API; and why it fails before it is read, if it does."""
        engine, config = self.runner.pipeline.engine.name, job.inbox.config
        if upload_of(claim.state.relative_path) is None:  # not a task: no record to read
            return Route.of(config, engine), known_failure(job)
        try:
            task = await asyncio.to_thread(task_of, config, claim.relative_path)
        except TaskRecordError as error:
            return Route.of(config, engine), failures.task_unreadable(str(error))
        return Route.of(config, engine, task), known_failure(job)

    def _may_start(self, job: Job) -> bool:
        """Its inbox's lease held and its model's engine reading (a model whose engine is
        garbled or unreachable pauses its own inboxes only); and a new file beside other
        daemons only while few of this one's documents wait for the engine (a claim
        already held is this daemon's to run)."""
        if not job.inbox.work.tenure.holds():
            return False
        if not self.takes_pages(job.inbox.config.model):
            return False
        if job.claim is not None or not self.shared(job.inbox):
            return True
        return self.waiting_documents() < SHARED_WAITING_DOCUMENTS

    def takes_pages(self, model: str) -> bool:
        """Whether the engine serving `model` takes pages now."""
        health = model_health(self.runner.pipeline.engine, model)
        return health.state is EngineState.ready

    def waiting_documents(self) -> int:
        """Documents of this daemon still opening, or waiting for a page slot."""
        opening = sum(1 for flight in self.runner.in_flight.values() if not flight.progress.pages)
        return opening + self.runner.pipeline.budget.waiting

    async def _claim(self, job: Job) -> Claim | None:
        assert job.path is not None
        self.intake.release(job)
        inbox, path = job.inbox, job.path
        shown = printable(str(path))
        try:
            claim = await asyncio.to_thread(inbox.work.claim, path, job.identity, job.companions)
        except NotClaimable as refusal:
            self.intake.block(inbox, path, refusal)
            return None
        except ClaimLost:  # the lease ran out just now: the file waits for the next one
            inbox.tracker.observe(path)
            return None
        except Changed as changed:
            if changed.quarantined is not None:
                self.intake.quarantine(inbox, changed.quarantined, str(changed))
            self.log.warning(
                "file.changed",
                path=shown,
                reason=str(changed),
                action="left alone; if it is a file it is looked at again",
            )
            inbox.tracker.observe(path)
            return None
        except OSError as error:
            transient = error.errno in RETRY_CLAIM_ERRNOS
            self.log.error(
                "file.claim_deferred" if transient else "file.claim_failed",
                path=shown,
                error=printable(str(error)),
                action="left in the inbox; tried again "
                + ("shortly" if transient else "at the next rescan"),
            )
            if transient:
                inbox.tracker.observe(path)
            return None
        self.intake.taken(inbox, path)
        if claim is None:
            # beside other daemons, usually one of them took it: no news
            log = self.log.debug if self.shared(inbox) else self.log.info
            log("file.vanished", path=shown, reason="gone before it was claimed")
            return None
        if self.stopping.is_set():  # the rename was under way as the stop came
            self.log.warning(
                "document.interrupted",
                doc=claim.id,
                path=printable(claim.state.relative_path),
                action="claimed as ocrd stopped; left in the work area for the next start",
            )
            return None
        self.log.info(
            "document.claimed",
            doc=claim.id,
            path=printable(claim.state.relative_path),
            inbox=str(inbox.config.path),
            **({"companions": claim.state.companions} if claim.state.companions else {}),
        )
        return claim

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.documents.pop(task, None)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self.on_crash(error)

    def forget(self, inbox: Inbox) -> int:
        """Drop the not yet claimed files of an inbox no longer served; how many."""
        unclaimed = [job for job in self.jobs if job.inbox is inbox and job.claim is None]
        for job in unclaimed:
            self.jobs.remove(job)
            self.intake.release(job)
        return len(unclaimed)

    async def give_up(self, work: Path) -> list[str]:
        """This daemon's lease on the work area `work` is lost: stop the documents of its
        claims (they write nothing more) and drop its recovered claims from the line;
        returns once the documents have stopped, with their paths."""

        def there(inbox: Inbox) -> bool:
            return inbox.config.work == work  # also an inbox replaced by a reload since

        dropped = [job for job in self.jobs if there(job.inbox) and job.claim is not None]
        for job in dropped:
            self.jobs.remove(job)
        stopping = {task: claim for task, (inbox, claim) in self.documents.items() if there(inbox)}
        for task in stopping:
            task.cancel()
        await asyncio.gather(*stopping, return_exceptions=True)
        claims = [*stopping.values(), *(job.claim for job in dropped if job.claim is not None)]
        return [printable(claim.state.relative_path) for claim in claims]

    @property
    def running(self) -> int:
        return len(self.admission.running)

    async def drain(self, grace_seconds: float) -> None:
        """In-flight documents get the grace period; the rest stay claimed for next time."""
        tasks = set(self.admission.running)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace_seconds)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    def queued(self, inbox: Inbox) -> list[Waiting]:
        """The files of `inbox` ready and in line (as `Intake.arriving` lists them)."""
        return [(job.since, True, job) for job in self.jobs if job.inbox is inbox]
