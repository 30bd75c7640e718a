"""docling-serve's v1 conversion API, so that the tools that call a docling-serve (docling's
own client, paperless-ngx's parser, RAG front ends) can call ocrd instead:

    POST /v1/convert/file           multipart `files` (one) and options as form fields;
                                    answered when converted (at most max_sync_wait_seconds)
    POST /v1/convert/file/async     the same, answered at once with a task
    POST /v1/convert/source         JSON: `sources` (one: base64 `file`, or `http` from a
    POST /v1/convert/source/async   listed host), `options`, `target` (inbody)
    GET  /v1/status/poll/{task_id}  the task (`?wait=` seconds for it to settle)
    GET  /v1/result/{task_id}       its result: `document` (md_content, json_content,
                                    text_content as to_formats asks), status, errors,
                                    processing_time
    GET  /health                    docling-serve's liveness answer

A task is an upload into the configured inbox (`ocrd/uploads/uploads.py`) with a record of
its options beside it (`ocrd/uploads/tasks.py`), written before the upload is in the inbox:
from there it is claimed, converted and settled as any file, and its state is read back from
its files (`ocrd/web/tasks.py`). Errors are answered as docling-serve answers them,
`{"detail": "..."}`. Converting needs the token (`X-Api-Key` or a bearer token), from
loopback too, as uploads do.
"""

from __future__ import annotations

import asyncio
import functools
import json
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, BinaryIO

from aiohttp import BodyPartReader, ClientPayloadError, MultipartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from ocrd.config import HttpConfig, InboxConfig
from ocrd.files.dropped import printable
from ocrd.files.storage import describe
from ocrd.log import get_logger
from ocrd.uploads.receiving import Receiving, UploadRefused, clean_filename
from ocrd.uploads.tasks import (
    MAX_RECORD_BYTES,
    TaskOptions,
    register,
    remove_record,
    write_record,
)
from ocrd.web import apidocs
from ocrd.web.api import READ_BYTES, WAIT_RETRY_SECONDS, token_matches
from ocrd.web.docling_body import read_json_body
from ocrd.web.docling_options import DoclingOptions, OptionRefused, from_form, parse
from ocrd.web.docling_sources import Fetched, file_source, url_source
from ocrd.web.documents import Documents
from ocrd.web.tasks import Images, Task, Tasks, TaskStatus, document_content, errors_of
from ocrd.web.uploading import Uploading

MAX_WAIT_SECONDS = 300.0
MAX_FIELDS = 200  # form fields of one request
JSON_OVERHEAD = 64 * 1024  # a source request's JSON beyond its base64 content
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


def detail(status: int, message: str) -> web.Response:
    return web.json_response({"detail": message}, status=status)


def _target(kind: object) -> None:
    """Only answers in the body are served."""
    if kind in (None, "inbody"):
        return
    if kind == "presigned_url":
        raise UploadRefused(422, PRESIGNED)
    raise UploadRefused(422, f"target {kind!r} is not served; ocrd answers in the body (inbody)")


def _target_kind(target: object) -> object:
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


def task_options(options: DoclingOptions, filename: str) -> TaskOptions:
    """The record of a task with these options; UploadRefused where from_formats excludes
    the file."""
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
        "task_type": "convert",
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


def too_many_waiting(limit: int) -> web.Response:
    """A synchronous conversion beyond `max_waiting_clients`: refused before its body is
    read, nothing kept."""
    response = detail(
        503,
        f"{limit} clients are waiting already (max_waiting_clients), nothing was kept; send "
        "it to the same route's /async and poll, or retry later",
    )
    response.headers["Retry-After"] = str(WAIT_RETRY_SECONDS)
    return response


