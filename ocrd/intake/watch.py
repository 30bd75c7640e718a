"""Watching: which files in an inbox are candidates, and when each is ready to take.

Events come from watchdog (inotify, or polling for SMB/NFS mounts where inotify is silent),
from a scan at start-up and from a periodic rescan that catches whatever events missed.
An event only makes a path a candidate; a candidate is ready once it has been quiet: two
looks at it `settle_seconds` apart found the same size, mtime and inode, so a scanner or a
slow copy is never read half-written. A folder whose name matches the inbox's
`job_folders` is a scan job: it is one candidate (an event for any file in it is an event
for the folder), and it is ready once it holds files and none of them (their number, sizes,
mtimes) changed for `settle_seconds`.

On a network filesystem inotify reports only what this machine did, never a file another
machine (a scanner, a person's PC, another ocrd) wrote to the share, so `polling: auto`
polls there (`polling_of`).

Nothing here blocks the event loop: the daemon asks which candidates are due for a look,
stats them in a thread, and hands the results back. A candidate is looked at only when an
event arrived for it or its quiet time is up, not every tick. A file whose stat fails with
an OS error (EIO, ESTALE on a network share) is logged once and looked at again later.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import heapq
import itertools
import os
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserverVFS

from ocrd.backoff import Backoff
from ocrd.config import InboxConfig
from ocrd.config.inboxes import is_candidate_name, job_folder_of
from ocrd.files.dropped import Identity, link_on_the_way, printable
from ocrd.intake.mounts import polling_of
from ocrd.log import get_logger

STAT_RETRY = Backoff(first=1.0, cap=60.0)
# Candidates looked at in one tick at most (the rest in the next ones): a backlog of
# thousands is looked at in short steps, so a stop or a status request waits for none.
DUE_PER_TICK = 1000


class CandidateKind(StrEnum):
    file = "file"
    folder = "folder"  # a scan job's folder
    link = "link"  # a symbolic link, or a path through a linked folder
    other = "other"  # a FIFO, a socket, a device


@dataclass(frozen=True)
class Look:
    """What one look at a candidate found."""

    kind: CandidateKind
    signature: tuple[int, ...] = ()  # changes whenever the candidate's content does
    files: int = 1  # files in a job folder
    identity: Identity | None = None  # which file (or folder) it is
    unreadable: str | None = None  # why a job folder cannot be read whole, if it cannot


StatOutcome = Look | OSError


def scan(inbox: InboxConfig, root: Path | None = None) -> tuple[list[Path], list[OSError]]:
    """Every candidate path under `root` (the inbox by default; hidden folders are not
    entered), and the errors met on the way. Blocking: run it in a thread."""
    found: list[Path] = []
    errors: list[OSError] = []
    if root is not None and root.is_symlink():
        return found, errors  # a linked folder moved in: never walked
    for folder, folders, files in os.walk(root or inbox.path, onerror=errors.append):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        jobs = [
            name
            for name in folders
            if job_folder_of((Path(folder) / name).relative_to(inbox.path), inbox, True)
        ]
        found += [Path(folder) / name for name in jobs]  # one candidate, not entered
        folders[:] = [name for name in folders if name not in jobs]
        if not inbox.recursive:
            folders.clear()
        for name in sorted(files):
            path = Path(folder) / name
            if is_candidate_name(path.relative_to(inbox.path), inbox):
                found.append(path)
    return found, errors


def look_at(path: Path, inbox: Path) -> Look:
    """One look at a candidate; OSError if it cannot be looked at. A path that passes
    through a linked folder is a link: it leads out of what was dropped. Blocking."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or link_on_the_way(inbox, path) is not None:
        return Look(CandidateKind.link)
    identity = Identity.of(info)
    if stat.S_ISREG(info.st_mode):
        signature = (info.st_size, info.st_mtime_ns, info.st_ino)
        return Look(CandidateKind.file, signature, identity=identity)
    if not stat.S_ISDIR(info.st_mode):
        return Look(CandidateKind.other)
    files, size, latest = 0, 0, info.st_mtime_ns
    errors: list[OSError] = []
    for root, folders, names in os.walk(path, onerror=errors.append):
        try:
            latest = max(latest, os.lstat(root).st_mtime_ns)
            folders[:] = [name for name in folders if not name.startswith(".")]
            for name in names:
                entry = os.lstat(os.path.join(root, name))
                files, size = files + 1, size + entry.st_size
                latest = max(latest, entry.st_mtime_ns)
        except OSError as error:  # deeper than PATH_MAX, say: the walk cannot see it all
            errors.append(error)
            folders.clear()
    totals = (files, size, latest, info.st_ino)
    return Look(CandidateKind.folder, totals, files, identity, _unwalkable(path, errors))


