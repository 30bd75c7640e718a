"""Intake: the inboxes being served, and the files in them that are ready to be taken.

Each inbox has a watcher (`watch.py`) that makes paths candidates, a tracker that says
when a candidate has been quiet long enough, with `collate: true` a collator that pairs a
fronts file with its backs, and the list of files ocrd's user may not move out (shown
with their fix until someone fixes them). `collect` turns what became ready into jobs for
the dispatcher; adding an inbox also takes up the claims an earlier run left in its work
area.

Several daemons may serve one inbox (`ocrd/sharing/instances.py`): each holds a lease on the work
area and keeps its claims in its own folder there; adding an inbox takes the lease first.
Claims taken over from a daemon that died, or this daemon's own claims after it took a new
lease, become jobs here too.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ocrd.config import InboxConfig
from ocrd.files import remove_stale_temporaries
from ocrd.files.dropped import Identity, printable
from ocrd.intake.claim import Claim, Destinations
from ocrd.intake.claiming import NotClaimable, WorkArea
from ocrd.intake.collate import Collator
from ocrd.intake.watch import InboxWatcher, QuietTracker, stat_all
from ocrd.log import get_logger
from ocrd.sharing.instances import Instances
from ocrd.sharing.leases import TakenOver
from ocrd.status import WAITING_LISTED, BlockedFile, WaitingFile


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
    tracker: QuietTracker
    watcher: InboxWatcher
    collator: Collator | None = None  # with `collate: true`: a fronts file waiting
    blocked: dict[Path, Blocked] = field(default_factory=dict)
    # Claim folders kept for an operator: what arrived in them is not what was checked.
    quarantined: dict[Path, str] = field(default_factory=dict)

    def shown(self, path: Path) -> str:
        """`path` relative to the inbox, printable whatever its bytes."""
        return printable(str(path.relative_to(self.config.path)))


@dataclass
class Job:
    """A document to start: a ready file (or job folder) still in its inbox, or a claim an
    earlier run left."""

    inbox: Inbox
    path: Path | None = None  # a ready file in the inbox, still to be claimed
    identity: Identity | None = None  # the file that settled there
    companions: tuple[Path, ...] = ()  # claimed with it: a duplex's backs file
    claim: Claim | None = None  # or a claim recovered from the work area
    # It never stopped changing (max_settle_wait_seconds): it fails without being read.
    still_growing: bool = False
    unreadable: str | None = None  # a job folder that cannot be read whole: it fails so
    since: float = field(default_factory=time.monotonic)  # first seen

    @property
    def relative_path(self) -> str:
        if self.claim is not None:
            return printable(self.claim.state.relative_path)
        assert self.path is not None
        return self.inbox.shown(self.path)


# A file waiting, as `Intake.arriving` and `DocumentDispatcher.queued` list it: since when
# (monotonic), whether it is ready, and where it is (a path in the inbox, or its job).
Waiting = tuple[float, bool, Path | Job]


class Intake:
    def __init__(self, instances: Instances) -> None:
        self.instances = instances
        self.inboxes: list[Inbox] = []
        # Ready files given out as jobs (or waiting to be paired) and not yet claimed: a
        # rescan finding one of them again must not make a second job of it.
        self._pending: set[Path] = set()
        self.log = get_logger()

    # --- the inboxes -------------------------------------------------------------------

    async def add(self, config: InboxConfig, recover: bool = True) -> tuple[Inbox, list[Job]]:
        """Serve an inbox: hold a lease on its work area, sweep what a killed run left,
        watch it; the claims it left, as jobs (oldest first) where `recover`."""
        lease = await self.instances.join(config.work)
        destinations = Destinations(config.outbox, config.done, config.failed)
        work = WorkArea(config.path, self.instances.claims_folder(config.work), lease, destinations)
        tracker = QuietTracker(config)

        def unlisted(folder: Path) -> None:
            self.block(inbox, folder, unlistable())

        inbox = Inbox(
            config=config,
            work=work,
            tracker=tracker,
            watcher=InboxWatcher(config, asyncio.get_running_loop(), tracker.observe, unlisted),
            collator=Collator(config.collate_window_seconds) if config.collate else None,
        )
        jobs = []
        if recover:
            name = self.instances.name
            claims = await asyncio.to_thread(_swept_and_recovered, config, work, name)
            jobs = self._recovered(inbox, claims, "document.recovered")
        await inbox.watcher.start()
        watcher = inbox.watcher
        self.log.info(
            "inbox.watching",
            inbox=str(config.path),
            polling=watcher.polling,
            reason=watcher.polling_reason,
        )
        self.inboxes.append(inbox)
        return inbox, jobs

    async def remove(self, path: Path) -> Inbox | None:
        """Stop watching an inbox; files not yet claimed stay in it."""
        inbox = next((i for i in self.inboxes if i.config.path == path), None)
        if inbox is None:
            return None
        await asyncio.to_thread(inbox.watcher.stop)
        self.inboxes.remove(inbox)
        return inbox

    async def replace(self, config: InboxConfig) -> tuple[Inbox | None, Inbox]:
        """New settings for an inbox (the old one and the new); a fronts file waiting for
        its backs keeps waiting."""
        old = await self.remove(config.path)
        new, _ = await self.add(config, recover=False)
        if old is not None and old.collator is not None and new.collator is not None:
            new.collator.fronts = old.collator.fronts
        return old, new

    async def stop(self) -> None:
        """Stop watching every inbox. A watch that fails to stop (watchdog's bookkeeping
        can break when folders are renamed under it in a loop) is logged, not raised: the
        stop goes on, and the documents in flight are drained all the same."""
        for inbox in list(self.inboxes):
            try:
                await asyncio.to_thread(inbox.watcher.stop)
            except Exception as error:
                self.log.warning(
                    "inbox.unwatch_failed",
                    inbox=str(inbox.config.path),
                    error=printable(f"{type(error).__name__}: {error}"),
                    action="ocrd stops all the same; its files are looked at again at the "
                    "next start",
                )

    # --- claims that became this daemon's --------------------------------------------------

    def on_work(self, work: Path) -> list[Inbox]:
        """The inboxes served whose work area is `work` (one, or none after a reload)."""
        return [inbox for inbox in self.inboxes if inbox.config.work == work]

    def _recovered(self, inbox: Inbox, claims: list[Claim], event: str, **facts: str) -> list[Job]:
        """Jobs of claims found in this daemon's folder (`event` says how they came);
        quarantined claims are listed, never processed."""
        jobs = []
        for claim in claims:
            if claim.state.quarantine:
                self.quarantine(inbox, claim.folder, claim.state.quarantine)
                continue
            self.log.info(
                event,
                doc=claim.id,
                path=printable(claim.state.relative_path),
                attempts=claim.state.attempts,
                **facts,
            )
            jobs.append(Job(inbox, claim=claim))
        return jobs

    async def regained(self, work: Path) -> list[Job]:
        """A new lease on `work`: the claims left in this daemon's folder there are its
        own again (those the daemon that took the lease over did not move), and what its
        given-up documents left half-written is swept away (a write of another inbox's
        document into a shared outbox that this meets is only retried)."""
        lease = self.instances.lease(work)
        jobs = []
        for inbox in self.on_work(work):
            inbox.work.tenure = lease
            name = self.instances.name
            claims = await asyncio.to_thread(_swept_and_recovered, inbox.config, inbox.work, name)
            jobs += self._recovered(inbox, claims, "document.recovered")
        return jobs

    async def taken_over(self, work: Path, taken: TakenOver) -> list[Job]:
        """Claims moved into this daemon's folder from a daemon that died: what that one
        left half-written is swept away, and its documents are this daemon's jobs."""
        jobs: list[Job] = []
        for inbox in self.on_work(work):
            claims = await asyncio.to_thread(_swept_and_adopted, inbox, taken)
            jobs += self._recovered(inbox, claims, "document.taken_over", from_instance=taken.owner)
        return jobs

    # --- what became ready ---------------------------------------------------------------

    async def collect(self) -> list[Job]:
        """Jobs for the files that became ready since the last call."""
        jobs: list[Job] = []
        for inbox in self.inboxes:
            jobs += self._collate_expired(inbox)
            paths = inbox.tracker.due()
            if not paths:
                continue
            outcomes = await asyncio.to_thread(stat_all, paths, inbox.config.path)
            for ready in inbox.tracker.ready(outcomes):
                if ready.path in self._pending:
                    continue
                self._pending.add(ready.path)
                if ready.still_growing:
                    jobs.append(Job(inbox, ready.path, still_growing=True, since=ready.first_seen))
                elif inbox.collator is not None and not ready.folder:
                    jobs += self._collate(inbox, ready.path, ready.first_seen)
                else:
                    job = Job(inbox, ready.path, ready.identity, since=ready.first_seen)
                    job.unreadable = ready.unreadable
                    jobs.append(job)
        return jobs

    def release(self, job: Job) -> None:
        """A job's files are being claimed (or no longer served): a later look may find
        them again."""
        self._pending.difference_update(
            (job.path, *job.companions) if job.path is not None else job.companions
        )

    def _collate(self, inbox: Inbox, path: Path, first_seen: float) -> list[Job]:
        """In a collating inbox a file waits as the fronts, or completes a pair."""
        assert inbox.collator is not None
        pair = inbox.collator.add(path, first_seen)
        if pair is None:
            self.log.info(
                "collate.fronts_waiting",
                path=printable(str(path)),
                window_seconds=inbox.config.collate_window_seconds,
            )
            return []
        fronts, backs = pair
        self.log.info("collate.paired", fronts=printable(str(fronts)), backs=printable(str(backs)))
        return [Job(inbox, fronts, companions=(backs,), since=first_seen)]

    def _collate_expired(self, inbox: Inbox) -> list[Job]:
        alone = inbox.collator.expired() if inbox.collator is not None else None
        if alone is None:
            return []
        self.log.info(
            "collate.alone",
            path=printable(str(alone.path)),
            reason=f"no backs file came within {inbox.config.collate_window_seconds:g} s; "
            "converted as it is",
        )
        return [Job(inbox, alone.path, since=alone.first_seen)]

    async def rescan(self) -> None:
        """Every inbox again, for events that were missed; forget blocked files that are
        gone (their owner moved or deleted them)."""
        for inbox in self.inboxes:
            await inbox.watcher.rescan()
            if inbox.blocked:
                cleared = await asyncio.to_thread(_cleared, list(inbox.blocked))
                for path in cleared:
                    self.taken(inbox, path)

    # --- files ocrd may not take ---------------------------------------------------------

    def block(self, inbox: Inbox, path: Path, refusal: NotClaimable) -> None:
        """List a file ocrd cannot take (logged once, not at every rescan)."""
        known = inbox.blocked.get(path)
        if known is not None and known.reason == refusal.reason:
            return
        inbox.blocked[path] = Blocked(refusal.reason, refusal.fix, time.time())
        self.log.warning(
            "file.blocked",
            path=printable(str(path)),
            reason=refusal.reason,
            fix=refusal.fix,
            action="left in the inbox and listed on the status page; tried again at every rescan",
        )

    def quarantine(self, inbox: Inbox, folder: Path, reason: str) -> None:
        """List a claim folder that is kept for an operator, never processed."""
        inbox.quarantined[folder] = reason
        self.log.error(
            "claim.quarantined",
            folder=printable(str(folder)),
            reason=reason,
            action="kept in the work area and never processed; look at it, then move or "
            "remove it by hand",
        )

    def taken(self, inbox: Inbox, path: Path) -> None:
        """A file was claimed (or went away): it is no longer blocked."""
        if inbox.blocked.pop(path, None) is not None:
            self.log.info("file.unblocked", path=printable(str(path)))

    # --- facts for the status report -----------------------------------------------------

    def waiting_count(self) -> int:
        collating = sum(1 for i in self.inboxes if i.collator is not None and i.collator.fronts)
        return sum(len(inbox.tracker) for inbox in self.inboxes) + collating

    @staticmethod
    def arriving(inbox: Inbox) -> list[Waiting]:
        """Files of `inbox` not yet ready: still changing, or a fronts file waiting. Plain
        tuples, cheap for thousands: only those listed are made into reports."""
        blocked = inbox.blocked
        waiting: list[Waiting] = [
            (seen, False, path) for path, seen in inbox.tracker.waiting() if path not in blocked
        ]
        fronts = inbox.collator.fronts if inbox.collator is not None else None
        if fronts is not None:
            waiting.append((fronts.first_seen, True, fronts.path))
        return waiting

    @staticmethod
    def listed(inbox: Inbox, waiting: Waiting, now: float) -> WaitingFile:
        """One waiting file as the status report lists it."""
        since, ready, where = waiting
        shown = where.relative_path if isinstance(where, Job) else inbox.shown(where)
        return WaitingFile(path=shown, waiting_seconds=round(now - since, 1), ready=ready)

    @staticmethod
    def blocked_files(inbox: Inbox) -> list[BlockedFile]:
        return [
            BlockedFile(path=inbox.shown(path), reason=b.reason, fix=b.fix, since=b.since)
            for path, b in list(inbox.blocked.items())[:WAITING_LISTED]
        ]

    def problems(self) -> list[str]:
        problems = []
        for inbox in self.inboxes:
            if inbox.watcher.missing:
                problems.append(f"INBOX MISSING: {inbox.config.path}")
            elif not inbox.watcher.watching:
                problems.append(f"inbox not watched: {inbox.config.path}")
        return problems

    def attention(self) -> list[str]:
        lines = [
            f"quarantined claim {printable(str(folder))}: {reason}; move or remove it by hand"
            for inbox in self.inboxes
            for folder, reason in inbox.quarantined.items()
        ]
        for inbox in self.inboxes:
            if inbox.blocked:
                count = len(inbox.blocked)
                lines.append(
                    f"{count} file{'s' if count > 1 else ''} in {inbox.config.path} cannot be "
                    "taken (no permission); see the status page for why and how to fix it"
                )
        return lines


