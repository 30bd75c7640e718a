"""Uploads: files handed over by HTTP go into an inbox as if someone had dropped them there.

An upload gets a random id (128 bits, base32) and is written, hidden, into a folder of its
own, `<inbox>/uploads/<id>/.upload.part` (the watcher ignores hidden names), made durable,
recorded and linked to `<inbox>/uploads/<id>/<name>` once complete (`receiving.py`: every
folder and file of it is ocrd's alone). From there it is claimed, converted and settled
like any dropped file; its relative path keeps it apart in the outbox, done/ and failed/
(`ocrd/web/documents.py` finds its state from those files).

The uploads folder is held open and put back where someone who may write the inbox renamed
or replaced it (`guard.py`). The folders a claim leaves behind (holding only the record),
and a hidden part a killed run left, are tidied away periodically; the same round notices
an uploads folder ocrd cannot use and cannot set aside (a link, a file, someone else's
folder in a sticky inbox), which is a problem until it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import PurePath

from ocrd.config import UPLOADS_FOLDER, Config, InboxConfig
from ocrd.config.inboxes import is_candidate_name, job_folder_of
from ocrd.files.beneath import DIRECTORY
from ocrd.files.dropped import NotRegularFile, printable
from ocrd.log import get_logger
from ocrd.uploads.guard import UploadsGuard
from ocrd.uploads.receiving import (
    PART,
    RECORD,
    UPLOAD_ID,
    Receiving,
    UploadRefused,
    UploadsFolderUnusable,
    name_too_long,
    new_upload_id,
    private_entries,
    uploads_folder,
)

TIDY_SECONDS = 10.0  # how often empty upload folders and stale parts are looked for
# An upload folder holding nothing but its record this long is removed: a claim took its
# file (a folder just made for an upload holds its part within microseconds).
EMPTY_FOR_SECONDS = 5.0


def tidy(inbox: InboxConfig, stale_after: float, now: float | None = None) -> int:
    """Remove from `<inbox>/uploads/` the parts of uploads that cannot still be arriving
    (older than `stale_after`: a run killed while receiving) and the folders claims left
    holding only their record a while ago; keep every folder and file there ocrd's alone.
    How many folders went. UploadsFolderUnusable where the uploads folder is no folder of
    ocrd's. Blocking."""
    now = time.time() if now is None else now
    removed = 0
    try:
        with uploads_folder(inbox.path, make=False) as uploads:
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
        private_entries(folder)
        for entry in os.listdir(folder):
            info = os.stat(entry, dir_fd=folder, follow_symlinks=False)
            if entry == PART and now - info.st_mtime > stale_after:
                os.unlink(entry, dir_fd=folder)
        if set(os.listdir(folder)) - {RECORD}:
            return False  # the upload still waits (or something ocrd leaves alone)
        if now - os.fstat(folder).st_mtime < EMPTY_FOR_SECONDS:
            return False
        with contextlib.suppress(FileNotFoundError):
            os.unlink(RECORD, dir_fd=folder)
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
        # Inboxes whose uploads folder ocrd cannot use, and why (shown until it is fixed).
        self.unusable: dict[str, str] = {}
        self.guard = UploadsGuard()

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

    def begin(self, inbox: InboxConfig, name: str, given: str | None = None) -> Receiving:
        """Start receiving a file called `name` (cleaned from `given`, what the client
        said) into `inbox`; UploadRefused where the inbox would not take a file so named.
        Blocking."""
        upload_id = new_upload_id()
        relative = PurePath(UPLOADS_FOLDER, upload_id, name)
        said = printable(given) if given is not None else name
        if not is_candidate_name(relative, inbox) or job_folder_of(relative, inbox, False):
            raise UploadRefused(
                422,
                f"inbox {inbox.path} would never take a file named {said!r} (hidden, "
                "temporary or lock-file names, and its include and ignore patterns); "
                "send it under another name",
            )
        if name_too_long(name, inbox.path):
            raise UploadRefused(
                422,
                f"the name {said!r} is too long for inbox {inbox.path} ({len(os.fsencode(name))} "
                "bytes); send it under a shorter name",
            )
        self.keep_folder(inbox)
        try:
            return Receiving.begin(inbox, upload_id, name)
        except UploadsFolderUnusable as unusable:
            self.notice_unusable(inbox, str(unusable))
            raise UploadRefused(503, f"{unusable}; an operator must remove it") from None

    def keep_folder(self, inbox: InboxConfig) -> None:
        """Put the inbox's uploads folder back where someone renamed or replaced it
        (`guard.py`); where that fails, uploads_folder says why uploads cannot go there.
        Blocking."""
        try:
            self.guard.keep(inbox.path)
        except OSError as error:
            self.log.warning(
                "uploads.guard_failed",
                inbox=str(inbox.path),
                error=printable(str(error)),
                action="tried again at the next upload and tidying round",
            )

    def problems(self) -> list[str]:
        """Inboxes taking uploads whose uploads folder ocrd cannot use."""
        return [f"UPLOADS UNUSABLE in {inbox}: {why}" for inbox, why in self.unusable.items()]

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
            self.guard.close()

    async def _tidy_forever(self) -> None:
        while True:
            await self.tidy_now()
            await asyncio.sleep(TIDY_SECONDS)

    async def tidy_now(self) -> None:
        """One round over every inbox: tidy its uploads folder, and notice one ocrd cannot
        use (a problem while it lasts, logged when it appears and when it is gone)."""
        stale_after = self.config.http.upload_timeout_seconds + TIDY_SECONDS
        taking = {str(inbox.path) for inbox in self.config.inboxes if inbox.uploads}
        for gone in set(self.unusable) - taking:
            del self.unusable[gone]  # uploads switched off there by a reload
        for inbox in [inbox for inbox in self.config.inboxes if inbox.uploads]:
            await asyncio.to_thread(self.keep_folder, inbox)
            try:  # (an `uploads` folder in an inbox taking none is people's own)
                await asyncio.to_thread(tidy, inbox, stale_after)
            except UploadsFolderUnusable as unusable:
                self.notice_unusable(inbox, str(unusable))
                continue
            except OSError as error:
                self.log.warning(
                    "uploads.tidy_failed",
                    inbox=str(inbox.path),
                    error=printable(str(error)),
                    action="tried again later",
                )
                continue
            if self.unusable.pop(str(inbox.path), None) is not None:
                self.log.info("uploads.usable", inbox=str(inbox.path))

    def notice_unusable(self, inbox: InboxConfig, reason: str) -> None:
        """Uploads into `inbox` cannot be kept: a problem until the uploads folder is fixed
        (logged once)."""
        if self.unusable.get(str(inbox.path)) == reason:
            return
        self.unusable[str(inbox.path)] = reason
        self.log.error(
            "uploads.unusable",
            inbox=str(inbox.path),
            reason=reason,
            action="uploads into this inbox are answered 503 until an operator removes what "
            f"lies at {inbox.path / UPLOADS_FOLDER}",
        )
