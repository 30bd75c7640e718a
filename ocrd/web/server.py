"""The daemon's small HTTP server, on its event loop: the status page, the report as JSON,
Prometheus metrics, health, and the documents API.

    GET /             the status page (HTML, refreshes itself)
    GET /api/status   the same facts as JSON (`ocrd status` reads it)
    GET /metrics      Prometheus text format
    GET /healthz      200 while the daemon's main loop ticks, else 503
    GET /readyz       200 when ready (engine loaded, inboxes watched, no storage fault,
                      fleet reachable), else 503 with what is wrong
    /api/documents... uploads and their results (`ocrd/web/api.py`)
    /v1/...           docling-serve's conversion API, /docs, /openapi.json (`ocrd/web/docling.py`)

Every answer is built from memory in well under a millisecond and written by aiohttp
without blocking, so a slow client holds only its own connection. Clients other than
loopback must send `Authorization: Bearer <token>` (or `?token=`) when the token's
environment variable is set; with `trust_loopback: false` (a reverse proxy on the same
host) loopback clients too.

The port is open to anyone who can reach it, and the daemon's files and its HTTP clients
share one process's open files, so connections are bounded before any token is checked:
at most `max_connections` at once, each must send its request's headers within
`header_timeout_seconds` (slower clients are dropped), and each serves one request. A
connection beyond the limit is asked what it wants, briefly: a health check (`/healthz`,
`/readyz`, `/metrics`) is served from a small reserve of its own, so no number of other
clients (waiting ones, slow ones) makes the service look dead to its watchdog or a load
balancer; anything else is answered 503 and closed. Health answers without the token
unless `health_needs_token` says otherwise.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.web_runner import BaseSite

from ocrd.config import HttpConfig
from ocrd.log import get_logger
from ocrd.status import StatusReport
from ocrd.supervise import Liveness
from ocrd.uploads.uploads import Uploads
from ocrd.web.api import DocumentsApi, token_matches
from ocrd.web.docling import serve_docling_api
from ocrd.web.documents import Documents
from ocrd.web.metrics import CONTENT_TYPE, Metrics
from ocrd.web.statuspage import render
from ocrd.web.uploading import Uploading

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LINGERING_SECONDS = 1.0  # after the answer, how long a body nobody reads may still come
# served beyond the limit (/health: docling-serve's)
HEALTH_PATHS = frozenset({b"/healthz", b"/readyz", b"/metrics", b"/health"})
UNGUARDED_PATHS = frozenset({"/healthz", "/readyz", "/health"})  # a load balancer's: no token
DOCLING_PREFIX = "/v1/"
API_PAGE = "/docs"  # the page and Swagger UI's files; what it fetches from ocrd sends the token
PEEK_SECONDS = 2.0  # a connection beyond the limit must say what it asks for within this
MAX_REQUEST_LINE = 8192
BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 36\r\nRetry-After: 5\r\n\r\nocrd: too many connections; retry.\r\n"
)


@dataclass
class ConnectionLimits:
    """How many connections may be open, and how long a client may take to send its
    request's headers; the reserve for health checks beyond that; and what was turned
    away."""

    max_connections: int
    header_timeout: float
    open: int = 0
    peeking: int = 0  # beyond the limit, still saying what they ask for
    reserve: int = 0  # health checks served beyond the limit
    turned_away: dict[str, int] = field(default_factory=lambda: {"busy": 0, "slow": 0})

    @property
    def reserve_slots(self) -> int:
        return max(8, self.max_connections // 4)

    def room(self) -> str | None:
        """Where a new connection goes: "open", "peeking" (beyond the limit, to be asked
        what it wants), or None (turned away at once)."""
        if self.open < self.max_connections:
            return "open"
        return "peeking" if self.peeking + self.reserve < self.reserve_slots else None


def health_request(head: bytes) -> bool:
    """Whether a request's first line asks for a health check (GET or HEAD)."""
    method, _, rest = head.lstrip(b"\r\n").partition(b" ")
    target = rest.partition(b" ")[0].partition(b"?")[0]
    return method in (b"GET", b"HEAD") and target in HEALTH_PATHS


