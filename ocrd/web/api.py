"""The documents API over HTTP: hand a file over, follow it, fetch its Markdown.

    POST /api/documents                       a file: the multipart field `file`, or the raw
                                              body with `?filename=`; `?inbox=` (or a form
                                              field `inbox` before the file) picks the inbox
    GET  /api/documents/{id}                  its state; `?wait=SECONDS` until it settles
    GET  /api/documents/{id}/markdown         its Markdown once done (`?wait=` too)
    GET  /api/documents/{id}/{file}           its outputs by name (`<stem>.md`, `.layout.json`,
    GET  /api/documents/{id}/{assets}/{figure}  `.raw.jsonl`, the figures the Markdown links)
    GET  /api/openapi.json                    this API, described

An upload always needs the bearer token, from loopback too, and goes to an inbox that says
`uploads: true`. It is refused before its body is read where it can be (the token, the
inbox, a Content-Length over the limit; a client that sends `Expect: 100-continue` learns
it before sending anything), and otherwise streamed to disk in pieces, never held in memory
(`ocrd/intake/uploads.py` writes it). A client that sends nothing for `header_timeout_seconds`, or
takes longer than `upload_timeout_seconds` in all, is dropped, and what it sent removed.
Waiting (`?wait=`) holds neither the event loop nor a thread (`Documents.settled`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import quote

from aiohttp import BodyPartReader, ClientPayloadError, web
from pydantic import BaseModel

from ocrd import __version__
from ocrd.config import HttpConfig
from ocrd.files.dropped import printable
from ocrd.files.storage import describe
from ocrd.intake.uploads import Receiving, UploadRefused, Uploads, clean_filename
from ocrd.log import get_logger
from ocrd.web import openapi
from ocrd.web.documents import Documents, DocumentState, Found, Outputs, is_document_id
from ocrd.web.served import MissingOutput, serve

READ_BYTES = 256 * 1024  # read from the client at a time
WRITE_BYTES = 1024 * 1024  # written to disk at a time, in a thread
MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers beyond the file's bytes
MAX_FIELD_BYTES = 4096  # a form field other than the file
MAX_WAIT_SECONDS = 300.0


class PartLinks(BaseModel):
    """One part of a document split at separator sheets: a document of its own."""

    markdown: str  # its Markdown's URL
    files: dict[str, str] = {}  # each of its outputs present (relative name: its URL)


class DocumentLinks(BaseModel):
    status: str
    markdown: str | None = None  # once done (a split document's: every part's, in order)
    files: dict[str, str] = {}  # each output present (relative name: its URL), once done
    parts: list[PartLinks] = []  # a document split at separator sheets: each part's


class DocumentStatus(BaseModel):
    """A document as `GET /api/documents/{id}` describes it."""

    id: str
    state: DocumentState
    inbox: str
    path: str  # relative to the inbox
    filename: str
    uploaded_at: str | None = None  # ISO 8601, UTC
    started_at: str | None = None  # claimed from the inbox
    finished_at: str | None = None
    pages: int | None = None
    pages_done: int | None = None  # while converting in this daemon
    eta_seconds: float | None = None
    stage: str | None = None  # failed: where
    page: int | None = None  # failed: on which page, if one
    reason: str | None = None  # failed: why, in words
    links: DocumentLinks


class UploadAccepted(BaseModel):
    """The answer to an upload (202)."""

    id: str
    state: DocumentState
    inbox: str
    path: str
    filename: str
    size: int
    status_url: str
    markdown_url: str


class ErrorBody(BaseModel):
    error: str
    state: DocumentState | None = None
    status_url: str | None = None


def presented_token(request: web.Request) -> str:
    given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
    return given or request.query.get("token", "")


def token_matches(request: web.Request, token: str | None) -> bool:
    return token is not None and hmac.compare_digest(
        presented_token(request).encode(errors="surrogateescape"), token.encode()
    )


def error(status: int, message: str, **extra: Any) -> web.Response:
    body = ErrorBody(error=message, **extra).model_dump(mode="json", exclude_none=True)
    return web.json_response(body, status=status)


class DocumentsApi:
    """The routes of the documents API, for one run of the HTTP server."""

    def __init__(
        self, uploads: Uploads, documents: Documents, config: HttpConfig, token: str | None
    ) -> None:
        self.uploads = uploads
        self.documents = documents
        self.config = config
        self.token = token
        self.log = get_logger()

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/api/documents", self.upload, expect_handler=self.expect)
        router.add_get("/api/openapi.json", self.openapi)
        router.add_get("/api/documents/{id}", self.status)
        router.add_get("/api/documents/{id}/markdown", self.markdown)
        router.add_get("/api/documents/{id}/{name}", self.output)
        router.add_get("/api/documents/{id}/{folder}/{name}", self.output)

    # --- uploading -------------------------------------------------------------------------

    def _admit(self, request: web.Request) -> None:
        """UploadRefused unless the request may upload, as far as its headers tell."""
        if self.token is None:
            raise UploadRefused(
                403, f"uploads need a bearer token, and {self.config.token_env} is not set"
            )
        if not token_matches(request, self.token):
            raise UploadRefused(
                401, "uploads need the bearer token (Authorization: Bearer <token>)"
            )
        self.uploads.inbox_for(request.query.get("inbox"))
        length = request.content_length
        if length == 0:
            raise UploadRefused(400, "the body is empty: send the file")
        slack = MULTIPART_OVERHEAD if request.content_type == "multipart/form-data" else 0
        if length is not None and length > self.config.max_upload_bytes + slack:
            raise UploadRefused(413, self._too_large())

    def _too_large(self) -> str:
        return f"the file is larger than this server takes (max_upload_mb: "\
               f"{self.config.max_upload_mb:g})"  # fmt: skip

    async def expect(self, request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue`: refuse before the client sends its body, where the
        headers say enough."""
        if request.headers.get("Expect", "").lower() != "100-continue":
            raise web.HTTPExpectationFailed(text=f"unknown Expect: {request.headers['Expect']}")
        try:
            self._admit(request)
        except UploadRefused as refused:
            self._refused(request, refused)
            response = error(refused.status, refused.reason)
            response.force_close()  # answered here, the middlewares do not run
            return response
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0
        return None

    async def upload(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        try:
            self._admit(request)
            async with asyncio.timeout(self.config.upload_timeout_seconds):
                received = await self._receive(request)
        except UploadRefused as refused:
            self._refused(request, refused)
            return error(refused.status, refused.reason)
        except TimeoutError:
            slow = UploadRefused(
                408,
                f"the upload took longer than {self.config.upload_timeout_seconds:g} s "
                "(upload_timeout_seconds) and was dropped",
            )
            self._refused(request, slow)
            return error(slow.status, slow.reason)
        except (ConnectionError, ClientPayloadError) as lost:
            self.log.warning(
                "upload.aborted",
                client=request.remote,
                reason=f"the client went away before the upload was complete ({lost})",
                action="nothing was kept",
            )
            return error(400, "the upload did not complete")
        except OSError as failure:  # the inbox's disk is full, gone, read-only
            self.log.error(
                "upload.failed",
                client=request.remote,
                error=printable(describe(failure)),
                action="the client is told to try again later; nothing was kept",
            )
            return error(503, f"ocrd could not write the upload: {printable(describe(failure))}")
        self.log.info(
            "upload.received",
            id=received.id,
            inbox=str(received.inbox.path),
            path=printable(received.relative_path),
            bytes=received.size,
            seconds=round(time.monotonic() - started, 3),
            client=request.remote,
        )
        status_url = self._url(request, received.id)
        accepted = UploadAccepted(
            id=received.id,
            state=DocumentState.waiting,
            inbox=str(received.inbox.path),
            path=printable(received.relative_path),
            filename=printable(received.name),
            size=received.size,
            status_url=status_url,
            markdown_url=f"{status_url}/markdown",
        )
        return web.json_response(
            accepted.model_dump(mode="json"), status=202, headers={"Location": status_url}
        )

    def _refused(self, request: web.Request, refused: UploadRefused) -> None:
        self.log.warning(
            "upload.refused", status=refused.status, reason=refused.reason, client=request.remote
        )

    async def _receive(self, request: web.Request) -> Receiving:
        inbox_name = request.query.get("inbox")
        if request.content_type != "multipart/form-data":
            filename = request.query.get("filename")
            return await self._store(request, inbox_name, filename,
                                     lambda: request.content.read(READ_BYTES))  # fmt: skip
        try:
            reader = await request.multipart()
            while True:
                part = await self._idle_limited(reader.next)
                if part is None:
                    raise UploadRefused(
                        400, "no file: send it as the multipart field 'file' (curl -F file=@NAME)"
                    )
                if not isinstance(part, BodyPartReader):
                    continue  # a nested multipart body: not ours
                if part.name == "inbox" and part.filename is None:
                    inbox_name = await self._field(part)
                elif part.name == "file":
                    read = functools.partial(part.read_chunk, READ_BYTES)
                    return await self._store(request, inbox_name, part.filename, read)
        except (ValueError, AssertionError) as malformed:  # what aiohttp's parser says
            raise UploadRefused(400, f"the multipart body is malformed: {malformed}") from None

    async def _field(self, part: BodyPartReader) -> str:
        value = b""
        while chunk := await self._idle_limited(lambda: part.read_chunk(MAX_FIELD_BYTES)):
            value += chunk
            if len(value) > MAX_FIELD_BYTES:
                raise UploadRefused(400, f"the form field {part.name!r} is too long")
        return value.decode("utf-8", "replace")

    async def _idle_limited(self, read: Callable[[], Awaitable[Any]]) -> Any:
        """`read()`, unless the client sends nothing for `header_timeout_seconds`."""
        idle = self.config.header_timeout_seconds
        try:
            async with asyncio.timeout(idle):
                return await read()
        except TimeoutError:
            raise UploadRefused(
                408, f"nothing arrived for {idle:g} s (header_timeout_seconds); dropped"
            ) from None

    async def _store(
        self,
        request: web.Request,
        inbox_name: str | None,
        filename: str | None,
        read: Callable[[], Awaitable[bytes]],
    ) -> Receiving:
        """Stream the file into its inbox; whatever goes wrong, nothing is left there."""
        inbox = self.uploads.inbox_for(inbox_name)
        receiving = await asyncio.to_thread(self.uploads.begin, inbox, clean_filename(filename))
        limit = self.config.max_upload_bytes
        try:
            pending = bytearray()
            while chunk := await self._idle_limited(read):
                if receiving.size + len(pending) + len(chunk) > limit:
                    raise UploadRefused(413, self._too_large())
                pending += chunk
                if len(pending) >= WRITE_BYTES:
                    await asyncio.to_thread(receiving.write, pending)
                    pending = bytearray()
            if pending:
                await asyncio.to_thread(receiving.write, pending)
            if receiving.size == 0:
                raise UploadRefused(400, "the file is empty")
            await asyncio.to_thread(receiving.commit)
        except BaseException:
            cleanup = asyncio.ensure_future(asyncio.to_thread(receiving.abort))
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(cleanup)  # finished even if this task is cancelled
            raise
        return receiving

    # --- following and fetching ------------------------------------------------------------

    def _url(self, request: web.Request, document_id: str, *parts: str) -> str:
        tail = "".join(f"/{quote(part, safe='/')}" for part in parts)
        return f"{request.url.origin()}/api/documents/{document_id}{tail}"

    async def _find(self, request: web.Request) -> Found | web.Response:
        document_id = request.match_info["id"]
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            wait = -1.0
        if not 0 <= wait <= MAX_WAIT_SECONDS:
            return error(400, f"wait must be a number of seconds from 0 to {MAX_WAIT_SECONDS:g}")
        found = None
        if is_document_id(document_id):
            finder = self.documents.settled(document_id, wait) if wait else None
            found = await (finder or self.documents.find(document_id))
        if found is None:
            return error(
                404,
                f"no document {document_id!r}: an id is an upload's, or the claim id of a "
                "document finished since ocrd started (the status page links those)",
            )
        return found

    def describe(self, request: web.Request, found: Found) -> DocumentStatus:
        links = DocumentLinks(status=self._url(request, found.id))
        if found.state is DocumentState.done and found.outputs is not None:
            links.markdown = self._url(request, found.id, "markdown")
            links.files = {printable(name): self._url(request, found.id, name)
                           for name in found.files}  # fmt: skip
            if found.outputs.split:
                links.parts = [
                    self._part_links(request, found.id, markdown, names)
                    for markdown, names in zip(found.outputs.markdowns, found.parts, strict=True)
                ]
        return DocumentStatus(
            id=found.id,
            state=found.state,
            inbox=found.inbox,
            path=printable(found.path),
            filename=printable(found.name),
            uploaded_at=found.uploaded_at,
            started_at=found.started_at,
            finished_at=found.finished_at,
            pages=found.pages,
            pages_done=found.pages_done,
            eta_seconds=found.eta_seconds,
            stage=found.stage,
            page=found.page,
            reason=found.reason,
            links=links,
        )

    def _part_links(
        self, request: web.Request, document_id: str, markdown: str, names: list[str]
    ) -> PartLinks:
        """A part's links: its Markdown, and every file of it present."""
        return PartLinks(
            markdown=self._url(request, document_id, markdown),
            files={printable(name): self._url(request, document_id, name) for name in names},
        )

    async def status(self, request: web.Request) -> web.Response:
        found = await self._find(request)
        if isinstance(found, web.Response):
            return found
        return web.json_response(self.describe(request, found).model_dump(mode="json"))

    def _not_done(self, request: web.Request, found: Found) -> web.Response | Outputs:
        if found.state is not DocumentState.done:
            why = f": {found.reason}" if found.reason else ""
            return error(
                409,
                f"document {found.id} is {found.state.value}{why}",
                state=found.state,
                status_url=self._url(request, found.id),
            )
        if found.outputs is None:
            return error(404, f"the outputs of document {found.id} are no longer in the outbox")
        return found.outputs

    async def markdown(self, request: web.Request) -> web.StreamResponse:
        outputs = await self._done_outputs(request)
        if isinstance(outputs, web.Response):
            return outputs
        return await self._serve(request, outputs, *((m,) for m in outputs.markdowns))

    async def output(self, request: web.Request) -> web.StreamResponse:
        outputs = await self._done_outputs(request)
        if isinstance(outputs, web.Response):
            return outputs
        parts = tuple(p for p in (request.match_info.get("folder"), request.match_info["name"])
                      if p is not None)  # fmt: skip
        return await self._serve(request, outputs, parts)

    async def _done_outputs(self, request: web.Request) -> Outputs | web.Response:
        """The outputs of the document the request names, or the answer why there are none."""
        found = await self._find(request)
        if isinstance(found, web.Response):
            return found
        return self._not_done(request, found)

    async def _serve(
        self, request: web.Request, outputs: Outputs, *files: Sequence[str]
    ) -> web.StreamResponse:
        try:
            return await serve(request, outputs, *files)
        except MissingOutput as missing:
            return error(404, f"no file {missing.name!r} among this document's outputs")

    async def openapi(self, request: web.Request) -> web.Response:
        return web.json_response(describe_api(self.config))


def describe_api(config: HttpConfig) -> dict[str, Any]:
    """The OpenAPI 3.1 description of the documents API (and the reports beside it)."""
    return openapi.document(
        __version__,
        config.max_upload_mb,
        {
            "DocumentStatus": DocumentStatus,
            "UploadAccepted": UploadAccepted,
            "Error": ErrorBody,
        },
    )
