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
import functools
import time
from collections.abc import Awaitable, Callable

from aiohttp import BodyPartReader, ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError

from ocrd.config import HttpConfig
from ocrd.files.dropped import printable
from ocrd.files.storage import describe
from ocrd.log import get_logger
from ocrd.uploads.receiving import Receiving, UploadRefused
from ocrd.uploads.uploads import Uploads
from ocrd.web.api import READ_BYTES, UploadAccepted, document_url, error, token_matches
from ocrd.web.bodies import RequestBodies
from ocrd.web.documents import DocumentState

MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers beyond the file's bytes


class Uploading:
    """The upload route, for one run of the HTTP server."""

    def __init__(self, uploads: Uploads, config: HttpConfig, token: str | None) -> None:
        self.uploads = uploads
        self.config = config
        self.token = token
        self.bodies = RequestBodies(uploads, config)
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
            raise UploadRefused(413, self.bodies.too_large())

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
                part = await self.bodies.idle_limited(reader.next)
                if part is None:
                    raise UploadRefused(
                        400, "no file: send it as the multipart field 'file' (curl -F file=@NAME)"
                    )
                if not isinstance(part, BodyPartReader):
                    continue  # a nested multipart body: not ours
                if part.name == "inbox" and part.filename is None:
                    inbox_name = await self.bodies.field(part)
                elif part.name == "file":
                    read = functools.partial(part.read_chunk, READ_BYTES)
                    return await self._store(request, inbox_name, part.filename, read)
        except (ValueError, AssertionError, HttpProcessingError) as malformed:  # aiohttp's parser
            raise UploadRefused(400, f"the multipart body is malformed: {malformed}") from None

    async def _store(
        self,
        request: web.Request,
        inbox_name: str | None,
        filename: str | None,
        read: Callable[[], Awaitable[bytes]],
    ) -> tuple[Receiving, web.Response]:
        """Stream the file into its inbox, and its answer, made before the commit, which
        is the last step; whatever goes wrong, nothing is left there."""
        answers: list[web.Response] = []

        async def answer(receiving: Receiving) -> None:
            answers.append(self._accepted(request, receiving))

        receiving = await self.bodies.store(inbox_name, filename, read, answer)
        return receiving, answers[0]
