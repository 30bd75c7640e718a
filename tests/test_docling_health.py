"""docling-serve's routes where no inbox takes uploads, as the README says: served, every
conversion refused with a 403 that says why, and `/health` answering 503 with the same
reason (so that a client's or a load balancer's health check sends no work here); a reload
that turns `uploads: true` on makes them take work at once, on the same server."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import wait_until, write_config
from helpers import make_pdf

pytestmark = pytest.mark.slow

TOKEN = "health-token"
AUTH = {"X-Api-Key": TOKEN}


def test_health_says_why_no_conversion_is_taken_until_a_reload_turns_uploads_on(
    tmp_path: Path, start_daemon: Any
) -> None:
    config = write_config(tmp_path, {"recursive": True})  # uploads: false (the default)
    daemon = start_daemon(config, env={"OCRD_HTTP_TOKEN": TOKEN})
    [listening] = daemon.wait_for("http.listening")
    url = f"http://{listening['address']}"
    daemon.wait_for("daemon.ready")

    health = httpx.get(f"{url}/health")
    assert health.status_code == 503
    assert health.json() == {
        "status": "unavailable",
        "detail": "uploads are off: no inbox has 'uploads: true'",
    }
    pdf = make_pdf(tmp_path / "scan.pdf", 1).read_bytes()
    refused = httpx.post(f"{url}/v1/convert/file", headers=AUTH, files={"files": pdf})
    assert refused.status_code == 403 and "uploads: true" in refused.json()["detail"]
    assert httpx.get(f"{url}/healthz").status_code == 200  # ocrd itself is alive

    data = yaml.safe_load(config.read_text())
    data["inboxes"][0]["uploads"] = True
    config.write_text(yaml.safe_dump(data))
    daemon.process.send_signal(signal.SIGHUP)
    [reloaded] = daemon.wait_for("config.reloaded")
    assert reloaded["http_restarted"] is False  # the same server, the same URL

    wait_until(lambda: httpx.get(f"{url}/health").status_code == 200, 30, "/health ok")
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    converted = httpx.post(
        f"{url}/v1/convert/file", headers=AUTH, files={"files": ("scan.pdf", pdf)}, timeout=120
    )
    assert converted.status_code == 200, converted.text
    assert "Simulated page 1" in converted.json()["document"]["md_content"]
    assert daemon.stop() == 0


def test_health_needs_no_token_where_other_routes_do(tmp_path: Path, start_daemon: Any) -> None:
    """`/health` is a health check like `/healthz`: answered without the token, also
    where loopback is not trusted; a conversion without it is refused in docling's shape."""
    config = write_config(
        tmp_path,
        {"uploads": True, "recursive": True},
        http={"listen": "127.0.0.1:0", "trust_loopback": False},
    )
    daemon = start_daemon(config, env={"OCRD_HTTP_TOKEN": TOKEN})
    [listening] = daemon.wait_for("http.listening")
    url = f"http://{listening['address']}"
    daemon.wait_for("daemon.ready")

    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    refused = httpx.get(f"{url}/v1/status/poll/unknown")
    assert refused.status_code == 401 and "bearer token" in refused.json()["detail"]
    assert httpx.get(f"{url}/v1/status/poll/unknown", headers=AUTH).status_code == 404
    assert daemon.stop() == 0
