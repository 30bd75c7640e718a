"""A task's options, kept beside its upload: what a client of the docling-serve API asked
for that changes how the document is converted (a page range, the text layer against the
pixels, figures, the page separator), and what it asked to get back (formats, images).

Its record is kept twice: ocrd's own copy in `<work>/.tasks/<id>.json`, where people who
may write the inbox cannot change, rename or remove it, by which the task is found and
converted; and `<inbox>/uploads/<id>/.task.json` (what an older ocrd read): hidden, so no
watcher takes it for a document. Both are made durable before the upload gets its name,
so a claim never sees an upload without them. They stay after the claim has taken the
file, so a document claimed again after a restart (or by another daemon sharing the inbox)
is converted with the same options; they go when the task's results are tidied away.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import PurePath
from typing import Annotated, Any

from pydantic import Field, ValidationError

from ocrd.config import UPLOADS_FOLDER, InboxConfig, OutputKind, PdfText
from ocrd.config.base import Strict
from ocrd.files.beneath import DIRECTORY, entries_beneath, folder_beneath
from ocrd.files.dropped import NotRegularFile
from ocrd.uploads.receiving import RECORD as UPLOAD_RECORD
from ocrd.uploads.receiving import UPLOAD_ID, upload_of

RECORD = ".task.json"
REGISTRY = ".tasks"  # in the inbox's work area: ocrd's own copy of each task's record
MAX_RECORD_BYTES = 64 * 1024
TASK_OUTPUTS = (OutputKind.docling,)  # what a task's answer is assembled from


class TaskRecordError(Exception):
    """A task's record exists but cannot be read: its document must not be converted
    under other options than those asked for."""


class TaskOptions(Strict):
    """What a task asked for. Unset fields leave the inbox's settings as they are."""

    created_at: float  # wall-clock seconds
    pages: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None = None
    pdf_text: PdfText | None = None
    figures: bool | None = None
    page_separator: str | None = None
    # What the answer holds (the result is assembled from the outputs when asked for).
    to_formats: tuple[str, ...] = ("md",)
    image_export_mode: str = "placeholder"
    filename: str = ""  # as the client named it
    # A chunk task (docling-serve's /v1/chunk routes): its chunking options, and whether
    # its answer holds the DoclingDocument too. None: a conversion task.
    chunking: dict[str, Any] | None = None
    include_converted_doc: bool = False

    def record(self) -> bytes:
        return self.model_dump_json().encode()

    def inbox_settings(self, inbox: InboxConfig) -> InboxConfig:
        """The inbox's settings with this task's changes: its options, its answer's
        outputs (a DoclingDocument, and the layout file that says which pages the engine
        left unfinished)."""
        update: dict[str, Any] = {
            "outputs": tuple(dict.fromkeys((*inbox.outputs, *TASK_OUTPUTS))),
            "layout_file": True,
        }
        if self.pdf_text is not None:
            update["pdf_text"] = self.pdf_text
        if self.figures is not None:
            update["figures"] = self.figures
        if self.page_separator is not None:
            update["page_separator"] = self.page_separator
        return inbox.model_copy(update=update)


def write_record(folder: int, options: TaskOptions, name: str = RECORD) -> None:
    """Write the record into an upload's folder (a descriptor), durably. Blocking."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(name, flags, 0o600, dir_fd=folder)
    try:
        data = memoryview(options.record())
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_record(inbox: InboxConfig, upload_id: str) -> TaskOptions | None:
    """The task record of an upload: ocrd's own copy in the work area (which people who
    may write the inbox cannot change), else the one beside the upload (a task an older
    ocrd accepted); None where it has none (an upload of the documents API). TaskRecordError
    where it has one that cannot be read. Blocking."""
    for root, parts, name in (
        (inbox.work, (REGISTRY,), f"{upload_id}.json"),
        (inbox.path, (UPLOADS_FOLDER, upload_id), RECORD),
    ):
        try:
            with folder_beneath(root, parts) as folder:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
        except (FileNotFoundError, NotADirectoryError, NotRegularFile):
            continue
        except OSError as error:
            raise TaskRecordError(f"cannot open its task record: {error.strerror}") from None
        return _parsed(fd)
    return None


def _parsed(fd: int) -> TaskOptions:
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_RECORD_BYTES + 1)
    try:
        if len(data) > MAX_RECORD_BYTES:
            raise ValueError("it is too large")
        return TaskOptions.model_validate(json.loads(data))
    except (ValueError, ValidationError) as error:
        raise TaskRecordError(f"its task record is damaged: {error}") from None


def register(inbox: InboxConfig, upload_id: str, options: TaskOptions) -> None:
    """Keep ocrd's own copy of a task's record in `<work>/.tasks/` (ocrd's alone, as the
    work area is): a task is found by it whatever becomes of the inbox's folders. Durable
    before the upload is in the inbox. Blocking."""
    with folder_beneath(inbox.work, (), make=True) as work:
        with contextlib.suppress(FileExistsError):
            os.mkdir(REGISTRY, 0o700, dir_fd=work)
        folder = os.open(REGISTRY, DIRECTORY, dir_fd=work)
    try:
        write_record(folder, options, f"{upload_id}.json")
        os.fsync(folder)
    finally:
        os.close(folder)


def registered(inbox: InboxConfig) -> list[str]:
    """The ids of the tasks ocrd keeps a record of for this inbox. Blocking."""
    names = [name for name, _ in entries_beneath(inbox.work, (REGISTRY,))]
    return [name[: -len(".json")] for name in names if UPLOAD_ID.match(name[: -len(".json")])]


def task_of(inbox: InboxConfig, relative: str | PurePath) -> TaskOptions | None:
    """The options of the task a claimed document belongs to, if it is one. Blocking."""
    upload_id = upload_of(str(relative))
    return read_record(inbox, upload_id) if upload_id is not None else None


def remove_record(inbox: InboxConfig, upload_id: str) -> None:
    """Remove a task's record, the upload's record, and its upload folder (empty by
    then). Blocking."""
    gone = (FileNotFoundError, NotADirectoryError, NotRegularFile)
    with contextlib.suppress(*gone), folder_beneath(inbox.path, (UPLOADS_FOLDER, upload_id)) as fd:
        for record in (RECORD, UPLOAD_RECORD):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(record, dir_fd=fd)
    with contextlib.suppress(*gone), folder_beneath(inbox.work, (REGISTRY,)) as fd:
        os.unlink(f"{upload_id}.json", dir_fd=fd)
    # A folder that holds something else stays (OSError).
    with contextlib.suppress(OSError), folder_beneath(inbox.path, (UPLOADS_FOLDER,)) as uploads:
        os.rmdir(upload_id, dir_fd=uploads)
