"""Watching: which files in an inbox are candidates, and when each is ready to take.

Events come from watchdog (inotify, or polling for SMB/NFS mounts where inotify is silent),
from a scan at start-up and from a periodic rescan that catches whatever events missed.
An event only makes a path a candidate; a candidate is ready once its size and mtime have
stayed unchanged for the inbox's settle time, so a scanner or a slow copy is never read
half-written.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver
from watchdog.observers.polling import PollingObserver

from ocrd.config import DEFAULT_TEMPORARY_SUFFIXES, InboxConfig
from ocrd.log import get_logger


def is_candidate_name(relative: PurePath, inbox: InboxConfig) -> bool:
    """Whether a path (relative to the inbox) names a file ocrd should consider at all."""
    if any(part.startswith(".") for part in relative.parts):
        return False  # hidden files and folders, including ocrd's own temporary files
    name = relative.name
    if name.startswith("~$") or name.lower().endswith(DEFAULT_TEMPORARY_SUFFIXES):
        return False  # Office lock files and uploads still in progress
    if not inbox.recursive and len(relative.parts) > 1:
        return False
    text = relative.as_posix()

    def matches(pattern: str) -> bool:
        return fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(text, pattern)

    return any(matches(p) for p in inbox.include) and not any(matches(p) for p in inbox.ignore)


def scan(inbox: InboxConfig) -> Iterator[Path]:
    """Every candidate path under the inbox (hidden folders are not entered)."""
    for root, folders, files in os.walk(inbox.path):
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        if not inbox.recursive:
            folders.clear()
        for name in sorted(files):
            path = Path(root) / name
            if is_candidate_name(path.relative_to(inbox.path), inbox):
                yield path


@dataclass
class _Observed:
    signature: tuple[int, int, int]  # size, mtime, inode: a file replaced by another changes
    stable_since: float
    first_seen: float


@dataclass(frozen=True)
class Ready:
    path: Path
    still_growing: bool = False  # never settled within max_settle_wait_seconds


class SettleTracker:
    """Candidates of one inbox until they have been quiet for `settle_seconds`."""

    def __init__(self, inbox: InboxConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.inbox = inbox
        self.clock = clock
        self.log = get_logger(inbox=str(inbox.path))
        self._candidates: dict[Path, _Observed | None] = {}
        self._warned: set[Path] = set()

    def __len__(self) -> int:
        return len(self._candidates)

    def observe(self, path: Path) -> None:
        if path not in self._candidates:
            self._candidates[path] = None

    def ready(self) -> list[Ready]:
        """Candidates that stayed unchanged long enough, or that kept changing for longer
        than the inbox's max_settle_wait_seconds; they leave the tracker."""
        now = self.clock()
        ready = []
        for path, seen in list(self._candidates.items()):
            info = self._regular_file_stat(path)
            if info is None:
                del self._candidates[path]
                continue
            signature = (info.st_size, info.st_mtime_ns, info.st_ino)
            if seen is None or seen.signature != signature:
                first_seen = now if seen is None else seen.first_seen
                self._candidates[path] = seen = _Observed(signature, now, first_seen)
            if now - seen.stable_since >= self.inbox.settle_seconds:
                del self._candidates[path]
                ready.append(Ready(path))
            elif now - seen.first_seen >= self.inbox.max_settle_wait_seconds:
                del self._candidates[path]
                ready.append(Ready(path, still_growing=True))
        return ready

    def _regular_file_stat(self, path: Path) -> os.stat_result | None:
        try:
            info = path.lstat()
        except FileNotFoundError:
            self._warned.discard(path)
            return None
        if stat.S_ISREG(info.st_mode):
            return info
        if stat.S_ISDIR(info.st_mode):
            return None
        if path not in self._warned:  # once per path, not at every rescan
            self._warned.add(path)
            kind = "symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
            self.log.warning("file.skipped", path=str(path), reason=f"{kind}; left in place")
        return None


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
    ) -> None:
        self.inbox = inbox
        self._loop = loop
        self._on_candidate = on_candidate
        self._observer: BaseObserver | None = None
        self.missing = False
        self.log = get_logger(inbox=str(inbox.path))

    def start(self) -> None:
        self._start_observer()
        self.rescan()

    def _start_observer(self) -> None:
        observer = (
            PollingObserver(timeout=self.inbox.poll_interval_seconds)
            if self.inbox.polling
            else Observer()
        )
        handler = _Handler(self._from_thread)
        observer.schedule(handler, str(self.inbox.path), recursive=self.inbox.recursive)
        observer.daemon = True
        observer.start()
        self._observer = observer

    def rescan(self) -> None:
        """Take every candidate again; notice an inbox that was removed or came back."""
        if not self.inbox.path.is_dir():
            if not self.missing:
                self.missing = True
                self.log.error(
                    "inbox.missing",
                    action="files dropped now are not seen; watching resumes when it is back",
                )
            return
        if self.missing:
            self.missing = False
            self.stop()
            self._start_observer()  # the old watch died with the old folder
            self.log.info("inbox.restored")
        for path in scan(self.inbox):
            self._on_candidate(path)

    def _from_thread(self, path: Path, is_directory: bool) -> None:
        self._loop.call_soon_threadsafe(self._event, path, is_directory)

    def _event(self, path: Path, is_directory: bool) -> None:
        try:
            relative = path.relative_to(self.inbox.path)
        except ValueError:
            return
        if is_directory:
            # A folder moved in brings files that raised no events of their own.
            if (
                relative.parts
                and not any(p.startswith(".") for p in relative.parts)
                and self.inbox.recursive
            ):
                for root, folders, files in os.walk(path):
                    folders[:] = [name for name in folders if not name.startswith(".")]
                    for name in files:
                        self._event(Path(root) / name, False)
            return
        if is_candidate_name(relative, self.inbox):
            self._on_candidate(path)

    def stop(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=10)
            self._observer = None
