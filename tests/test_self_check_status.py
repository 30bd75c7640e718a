"""Each engine's self-check shown as it is, on the status page, in /api/status, in the
metrics and in `ocrd status`: RapidOCR (and the simulated engine) have none, so after pages
were converted they say "none for this engine" and `self_check_passed: null`, never "not
yet" and `false`; an OpenAI-compatible server that read ocrd's test page says so."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import write_config
from fleet import StandInFleetServer, free_port
from helpers import make_pdf
from test_http import metric

pytestmark = pytest.mark.slow


def ocrd_status(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocrd", "status", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def converted_and_reported(tmp_path: Path, start_daemon: Any, engine: dict[str, Any]) -> Any:
    """A daemon on `engine` that converted a page: its replica in /api/status, its status
    page, its metrics and what `ocrd status` prints."""
    config = write_config(tmp_path, engine=engine, http={"listen": f"127.0.0.1:{free_port()}"})
    daemon = start_daemon(config)
    [listening] = daemon.wait_for("http.listening")
    url = f"http://{listening['address']}"
    daemon.wait_for("daemon.ready", timeout=120)
    make_pdf(tmp_path / "data" / "inbox" / "letter.pdf", 1)
    [finished] = daemon.wait_for("document.finished", timeout=120)
    assert finished["outcome"] == "done", finished
    [replica] = httpx.get(f"{url}/api/status").json()["replicas"]
    page = httpx.get(f"{url}/").text
    metrics = httpx.get(f"{url}/metrics").text
    printed = ocrd_status(config)
    assert daemon.stop() == 0
    assert printed.returncode == 0, printed.stderr
    return replica, page, metrics, printed.stdout


@pytest.mark.parametrize(
    "engine",
    [
        {"kind": "rapidocr"},
        {"kind": "simulated", "simulated": {"seconds_per_page": 0.05}},
    ],
    ids=["rapidocr", "simulated"],
)
def test_an_engine_without_a_self_check_says_so(
    tmp_path: Path, start_daemon: Any, engine: dict[str, Any]
) -> None:
    replica, page, metrics, printed = converted_and_reported(tmp_path, start_daemon, engine)

    assert replica["self_check_state"] == "none"
    assert replica["self_check_passed"] is None and replica["self_check"] is None
    assert "none for this engine" in page and "not yet" not in page
    assert metric(metrics, "ocrd_engine_replica_self_check_passed", replica="in-process") is None
    assert "self-check: none for this engine" in printed


def test_a_server_that_read_the_test_page_shows_its_self_check(
    tmp_path: Path, start_daemon: Any
) -> None:
    """The control: where there is a self-check, its result is shown (a stand-in server,
    which answers the text ocrd drew on its test page)."""
    fleet = StandInFleetServer(delay=0.05)
    fleet.start()
    try:
        engine = {"kind": "openai", "openai": {"base_urls": [fleet.url]}}
        replica, page, metrics, printed = converted_and_reported(tmp_path, start_daemon, engine)
    finally:
        fleet.stop()

    assert replica["self_check_state"] == "passed" and replica["self_check_passed"] is True
    assert replica["self_check"].startswith("read ")
    assert replica["self_check"] in page and "none for this engine" not in page
    assert metric(metrics, "ocrd_engine_replica_self_check_passed", replica=fleet.url) == 1
    assert f"self-check: {replica['self_check']}" in printed
