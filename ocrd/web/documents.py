"""Finding a document again: what became of an upload (or a dropped document) is found
from the files alone, so it survives a restart and is the same whichever daemon sharing
the inbox converted it. An upload's state is where its file is:

    waiting      <inbox>/uploads/<id>/<name>
    converting   <work>/<claim>/uploads/<id>/<name>   (progress from the documents in flight)
    done         <outbox>/uploads/<id>/<stem>.md      (the original in done/uploads/<id>/)
    failed       <failed>/uploads/<id>/<stem>.error.json

Memory adds what files do not say, and what a settlement under a flat name put elsewhere;
finished dropped documents are found by their claim id, from memory, for the status page's
links. Each folder on the way is opened without following a link (`ocrd/files/beneath.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path, PurePath
from typing import Any

from ocrd.config import UPLOADS_FOLDER, Config, InboxConfig
from ocrd.documents.document import DocumentRunner, InFlight
from ocrd.domain import DocumentSummary, Outcome
from ocrd.files.beneath import folder_beneath, open_beneath, plain_part, visible_files
from ocrd.files.dropped import printable
from ocrd.output.settle import ERROR_SUFFIX
from ocrd.output.write import OutputFiles
from ocrd.sharing.tenure import STATE_FILE
from ocrd.uploads.receiving import UPLOAD_ID, mismatch, read_record, upload_of

CLAIM_ID = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{6}$")  # claim.new_claim_id
RECHECK_SECONDS = 2.0  # a waiter looks again this often (another daemon may settle it)
TELLING_SECONDS = 2.0  # at most this long from a settlement in the files to its summary
REMEMBERED = 1000  # finished documents remembered (for links and flat names)
MAX_REPORT_BYTES = 1 << 20  # an error report read back for its reason


class DocumentState(StrEnum):
    waiting = "waiting"  # in the inbox
    converting = "converting"  # claimed: in the work area
    done = "done"
    failed = "failed"


def is_document_id(text: str) -> bool:
    """An upload's id, or a claim's (a dropped document's)."""
    return bool(UPLOAD_ID.match(text) or CLAIM_ID.match(text))


def iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds")


@dataclass(frozen=True)
class Outputs:
    """A converted document's files: its Markdown in `root/folder...` (a document split at
    separator sheets: each part's, `<stem>-1.md`, `<stem>-2.md`, ...), and beside each the
    companions of that Markdown (figures, layout file, raw file, searchable PDF) and
    nothing else."""

    root: Path  # the outbox
    folder: tuple[str, ...]  # from the outbox to the Markdown's folder
    markdowns: tuple[str, ...]  # the Markdown's name, or each part's in order

    @property
    def markdown(self) -> str:
        """The (first part's) Markdown."""
        return self.markdowns[0]

    @property
    def split(self) -> bool:
        return len(self.markdowns) > 1

    def allows(self, parts: Sequence[str]) -> bool:
        """Whether `parts` (relative to the Markdown's folder) names one of these files."""
        if len(parts) == 1:
            return any(parts[0] in _companions(markdown) for markdown in self.markdowns)
        return (
            len(parts) == 2
            and parts[0] in (OutputFiles(Path(m)).assets.name for m in self.markdowns)
            and plain_part(parts[1])
            and not parts[1].startswith(".")
        )

    def present_by_part(self) -> list[list[str]]:
        """Each part's files that exist (its Markdown first), relative to the Markdown's
        folder. Blocking."""
        found = {name for name, _ in visible_files(self.root, self.folder)}
        by_part = []
        for markdown in self.markdowns:
            assets = OutputFiles(Path(markdown)).assets.name
            figures = visible_files(self.root, (*self.folder, assets))
            by_part.append(
                [name for name in _companions(markdown) if name in found]
                + [f"{assets}/{name}" for name, _ in sorted(figures)]
            )
        return by_part

    def open(self, parts: Sequence[str]) -> int:
        """A descriptor of one of the files (FileNotFoundError for any other). Blocking."""
        if not self.allows(parts):
            raise FileNotFoundError(errno.ENOENT, "not a file of this document", "/".join(parts))
        return open_beneath(self.root, (*self.folder, *parts))


def _companions(markdown: str) -> tuple[str, ...]:
    """A Markdown's name and the names of the files beside it that go with it."""
    files = OutputFiles(Path(markdown))
    return (markdown, *files.beside, files.pdf.name)


def part_names(markdown: str, names: Sequence[str]) -> tuple[str, ...]:
    """Where `markdown` is the first part of a split document (`<stem>-1.md`), every part
    in `names` in order (`<stem>-2.md`, ...); otherwise `markdown` alone."""
    base, first = markdown[: -len("-1.md")], markdown.endswith("-1.md")
    parts: list[str] = []
    while first and f"{base}-{len(parts) + 1}.md" in names:
        parts.append(f"{base}-{len(parts) + 1}.md")
    return tuple(parts) if len(parts) > 1 else (markdown,)


@dataclass
class Found:
    """What is known of one document."""

    id: str
    inbox: str
    state: DocumentState
    path: str  # relative to the inbox
    uploaded_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    claim: str | None = None  # the claim's id while converting (or from memory)
    outputs: Outputs | None = None
    files: list[str] = field(default_factory=list)  # outputs present
    parts: list[list[str]] = field(default_factory=list)  # a split one's: each part's files
    pages: int | None = None
    pages_done: int | None = None
    eta_seconds: float | None = None
    stage: str | None = None
    page: int | None = None
    reason: str | None = None
    error_report: str | None = None  # where it is

    @property
    def name(self) -> str:
        return PurePath(self.path).name

    def show(self, outputs: Outputs) -> None:
        """Its outputs, and which of their files are present (part by part). Blocking."""
        self.outputs = outputs
        self.parts = outputs.present_by_part()
        self.files = [name for part in self.parts for name in part]

    @property
    def settled(self) -> bool:
        return self.state in (DocumentState.done, DocumentState.failed)


@dataclass(frozen=True)
class _Remembered:
    inbox: InboxConfig
    summary: DocumentSummary


@dataclass(frozen=True)
class _Claimed:
    """The claim holding an upload, as its folder and `.claim.json` tell."""

    id: str
    name: str  # the upload's
    uploaded: float  # its mtime
    claimed_at: str | None
    markdown: str | None  # where its settlement planned them, once planned
    error_report: str | None


def _claim_folders(work: Path) -> Iterator[Path]:
    """The claim folders in a work area: in each daemon's folder (`ocrd/sharing/instances.py`),
    and those an older ocrd kept directly in the work folder."""
    for entry in _listed(work):
        if (entry / STATE_FILE).exists():
            yield entry
        else:
            yield from _listed(entry)


def _listed(folder: Path) -> list[Path]:
    try:
        return [folder / name for name in os.listdir(folder) if not name.startswith(".")]
    except OSError:
        return []


def _claimed(inbox: InboxConfig, upload_id: str) -> _Claimed | None:
    for folder in _claim_folders(inbox.work):
        claim = folder.name
        files = visible_files(folder, (UPLOADS_FOLDER, upload_id))
        if not files:
            continue
        state: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            state = json.loads((folder / STATE_FILE).read_bytes())
        settlement = state.get("settlement") or {}
        claimed = PurePath(str(state.get("relative_path", ""))).name  # what the claim took
        own = [(name, info) for name, info in files if name == claimed]
        if not own:
            continue
        name, info = own[0]
        return _Claimed(
            claim,
            name,
            info.st_mtime,
            state.get("claimed_at"),
            settlement.get("markdown"),
            settlement.get("error_report"),
        )
    return None


def _pick(names: Sequence[str], expected: Sequence[str | None]) -> str | None:
    """The one of `names` that is expected (by the original's name, or the plan saved in
    the claim); the only one where nothing says which."""
    for name in expected:
        if name is not None and name in names:
            return name
    return names[0] if len(names) == 1 and not any(expected) else None


def _read_report(root: Path, parts: Sequence[str]) -> dict[str, Any]:
    try:
        fd = open_beneath(root, parts)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_REPORT_BYTES)
    try:
        report = json.loads(data)
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def _own_files(root: Path, parts: Sequence[str]) -> list[tuple[str, os.stat_result]]:
    """The files of an upload's folder that are ocrd's own: an upload's file, its outputs
    and its report are all written by ocrd's user, so a file someone else put there (an
    output folder people may write) is never taken for the upload's."""
    return [
        (name, info) for name, info in visible_files(root, parts) if info.st_uid == os.geteuid()
    ]


