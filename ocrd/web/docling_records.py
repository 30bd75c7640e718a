"""A docling task's record and its answer: which options a request's file may be converted
with (`from_formats` by the name's kind, the answer's target), and the task as docling-serve
describes one."""

from __future__ import annotations

import time

from aiohttp import web

from ocrd.files.dropped import printable
from ocrd.uploads.receiving import UploadRefused
from ocrd.uploads.tasks import MAX_RECORD_BYTES, TaskOptions
from ocrd.web.docling_chunks import Chunking
from ocrd.web.docling_options import DoclingOptions
from ocrd.web.tasks import Task, TaskStatus

PRESIGNED = (  # docling-serve's words, on which its clients fall back to an answer in the body
    "Presigned URL target requires artifact storage to be configured and enabled on the "
    "server; ocrd answers in the body (target inbody)"
)
MAX_FILENAME_CHARS = 1000  # the name a task's answer gives its document
IMAGE_SUFFIXES = (".tif", ".tiff", ".png", ".jpg", ".jpeg")
OFFICE_KINDS = {
    **{kind: kind for kind in ("docx", "pptx", "xlsx", "html", "md", "csv")},
    "htm": "html",
    "markdown": "md",
}


def target(kind: object) -> None:
    """Only answers in the body are served."""
    if kind in (None, "inbody"):
        return
    if kind == "presigned_url":
        raise UploadRefused(422, PRESIGNED)
    raise UploadRefused(422, f"target {kind!r} is not served; ocrd answers in the body (inbody)")


def target_kind(target: object) -> object:
    """The `kind` of a JSON request's `target` (an object, as docling-serve takes it)."""
    if target is None:
        return None
    if not isinstance(target, dict):
        raise UploadRefused(
            422, f'target must be an object such as {{"kind": "inbody"}}, not {target!r:.80}'
        )
    return target.get("kind")


def input_kind(filename: str) -> str:
    """docling's name for the kind of file a name says (for `from_formats`; what the file
    is, the daemon tells by its content)."""
    name = filename.lower()
    suffix = name[name.rfind(".") + 1 :] if "." in name else ""
    if name.endswith(IMAGE_SUFFIXES):
        return "image"
    return OFFICE_KINDS.get(suffix, "pdf")


def task_options(
    options: DoclingOptions, filename: str, chunking: Chunking | None = None
) -> TaskOptions:
    """The record of a task with these options (a chunk task's too); UploadRefused where
    from_formats excludes the file."""
    kind = input_kind(filename)
    if not options.takes(kind):
        raise UploadRefused(422, f"from_formats excludes {filename!r} (a {kind})")
    record = TaskOptions(
        created_at=time.time(),
        pages=options.pages,
        pdf_text=options.pdf_text(),
        figures=options.include_images if "include_images" in options.model_fields_set else None,
        page_separator=options.md_page_break_placeholder
        if "md_page_break_placeholder" in options.model_fields_set
        else None,
        to_formats=tuple(dict.fromkeys(options.to_formats)),
        image_export_mode=options.image_export_mode,
        filename=printable(filename)[:MAX_FILENAME_CHARS],
    )
    if chunking is not None:
        record = record.model_copy(
            update={
                "chunking": chunking.options.model_dump(),
                "include_converted_doc": chunking.include_converted_doc,
            }
        )
    if len(record.record()) > MAX_RECORD_BYTES:  # read back by every poll: refused now
        raise UploadRefused(
            422, f"the options take more than {MAX_RECORD_BYTES // 1024} KB; send shorter ones"
        )
    return record


def task_answer(task_id: str, task: Task | None) -> web.Response:
    """docling-serve's answer about a task: its status, its place, its counts."""
    status = task.status if task is not None else TaskStatus.pending
    done = status in (TaskStatus.success, TaskStatus.partial_success, TaskStatus.failure)
    body = {
        "task_id": task_id,
        "task_type": "convert" if task is None or task.options.chunking is None else "chunk",
        "task_status": status.value,
        "task_position": task.position if task is not None else None,
        "task_meta": {
            "num_docs": 1,
            "num_processed": int(done),
            "num_succeeded": int(status is TaskStatus.success),
            "num_partially_succeeded": int(status is TaskStatus.partial_success),
            "num_failed": int(status is TaskStatus.failure),
        },
        "error_message": task.error_message if task is not None else None,
    }
    return web.json_response(body)
