"""Nothing lost, nothing twice: SIGKILL at random moments, then the invariants."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until, write_config
from helpers import make_pdf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from kill_loop import kill_loop

pytestmark = pytest.mark.slow

KILLS = 50


def test_kill_loop_keeps_every_invariant(tmp_path: Path) -> None:
    """50 SIGKILLs at random moments; then each input is once in done/ or failed/, each
    done/ original has one complete Markdown, and nothing is left or orphaned."""
    result = kill_loop(tmp_path, kills=KILLS, documents=24, seed=20261122)
    print(json.dumps({k: v for k, v in result.items() if k != "problems"}))
    assert result["problems"] == [], "\n".join(result["problems"])
    assert result["final_exit_code"] == 0
    assert result["inputs"] == result["expected_inputs"] == result["done"] + result["failed"]
    assert result["markdown"] == result["done"] > 0
    assert result["failed"] >= 3 * result["backlogs"]  # at least the three bad files


def test_a_long_document_killed_half_way_resumes_where_it_stopped(
    tmp_path: Path, start_daemon
) -> None:
    engine = {"kind": "simulated", "simulated": {"seconds_per_page": 0.2, "capacity": 4}}
    config = write_config(tmp_path, engine=engine)
    data = tmp_path / "data"
    pages = 60
    make_pdf(data / "inbox" / "long.pdf", pages)

    first = start_daemon(config)
    first.wait_for("page.recognised", timeout=120, count=30)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=30)
    recognised_before = len(first.find("page.recognised"))

    second = start_daemon(config)
    [summary] = second.wait_for("document.finished", timeout=180)
    assert second.stop() == 0
    [opened] = second.find("document.opened")
    sent_again = len(second.find("page.recognised"))
    assert opened["resumed_pages"] >= 30
    assert sent_again == pages - opened["resumed_pages"]
    assert sent_again <= pages - 30 < pages - 1
    assert recognised_before + sent_again >= pages
    assert summary["pages"] == pages
    markdown = (data / "outbox" / "long.md").read_text()
    assert all(f"<!-- page {n} -->" in markdown for n in range(2, pages + 1))
    assert markdown.count("# Simulated page") == pages


def kill(daemon: DaemonProcess) -> None:
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait(timeout=30)


def engine_notes(data: Path) -> int:
    """How many attempts sent a page of a claimed document to the engine."""
    journals = data.glob("work/**/.pages.jsonl")
    return sum(journal.read_text().count('"engine_reached"') for journal in journals)


def test_a_document_that_crashed_the_daemon_twice_is_set_aside(
    tmp_path: Path, start_daemon
) -> None:
    engine = {"kind": "simulated", "simulated": {"seconds_per_page": 5.0}}
    config = write_config(tmp_path, engine=engine)
    data = tmp_path / "data"
    make_pdf(data / "inbox" / "poison.pdf", 2)
    for attempt in (1, 2):  # the daemon dies while a page is in the engine, twice
        daemon = start_daemon(config)
        wait_until(lambda n=attempt: engine_notes(data) == n, 60, "a page in the engine")
        kill(daemon)

    third = start_daemon(config)
    make_pdf(data / "inbox" / "healthy.pdf", 1)
    [summary] = third.wait_for("document.finished", timeout=60, path="poison.pdf")
    third.wait_for("document.finished", timeout=60, path="healthy.pdf")
    assert third.stop() == 0
    assert summary["outcome"] == "failed" and summary["stage"] == "crash"
    report = json.loads((data / "failed" / "poison.error.json").read_text())
    assert report["message"].startswith("crashed the daemon: the daemon or its engine died 2 times")
    assert report["attempts"] == 2 and report["error_type"] == "PoisonDocument"
    assert (data / "done" / "healthy.pdf").exists()


def test_a_document_that_gets_further_between_deaths_is_not_blamed(
    tmp_path: Path, start_daemon
) -> None:
    """Deaths while a document runs alone count against it only when it is stuck: one that
    recognised pages since its last start is retried alone again; one with a page in the
    engine and none recognised since is set aside."""
    engine = {"kind": "simulated", "simulated": {"seconds_per_page": 1.0, "capacity": 1}}
    config = write_config(tmp_path, engine=engine)
    data = tmp_path / "data"
    make_pdf(data / "inbox" / "moving.pdf", 8)
    first = start_daemon(config)
    first.wait_for("document.started", timeout=60)
    kill(first)  # a strike
    second = start_daemon(config)
    [started] = second.wait_for("document.started", timeout=60)
    assert started["alone"]
    second.wait_for("page.recognised", timeout=60, count=2)
    kill(second)  # alone, but two pages further: not blamed
    notes = engine_notes(data)

    third = start_daemon(config)
    [started] = third.wait_for("document.started", timeout=60)
    assert started["alone"] and started["attempt"] == 3
    wait_until(lambda: engine_notes(data) > notes, 60, "the third attempt's page in the engine")
    kill(third)  # alone, a page in the engine, and no page further: it is stuck

    fourth = start_daemon(config)
    [summary] = fourth.wait_for("document.finished", timeout=60, path="moving.pdf")
    assert fourth.stop() == 0
    assert not fourth.find("document.started")
    assert summary["outcome"] == "failed" and summary["stage"] == "crash"
    report = json.loads((data / "failed" / "moving.error.json").read_text())
    assert report["attempts"] == 3 and report["error_type"] == "PoisonDocument"
    assert "before it got one page further" in report["message"]


def test_documents_in_flight_when_the_daemon_died_are_retried_alone_and_all_convert(
    tmp_path: Path, start_daemon
) -> None:
    """A crash with four documents in flight is evidence against none of them in
    particular: after the restart each is retried alone, and all four convert."""
    engine = {"kind": "simulated", "simulated": {"seconds_per_page": 1.0, "capacity": 16}}
    config = write_config(tmp_path, engine=engine)
    data = tmp_path / "data"
    for index in range(4):
        make_pdf(data / "inbox" / f"doc{index}.pdf", 3)
    first = start_daemon(config)
    first.wait_for("document.started", timeout=60, count=4)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=30)

    second = start_daemon(config)
    finished = second.wait_for("document.finished", timeout=120, count=4)
    assert second.stop() == 0
    assert {event["outcome"] for event in finished} == {"done"}
    started = second.find("document.started")
    assert len(started) == 4 and all(event["alone"] for event in started)
    sequence = [
        (event["event"], event["doc"])
        for event in second.events
        if event.get("event") in ("document.started", "document.finished")
    ]
    for index in range(0, 8, 2):  # each ran alone: started, finished, then the next
        assert sequence[index][0] == "document.started"
        assert sequence[index + 1] == ("document.finished", sequence[index][1])
    assert len(list((data / "done").glob("*.pdf"))) == 4
    assert list((data / "failed").iterdir()) == []
