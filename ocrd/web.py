"""The daemon's small HTTP server, on its event loop: the status page, the report as JSON,
Prometheus metrics, and health.

    GET /             the status page (HTML, refreshes itself)
    GET /api/status   the same facts as JSON (`ocrd status` reads it)
    GET /metrics      Prometheus text format
    GET /healthz      200 while the daemon's main loop ticks, else 503
    GET /readyz       200 when ready (engine loaded, inboxes watched, no storage fault,
                      fleet reachable), else 503 with what is wrong

Every answer is built from memory in well under a millisecond and written by aiohttp
without blocking, so a slow client holds only its own connection. Clients other than
loopback must send `Authorization: Bearer <token>` (or `?token=`) when the token's
environment variable is set.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from ocrd.config import HttpConfig
from ocrd.log import get_logger
from ocrd.metrics import CONTENT_TYPE, Metrics
from ocrd.status import StatusReport
from ocrd.statuspage import render

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Liveness:
    alive: bool
    seconds_since_tick: float


class WebServer:
    def __init__(
        self,
        config: HttpConfig,
        report: Callable[[], StatusReport],
        liveness: Callable[[], Liveness],
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.report = report
        self.liveness = liveness
        self.metrics = metrics
        self.address: str | None = None
        self.token = os.environ.get(config.token_env) or None
        self.log = get_logger()
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._authorise])
        app.router.add_get("/", self.index)
        app.router.add_get("/api/status", self.api_status)
        app.router.add_get("/metrics", self.prometheus)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        return app

    async def start(self) -> str:
        """Listen; the address actually bound (a port of 0 picks a free one)."""
        runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, shutdown_timeout=1.0
        )
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
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
        if self.token is None or _loopback(request.remote or ""):
            return await handler(request)
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        given = given or request.query.get("token", "")
        if hmac.compare_digest(given.encode(), self.token.encode()):
            return await handler(request)
        return web.json_response(
            {"error": "a bearer token is required (Authorization: Bearer <token>)"}, status=401
        )

    async def index(self, request: web.Request) -> web.Response:
        return web.Response(text=render(self.report()), content_type="text/html")

    async def api_status(self, request: web.Request) -> web.Response:
        report = self.report()
        return web.Response(
            text=report.model_dump_json(), content_type="application/json",
            status=200 if report.ready else 503,
        )  # fmt: skip

    async def prometheus(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})

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


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False
