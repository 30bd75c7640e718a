"""Uploads: files handed over by HTTP go into an inbox as if someone had dropped them there,
and what became of each is found again from the files alone.

An upload gets a random id (128 bits, base32) and is written, hidden, into a folder of its
own, `<inbox>/uploads/<id>/.upload.part` (the watcher ignores hidden names), made durable
and linked to `<inbox>/uploads/<id>/<name>` once complete. From there it is claimed,
converted and settled like any dropped file; its relative path keeps it apart in the
outbox, done/ and failed/. Its state is where its file is:

    waiting      <inbox>/uploads/<id>/<name>
    converting   <work>/<claim>/uploads/<id>/<name>   (progress from the documents in flight)
    done         <outbox>/uploads/<id>/<stem>.md      (the original in done/uploads/<id>/)
    failed       <failed>/uploads/<id>/<stem>.error.json

so it survives a restart: nothing is known only in memory. (Memory adds what files do not
say, and what a settlement under a flat name put elsewhere; finished dropped documents are
found by their claim id, from memory, for the status page's links.)

Everything under an inbox or an outbox may have been made by people on a share, so each
folder on the way is opened without following a link, and only regular files are read.
The empty `uploads/<id>/` folder a claim leaves behind, and a hidden part a killed run
left, are tidied away periodically.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import json
import os
import re
import secrets
import stat
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path, PurePath
from typing import Any

from ocrd.config import UPLOADS_FOLDER, Config, InboxConfig
from ocrd.documents.document import DocumentRunner, InFlight
from ocrd.domain import DocumentSummary, Outcome
from ocrd.files import numbered
from ocrd.files.dropped import NotRegularFile, kind_of, printable
from ocrd.intake.claim import STATE_FILE
from ocrd.intake.watch import is_candidate_name, job_folder_of
from ocrd.log import get_logger
from ocrd.output.settle import ERROR_SUFFIX
from ocrd.output.write import OutputFiles

UPLOAD_ID = re.compile(r"^[a-z2-7]{26}$")  # 128 random bits in base32
CLAIM_ID = re.compile(r"^\d{8}T\d{6}-[0-9a-f]{6}$")  # claim.new_claim_id
PART = ".upload.part"  # the upload while it arrives: hidden, so never a candidate
DEFAULT_NAME = "upload"
TIDY_SECONDS = 10.0  # how often empty upload folders and stale parts are looked for
# An upload folder empty this long is removed: a claim took its file (a folder just made
# for an upload holds its part within microseconds).
EMPTY_FOR_SECONDS = 5.0
RECHECK_SECONDS = 2.0  # a waiter looks again this often (another daemon may settle it)
REMEMBERED = 1000  # finished documents remembered (for links and flat names)
MAX_REPORT_BYTES = 1 << 20  # an error report read back for its reason
_REFUSED_CHARACTERS = re.compile(r'[<>:"|?*\x00-\x1f\x7f]')

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class DocumentState(StrEnum):
    waiting = "waiting"  # in the inbox
    converting = "converting"  # claimed: in the work area
    done = "done"
    failed = "failed"


class UploadRefused(Exception):
    """An upload that is not taken: the HTTP status to answer, and why, in words."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def new_upload_id() -> str:
    return base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


def is_document_id(text: str) -> bool:
    """An upload's id, or a claim's (a dropped document's)."""
    return bool(UPLOAD_ID.match(text) or CLAIM_ID.match(text))


def clean_filename(given: str | None) -> str:
    """The name an upload is given in the inbox: the last component of what the client
    said, without characters a share refuses or control characters, never hidden, at most
    200 bytes for its stem (the extension is kept)."""
    name = (given or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = printable(name).replace("\\", "_")
    name = _REFUSED_CHARACTERS.sub("_", name).strip().lstrip(".").strip()
    return numbered(Path(name or DEFAULT_NAME), 1).name


def iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, UTC).isoformat(timespec="milliseconds")


# --- files beneath a root, never through a link ----------------------------------------