def _unwalkable(job: Path, errors: list[OSError]) -> str | None:
    """Why a job folder cannot be read whole (a folder in it that cannot be listed, or one
    nested deeper than a path can name), in words; None where it can."""
    unreadable = [e for e in errors if not isinstance(e, PermissionError)]  # blocked instead
    if not unreadable:
        return None
    error = unreadable[0]
    where = printable(os.path.relpath(error.filename, job)) if error.filename else "in it"
    if error.errno == errno.ENAMETOOLONG:
        where = f"{len(os.fsencode(error.filename or ''))} bytes of path deep"
    return (
        f"the scan job folder cannot be read whole: {error.strerror} ({where}); its pages "
        "cannot all be found, so it is not converted"
    )


def stat_all(paths: Iterable[Path], inbox: Path) -> dict[Path, StatOutcome]:
    """A look at each path, or the OSError it raised. Blocking: run it in a thread."""
    outcomes: dict[Path, StatOutcome] = {}
    for path in paths:
        try:
            outcomes[path] = look_at(path, inbox)
        except OSError as error:
            outcomes[path] = error
    return outcomes


@dataclass
class _Candidate:
    first_seen: float
    signature: tuple[int, ...] | None = None  # size, mtime, inode; a folder's totals
    identity: Identity | None = None
    stable_since: float = 0.0
    due: float = 0.0  # when to look next
    failures: int = 0  # stats in a row that raised an OS error


@dataclass(frozen=True)
class Ready:
    path: Path
    first_seen: float  # monotonic
    still_growing: bool = False  # never settled within max_settle_wait_seconds
    folder: bool = False  # a scan job's folder
    identity: Identity | None = None  # the file that settled: the one to claim
    unreadable: str | None = None  # a job folder that cannot be read whole: why


