"""Tasks of the docling-serve API: an upload with a task record (`ocrd/uploads/tasks.py`),
followed as any upload is (`ocrd/web/documents.py`), so its state comes from its files and
survives a restart, whichever daemon sharing the inbox converts it.

    pending          waiting in the inbox (task_position: uploads with a task ahead of it)
    started          claimed, being converted
    success          done
    partial_success  done, with pages the engine left unfinished (named in `errors`)
    failure          failed (the reason from its error report)

A result is assembled from the document's outputs when it is asked for: the Markdown, the
DoclingDocument (`<name>.docling.json`) and its text, with the figures as the client asked
(a placeholder, embedded as data URLs, or referenced by their URLs in the documents API).
Settled tasks' files (outputs, original, error report, record) are removed
`results_keep_seconds` after they settled.
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import contextlib
import json
import os
import re
import shutil
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from ocrd.config import UPLOADS_FOLDER, Config, InboxConfig
from ocrd.files.beneath import entries_beneath, folder_beneath, visible_files
from ocrd.files.dropped import printable
from ocrd.log import get_logger
from ocrd.output.write import OutputFiles
from ocrd.uploads.receiving import UPLOAD_ID
from ocrd.uploads.tasks import (
    TaskOptions,
    TaskRecordError,
    read_record,
    registered,
    remove_record,
)
from ocrd.web.documents import RECHECK_SECONDS, Documents, DocumentState, Found, Outputs

TIDY_SECONDS = 60.0
QUEUE_SECONDS = 2.0  # how old the list of waiting tasks that positions come from may be
MAX_OUTPUT_BYTES = 256 * 1024 * 1024  # an output read back into an answer
PART_BREAK = "\n\n"  # between the Markdown of a split document's parts
PLACEHOLDER = "<!-- image -->"
# The keys of docling-serve's `document` (ExportDocumentResponse) beside `filename`.
CONTENT_KEYS = (
    "md_content",
    "json_content",
    "html_content",
    "text_content",
    "doctags_content",
    "doclang_content",
)
FROM_DOCLING = (
    "json",
    "text",
    "html",
    "doctags",
)  # the formats made from the DoclingDocument  # docling's placeholder for a picture
_LINK = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


class TaskStatus(StrEnum):
    pending = "pending"
    started = "started"
    success = "success"
    partial_success = "partial_success"
    failure = "failure"


@dataclass
class Task:
    """What is known of one task."""

    found: Found
    options: TaskOptions
    position: int | None = None
    unfinished_pages: list[int] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.found.id

    @property
    def status(self) -> TaskStatus:
        state = self.found.state
        if state is DocumentState.waiting:
            return TaskStatus.pending
        if state is DocumentState.converting:
            return TaskStatus.started
        if state is DocumentState.failed:
            return TaskStatus.failure
        return TaskStatus.partial_success if self.unfinished_pages else TaskStatus.success

    @property
    def settled(self) -> bool:
        return self.found.settled

    @property
    def error_message(self) -> str | None:
        if self.status is TaskStatus.failure:
            return self.found.reason or "the document could not be converted"
        return None

    @property
    def processing_time(self) -> float:
        """Seconds from the upload to the settlement (to now while it is not settled)."""
        start = _seconds(self.found.uploaded_at) or self.options.created_at
        end = _seconds(self.found.finished_at) or time.time()
        return round(max(end - start, 0.0), 3)


def _seconds(iso: str | None) -> float | None:
    if not iso:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(iso).timestamp()
    return None


def _read(outputs: Outputs, parts: tuple[str, ...]) -> bytes | None:
    """One output file, or None where it is not there. Blocking."""
    try:
        fd = outputs.open(parts)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        return handle.read(MAX_OUTPUT_BYTES)


def unfinished_pages(outputs: Outputs) -> list[int]:
    """The pages the engine left unfinished, from the layout file a task's document gets
    (each part's, where it was split)."""
    pages: list[int] = []
    for markdown in outputs.markdowns:
        layout = _read(outputs, (OutputFiles(Path(markdown)).layout.name,))
        with contextlib.suppress(ValueError, TypeError, AttributeError):
            listed = json.loads(layout or b"{}").get("unfinished_pages", [])
            pages += [int(page) for page in listed]
    return pages


def waiting_tasks(inbox: InboxConfig) -> list[float]:
    """When each task still waiting in the inbox was accepted, in order. Blocking."""
    accepted = []
    for name, info in entries_beneath(inbox.path, (UPLOADS_FOLDER,)):
        if not UPLOAD_ID.match(name) or not info.st_mtime:
            continue
        if not visible_files(inbox.path, (UPLOADS_FOLDER, name)):
            continue  # claimed (or not yet complete)
        with contextlib.suppress(TaskRecordError):
            task = read_record(inbox, name)
            if task is not None:
                accepted.append(task.created_at)
    return sorted(accepted)


# --- the answer ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Images:
    """How pictures are answered: `mode`, and for `referenced` the documents API's URL of
    the document's folder (figures are its files)."""

    mode: str
    base_url: str

    def uri(self, outputs: Outputs, link: str) -> str | None:
        """The picture's URI in the answer; None: a placeholder."""
        if self.mode == "referenced":
            return f"{self.base_url}/{link}"
        if self.mode != "embedded":
            return None
        data = _read(outputs, tuple(unquote(link).split("/")))
        return f"data:image/png;base64,{base64.b64encode(data).decode()}" if data else None


def markdown_for(text: str, outputs: Outputs, images: Images) -> str:
    assets = quote(OutputFiles(Path(outputs.markdown)).assets.name, errors="surrogateescape")

    def replace(match: re.Match[str]) -> str:
        link = match.group(2)
        if not link.startswith(f"{assets}/"):
            return match.group(0)
        uri = images.uri(outputs, link)
        return f"![{match.group(1)}]({uri})" if uri else PLACEHOLDER

    return _LINK.sub(replace, text)


def docling_for(data: dict[str, Any], outputs: Outputs, images: Images) -> dict[str, Any]:
    """The DoclingDocument's pictures with their images as asked (none: a placeholder)."""
    for picture in data.get("pictures", []):
        image = picture.get("image")
        if not isinstance(image, dict) or not isinstance(image.get("uri"), str):
            continue
        link = quote(image["uri"], safe="/")
        uri = images.uri(outputs, link)
        if uri is None:
            picture.pop("image")
        else:
            image["uri"] = uri
    return data


def document_content(task: Task, images: Images) -> dict[str, Any]:
    """`document` of docling-serve's answer: the formats the task asked for, of the whole
    document (a document split at separator or blank pages: its parts joined, in order),
    and null for those it did not. Blocking."""
    found, formats = task.found, task.options.to_formats
    content: dict[str, Any] = {"filename": task.options.filename or printable(found.name)}
    content.update(dict.fromkeys(CONTENT_KEYS))
    outputs = found.outputs
    if outputs is None or task.status is TaskStatus.failure:
        return content
    parts = [Outputs(outputs.root, outputs.folder, (name,)) for name in outputs.markdowns]
    if "md" in formats:
        content["md_content"] = PART_BREAK.join(
            markdown_for(
                (_read(part, (part.markdown,)) or b"").decode("utf-8", "replace"), part, images
            )
            for part in parts
        )
    if set(formats) & set(FROM_DOCLING):
        data = _joined([_docling_of(part, images) for part in parts])
        if data is not None:
            content.update(exports(data, formats, images.mode))
    return content


def docling_document(task: Task, images: Images) -> dict[str, Any] | None:
    """The task's whole DoclingDocument (its parts joined); None where it has none."""
    outputs = task.found.outputs
    if outputs is None or task.status is TaskStatus.failure:
        return None
    parts = [Outputs(outputs.root, outputs.folder, (name,)) for name in outputs.markdowns]
    return _joined([_docling_of(part, images) for part in parts])


def exports(data: dict[str, Any], formats: tuple[str, ...], mode: str) -> dict[str, Any]:
    """docling-core's exports of the DoclingDocument that `formats` asks for."""
    content: dict[str, Any] = {}
    if "json" in formats:
        content["json_content"] = data
    if not set(formats) & {"text", "html", "doctags"}:
        return content
    # docling-core takes over a second to import: only answers that need it pay.
    from docling_core.types.doc.base import ImageRefMode
    from docling_core.types.doc.document import DoclingDocument

    document = DoclingDocument.model_validate(data)
    if "text" in formats:
        content["text_content"] = document.export_to_text()
    if "html" in formats:
        content["html_content"] = document.export_to_html(image_mode=ImageRefMode(mode))
    if "doctags" in formats:
        content["doctags_content"] = document.export_to_doctags()
    return content


def _docling_of(part: Outputs, images: Images) -> dict[str, Any] | None:
    raw = _read(part, (OutputFiles(Path(part.markdown)).docling.name,))
    return docling_for(json.loads(raw), part, images) if raw else None


def _joined(documents: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One DoclingDocument of a document's parts (None where a part has none)."""
    if any(document is None for document in documents) or not documents:
        return None
    if len(documents) == 1:
        return documents[0]
    from docling_core.types.doc.document import DoclingDocument  # slow to import: see exports

    parts = [DoclingDocument.model_validate(document) for document in documents]
    joined = DoclingDocument.concatenate(parts)
    joined.name = parts[0].name
    return joined.export_to_dict()


def errors_of(task: Task) -> list[dict[str, Any]]:
    """docling's error items: the failure, or each page the engine left unfinished."""
    if task.status is TaskStatus.failure:
        return [
            {
                "component_type": "pipeline",
                "module_name": "ocrd",
                "error_message": task.error_message,
                "category": "unknown",
                "page_no": task.found.page,
            }
        ]
    return [
        {
            "component_type": "model",
            "module_name": "ocrd",
            "category": "inference_failure",
            "error_message": f"page {page} is incomplete: the engine stopped it before its end",
            "page_no": page,
        }
        for page in task.unfinished_pages
    ]


# --- finding, waiting, tidying -------------------------------------------------------------------


class Tasks:
    """The tasks of the docling-serve API, found from their files."""

    def __init__(self, documents: Documents, config: Callable[[], Config]) -> None:
        self.documents = documents
        self.config = config  # the daemon's configuration now (a reload changes it)
        self.log = get_logger()
        self._queues: dict[str, tuple[float, list[float]]] = {}  # per inbox: made, queue
        self._queue_lock = asyncio.Lock()

    def _inbox(self, path: str) -> InboxConfig | None:
        return next((i for i in self.config().inboxes if str(i.path) == path), None)

    async def find(self, task_id: str, wait: float = 0.0) -> Task | None:
        """The task (once settled, or after `wait` seconds); None if there is none."""
        if not UPLOAD_ID.match(task_id):
            return None
        found = await (
            self.documents.settled(task_id, wait) if wait else self.documents.find(task_id)
        )
        inbox = self._inbox(found.inbox) if found is not None else None
        if found is None or inbox is None:
            return await self._unseen(task_id, wait)
        task = await asyncio.to_thread(self._task, inbox, found)
        if task is not None and task.status is TaskStatus.pending:
            task.position = await self._position(inbox, task)
        return task

    async def _unseen(self, task_id: str, wait: float) -> Task | None:
        """A task ocrd accepted whose file is nowhere it looks (someone moved the uploads
        folder, which `ocrd/uploads/guard.py` puts back): still pending, never unknown."""
        for inbox in [i for i in self.config().inboxes if i.uploads]:
            with contextlib.suppress(TaskRecordError):
                options = await asyncio.to_thread(read_record, inbox, task_id)
                if options is not None:
                    await asyncio.sleep(min(wait, RECHECK_SECONDS))
                    relative = f"{UPLOADS_FOLDER}/{task_id}/{options.filename}"
                    waiting = Found(task_id, str(inbox.path), DocumentState.waiting, relative)
                    return Task(waiting, options)
        return None

    @staticmethod
    def _task(inbox: InboxConfig, found: Found) -> Task | None:
        try:
            options = read_record(inbox, found.id)
        except TaskRecordError:
            options = None
        if options is None:
            return None  # an upload of the documents API, or a task tidied away
        task = Task(found, options)
        if found.state is DocumentState.done and found.outputs is not None:
            task.unfinished_pages = unfinished_pages(found.outputs)
        return task

    async def _position(self, inbox: InboxConfig, task: Task) -> int:
        """1 + the tasks waiting in the inbox that were accepted before this one, from a
        list of them made at most every QUEUE_SECONDS (shared by every poll meanwhile: a
        poll costs the same with a thousand tasks waiting as with one)."""
        key = str(inbox.path)
        async with self._queue_lock:
            made, queue = self._queues.get(key, (-QUEUE_SECONDS, []))
            if time.monotonic() - made >= QUEUE_SECONDS:
                queue = await asyncio.to_thread(waiting_tasks, inbox)
                self._queues[key] = (time.monotonic(), queue)
        return 1 + bisect.bisect_left(queue, task.options.created_at)

    @contextlib.asynccontextmanager
    async def tidying(self) -> AsyncIterator[None]:
        """Remove expired tasks now and every `TIDY_SECONDS` (or `results_keep_seconds`,
        where that is shorter) while the context lasts."""
        job = asyncio.create_task(self._tidy_forever())
        try:
            yield
        finally:
            job.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await job

    async def _tidy_forever(self) -> None:
        while True:
            config = self.config()
            keep = config.http.docling.results_keep_seconds
            for inbox in [i for i in config.inboxes if i.uploads]:
                try:
                    removed = await self.tidy(inbox, keep)
                except OSError as error:
                    self.log.warning(
                        "task.tidy_failed",
                        inbox=str(inbox.path),
                        error=printable(str(error)),
                        action="tried again later",
                    )
                    continue
                for task_id in removed:
                    self.log.info("task.expired", id=task_id, inbox=str(inbox.path))
            await asyncio.sleep(min(TIDY_SECONDS, keep))

    async def tidy(self, inbox: InboxConfig, keep: float, now: float | None = None) -> list[str]:
        """Remove the files of this inbox's tasks that settled more than `keep` seconds
        ago; their ids."""
        now = time.time() if now is None else now
        removed = []
        for name in await asyncio.to_thread(task_ids, inbox):
            try:
                options = await asyncio.to_thread(read_record, inbox, name)
            except TaskRecordError:
                options = None
            if options is None:
                continue
            found = await self.documents.find(name)
            if found is not None and not found.settled:
                continue
            # No document at all: an upload that never completed, as old as its record.
            finished = (_seconds(found.finished_at) if found else None) or options.created_at
            if now - finished < keep:
                continue
            await asyncio.to_thread(remove_task, inbox, name)
            removed.append(name)
        return removed


def task_ids(inbox: InboxConfig) -> set[str]:
    """The ids of the inbox's tasks: those ocrd keeps a record of, and the upload folders
    (of tasks an older ocrd accepted). Blocking."""
    folders = [name for name, _ in entries_beneath(inbox.path, (UPLOADS_FOLDER,))]
    return {name for name in folders if UPLOAD_ID.match(name)} | set(registered(inbox))


def remove_task(inbox: InboxConfig, upload_id: str) -> None:
    """A task's files: its outputs, its original in done/ or failed/ (with the error
    report), and its record. Each tree removed beneath its root, never through a link."""
    for root in (inbox.outbox, inbox.done, inbox.failed):
        with (
            contextlib.suppress(FileNotFoundError, NotADirectoryError, OSError),
            folder_beneath(root, (UPLOADS_FOLDER,)) as uploads,
        ):
            shutil.rmtree(upload_id, dir_fd=uploads)
    remove_record(inbox, upload_id)