class _Guarded(asyncio.Protocol):
    """aiohttp's connection handler behind the limits: counted, timed until its request's
    headers are in, or turned away before aiohttp sees a byte."""

    def __init__(self, handler: asyncio.Protocol, limits: ConnectionLimits) -> None:
        self._handler = handler
        self._limits = limits
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""
        self._begun = False  # a byte other than a line end arrived (a request has begun)
        self._admitted: str | None = None  # the count it is in: "open" or "reserve"
        self._peeked: bytearray | None = None  # beyond the limit: what it sent so far

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        room = self._limits.room()
        if room is None:
            self._turn_away()
        elif room == "open":
            self._admit("open")
        else:
            self._limits.peeking += 1
            self._peeked = bytearray()
            timeout = min(self._limits.header_timeout, PEEK_SECONDS)
            self._timer = asyncio.get_running_loop().call_later(timeout, self._too_slow)

    def _turn_away(self) -> None:
        assert self._transport is not None
        self._limits.turned_away["busy"] += 1
        self._transport.write(BUSY)
        self._transport.close()

    def _admit(self, count: str) -> None:
        assert self._transport is not None
        self._admitted = count
        setattr(self._limits, count, getattr(self._limits, count) + 1)
        if self._timer is not None:
            self._timer.cancel()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self._limits.header_timeout, self._too_slow)
        self._handler.connection_made(self._transport)

    def _peek(self, data: bytes) -> None:
        """Beyond the limit: a health check is served from the reserve, anything else
        turned away, as soon as its first line is in."""
        assert self._peeked is not None
        self._peeked += data
        head = bytes(self._peeked).lstrip(b"\r\n")
        if b"\n" not in head and len(self._peeked) < MAX_REQUEST_LINE:
            return
        peeked, self._peeked = bytes(self._peeked), None
        self._limits.peeking -= 1
        if health_request(head):
            self._admit("reserve")
            self.data_received(peeked)
        else:
            self._turn_away()

    def _too_slow(self) -> None:
        self._timer = None
        self._limits.turned_away["slow"] += 1
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if self._peeked is not None:
            self._peek(data)
            return
        if not self._admitted:
            return
        if self._timer is not None:
            if not self._begun:  # empty lines may come first, and end no headers
                data_seen = data.lstrip(b"\r\n")
                self._begun = bool(data_seen)
            else:
                data_seen = data
            seen = self._tail + data_seen
            if b"\r\n\r\n" in seen:  # the request's headers are complete
                self._timer.cancel()
                self._timer = None
            self._tail = seen[-3:]
        self._handler.data_received(data)

    def eof_received(self) -> bool | None:
        return self._handler.eof_received() if self._admitted else None

    def pause_writing(self) -> None:
        if self._admitted:
            self._handler.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self._handler.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._peeked is not None:
            self._peeked = None
            self._limits.peeking -= 1
        if self._admitted:
            count, self._admitted = self._admitted, None
            setattr(self._limits, count, getattr(self._limits, count) - 1)
            self._handler.connection_lost(exc)


