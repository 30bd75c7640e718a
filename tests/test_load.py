"""Under load: stopping with 20,000 files waiting, and health checks while waiting clients
fill every connection. `ocrd run` as a subprocess, real signals, real sockets."""

from __future__ import annotations

import resource
import selectors
import signal
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import claims_left, write_config
from test_http import base_url, outward_address
from test_uploads import AUTH, WITH_TOKEN

pytestmark = pytest.mark.slow

BACKLOG = 20_000
GRACE_SECONDS = 3


def test_sigterm_stops_claiming_at_once_with_20000_files_waiting(
    tmp_path: Path, start_daemon: Any
) -> None:
    """20,000 small files wait; ocrd claims them one after another (each fails at once:
    none is a PDF). On SIGTERM nothing more is claimed, what is in flight gets the grace
    period, and the daemon exits 0 well within the grace period and a few seconds."""
    config = write_config(
        tmp_path,
        {"settle_seconds": 0.2},
        pipeline={"shutdown_grace_seconds": GRACE_SECONDS, "rescan_interval_seconds": 60},
    )
    inbox = tmp_path / "data" / "inbox"
    for index in range(BACKLOG):
        (inbox / f"f{index:05d}.pdf").write_bytes(b"not a PDF")
    daemon = start_daemon(config)
    daemon.wait_for("document.claimed", count=20, timeout=120)
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(timeout=GRACE_SECONDS + 30) == 0, daemon.output()
    daemon.stop()

    events = list(daemon.events)
    names = [event.get("event") for event in events]
    stopping = names.index("daemon.stopping")
    late = [e["path"] for e in events[stopping:] if e.get("event") == "document.claimed"]
    assert late == [], f"{len(late)} files claimed after daemon.stopping"
    claimed = {e["doc"] for e in events if e.get("event") == "document.claimed"}
    ended = {
        e["doc"] for e in events if e.get("event") in ("document.finished", "document.interrupted")
    }
    assert claimed <= ended, f"claimed and never ended nor interrupted: {claimed - ended}"
    assert "daemon.stopped" in names[stopping:]
    assert len(claims_left(tmp_path / "data" / "work")) < BACKLOG


def waiter(port: int, document: str) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=30)
    request = f"GET /api/documents/{document}?wait=300 HTTP/1.1\r\nHost: ocrd\r\n\r\n"
    client.sendall(request.encode())
    return client


def first_answers(clients: list[socket.socket], seconds: float) -> list[bytes]:
    """What the server wrote to each client within `seconds` (all read at once), until it
    closed that connection (b"" for a client it still keeps waiting)."""
    answers = {client: b"" for client in clients}
    with selectors.DefaultSelector() as selector:
        for client in clients:
            client.setblocking(False)
            selector.register(client, selectors.EVENT_READ)
        deadline = time.monotonic() + seconds
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                client = key.fileobj
                assert isinstance(client, socket.socket)
                chunk = client.recv(4096)
                answers[client] += chunk
                if not chunk:
                    selector.unregister(client)
    for client in clients:
        client.setblocking(True)
    return [answers[client] for client in clients]


def test_health_answers_while_waiting_clients_fill_every_connection(
    tmp_path: Path, start_daemon: Any
) -> None:
    """An upload that will not be converted for a long while, and clients without a token
    (loopback) waiting for it with `?wait=300`, more than `max_connections`, with slow
    clients filling what is left: the waiters beyond `max_waiting_clients` are told 503
    and when to retry, and /healthz, /readyz and /metrics still answer at once; the status
    page, beyond the limit, is 503."""
    http = {"listen": "127.0.0.1:0", "max_connections": 64, "max_waiting_clients": 32}
    config = write_config(tmp_path, {"uploads": True, "settle_seconds": 3600}, http=http)
    daemon = start_daemon(config, env=WITH_TOKEN)
    url = base_url(daemon)
    port = int(url.rsplit(":", 1)[1])
    daemon.wait_for("daemon.ready")
    sent = httpx.post(
        f"{url}/api/documents",
        params={"filename": "a.pdf"},
        headers=AUTH,
        content=b"%PDF-1.4 waits for an hour",
    )
    assert sent.status_code == 202, sent.text
    document = sent.json()["id"]

    waiters = [waiter(port, document) for _ in range(64)]
    slow = []
    try:
        answers = first_answers(waiters, 5)
        refused = [a for a in answers if a]
        assert len(refused) == 32, f"{len(refused)} of 64 waiters answered at once"
        assert all(a.startswith(b"HTTP/1.1 503") for a in refused), refused[0][:300]
        assert all(b"Retry-After: " in a and b"max_waiting_clients" in a for a in refused)
        for _ in range(32):  # the connections the refused waiters left, taken by slow ones
            client = socket.create_connection(("127.0.0.1", port), timeout=30)
            client.sendall(b"GET /api/status HTTP/1.1\r\n")
            slow.append(client)
        busy = httpx.get(f"{url}/", timeout=10)
        assert busy.status_code == 503 and "too many connections" in busy.text
        for path in ("/healthz", "/readyz", "/metrics"):
            health = httpx.get(f"{url}{path}", timeout=10)
            assert health.status_code == 200, (path, health.text[:300])
    finally:
        for client in waiters + slow:
            client.close()
    assert daemon.stop() == 0


