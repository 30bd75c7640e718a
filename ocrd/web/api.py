"""The documents API over HTTP: hand a file over, follow it, fetch its Markdown.

    POST /api/documents                       a file: the multipart field `file`, or the raw
                                              body with `?filename=`; `?inbox=` (or a form
                                              field `inbox` before the file) picks the inbox
    GET  /api/documents/{id}                  its state; `?wait=SECONDS` until it settles
    GET  /api/documents/{id}/markdown         its Markdown once done (`?wait=` too)
    GET  /api/documents/{id}/{file}           its outputs by name (`<stem>.md`, `.layout.json`,
    GET  /api/documents/{id}/{assets}/{figure}  `.raw.jsonl`, the figures the Markdown links)
    GET  /api/openapi.json                    this API, described

Uploading is `ocrd/web/uploading.py`; this module answers for documents and serves their
outputs, and holds what both describe (the models, the OpenAPI description). Waiting
(`?wait=`) holds neither the event loop nor a thread (`Documents.settled`), and at most
`max_waiting_clients` wait at once.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from aiohttp import web
from pydantic import BaseModel

from ocrd import __version__
from ocrd.config import HttpConfig
from ocrd.files.dropped import printable
from ocrd.web import openapi
from ocrd.web.documents import Documents, DocumentState, Found, Outputs, is_document_id
from ocrd.web.served import MissingOutput, serve

READ_BYTES = 256 * 1024  # read from a file or a client at a time
MAX_WAIT_SECONDS = 300.0
WAIT_RETRY_SECONDS = 10  # told to a waiting client beyond max_waiting_clients


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


def presented_tokens(request: web.Request) -> list[str]:
    """Every token the request carries: a bearer token, docling-serve's `X-Api-Key` (its
    clients send that), `?token=` (a browser)."""
    found = []
    if "Authorization" in request.headers:
        found.append(request.headers["Authorization"].removeprefix("Bearer ").strip())
    if "X-Api-Key" in request.headers:
        found.append(request.headers["X-Api-Key"].strip())
    if "token" in request.query:
        found.append(request.query["token"])
    return found


def token_matches(request: web.Request, token: str | None) -> bool:
    """Whether the request carries the token, and no wrong one beside it (a client sending
    two that disagree is refused, whichever is right)."""
    presented = presented_tokens(request)
    return (
        token is not None
        and bool(presented)
        and all(
            hmac.compare_digest(given.encode(errors="surrogateescape"), token.encode())
            for given in presented
        )
    )


def error(status: int, message: str, **extra: Any) -> web.Response:
    body = ErrorBody(error=message, **extra).model_dump(mode="json", exclude_none=True)
    return web.json_response(body, status=status)


class DocumentsApi:
    """The routes that follow documents and fetch their outputs, for one run of the HTTP
    server (uploading is `ocrd/web/uploading.py`)."""

    def __init__(self, documents: Documents, config: HttpConfig) -> None:
        self.documents = documents
        self.config = config

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/api/openapi.json", self.openapi)
        router.add_get("/api/documents/{id}", self.status)
        router.add_get("/api/documents/{id}/markdown", self.markdown)
        router.add_get("/api/documents/{id}/{name}", self.output)
        router.add_get("/api/documents/{id}/{folder}/{name}", self.output)

    # --- following and fetching ------------------------------------------------------------

    async def _find(self, request: web.Request) -> Found | web.Response:
        document_id = request.match_info["id"]
        try:
            wait = float(request.query.get("wait", "0"))
        except ValueError:
            wait = -1.0
        if not 0 <= wait <= MAX_WAIT_SECONDS:
            return error(400, f"wait must be a number of seconds from 0 to {MAX_WAIT_SECONDS:g}")
        found = None
        if is_document_id(document_id) and wait:
            with self.documents.waiter(self.config.max_waiting_clients) as placed:
                if not placed:
                    return self._too_many_waiting()
                found = await self.documents.settled(document_id, wait)
        elif is_document_id(document_id):
            found = await self.documents.find(document_id)
        if found is None:
            return error(
                404,
                f"no document {document_id!r}: an id is an upload's, or the claim id of a "
                "document finished since ocrd started (the status page links those)",
            )
        return found

    def _too_many_waiting(self) -> web.Response:
        """Waiting clients have a limit of their own, below the connections', so that they
        never take every connection (nor the open files behind them)."""
        limit = self.config.max_waiting_clients
        response = error(
            503,
            f"{limit} clients are waiting already (max_waiting_clients); ask again without "
            "?wait= or retry later",
        )
        response.headers["Retry-After"] = str(WAIT_RETRY_SECONDS)
        return response

    def describe(self, request: web.Request, found: Found) -> DocumentStatus:
        links = DocumentLinks(status=document_url(request, found.id))
        if found.state is DocumentState.done and found.outputs is not None:
            links.markdown = document_url(request, found.id, "markdown")
            links.files = {
                printable(name): document_url(request, found.id, name) for name in found.files
            }
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
            markdown=document_url(request, document_id, markdown),
            files={printable(name): document_url(request, document_id, name) for name in names},
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
                status_url=document_url(request, found.id),
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
        parts = tuple(
            p
            for p in (request.match_info.get("folder"), request.match_info["name"])
            if p is not None
        )
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


def document_url(request: web.Request, document_id: str, *parts: str) -> str:
    tail = "".join(f"/{quote(part, safe='/')}" for part in parts)
    return f"{_origin(request)}/api/documents/{document_id}{tail}"


def _origin(request: web.Request) -> str:
    """`scheme://host` of the request, from its Host header; "" (links relative to this
    server) where that header is no host at all."""
    try:
        return str(request.url.origin())
    except ValueError:
        return ""


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
