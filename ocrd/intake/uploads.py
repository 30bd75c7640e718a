"""Uploads: files handed over by HTTP go into an inbox as if someone had dropped them there.

An upload gets a random id (128 bits, base32) and is written, hidden, into a folder of its
own, `<inbox>/uploads/<id>/.upload.part` (the watcher ignores hidden names), made durable
and linked to `<inbox>/uploads/<id>/<name>` once complete. From there it is claimed,
converted and settled like any dropped file; its relative path keeps it apart in the
outbox, done/ and failed/ (`ocrd/web/documents.py` finds its state from those files).

Every folder on the way is opened without following a link (`ocrd/files/beneath.py`). The
empty `uploads/<id>/` folder a claim leaves behind, and a hidden part a killed run left,
are tidied away periodically.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import errno
import os
import re
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path, PurePath

from ocrd.config import UPLOADS_FOLDER, Config, InboxConfig
from ocrd.files import numbered
from ocrd.files.beneath import DIRECTORY, folder_beneath
from ocrd.files.dropped import NotRegularFile, printable
from ocrd.intake.watch import is_candidate_name, job_folder_of
from ocrd.log import get_logger

UPLOAD_ID = re.compile(r"^[a-z2-7]{26}$")  # 128 random bits in base32
PART = ".upload.part"  # the upload while it arrives: hidden, so never a candidate
DEFAULT_NAME = "upload"
TIDY_SECONDS = 10.0  # how often empty upload folders and stale parts are looked for
# An upload folder empty this long is removed: a claim took its file (a folder just made
# for an upload holds its part within microseconds).
EMPTY_FOR_SECONDS = 5.0
_REFUSED_CHARACTERS = re.compile(r'[<>:"|?*\x00-\x1f\x7f]')


class UploadRefused(Exception):
    """An upload that is not taken: the HTTP status to answer, and why, in words."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def new_upload_id() -> str:
    return base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


def upload_of(relative: str) -> str | None:
    """The upload id in a relative path `uploads/<id>/<name>`, if it is one."""
    parts = PurePath(relative).parts
    if len(parts) == 3 and parts[0] == UPLOADS_FOLDER and UPLOAD_ID.match(parts[1]):
        return parts[1]
    return None


def clean_filename(given: str | None) -> str:
    """The name an upload is given in the inbox: the last component of what the client
    said, without characters a share refuses or control characters, never hidden, at most
    200 bytes for its stem (the extension is kept)."""
    name = (given or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = printable(name).replace("\\", "_")
    name = _REFUSED_CHARACTERS.sub("_", name).strip().lstrip(".").strip()
    return numbered(Path(name or DEFAULT_NAME), 1).name



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

    @property
    def folder(self) -> int:
        """A descriptor of the upload's own folder, until it is committed or aborted: a
        record written there beside the file (`ocrd/intake/tasks.py`) is in place before
        the file is."""
        return self._folder

    @classmethod
    def begin(cls, inbox: InboxConfig, upload_id: str, name: str) -> Receiving:
        """A new upload folder in `inbox` with an empty hidden part in it."""
        with folder_beneath(inbox.path, ()) as root:
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


def tidy(inbox: InboxConfig, stale_after: float, now: float | None = None) -> int:
    """Remove from `<inbox>/uploads/` the parts of uploads that cannot still be arriving
    (older than `stale_after`: a run killed while receiving) and the folders claims left
    empty a while ago; how many folders went. Blocking."""
    now = time.time() if now is None else now
    removed = 0
    try:
        with folder_beneath(inbox.path, (UPLOADS_FOLDER,)) as uploads:
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
    """Uploads into the configured inboxes: which inbox takes one, receiving it, tidying."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.log = get_logger()

    def configure(self, config: Config) -> None:
        """The configuration after a reload."""
        self.config = config

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