class DoclingApi:
    """The routes of docling-serve's API, over the documents API's uploads."""

    def __init__(self, api: Uploading, tasks: Tasks, config: HttpConfig) -> None:
        self.bodies = api.bodies  # read as an upload's, under the same limits
        self.token = api.token
        self.tasks = tasks
        self.config = config
        self.log = get_logger()

    def add_routes(self, router: web.UrlDispatcher) -> None:
        for path, asynchronous in (("/v1/convert/file", False), ("/v1/convert/file/async", True)):
            router.add_post(path, functools.partial(self.convert_file, asynchronous=asynchronous))
        for path, asynchronous in (
            ("/v1/convert/source", False),
            ("/v1/convert/source/async", True),
        ):
            handler = functools.partial(self.convert_source, asynchronous=asynchronous)
            router.add_post(path, handler)
        router.add_get("/v1/status/poll/{task_id}", self.poll)
        router.add_get("/v1/result/{task_id}", self.result)
        router.add_get("/health", self.health)

    # --- admitting and receiving -------------------------------------------------------------

    def _inbox(self) -> InboxConfig:
        return self.bodies.uploads.inbox_for(self.config.docling.inbox)

    def _admit(self, request: web.Request, slack: int) -> InboxConfig:
        """The inbox a task goes to; UploadRefused where the headers already say no."""
        if self.token is None:
            raise UploadRefused(
                403, f"converting needs a token, and {self.config.token_env} is not set"
            )
        if not token_matches(request, self.token):
            raise UploadRefused(
                401, "converting needs the token (X-Api-Key or Authorization: Bearer)"
            )
        inbox = self._inbox()
        length = request.content_length
        if length is not None and length > self.config.max_upload_bytes + slack:
            raise UploadRefused(413, "the file is larger than this server takes (max_upload_mb)")
        return inbox

    async def _accepting(
        self, request: web.Request, receive: Callable[[], Awaitable[Receiving]]
    ) -> Receiving | web.Response:
        """Receive a task within the upload's time limit; the answer why not, if not."""
        try:
            async with asyncio.timeout(self.config.upload_timeout_seconds):
                return await receive()
        except OptionRefused as refused:
            return self._refused(request, UploadRefused(422, str(refused)))
        except UploadRefused as refused:
            return self._refused(request, refused)
        except TimeoutError:
            return self._refused(
                request,
                UploadRefused(
                    408, "the request took longer than upload_timeout_seconds and was dropped"
                ),
            )
        except (ConnectionError, ClientPayloadError):
            return detail(400, "the request did not complete")
        except OSError as failure:
            self.log.error(
                "task.failed",
                error=printable(describe(failure)),
                action="the client is told to try again later; nothing was kept",
            )
            return detail(503, f"ocrd could not write the file: {printable(describe(failure))}")

    def _refused(self, request: web.Request, refused: UploadRefused) -> web.Response:
        self.log.warning(
            "task.refused", status=refused.status, reason=refused.reason, client=request.remote
        )
        return detail(refused.status, refused.reason)

    async def _file_task(self, request: web.Request, inbox: InboxConfig) -> Receiving:
        """The multipart request's file, streamed into the inbox with its task record."""
        fields: dict[str, list[str]] = {}
        try:
            reader = await request.multipart()
            while (part := await self.bodies.idle_limited(reader.next)) is not None:
                if not isinstance(part, BodyPartReader):
                    continue
                if part.name == "files":
                    return await self._stream(request, inbox, reader, part, fields)
                if sum(map(len, fields.values())) >= MAX_FIELDS:
                    raise UploadRefused(422, "too many form fields")
                fields.setdefault(part.name or "", []).append(await self.bodies.field(part))
        except (ValueError, AssertionError, HttpProcessingError) as malformed:  # aiohttp's parser
            raise UploadRefused(400, f"the multipart body is malformed: {malformed}") from None
        raise UploadRefused(400, "no file: send it as the multipart field 'files'")

    async def _stream(
        self,
        request: web.Request,
        inbox: InboxConfig,
        reader: MultipartReader,
        part: BodyPartReader,
        fields: dict[str, list[str]],
    ) -> Receiving:
        name = clean_filename(part.filename)
        self._form_options(fields, name)  # refused before the file is read, where it can be

        async def before_commit(receiving: Receiving) -> None:
            while (more := await self.bodies.idle_limited(reader.next)) is not None:
                if not isinstance(more, BodyPartReader):
                    continue
                if more.name == "files":
                    raise UploadRefused(422, "one file per request: send each on its own")
                fields.setdefault(more.name or "", []).append(await self.bodies.field(more))
            record = self._form_options(fields, name)
            await asyncio.to_thread(write_record, receiving.folder, record)
            await asyncio.to_thread(register, inbox, receiving.id, record)

        read = functools.partial(part.read_chunk, READ_BYTES)
        return await self.bodies.store(str(inbox.path), part.filename, read, before_commit)

    def _form_options(self, fields: dict[str, list[str]], name: str) -> TaskOptions:
        options = dict(fields)
        _target((options.pop("target_type", None) or ["inbody"])[-1])
        if any(value.strip() for value in options.pop("callbacks", [])):
            raise UploadRefused(422, "callbacks are not served; poll /v1/status/poll/{task_id}")
        return task_options(from_form(options), name)

    async def _source_task(self, request: web.Request, inbox: InboxConfig) -> Receiving:
        """The JSON request's one source, fetched or decoded, written into the inbox with its
        task record."""
        limit = self.config.max_upload_bytes * 4 // 3 + JSON_OVERHEAD
        with tempfile.TemporaryFile(dir=inbox.work) as spool:  # ocrd's alone, as uploads are
            payload = await read_json_body(
                lambda: self.bodies.idle_limited(lambda: request.content.read(READ_BYTES)),
                spool,
                limit,
                JSON_OVERHEAD,
            )
            sources = payload.get("sources")
            if not isinstance(sources, list) or len(sources) != 1:
                raise UploadRefused(422, "sources: give exactly one source (one document a task)")
            if not isinstance(sources[0], dict):
                raise UploadRefused(422, "sources: a source is an object with a 'kind'")
            _target(_target_kind(payload.get("target")))
            if payload.get("callbacks"):
                raise UploadRefused(422, "callbacks are not served; poll /v1/status/poll/{task_id}")
            options = parse(payload.get("options") or {})
            fetched = await self._fetch(sources[0], spool)
            record = task_options(options, fetched.name)
            return await asyncio.to_thread(self._write, inbox, fetched, record)

    async def _fetch(self, source: dict[str, Any], spool: BinaryIO) -> Fetched:
        kind = source.get("kind", "file" if "base64_string" in source else None)
        limit = self.config.max_upload_bytes
        if kind == "file":
            return file_source(source, limit, spool)
        if kind == "http":
            docling = self.config.docling
            return await url_source(
                source, docling.url_hosts, limit, self.config.upload_timeout_seconds
            )
        raise UploadRefused(422, f"source kind {kind!r} is not served (file, http)")

    def _write(self, inbox: InboxConfig, fetched: Fetched, record: TaskOptions) -> Receiving:
        receiving = self.bodies.uploads.begin(inbox, clean_filename(fetched.name), fetched.name)
        try:
            for piece in fetched.pieces():
                receiving.write(piece)
            write_record(receiving.folder, record)
            register(inbox, receiving.id, record)
            receiving.commit()
        except BaseException:
            receiving.abort()
            remove_record(inbox, receiving.id)
            raise
        return receiving

    # --- answering -----------------------------------------------------------------------------

    async def convert_file(self, request: web.Request, asynchronous: bool) -> web.Response:
        def receive() -> Awaitable[Receiving]:
            return self._file_task(request, self._admit(request, 64 * 1024))

        return await self._convert(request, receive, asynchronous)

    async def convert_source(self, request: web.Request, asynchronous: bool) -> web.Response:
        limit = self.config.max_upload_bytes // 3 + JSON_OVERHEAD  # base64 is 4/3 its bytes

        def receive() -> Awaitable[Receiving]:
            return self._source_task(request, self._admit(request, limit))

        return await self._convert(request, receive, asynchronous)

    async def _convert(
        self,
        request: web.Request,
        receive: Callable[[], Awaitable[Receiving]],
        asynchronous: bool,
    ) -> web.Response:
        """A task received and answered; a synchronous one waits for its result, so it
        takes a place among `max_waiting_clients` (as pollers do) from before its body is
        read: synchronous clients never take every connection uploads need."""
        if asynchronous:
            return await self._answer(request, await self._accepting(request, receive), True)
        with self.tasks.documents.waiter(self.config.max_waiting_clients) as placed:
            authorized = self.token is not None and token_matches(request, self.token)
            if not placed and authorized:  # (others are refused at once below, unread)
                return too_many_waiting(self.config.max_waiting_clients)
            return await self._answer(request, await self._accepting(request, receive), False)

    async def _answer(
        self, request: web.Request, received: Receiving | web.Response, asynchronous: bool
    ) -> web.Response:
        if isinstance(received, web.Response):
            return received
        self.log.info(
            "task.accepted",
            id=received.id,
            inbox=str(received.inbox.path),
            path=printable(received.relative_path),
            bytes=received.size,
            synchronous=not asynchronous,
            client=request.remote,
        )
        if asynchronous:
            task = await self.tasks.find(received.id)
            return task_answer(received.id, task)
        wait = self.config.docling.max_sync_wait_seconds
        task = await self.tasks.find(received.id, wait)
        if task is None or not task.settled:
            return detail(
                504,
                f"Conversion is taking too long. The maximum wait time is "
                f"configured as http.docling.max_sync_wait_seconds={wait:g}; the task "
                f"goes on: GET /v1/status/poll/{received.id}, then "
                f"/v1/result/{received.id}",
            )
        return await self._result(request, task)

    async def poll(self, request: web.Request) -> web.Response:
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            wait = -1.0
        if not 0 <= wait <= MAX_WAIT_SECONDS:
            return detail(422, f"wait must be a number of seconds from 0 to {MAX_WAIT_SECONDS:g}")
        task_id = request.match_info["task_id"]
        with self.tasks.documents.waiter(self.config.max_waiting_clients) as placed:
            # Beyond the limit, the task as it is now: docling's clients poll again.
            task = await self.tasks.find(task_id, wait if placed else 0.0)
        if task is None:
            return detail(404, "Task not found.")
        return task_answer(task_id, task)

    async def result(self, request: web.Request) -> web.Response:
        task = await self.tasks.find(request.match_info["task_id"])
        if task is None:
            return detail(404, "Task not found.")
        if not task.settled:
            return detail(404, "Task result not found. Please wait for a completion status.")
        return await self._result(request, task)

    async def _result(self, request: web.Request, task: Task) -> web.Response:
        base = f"{request.url.origin()}/api/documents/{task.id}"
        images = Images(task.options.image_export_mode, base)
        document = await asyncio.to_thread(document_content, task, images)
        body = {
            "document": document,
            "status": task.status.value,
            "errors": errors_of(task),
            "processing_time": task.processing_time,
            "timings": {},
        }
        return web.json_response(body, dumps=functools.partial(json.dumps, ensure_ascii=False))

    async def health(self, request: web.Request) -> web.Response:
        """docling-serve's answer while conversions are taken; 503 naming why while every
        one would be refused (no inbox takes uploads, no token), so that a client's or a
        load balancer's health check sends no work here."""
        try:
            self._admit_anyone()
        except UploadRefused as refused:
            return web.json_response(
                {"status": "unavailable", "detail": refused.reason}, status=503
            )
        return web.json_response({"status": "ok"})

    def _admit_anyone(self) -> None:
        if self.token is None:
            raise UploadRefused(
                403, f"converting needs a token, and {self.config.token_env} is not set"
            )
        self._inbox()


def serve_docling_api(
    app: web.Application, api: Uploading, documents: Documents, config: HttpConfig
) -> None:
    """docling-serve's routes, the API page, and the tidying of expired tasks while the
    server runs."""
    tasks = Tasks(documents, lambda: documents.config)
    DoclingApi(api, tasks, config).add_routes(app.router)
    apidocs.add_routes(app.router, apidocs.describe(bool(config.docling.url_hosts)))

    async def tidying(app: web.Application) -> AsyncIterator[None]:
        async with tasks.tidying():
            yield

    app.cleanup_ctx.append(tidying)