def test_waiting_clients_never_exhaust_open_files(tmp_path: Path, start_daemon: Any) -> None:
    """2,000 clients wait for a document at once under a 1,024 open-file limit: each is
    waiting or told 503, none gets a 500, and health answers throughout."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), hard))  # the clients' side
    config = write_config(
        tmp_path, {"uploads": True, "settle_seconds": 3600}, http={"listen": "127.0.0.1:0"}
    )
    daemon = start_daemon(config, env=WITH_TOKEN, open_files=1024)
    url = base_url(daemon)
    port = int(url.rsplit(":", 1)[1])
    daemon.wait_for("daemon.ready")
    sent = httpx.post(
        f"{url}/api/documents",
        params={"filename": "a.pdf"},
        headers=AUTH,
        content=b"%PDF-1.4 waits for an hour",
    )
    document = sent.json()["id"]
    clients = []
    try:
        for _ in range(2000):
            try:
                clients.append(waiter(port, document))
            except OSError:  # the listen backlog was full for a moment: refused, not served
                continue
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200
        for client in clients:
            client.settimeout(0.5)
        statuses: dict[bytes, int] = {}
        for client in clients:
            try:
                first = client.recv(12)
            except TimeoutError:
                first = b"waiting"
            except ConnectionResetError:
                first = b"reset"
            statuses[first] = statuses.get(first, 0) + 1
    finally:
        for client in clients:
            client.close()
    assert set(statuses) <= {b"HTTP/1.1 503", b"waiting", b"reset", b""}, statuses
    assert statuses.get(b"waiting", 0) <= 32, statuses
    assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
    assert daemon.stop() == 0


def test_load_balancers_check_health_without_the_token(tmp_path: Path, start_daemon: Any) -> None:
    """From another host, with a token set: /healthz and /readyz answer without it (what a
    load balancer's health check can send); everything else needs it; and with
    `health_needs_token: true` health needs it too."""
    config = write_config(tmp_path, http={"listen": "0.0.0.0:0"})
    daemon = start_daemon(config, env={"OCRD_HTTP_TOKEN": "s3cret"})
    port = base_url(daemon).rsplit(":", 1)[1]
    daemon.wait_for("daemon.ready")
    outside = f"http://{outward_address()}:{port}"
    assert httpx.get(f"{outside}/healthz").status_code == 200
    assert httpx.get(f"{outside}/readyz").status_code == 200
    for path in ("/metrics", "/api/status", "/"):
        assert httpx.get(f"{outside}{path}").status_code == 401, path
    assert daemon.stop() == 0

    config = write_config(tmp_path, http={"listen": "0.0.0.0:0", "health_needs_token": True})
    daemon = start_daemon(config, env={"OCRD_HTTP_TOKEN": "s3cret"})
    port = base_url(daemon).rsplit(":", 1)[1]
    daemon.wait_for("daemon.ready")
    outside = f"http://{outward_address()}:{port}"
    assert httpx.get(f"{outside}/readyz").status_code == 401
    token = {"Authorization": "Bearer s3cret"}
    assert httpx.get(f"{outside}/readyz", headers=token).status_code == 200
    assert daemon.stop() == 0