def _sweep(config: InboxConfig, instance: str) -> None:
    """Remove the temporaries `instance` (not running) left in the output folders."""
    for folder in (config.outbox, config.done, config.failed):
        if folder.is_dir():
            remove_stale_temporaries(folder, instance)


def _swept_and_recovered(config: InboxConfig, work: WorkArea, instance: str) -> list[Claim]:
    """Sweep temporaries a killed run left; the claims it left, oldest first. Blocking."""
    _sweep(config, instance)
    return work.recover()


def unlistable() -> NotClaimable:
    return NotClaimable(
        "ocrd's user may not list this folder, so the files in it cannot even be seen",
        "let ocrd's group read it (chgrp ocrd; chmod g+rx) or set the inbox up as the "
        "manual's 'A shared inbox' (docs/sharing.md) says",
    )


def _cleared(paths: list[Path]) -> list[Path]:
    """Blocked entries that are gone (their owner moved or deleted them), and folders that
    may be listed now (their files are found by the rescan). Blocking."""
    return [
        path
        for path in paths
        if not os.path.lexists(path) or (path.is_dir() and os.access(path, os.R_OK | os.X_OK))
    ]


def _swept_and_adopted(inbox: Inbox, taken: TakenOver) -> list[Claim]:
    """Sweep the temporaries of a daemon whose claims were taken over; its claims now in
    this daemon's folder, oldest first. Blocking."""
    _sweep(inbox.config, taken.owner)
    claims = [inbox.work.adopt(folder) for folder in taken.folders]
    return sorted((claim for claim in claims if claim is not None), key=lambda c: c.folder.name)
