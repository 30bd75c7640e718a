"""`/docs` in a real headless Chromium: the page, Swagger UI's files and the description it
shows all come from ocrd, and nothing else is asked for (no validator.swagger.io, no CDN,
no fonts). Chromium's network log (`--log-net-log`) records every request; the page's own
are those it initiated, and the main frame."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import write_config
from test_http import chromium, outward_address

pytestmark = pytest.mark.slow

TOKEN = "docs-token"


def page_requests(net_log: Path, origin: str) -> list[str]:
    """The URLs of the requests the page made (the main frame, and all it initiated),
    leaving out the browser's own (update checks and the like, initiated by no origin)."""
    log = json.loads(net_log.read_text())
    start = log["constants"]["logEventTypes"]["URL_REQUEST_START_JOB"]
    urls = []
    for event in log["events"]:
        params = event.get("params") or {}
        if event["type"] != start or "url" not in params:
            continue
        if params.get("initiator") == origin or params.get("request_type") == "main frame":
            urls.append(params["url"])
    return urls


def test_the_api_page_asks_nothing_of_any_host_but_ocrd(tmp_path: Path, start_daemon: Any) -> None:
    config = write_config(
        tmp_path,
        {"uploads": True, "recursive": True},
        http={"listen": "0.0.0.0:0"},
    )
    daemon = start_daemon(config, env={"OCRD_HTTP_TOKEN": TOKEN})
    [listening] = daemon.wait_for("http.listening")
    # Opened as from another host: Swagger UI asks its validator about any description
    # but one on localhost, and such a client needs the token.
    origin = f"http://{outward_address()}:{listening['address'].rsplit(':', 1)[1]}"
    daemon.wait_for("daemon.ready")
    net_log = tmp_path / "net-log.json"

    browser = chromium(
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--log-net-log={net_log}",
        "--virtual-time-budget=20000",  # until Swagger UI has fetched and shown the description
        "--dump-dom",
        f"{origin}/docs?token={TOKEN}",
    )
    assert daemon.stop() == 0

    assert browser.returncode == 0, browser.stderr[-2000:]
    assert "docling-serve's conversion API" in browser.stdout  # the description, rendered
    requests = page_requests(net_log, origin)
    assert f"{origin}/openapi.json" in requests, requests  # fetched with the token
    assert f"{origin}/docs/static/swagger-ui-bundle.js" in requests, requests
    elsewhere = [url for url in requests if not url.startswith(f"{origin}/")]
    assert elsewhere == [], f"the page asked other hosts: {elsewhere}"