class QuietTracker:
    """Candidates of one inbox until they have been quiet for `settle_seconds`."""

    def __init__(self, inbox: InboxConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.inbox = inbox
        self.clock = clock
        self.log = get_logger(inbox=str(inbox.path))
        self._candidates: dict[Path, _Candidate] = {}
        self._due: list[tuple[float, int, Path]] = []  # a heap; stale entries are skipped
        self._order = itertools.count()
        self._warned: set[Path] = set()

    def __len__(self) -> int:
        return len(self._candidates)

    def oldest(self) -> float | None:
        """When the longest-waiting candidate was first seen (monotonic), or None."""
        return min((c.first_seen for c in self._candidates.values()), default=None)

    def waiting(self) -> list[tuple[Path, float]]:
        """Each candidate and when it was first seen (monotonic)."""
        return [(path, candidate.first_seen) for path, candidate in self._candidates.items()]

    def observe(self, path: Path) -> None:
        """Something happened to `path` (an event, a scan): look at it at the next tick."""
        now = self.clock()
        candidate = self._candidates.setdefault(path, _Candidate(first_seen=now))
        self._look_at(path, candidate, now)

    def _look_at(self, path: Path, candidate: _Candidate, when: float) -> None:
        candidate.due = when
        heapq.heappush(self._due, (when, next(self._order), path))

    def due(self, limit: int = DUE_PER_TICK) -> list[Path]:
        """Candidates to stat now (at most `limit`; the others stay due)."""
        now = self.clock()
        paths: dict[Path, None] = {}
        while self._due and self._due[0][0] <= now and len(paths) < limit:
            when, _, path = heapq.heappop(self._due)
            candidate = self._candidates.get(path)
            if candidate is not None and candidate.due == when:
                paths[path] = None
        return list(paths)

    def ready(self, outcomes: dict[Path, StatOutcome]) -> list[Ready]:
        """Take the stats of `due()`'s paths; the candidates that are ready leave the tracker."""
        now = self.clock()
        ready = []
        for path, outcome in outcomes.items():
            candidate = self._candidates.get(path)
            if candidate is None:
                continue
            if isinstance(outcome, OSError):
                if outcome.errno in (errno.ENOENT, errno.ENOTDIR):
                    self._forget(path)
                else:
                    self._stat_failed(path, candidate, outcome, now)
                continue
            if not self._is_page_source(path, outcome):
                self._forget(path, keep_warning=True)
                continue
            if candidate.failures:
                self.log.info("file.stat_recovered", path=str(path))
                candidate.failures = 0
            if outcome.signature != candidate.signature:
                candidate.signature, candidate.stable_since = outcome.signature, now
            candidate.identity = outcome.identity
            folder = outcome.kind is CandidateKind.folder
            empty = folder and outcome.files == 0 and not outcome.unreadable  # not yet begun
            if empty and now - candidate.first_seen >= self.inbox.max_settle_wait_seconds:
                self.log.info("file.skipped", path=str(path), reason="an empty job folder")
                self._forget(path)
            elif not empty and now - candidate.stable_since >= self.inbox.settle_seconds:
                self._forget(path)
                ready.append(
                    Ready(
                        path,
                        candidate.first_seen,
                        folder=folder,
                        identity=outcome.identity,
                        unreadable=outcome.unreadable,
                    )
                )
            elif now - candidate.first_seen >= self.inbox.max_settle_wait_seconds:
                self._forget(path)
                ready.append(Ready(path, candidate.first_seen, True, identity=outcome.identity))
            else:
                when = candidate.stable_since + self.inbox.settle_seconds
                # An empty job folder is stable but not ready: look again within a second.
                later = now + min(1.0, self.inbox.settle_seconds)
                self._look_at(path, candidate, when if when > now else later)
        return ready

    def _stat_failed(self, path: Path, candidate: _Candidate, error: OSError, now: float) -> None:
        candidate.failures += 1
        delay = STAT_RETRY.nth(candidate.failures)
        if candidate.failures == 1:
            self.log.warning(
                "file.stat_failed",
                path=str(path),
                error=f"{error.strerror} ({errno.errorcode.get(error.errno or 0, '?')})",
                action="left where it is and looked at again later",
            )
        self._look_at(path, candidate, now + delay)

    def _forget(self, path: Path, keep_warning: bool = False) -> None:
        self._candidates.pop(path, None)
        if not keep_warning:
            self._warned.discard(path)

    def _is_page_source(self, path: Path, look: Look) -> bool:
        """A regular file, or a job folder; symlinks and the like are left alone."""
        if look.kind is CandidateKind.file:
            return True
        if look.kind is CandidateKind.folder:
            relative = path.relative_to(self.inbox.path)
            return job_folder_of(relative, self.inbox, True) == relative
        if path not in self._warned:  # once per path
            self._warned.add(path)
            kind = "a symbolic link" if look.kind is CandidateKind.link else "not a regular file"
            self.log.warning(
                "file.skipped",
                path=printable(str(path)),
                reason=f"{kind}; never followed or opened, left in place",
            )
        return False


class _Handler(FileSystemEventHandler):
    def __init__(self, notify: Callable[[Path, bool], None]) -> None:
        self._notify = notify

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in ("deleted", "closed_no_write", "opened"):
            return
        path = event.dest_path if event.event_type == "moved" else event.src_path
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        self._notify(Path(path), event.is_directory)


class InboxWatcher:
    """Feeds candidate paths of one inbox to the event loop from watchdog's thread."""

    def __init__(
        self,
        inbox: InboxConfig,
        loop: asyncio.AbstractEventLoop,
        on_candidate: Callable[[Path], None],
        on_unlistable: Callable[[Path], None] = lambda _: None,
    ) -> None:
        """`on_candidate(path)` for every path that may be a document; `on_unlistable(folder)`
        for a folder ocrd's user may not list (its files cannot be seen at all)."""
        self.inbox = inbox
        self._loop = loop
        self._on_candidate = on_candidate
        self._on_unlistable = on_unlistable
        self._observer: BaseObserver | None = None
        # Folders moved in are walked for their files by one task at a time, however many
        # folder events came (a tree moved in raises one per folder it holds).
        self._walker: asyncio.Task[None] | None = None
        self._walk_again = False
        self.polling, self.polling_reason = polling_of(inbox)
        self.missing = False
        self.log = get_logger(inbox=str(inbox.path))

    @property
    def watching(self) -> bool:
        return self._observer is not None and self._observer.is_alive() and not self.missing

    async def start(self) -> None:
        await asyncio.to_thread(self._start_observer)
        await self.rescan()

    def _start_observer(self) -> None:
        """Blocking (watchdog lists the whole tree first): run it in a thread. Polling
        looks at entries with lstat, so a link to a folder (even to `/`) is never walked."""
        observer = (
            PollingObserverVFS(
                os.lstat, os.scandir, polling_interval=self.inbox.poll_interval_seconds
            )
            if self.polling
            else Observer()
        )
        handler = _Handler(self._from_thread)
        observer.schedule(handler, str(self.inbox.path), recursive=self.inbox.recursive)
        observer.daemon = True
        observer.start()
        self._observer = observer

    async def rescan(self) -> None:
        """Take every candidate again; notice an inbox that was removed or came back, and
        a watch whose thread died."""
        present = await asyncio.to_thread(self.inbox.path.is_dir)
        if not present:
            if not self.missing:
                self.missing = True
                self.log.error(
                    "inbox.missing",
                    action="files dropped now are not seen; watching resumes when it is back",
                )
            return
        if self.missing:
            self.missing = False
            await asyncio.to_thread(self._restart_observer)  # it died with the old folder
            self.log.info("inbox.restored")
        elif self._observer is None or not self._observer.is_alive():
            self.log.error("inbox.watch_restarted", reason="the watching thread had stopped")
            await asyncio.to_thread(self._restart_observer)
        await self._walk(self.inbox.path)

    def _restart_observer(self) -> None:
        self.stop()
        self._start_observer()

    async def _walk(self, root: Path) -> None:
        paths, errors = await asyncio.to_thread(scan, self.inbox, root)
        for error in errors:
            if isinstance(error, PermissionError) and error.filename:
                self._on_unlistable(Path(error.filename))
            else:
                self.log.warning("inbox.scan_error", error=printable(str(error)))
        for path in paths:
            self._on_candidate(path)

    def _walk_soon(self) -> None:
        self._walk_again = True
        if self._walker is None or self._walker.done():
            self._walker = asyncio.ensure_future(self._walk_while_asked())

    async def _walk_while_asked(self) -> None:
        while self._walk_again:
            self._walk_again = False
            await self._walk(self.inbox.path)

    def _from_thread(self, path: Path, is_directory: bool) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed while the daemon stopped
            self._loop.call_soon_threadsafe(self._event, path, is_directory)

    def _event(self, path: Path, is_directory: bool) -> None:
        try:
            relative = path.relative_to(self.inbox.path)
        except ValueError:
            return
        job = job_folder_of(relative, self.inbox, is_directory)
        if job is not None:  # anything in a scan job is news of the job
            self._on_candidate(self.inbox.path / job)
            return
        if is_directory:
            # A folder moved in brings files that raised no events of their own.
            if (
                relative.parts
                and not any(p.startswith(".") for p in relative.parts)
                and self.inbox.recursive
            ):
                self._walk_soon()
            return
        if is_candidate_name(relative, self.inbox):
            self._on_candidate(path)

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=10)
            self._observer = None