def _waiting(inbox: InboxConfig, upload_id: str) -> list[tuple[str, os.stat_result]]:
    """The upload's own file while it waits in the inbox: the one its record names (by
    name and inode), or the only file of an upload an older ocrd received."""
    files = visible_files(inbox.path, (UPLOADS_FOLDER, upload_id))
    try:
        with folder_beneath(inbox.path, (UPLOADS_FOLDER, upload_id)) as folder:
            record = read_record(folder)
    except OSError:
        return []
    if record is None:
        return files if len(files) == 1 else []
    return [(name, info) for name, info in files if mismatch(record, name, info) is None]


def find_upload(inbox: InboxConfig, upload_id: str) -> Found | None:
    """An upload's state in one inbox, from its files. Each place is looked at in the order
    a document passes them, so one moving on meanwhile is found further on. Blocking."""
    where = (UPLOADS_FOLDER, upload_id)
    waiting = _waiting(inbox, upload_id)
    claimed = _claimed(inbox, upload_id)
    written = [name for name, _ in _own_files(inbox.outbox, where)]
    failed = _own_files(inbox.failed, where)
    done = _own_files(inbox.done, where)

    def found(state: DocumentState, name: str, uploaded: float | None) -> Found:
        relative = f"{UPLOADS_FOLDER}/{upload_id}/{name}"
        result = Found(upload_id, str(inbox.path), state, relative)
        result.uploaded_at = iso(uploaded) if uploaded is not None else None
        result.claim = claimed.id if claimed else None
        result.started_at = claimed.claimed_at if claimed else None
        return result

    planned = claimed.markdown if claimed and claimed.markdown else None
    stem = PurePath(done[0][0]).stem if done else None
    markdown = _pick(
        [name for name in written if name.endswith(".md")],
        [
            f"{stem}.md" if stem else None,
            f"{stem}-1.md" if stem else None,  # split: parts
            PurePath(planned).name if planned else None,
        ],
    )
    originals = [(n, i) for n, i in failed if not n.endswith(ERROR_SUFFIX)]
    planned = claimed.error_report if claimed and claimed.error_report else None
    report = _pick(
        [name for name, _ in failed if name.endswith(ERROR_SUFFIX)],
        [
            f"{PurePath(originals[0][0]).stem}{ERROR_SUFFIX}" if originals else None,
            PurePath(planned).name if planned else None,
        ],
    )
    if markdown is not None:
        original = done[0] if done else None
        uploaded = original[1].st_mtime if original else claimed.uploaded if claimed else None
        result = found(DocumentState.done, original[0] if original else markdown, uploaded)
        result.show(Outputs(inbox.outbox, where, part_names(markdown, written)))
        with contextlib.suppress(OSError):
            with folder_beneath(inbox.outbox, where) as folder:
                info = os.stat(markdown, dir_fd=folder, follow_symlinks=False)
            result.finished_at = iso(info.st_mtime)
        return result
    if report is not None:
        facts = _read_report(inbox.failed, (*where, report))
        name = originals[0][0] if originals else claimed.name if claimed else report
        uploaded = originals[0][1].st_mtime if originals else None
        result = found(DocumentState.failed, name, uploaded)
        result.started_at = facts.get("claimed_at") or result.started_at
        result.finished_at = facts.get("failed_at")
        result.stage, result.page = facts.get("stage"), facts.get("page")
        result.reason = facts.get("message")
        result.error_report = str(inbox.failed.joinpath(*where, report))
        return result
    if claimed is not None:
        return found(DocumentState.converting, claimed.name, claimed.uploaded)
    if done:  # settled, its Markdown taken out of the outbox since (a hook, a person)
        return found(DocumentState.done, done[0][0], done[0][1].st_mtime)
    if waiting:
        name, info = waiting[0]
        return found(DocumentState.waiting, name, info.st_mtime)
    return None


