"""Uploading over HTTP: `POST /api/documents` takes a file into an inbox (see
`ocrd/web/api.py` for the routes that follow it, `ocrd/uploads/receiving.py` for what is
written).

An upload always needs the bearer token, from loopback too, and goes to an inbox that says
`uploads: true`. It is refused before its body is read where it can be (the token, the
inbox, a Content-Length over the limit; a client that sends `Expect: 100-continue` learns
it before sending anything), and otherwise streamed to disk in pieces, never held in
memory. A client that sends nothing for `header_timeout_seconds`, or takes longer than
`upload_timeout_seconds` in all, is dropped, and what it sent removed. The answer is made
before the file is committed, the last step.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import BodyPartReader, ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError

from ocrd.config import HttpConfig
from ocrd.files.dropped import printable
from ocrd.files.storage import describe
from ocrd.log import get_logger
from ocrd.uploads.receiving import Receiving, UploadRefused, clean_filename
from ocrd.uploads.uploads import Uploads
from ocrd.web.api import READ_BYTES, UploadAccepted, document_url, error, token_matches
from ocrd.web.documents import DocumentState

WRITE_BYTES = 1024 * 1024  # written to disk at a time, in a thread
MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers beyond the file's bytes
MAX_FIELD_BYTES = 4096  # a form field other than the file


class Uploading:
    """The upload route, for one run of the HTTP server."""

    def __init__(self, uploads: Uploads, config: HttpConfig, token: str | None) -> None:
        self.uploads = uploads
        self.config = config
        self.token = token
        self.log = get_logger()

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/api/documents", self.upload, expect_handler=self.expect)

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
        return (
            f"the file is larger than this server takes (max_upload_mb: "
            f"{self.config.max_upload_mb:g})"
        )

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
                received, answer = await self._receive(request)
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
        return answer

    def _accepted(self, request: web.Request, receiving: Receiving) -> web.Response:
        """The answer to an upload, made before it is committed: nothing that could fail is
        left to do once the file is in the inbox (a client told of a failure then would
        send it again, and it would be converted twice)."""
        status_url = document_url(request, receiving.id)
        accepted = UploadAccepted(
            id=receiving.id,
            state=DocumentState.waiting,
            inbox=str(receiving.inbox.path),
            path=printable(receiving.relative_path),
            filename=printable(receiving.name),
            size=receiving.size,
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

    async def _receive(self, request: web.Request) -> tuple[Receiving, web.Response]:
        inbox_name = request.query.get("inbox")
        if request.content_type != "multipart/form-data":
            filename = request.query.get("filename")
            return await self._store(
                request, inbox_name, filename, lambda: request.content.read(READ_BYTES)
            )
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
        except (ValueError, AssertionError, HttpProcessingError) as malformed:  # aiohttp's parser
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
        before_commit: Callable[[Receiving], Awaitable[None]] | None = None,
    ) -> tuple[Receiving, web.Response]:
        """Stream the file into its inbox, and its answer; whatever goes wrong, nothing is
        left there. The answer is made before the commit, which is the last step;
        `before_commit` runs once the file is complete and before it is in the inbox (a
        task's record is written then)."""
        inbox = self.uploads.inbox_for(inbox_name)
        name = clean_filename(filename)
        receiving = await asyncio.to_thread(self.uploads.begin, inbox, name, filename)
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
            answer = self._accepted(request, receiving)
            if before_commit is not None:
                await before_commit(receiving)
            await asyncio.to_thread(receiving.commit)
        except BaseException:
            cleanup = asyncio.ensure_future(asyncio.to_thread(receiving.abort))
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(cleanup)  # finished even if this task is cancelled
            raise
        return receiving, answer
