"""`ocrd run` against an inference fleet that goes away, comes back and refuses pages.

The fleet is a stand-in OpenAI-compatible server on loopback (tests/fleet.py): the daemon's
engine, HTTP client, retries, probes and accounting are all real.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import files_under, markdown_under, wait_until
from fleet import StandInFleetServer, fleet_config
from helpers import make_pdf

pytestmark = pytest.mark.slow


def test_a_fleet_that_goes_away_twice_fails_nothing(
    tmp_path: Path, start_daemon, notify_socket
) -> None:
    fleet = StandInFleetServer(delay=0.3)
    fleet.start()
    try:
        config = fleet_config(tmp_path, fleet)
        daemon = start_daemon(config, env={"NOTIFY_SOCKET": str(notify_socket.path)})
        daemon.wait_for("daemon.ready")
        inbox = tmp_path / "data" / "inbox"
        for index in range(8):
            make_pdf(inbox / f"doc{index}.pdf", 5, label=f"Doc {index} page")
        for outage in (1, 2):
            daemon.wait_for("page.recognised", timeout=60, count=10 * outage)
            fleet.stop()  # pages in flight are dropped, new connections refused
            daemon.wait_for("engine.unreachable", timeout=30, count=outage)
            wait_until(
                lambda: any("INFERENCE FLEET UNREACHABLE" in m for m in notify_socket.messages),
                10,
                "the outage in the systemd status",
            )
            fleet.start()
            daemon.wait_for("engine.reachable", timeout=30, count=outage)
        finished = daemon.wait_for("document.finished", timeout=120, count=8)
        assert daemon.process.poll() is None  # it never exited
        assert daemon.stop() == 0
    finally:
        fleet.stop()
    assert fleet.dropped > 0  # the outages really cut requests off
    assert {event["outcome"] for event in finished} == {"done"}
    assert not daemon.find("page.engine_error") and not daemon.find("engine.dead")
    # Two outages; on a loaded machine a request cut off by the first may mark the fleet
    # down once more just after it came back, which is an outage too.
    unreachable, *_ = daemon.find("engine.unreachable")
    assert len(daemon.find("engine.unreachable")) >= 2
    assert "since" in unreachable and fleet.url in unreachable["error"]
    data = tmp_path / "data"
    assert len(markdown_under(data / "outbox")) == 8
    assert files_under(data / "failed") == [] and files_under(data / "work") == []


def test_pages_the_fleet_refuses_fail_their_documents_and_nothing_stalls(
    tmp_path: Path, start_daemon, notify_socket
) -> None:
    fleet = StandInFleetServer(delay=0.05)
    fleet.refuse_pages = True
    fleet.start()
    try:
        config = fleet_config(tmp_path, fleet)
        daemon = start_daemon(config, env={"NOTIFY_SOCKET": str(notify_socket.path)})
        daemon.wait_for("daemon.ready")
        inbox = tmp_path / "data" / "inbox"
        for index in range(30):
            make_pdf(inbox / f"refused{index}.pdf", 1 + index % 3)
        refused = daemon.wait_for("document.finished", timeout=120, count=30)
        fleet.refuse_pages = False
        make_pdf(inbox / "good.pdf", 3)
        [good] = daemon.wait_for("document.finished", timeout=60, path="good.pdf")
        wait_until(
            lambda: "0 documents (0 pages) in flight" in notify_socket.messages[-1],
            10,
            "an idle status line",
        )
        assert daemon.stop() == 0
    finally:
        fleet.stop()
    assert {event["outcome"] for event in refused} == {"failed"}
    assert good["outcome"] == "done"
    failed = tmp_path / "data" / "failed"
    reports = sorted(failed.glob("*.error.json"))
    assert len(reports) == 30
    for path in reports:
        report = json.loads(path.read_text())
        assert report["stage"] == "recognise" and report["page"] >= 1
        assert f"refused page {report['page']}: HTTP 400" in report["message"]
    assert not daemon.find("page.engine_error")  # a refusal is not retried


def test_a_fleet_that_refuses_ocrds_key_holds_files_instead_of_failing_them(
    tmp_path: Path, start_daemon
) -> None:
    fleet = StandInFleetServer(delay=0.05, api_key="the-right-key")
    fleet.start()
    try:
        config = fleet_config(tmp_path, fleet)
        inbox = tmp_path / "data" / "inbox"
        make_pdf(inbox / "waiting.pdf", 2)
        wrong = start_daemon(config, env={"OCRD_OPENAI_API_KEY": "a-wrong-key"})
        [unreachable] = wrong.wait_for("engine.unreachable", timeout=30)
        assert "refuses ocrd's credentials (HTTP 401)" in unreachable["error"]
        wrong.wait_for("daemon.ready")
        assert not wrong.find("document.claimed")
        assert wrong.stop() == 0
        assert files_under(inbox) == ["waiting.pdf"]  # untouched, nothing failed

        right = start_daemon(config, env={"OCRD_OPENAI_API_KEY": "the-right-key"})
        [summary] = right.wait_for("document.finished", timeout=60)
        assert right.stop() == 0
    finally:
        fleet.stop()
    assert summary["outcome"] == "done" and summary["path"] == "waiting.pdf"