class Documents:
    """What became of each document: from the files, with the progress of those in flight
    here and the summaries of those that finished here."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.in_flight: Mapping[str, InFlight] = {}
        self._remembered: OrderedDict[str, _Remembered] = OrderedDict()
        self._news = asyncio.Event()  # set (and replaced) when a document settles here
        # Clients waiting for a document to settle now, through either API: one limit
        # (http.max_waiting_clients) for all, so that waiters never take every connection.
        self.waiting = 0

    def configure(self, config: Config) -> None:
        """The configuration after a reload."""
        self.config = config

    def follow(self, runner: DocumentRunner) -> None:
        """Progress from the documents in flight (settlements come to `document_finished`,
        which the runner is given when it is made)."""
        self.in_flight = runner.in_flight

    # --- finding documents -------------------------------------------------------------

    async def find(self, document_id: str) -> Found | None:
        """An upload's state from its files (a finished dropped document's from memory, by
        its claim id), with its progress while it converts here. One that has just settled
        in its files while this daemon has yet to tell its summary is answered once that is
        told (a moment later), so that "done" always comes with its pages."""
        news = self._news
        found = await self._find_once(document_id)
        if found is not None and found.settled and self._telling(document_id):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TELLING_SECONDS):
                    await news.wait()
            found = await self._find_once(document_id)
        return found

    async def _find_once(self, document_id: str) -> Found | None:
        found: Found | None = None
        if UPLOAD_ID.match(document_id):
            inboxes = list(self.config.inboxes)
            found = await asyncio.to_thread(_find_in, inboxes, document_id)
        remembered = self._remembered.get(document_id)
        if found is None and remembered is not None:
            found = await asyncio.to_thread(_from_memory, document_id, remembered)
        if found is None:
            found = self._running(document_id)
        if found is not None:
            self._add_progress(found, remembered)
        return found

    async def settled(self, document_id: str, seconds: float) -> Found | None:
        """The document's state once it is done or failed, or after `seconds`. Waiters hold
        no thread: they sleep until a document settles here, looking again every few
        seconds (another daemon may settle it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            news = self._news
            found = await self._find_once(document_id)
            left = deadline - loop.time()
            settled = found is not None and found.settled and not self._telling(document_id)
            if found is None or settled or left <= 0:
                return found
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, RECHECK_SECONDS)):
                    await news.wait()

    @contextlib.contextmanager
    def waiter(self, limit: int) -> Iterator[bool]:
        """A place among the `limit` clients that may wait at once: True while it is
        held, False where all are taken (the client is answered without waiting)."""
        if self.waiting >= limit:
            yield False
            return
        self.waiting += 1
        try:
            yield True
        finally:
            self.waiting -= 1

    def _telling(self, document_id: str) -> bool:
        """Settled in its files while this daemon has yet to tell its summary (pages,
        timing), which comes a moment later."""
        return document_id not in self._remembered and any(
            upload_of(str(flight.path)) == document_id for flight in self.in_flight.values()
        )

    def document_finished(self, inbox: InboxConfig, summary: DocumentSummary) -> None:
        remembered = _Remembered(inbox, summary)
        keys = [summary.doc]
        upload = upload_of(summary.path)
        if upload is not None:
            keys.append(upload)
        for key in keys:
            self._remembered[key] = remembered
            self._remembered.move_to_end(key)
        while len(self._remembered) > REMEMBERED:
            self._remembered.popitem(last=False)
        news, self._news = self._news, asyncio.Event()
        news.set()

    def _running(self, claim_id: str) -> Found | None:
        """A dropped document in flight here, by its claim id."""
        flight = self.in_flight.get(claim_id)
        if flight is None:
            return None
        found = Found(claim_id, flight.inbox, DocumentState.converting, printable(flight.path))
        found.claim = claim_id
        return found

    def _add_progress(self, found: Found, remembered: _Remembered | None) -> None:
        """What memory adds: pages so far while it converts here, pages when it finished."""
        if found.state is DocumentState.converting:
            flight = self.in_flight.get(found.claim) if found.claim else None
            if flight is not None:
                report = flight.report(time.monotonic())
                found.claim = flight.doc
                found.pages, found.pages_done = report.pages, report.pages_done
                found.eta_seconds = report.eta_seconds
        elif remembered is not None and remembered.summary.outcome.value == found.state.value:
            summary = remembered.summary
            found.pages = summary.pages or None
            found.claim = summary.doc
            found.started_at = found.started_at or iso(summary.finished_at - summary.seconds)


def _find_in(inboxes: list[InboxConfig], upload_id: str) -> Found | None:
    for inbox in inboxes:
        found = find_upload(inbox, upload_id)
        if found is not None:
            return found
    return None


def _from_memory(document_id: str, remembered: _Remembered) -> Found:
    """A finished document as it was settled (its files may have moved on since)."""
    summary, inbox = remembered.summary, remembered.inbox
    state = DocumentState(summary.outcome.value)
    found = Found(document_id, str(inbox.path), state, summary.path, claim=summary.doc)
    found.finished_at = iso(summary.finished_at)
    if summary.outcome is Outcome.done and summary.markdown:
        markdown = Path(summary.markdown)
        parts = [Path(str(part["markdown"])).name for part in summary.parts]
        with contextlib.suppress(ValueError):
            folder = markdown.parent.relative_to(inbox.outbox).parts
            found.show(Outputs(inbox.outbox, folder, tuple(parts) or (markdown.name,)))
    else:
        found.stage = summary.stage.value if summary.stage else None
        found.page, found.reason = summary.page, summary.reason
        found.error_report = summary.error_report
    return found
