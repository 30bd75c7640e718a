"""Hostile and careless HTTP clients: a flood of half-open connections under systemd's
default open-file limit, and a reverse proxy on the same host. Real sockets throughout."""

from __future__ import annotations

import resource
import signal
import socket
from pathlib import Path

import httpx
import pytest
from conftest import wait_until, write_config
from helpers import make_pdf
from test_http import base_url

pytestmark = pytest.mark.slow

SYSTEMD_DEFAULT_OPEN_FILES = 1024  # the soft limit a unit gets without LimitNOFILE=
HALF_OPEN = 1100


def open_slowly(port: int, count: int) -> list[socket.socket]:
    """`count` connections that each send the start of a request, and then nothing."""
    clients = []
    for _ in range(count):
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        client.sendall(b"GET /api/status HTTP/1.1\r\nHost: ocrd\r\n")  # no blank line: never done
        clients.append(client)
    return clients


def answer(client: socket.socket) -> bytes:
    """What the server wrote before it closed the connection (b"" if it just hung up)."""
    client.settimeout(30)
    data = b""
    try:
        while chunk := client.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def test_half_open_connections_cannot_starve_the_daemon(tmp_path: Path, start_daemon) -> None:
    """1,100 connections that never finish their headers, under a 1,024 open-file limit:
    those over the connection limit are answered 503 at once, the rest are dropped after
    the header time limit, and files keep being claimed and converted meanwhile."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4 * HALF_OPEN), hard))  # attacker's
    http = {"listen": "127.0.0.1:0", "max_connections": 64, "header_timeout_seconds": 3}
    config = write_config(tmp_path, http=http)
    daemon = start_daemon(config, open_files=SYSTEMD_DEFAULT_OPEN_FILES)
    port = int(base_url(daemon).rsplit(":", 1)[1])
    daemon.wait_for("daemon.ready")
    clients = open_slowly(port, HALF_OPEN)
    try:
        inbox = tmp_path / "data" / "inbox"
        for index in range(5):
            make_pdf(inbox / f"during-{index}.pdf", 1)
        finished = daemon.wait_for("document.finished", count=5, timeout=60)
        answers = [answer(client) for client in clients]
    finally:
        for client in clients:
            client.close()
    busy = [a for a in answers if a.startswith(b"HTTP/1.1 503")]
    dropped = [a for a in answers if a == b""]  # admitted, then cut off for being slow
    assert len(busy) + len(dropped) == HALF_OPEN  # every one ended; none holds the daemon
    assert len(busy) > HALF_OPEN // 2
    assert {e["outcome"] for e in finished} == {"done"}
    assert not daemon.find("file.claim_failed") and not daemon.find("file.claim_deferred")
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    assert daemon.stop() == 0


def test_behind_a_proxy_on_the_same_host_loopback_needs_the_token(
    tmp_path: Path, start_daemon
) -> None:
    config = write_config(tmp_path, http={"listen": "127.0.0.1:0", "trust_loopback": False})
    refused = start_daemon(config)  # no token set: it would refuse every client
    assert refused.process.wait(timeout=60) == 78
    [problem] = refused.find("startup.refused")
    assert "trust_loopback is false but OCRD_HTTP_TOKEN is not set" in problem["reason"]

    daemon = start_daemon(config, env={"OCRD_HTTP_TOKEN": "s3cret"})
    url = base_url(daemon)
    daemon.wait_for("daemon.ready")
    assert httpx.get(f"{url}/api/status").status_code == 401
    assert httpx.get(f"{url}/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    allowed = httpx.get(f"{url}/api/status", headers={"Authorization": "Bearer s3cret"})
    assert allowed.status_code == 200 and allowed.headers["Connection"] == "close"
    assert daemon.stop() == 0


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler of its own for `signum` (SigCgt in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    [caught] = [line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")]
    return bool(int(caught, 16) >> (signum - 1) & 1)


def test_a_sighup_right_after_start_does_not_end_the_daemon(tmp_path: Path, start_daemon) -> None:
    """`systemctl reload` may come before the daemon is ready: it reloads once it is."""
    config = write_config(tmp_path)
    daemon = start_daemon(config)
    # The first thing `ocrd run` does is take SIGHUP over (before that, a SIGHUP ends the
    # process, or is lost where it was started with SIGHUP ignored: nohup); its imports and
    # the engine's start come after, so this SIGHUP comes long before it is ready.
    wait_until(lambda: catches(daemon.process.pid, signal.SIGHUP), 30, "SIGHUP taken over")
    assert not daemon.find("daemon.ready")
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_for("daemon.ready", timeout=60)
    daemon.wait_for("config.reloaded", timeout=30)
    make_pdf(tmp_path / "data" / "inbox" / "after.pdf", 1)
    daemon.wait_for("document.finished", path="after.pdf", timeout=60)
    assert daemon.stop() == 0