class _GuardedSite(BaseSite):
    """A TCP site whose connections go through `_Guarded`."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, limits: ConnectionLimits):
        super().__init__(runner)
        self._host, self._port, self._limits = host, port, limits

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await asyncio.get_running_loop().create_server(
            lambda: _Guarded(server(), self._limits), self._host, self._port, reuse_address=True
        )


class WebServer:
    def __init__(
        self,
        config: HttpConfig,
        report: Callable[[], StatusReport],
        liveness: Callable[[], Liveness],
        metrics: Metrics,
        uploads: Uploads | None = None,
        documents: Documents | None = None,
    ) -> None:
        self.config = config
        self.report = report
        self.liveness = liveness
        self.metrics = metrics
        # the documents API, where the daemon has one
        self.uploads = uploads
        self.documents = documents
        self.address: str | None = None
        self.problem: str | None = None  # why it is not serving, for the status line
        self.token = os.environ.get(config.token_env) or None
        self.limits = ConnectionLimits(config.max_connections, config.header_timeout_seconds)
        self.log = get_logger()
        self._runner: web.AppRunner | None = None

    async def serve(self, config: HttpConfig | None = None) -> None:
        """Serve under `config` (the one it has, or a reloaded one), starting early so that
        /healthz and /readyz answer while the engine loads. A port that is taken costs the
        HTTP server only: OCR goes on, and the status line says why."""
        await self.stop()
        if config is not None:
            self.config = config
            self.token = os.environ.get(config.token_env) or None
            self.limits = ConnectionLimits(config.max_connections, config.header_timeout_seconds)
        if not self.config.enabled:
            return
        try:
            address = await self.start()
        except OSError as error:
            self.problem = f"HTTP server not started on {self.config.listen}: {error}"
            self.log.error("http.failed", error=self.problem)
            return
        self.problem = None
        self.log.info("http.listening", address=address, url=f"http://{address}/")

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_one_request_per_connection, self._authorise])
        app.router.add_get("/", self.index)
        app.router.add_get("/api/status", self.api_status)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        if self.uploads is not None and self.documents is not None:
            uploading = Uploading(self.uploads, self.config, self.token)
            uploading.add_routes(app.router)
            DocumentsApi(self.documents, self.config, self.uploads.keep_folders).add_routes(
                app.router
            )
            if self.config.docling.enabled:
                serve_docling_api(app, uploading, self.documents, self.config)
        return app

    async def start(self) -> str:
        """Listen; the address actually bound (a port of 0 picks a free one)."""
        runner = web.AppRunner(
            self.app(),
            access_log=None,
            handle_signals=False,
            shutdown_timeout=1.0,
            lingering_time=LINGERING_SECONDS,
        )
        await runner.setup()
        site = _GuardedSite(runner, self.config.host, self.config.port, self.limits)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        host, port = runner.addresses[0][:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        if self.token is None and not _loopback(self.config.host):
            self.log.warning(
                "http.unprotected",
                listen=self.address,
                action=f"set {self.config.token_env} in the environment to require a token",
            )
        return self.address

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _authorise(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.token is None and self.config.trust_loopback:
            return await handler(request)
        if request.path in UNGUARDED_PATHS and not self.config.health_needs_token:
            return await handler(request)  # what a load balancer asks, and nothing more
        if request.path == API_PAGE or request.path.startswith(f"{API_PAGE}/"):
            return await handler(request)  # Swagger UI's own files: as public as on PyPI
        if self.config.trust_loopback and _loopback(request.remote or ""):
            return await handler(request)
        if self.token is None:  # refused at start; never serve without the token asked for
            return _unauthorised(request, f"{self.config.token_env} is not set")
        if token_matches(request, self.token):
            return await handler(request)
        return _unauthorised(request, "a bearer token is required (Authorization: Bearer <token>)")

    async def index(self, request: web.Request) -> web.Response:
        # A browser that came with ?token= keeps it on the page's links (it passed above).
        token = request.query.get("token", "")
        return web.Response(text=render(self.report(), token), content_type="text/html")

    async def api_status(self, request: web.Request) -> web.Response:
        report = self.report()
        return web.Response(
            text=report.model_dump_json(),
            content_type="application/json",
            status=200 if report.ready else 503,
        )

    async def prometheus(self, request: web.Request) -> web.Response:
        body = await self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def healthz(self, request: web.Request) -> web.Response:
        liveness = self.liveness()
        body = {
            "status": "ok" if liveness.alive else "stuck",
            "seconds_since_main_loop_tick": round(liveness.seconds_since_tick, 3),
        }
        return web.json_response(body, status=200 if liveness.alive else 503)

    async def readyz(self, request: web.Request) -> web.Response:
        report = self.report()
        body = {
            "ready": report.ready,
            "engine": report.engine,
            "engine_state": report.engine_state,
            "problems": report.problems,
        }
        return web.json_response(body, status=200 if report.ready else 503)


@web.middleware
async def _one_request_per_connection(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Each connection carries one request, so the header time limit covers all of it; also
    one answered with an error (404, 405), which aiohttp raises."""
    try:
        response = await handler(request)
    except web.HTTPException as error:
        error.force_close()
        raise
    response.force_close()
    return response


def _unauthorised(request: web.Request, reason: str) -> web.Response:
    """401 in the shape the route's clients read: docling-serve's `{"detail": ...}` on its
    routes, ocrd's `{"error": ...}` elsewhere."""
    docling = request.path.startswith(DOCLING_PREFIX) or request.path in ("/health", "/version")
    return web.json_response({"detail" if docling else "error": reason}, status=401)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False