def _not_followed(name: str) -> NotRegularFile:
    return NotRegularFile(errno.ELOOP, "a symbolic link; not followed", name)


def _plain_part(part: str) -> bool:
    return part not in ("", ".", "..") and "/" not in part and "\0" not in part


@contextlib.contextmanager
def _folder(root: Path, parts: Sequence[str]) -> Iterator[int]:
    """A descriptor of the folder `root/parts...`, each part opened without following a
    link (`root` itself is the configuration's). FileNotFoundError, NotADirectoryError or
    NotRegularFile (a link on the way) where there is no such folder."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            if not _plain_part(part):
                raise FileNotFoundError(errno.ENOENT, "not a plain name", part)
            try:
                inner = os.open(part, DIRECTORY, dir_fd=fd)
            except OSError as error:
                if error.errno == errno.ELOOP:
                    raise _not_followed(part) from None
                raise
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def open_beneath(root: Path, parts: Sequence[str]) -> int:
    """A read-only descriptor of the regular file `root/parts...`: no link followed on the
    way or at the end, no FIFO waited on. Blocking; the caller closes it."""
    *folders, leaf = parts
    if not _plain_part(leaf):
        raise FileNotFoundError(errno.ENOENT, "not a plain name", leaf)
    with _folder(root, folders) as parent:
        try:
            fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=parent)  # fmt: skip
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise _not_followed(leaf) from None
            raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, f"{kind_of(mode)}, not a file", leaf)
    return fd


def _entries(root: Path, parts: Sequence[str]) -> list[tuple[str, os.stat_result]]:
    """The entries of the folder `root/parts...` with what each is (not followed); [] where
    there is no such folder."""
    try:
        with _folder(root, parts) as fd:
            found = []
            for name in os.listdir(fd):
                with contextlib.suppress(FileNotFoundError):
                    found.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
            return found
    except (FileNotFoundError, NotADirectoryError, NotRegularFile):
        return []


def _visible_files(root: Path, parts: Sequence[str]) -> list[tuple[str, os.stat_result]]:
    return [
        (name, info)
        for name, info in _entries(root, parts)
        if not name.startswith(".") and stat.S_ISREG(info.st_mode)
    ]


# --- receiving -------------------------------------------------------------------------


@dataclass
class Receiving:
    """An upload arriving: a hidden file in a folder of its own, until it is complete.
    Its methods block: call them in a thread."""

    id: str
    inbox: InboxConfig
    name: str
    _uploads: int  # descriptor of <inbox>/uploads
    _folder: int  # descriptor of <inbox>/uploads/<id>
    _file: int
    size: int = 0

    @property
    def relative_path(self) -> str:
        return f"{UPLOADS_FOLDER}/{self.id}/{self.name}"

    @classmethod
    def begin(cls, inbox: InboxConfig, upload_id: str, name: str) -> Receiving:
        """A new upload folder in `inbox` with an empty hidden part in it."""
        with _folder(inbox.path, ()) as root:
            with contextlib.suppress(FileExistsError):
                os.mkdir(UPLOADS_FOLDER, dir_fd=root)
            try:
                uploads = os.open(UPLOADS_FOLDER, DIRECTORY, dir_fd=root)
            except OSError as error:  # a link or a file someone put there
                raise UploadRefused(
                    503,
                    f"{inbox.path / UPLOADS_FOLDER} is not a folder ocrd can use "
                    f"({error.strerror}); an operator must remove what lies there",
                ) from None
        try:
            os.mkdir(upload_id, dir_fd=uploads)
            folder = os.open(upload_id, DIRECTORY, dir_fd=uploads)
        except BaseException:
            os.close(uploads)
            raise
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            part = os.open(PART, flags, 0o666, dir_fd=folder)
        except BaseException:
            os.close(folder)
            with contextlib.suppress(OSError):
                os.rmdir(upload_id, dir_fd=uploads)
            os.close(uploads)
            raise
        return cls(upload_id, inbox, name, uploads, folder, part)

    def write(self, data: bytes | bytearray) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._file, view)
            view = view[written:]
        self.size += len(data)

    def commit(self) -> None:
        """Make the upload durable and give it its name: from now on it is in the inbox."""
        os.fsync(self._file)
        os.close(self._file)
        self._file = -1
        try:
            os.link(PART, self.name, src_dir_fd=self._folder, dst_dir_fd=self._folder)
            os.unlink(PART, dir_fd=self._folder)
        except OSError as error:  # a share that refuses hard links: the folder is new
            if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            os.rename(PART, self.name, src_dir_fd=self._folder, dst_dir_fd=self._folder)
        os.fsync(self._folder)
        os.fsync(self._uploads)
        self._close_folders()

    def abort(self) -> None:
        """Remove the part and the folder: an upload that did not complete leaves nothing."""
        if self._file >= 0:
            os.close(self._file)
            self._file = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(PART, dir_fd=self._folder)
        with contextlib.suppress(OSError):
            os.rmdir(self.id, dir_fd=self._uploads)
        self._close_folders()

    def _close_folders(self) -> None:
        for fd in (self._folder, self._uploads):
            if fd >= 0:
                os.close(fd)
        self._folder = self._uploads = -1


# --- finding a document ----------------------------------------------------------------


@dataclass(frozen=True)
class Outputs:
    """A converted document's files: its Markdown in `root/folder...`, and beside it the
    companions of that Markdown (figures, layout file, raw file) and nothing else."""

    root: Path  # the outbox
    folder: tuple[str, ...]  # from the outbox to the Markdown's folder
    markdown: str  # the Markdown's name

    def allows(self, parts: Sequence[str]) -> bool:
        """Whether `parts` (relative to the Markdown's folder) names one of these files."""
        files = OutputFiles(Path(self.markdown))
        if len(parts) == 1:
            return parts[0] in (self.markdown, files.layout.name, files.raw.name)
        return (
            len(parts) == 2
            and parts[0] == files.assets.name
            and _plain_part(parts[1])
            and not parts[1].startswith(".")
        )

    def present(self) -> list[str]:
        """The files of the document that exist, relative to the Markdown's folder. Blocking."""
        files = OutputFiles(Path(self.markdown))
        found = [name for name, _ in _visible_files(self.root, self.folder)]
        present = [name for name in (self.markdown, files.layout.name, files.raw.name)
                   if name in found]  # fmt: skip
        figures = _visible_files(self.root, (*self.folder, files.assets.name))
        return present + [f"{files.assets.name}/{name}" for name, _ in sorted(figures)]

    def open(self, parts: Sequence[str]) -> int:
        """A descriptor of one of the files (FileNotFoundError for any other). Blocking."""
        if not self.allows(parts):
            raise FileNotFoundError(errno.ENOENT, "not a file of this document", "/".join(parts))
        return open_beneath(self.root, (*self.folder, *parts))


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

    @property
    def settled(self) -> bool:
        return self.state in (DocumentState.done, DocumentState.failed)


@dataclass(frozen=True)
class _Remembered:
    inbox: InboxConfig
    summary: DocumentSummary


def _upload_of(relative: str) -> str | None:
    """The upload id in a relative path `uploads/<id>/<name>`, if it is one."""
    parts = PurePath(relative).parts
    if len(parts) == 3 and parts[0] == UPLOADS_FOLDER and UPLOAD_ID.match(parts[1]):
        return parts[1]
    return None


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
    """The claim folders in a work area: in each daemon's folder (`ocrd/instances.py`),
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
        files = _visible_files(folder, (UPLOADS_FOLDER, upload_id))
        if not files:
            continue
        state: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            state = json.loads((folder / STATE_FILE).read_bytes())
        settlement = state.get("settlement") or {}
        name, info = files[0]
        return _Claimed(
            claim, name, info.st_mtime, state.get("claimed_at"),
            settlement.get("markdown"), settlement.get("error_report"),
        )  # fmt: skip
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


def find_upload(inbox: InboxConfig, upload_id: str) -> Found | None:
    """An upload's state in one inbox, from its files. Each place is looked at in the order
    a document passes them, so one moving on meanwhile is found further on. Blocking."""
    where = (UPLOADS_FOLDER, upload_id)
    waiting = _visible_files(inbox.path, where)
    claimed = _claimed(inbox, upload_id)
    written = [name for name, _ in _visible_files(inbox.outbox, where)]
    failed = _visible_files(inbox.failed, where)
    done = _visible_files(inbox.done, where)

    def found(state: DocumentState, name: str, uploaded: float | None) -> Found:
        relative = f"{UPLOADS_FOLDER}/{upload_id}/{name}"
        result = Found(upload_id, str(inbox.path), state, relative)
        result.uploaded_at = iso(uploaded) if uploaded is not None else None
        result.claim = claimed.id if claimed else None
        result.started_at = claimed.claimed_at if claimed else None
        return result

    planned = claimed.markdown if claimed and claimed.markdown else None
    markdown = _pick(
        [name for name in written if name.endswith(".md")],
        [f"{PurePath(done[0][0]).stem}.md" if done else None,
         PurePath(planned).name if planned else None],
    )  # fmt: skip
    originals = [(n, i) for n, i in failed if not n.endswith(ERROR_SUFFIX)]
    planned = claimed.error_report if claimed and claimed.error_report else None
    report = _pick(
        [name for name, _ in failed if name.endswith(ERROR_SUFFIX)],
        [f"{PurePath(originals[0][0]).stem}{ERROR_SUFFIX}" if originals else None,
         PurePath(planned).name if planned else None],
    )  # fmt: skip
    if markdown is not None:
        original = done[0] if done else None
        uploaded = original[1].st_mtime if original else claimed.uploaded if claimed else None
        result = found(DocumentState.done, original[0] if original else markdown, uploaded)
        result.outputs = Outputs(inbox.outbox, where, markdown)
        result.files = result.outputs.present()
        with contextlib.suppress(OSError):
            with _folder(inbox.outbox, where) as folder:
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


def tidy(inbox: InboxConfig, stale_after: float, now: float | None = None) -> int:
    """Remove from `<inbox>/uploads/` the parts of uploads that cannot still be arriving
    (older than `stale_after`: a run killed while receiving) and the folders claims left
    empty a while ago; how many folders went. Blocking."""
    now = time.time() if now is None else now
    removed = 0
    try:
        with _folder(inbox.path, (UPLOADS_FOLDER,)) as uploads:
            for name in os.listdir(uploads):
                if UPLOAD_ID.match(name) and _tidy_folder(uploads, name, stale_after, now):
                    removed += 1
    except (FileNotFoundError, NotADirectoryError, NotRegularFile):
        pass
    return removed


def _tidy_folder(uploads: int, name: str, stale_after: float, now: float) -> bool:
    try:
        folder = os.open(name, DIRECTORY, dir_fd=uploads)
    except OSError:
        return False  # gone, or not a folder: not ours to touch
    try:
        for entry in os.listdir(folder):
            info = os.stat(entry, dir_fd=folder, follow_symlinks=False)
            if entry == PART and now - info.st_mtime > stale_after:
                os.unlink(entry, dir_fd=folder)
        if os.listdir(folder) or now - os.fstat(folder).st_mtime < EMPTY_FOR_SECONDS:
            return False
    except FileNotFoundError:
        return False
    finally:
        os.close(folder)
    try:
        os.rmdir(name, dir_fd=uploads)  # refuses a folder that is no longer empty
    except OSError:
        return False
    return True


class Uploads:
    """Uploads into the configured inboxes, and what became of each document."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.in_flight: Mapping[str, InFlight] = {}
        self._remembered: OrderedDict[str, _Remembered] = OrderedDict()
        self._news = asyncio.Event()  # set (and replaced) when a document settles here
        self.log = get_logger()

    def configure(self, config: Config) -> None:
        """The configuration after a reload."""
        self.config = config

    def follow(self, runner: DocumentRunner) -> None:
        """Progress from the documents in flight; settlements as they happen."""
        self.in_flight = runner.in_flight
        runner.on_finished.append(self.document_finished)

    # --- taking an upload --------------------------------------------------------------

    def inbox_for(self, name: str | None) -> InboxConfig:
        """The inbox an upload goes to: the one named (its path, or its folder's name when
        that is unambiguous), or the first that takes uploads. UploadRefused otherwise."""
        taking = [inbox for inbox in self.config.inboxes if inbox.uploads]
        if not name:
            if not taking:
                raise UploadRefused(403, "uploads are off: no inbox has 'uploads: true'")
            return taking[0]
        named = [
            inbox for inbox in self.config.inboxes if name in (str(inbox.path), inbox.path.name)
        ]
        if len(named) != 1:
            known = ", ".join(str(inbox.path) for inbox in taking) or "none"
            why = "no" if not named else "more than one"
            raise UploadRefused(
                404, f"{why} inbox is called {name!r}; inboxes taking uploads: {known}"
            )
        if not named[0].uploads:
            raise UploadRefused(403, f"inbox {named[0].path} does not take uploads")
        return named[0]

    @staticmethod
    def begin(inbox: InboxConfig, name: str) -> Receiving:
        """Start receiving a file called `name` (cleaned) into `inbox`; UploadRefused where
        the inbox would not take a file so named. Blocking."""
        upload_id = new_upload_id()
        relative = PurePath(UPLOADS_FOLDER, upload_id, name)
        if not is_candidate_name(relative, inbox) or job_folder_of(relative, inbox, False):
            raise UploadRefused(
                422,
                f"inbox {inbox.path} would never take a file named {name!r} (hidden, "
                "temporary or lock-file names, and its include and ignore patterns); "
                "send it under another name",
            )
        return Receiving.begin(inbox, upload_id, name)

    # --- finding documents -------------------------------------------------------------

    async def find(self, document_id: str) -> Found | None:
        """An upload's state from its files (a finished dropped document's from memory, by
        its claim id), with its progress while it converts here."""
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
            found = await self.find(document_id)
            left = deadline - loop.time()
            settled = found is not None and found.settled and not self._telling(document_id)
            if found is None or settled or left <= 0:
                return found
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, RECHECK_SECONDS)):
                    await news.wait()

    def _telling(self, document_id: str) -> bool:
        """Settled in its files while this daemon has yet to tell its summary (pages,
        timing), which comes a moment later."""
        return document_id not in self._remembered and any(
            _upload_of(str(flight.path)) == document_id for flight in self.in_flight.values()
        )

    def document_finished(self, inbox: InboxConfig, summary: DocumentSummary) -> None:
        remembered = _Remembered(inbox, summary)
        keys = [summary.doc]
        upload = _upload_of(summary.path)
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

    # --- tidying -----------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def tidying(self) -> AsyncIterator[None]:
        """Tidy the upload folders now and every `TIDY_SECONDS` while the context lasts."""
        task = asyncio.create_task(self._tidy_forever())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _tidy_forever(self) -> None:
        while True:
            stale_after = self.config.http.upload_timeout_seconds + TIDY_SECONDS
            for inbox in list(self.config.inboxes):
                try:
                    await asyncio.to_thread(tidy, inbox, stale_after)
                except OSError as error:
                    self.log.warning(
                        "uploads.tidy_failed",
                        inbox=str(inbox.path),
                        error=printable(str(error)),
                        action="tried again later",
                    )
            await asyncio.sleep(TIDY_SECONDS)


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
        with contextlib.suppress(ValueError):
            folder = markdown.parent.relative_to(inbox.outbox).parts
            found.outputs = Outputs(inbox.outbox, folder, markdown.name)
            found.files = found.outputs.present()
    else:
        found.stage = summary.stage.value if summary.stage else None
        found.page, found.reason = summary.page, summary.reason
        found.error_report = summary.error_report
    return found
