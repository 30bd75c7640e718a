"""How the daemon runs: the pipeline's sizes and intervals, the HTTP server, and
several daemons sharing an inbox."""

from __future__ import annotations

import os
from typing import Annotated

from pydantic import Field

from ocrd.config.base import Auto, Strict


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class PipelineConfig(Strict):
    max_documents_in_flight: Annotated[int, Field(ge=1)] | Auto = "auto"
    max_pages_in_flight: Annotated[int, Field(ge=1)] | Auto = "auto"
    render_workers: Annotated[int, Field(ge=1)] | Auto = "auto"
    page_render_timeout_seconds: Annotated[float, Field(gt=0)] = 120.0
    page_retries: Annotated[int, Field(ge=0)] = 2
    page_retry_backoff_seconds: Annotated[float, Field(ge=0)] = 2.0
    render_memory_limit_mb: Annotated[int, Field(ge=256)] = 4096
    max_page_pixels: Annotated[int, Field(ge=1_000_000)] = 50_000_000
    rescan_interval_seconds: Annotated[float, Field(gt=0)] = 60.0
    shutdown_grace_seconds: Annotated[float, Field(ge=0)] = 30.0
    status_interval_seconds: Annotated[float, Field(gt=0)] = 5.0

    def pages_in_flight_for(self, engine_capacity: int) -> int:
        """`auto`: the engine's whole batch, plus a quarter more rendered and waiting, so a
        finished page's successor is already there (measured in BENCHMARKS.md)."""
        if self.max_pages_in_flight != "auto":
            return self.max_pages_in_flight
        return engine_capacity + max(4, engine_capacity // 4)

    def documents_in_flight_for(self, engine_capacity: int) -> int:
        """`auto`: enough that a small file is claimed while books are being read."""
        if self.max_documents_in_flight != "auto":
            return self.max_documents_in_flight
        return max(32, engine_capacity)

    def render_workers_for(self) -> int:
        """`auto`: one per CPU this process may run on."""
        return available_cpus() if self.render_workers == "auto" else self.render_workers


class DoclingApiConfig(Strict):
    """docling-serve's conversion API (`/v1/...`): served while enabled; converting needs an
    inbox with `uploads: true` (without one: 403, and `/health` answers 503)."""

    enabled: bool = True
    inbox: str | None = None  # the inbox tasks go to (path or folder name); default: the
    # first with `uploads: true`
    max_sync_wait_seconds: Annotated[float, Field(gt=0)] = 120.0  # then 504, as docling-serve
    results_keep_seconds: Annotated[float, Field(gt=0)] = 3600.0  # after a task settled
    # Hosts `http` sources may be fetched from; none: URL sources are refused.
    url_hosts: tuple[str, ...] = ()


class HttpConfig(Strict):
    """The daemon's HTTP server: metrics, health, the status page, uploads."""

    enabled: bool = True
    listen: Annotated[str, Field(pattern=r"^(\[[0-9a-fA-F:.]+\]|[^:\s]+):\d{1,5}$")] = (
        "127.0.0.1:9464"
    )
    token_env: str = "OCRD_HTTP_TOKEN"  # bearer token for clients other than loopback
    # false behind a reverse proxy on the same host (every client looks like loopback there):
    # then loopback clients need the token too.
    trust_loopback: bool = True
    max_connections: Annotated[int, Field(ge=1, le=10000)] = 64  # more are answered 503
    header_timeout_seconds: Annotated[float, Field(gt=0)] = 10.0  # slower clients are dropped
    # Clients waiting for a document (`?wait=`) at once; more are answered 503 (Retry-After).
    max_waiting_clients: Annotated[int, Field(ge=0, le=10000)] = 32
    # /healthz and /readyz answer load balancers without the token unless this is true.
    health_needs_token: bool = False
    # Uploads (`POST /api/documents`): the largest file taken, and how long its body may take
    # in all (a client that sends nothing for header_timeout_seconds is dropped sooner).
    max_upload_mb: Annotated[float, Field(gt=0)] = 200.0
    upload_timeout_seconds: Annotated[float, Field(gt=0)] = 600.0
    docling: DoclingApiConfig = DoclingApiConfig()

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"


class InstancesConfig(Strict):
    """Several daemons on one shared inbox (`ocrd/sharing/instances.py`)."""

    # A daemon whose lease is this old (by the shared filesystem's clock) is taken to be
    # dead and its claims are taken over; a daemon stops writing for its claims after half
    # of it without a successful renewal. The same on every host (the same file).
    lease_seconds: Annotated[float, Field(ge=1)] = 90.0

    @property
    def renew_seconds(self) -> float:
        """How often a lease is renewed (and others' are looked at): nine times a lease."""
        return self.lease_seconds / 9
