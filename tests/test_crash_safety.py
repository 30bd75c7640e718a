"""Nothing lost, nothing twice: SIGKILL at random moments, then the invariants."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pymupdf
import pytest
from conftest import DaemonProcess, wait_until, write_config
from helpers import make_pdf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from kill_loop import kill_loop

pytestmark = pytest.mark.slow

KILLS = 50


# 50 daemon starts: 170 s beside a busy core, over 300 with the suite's other worker too.
@pytest.mark.timeout(900)
def test_kill_loop_keeps_every_invariant(tmp_path: Path) -> None:
    """50 SIGKILLs at random moments; then each input is once in done/ or failed/, each
    done/ original has one complete Markdown, and nothing is left or orphaned."""
    result = kill_loop(tmp_path, kills=KILLS, documents=24, seed=20261122)
    print(json.dumps({k: v for k, v in result.items() if k != "problems"}))
    assert result["problems"] == [], "\n".join(result["problems"])
    assert result["final_exit_code"] == 0
    assert result["inputs"] == result["expected_inputs"] == result["done"] + result["failed"]
    assert result["markdown"] == result["done"] > 0
    assert result["failed"] == 3 * result["backlogs"]  # the bad files; no good one set aside
    assert result["set_aside"] == 0


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


FATAL = (255, 255, 0)  # the simulated engine dies on a page whose centre is this colour


def make_fatal_pdf(path: Path, pages: int, fatal_page: int) -> Path:
    """A PDF whose page `fatal_page` is yellow all over: it kills the simulated engine."""
    make_pdf(path, pages)
    doc = pymupdf.open(path)
    page = doc[fatal_page - 1]
    page.draw_rect(page.rect, color=(1, 1, 0), fill=(1, 1, 0), overlay=False)  # under its text
    doc.saveIncr()
    doc.close()
    return path


def test_a_document_whose_page_kills_the_engine_twice_is_set_aside(
    tmp_path: Path, start_daemon
) -> None:
    """The engine dies with the poison's page 2 in it, and with a good document's page too:
    both are struck and run alone after the restart; the good one converts, the poison
    kills the engine a second time and is then set aside, and everything else goes on."""
    engine = {
        "kind": "simulated",
        "simulated": {"seconds_per_page": 2.0, "capacity": 8, "fatal_colour": list(FATAL)},
    }
    config = write_config(tmp_path, engine=engine)
    data = tmp_path / "data"
    make_pdf(data / "inbox" / "bystander.pdf", 3)
    make_fatal_pdf(data / "inbox" / "poison.pdf", 3, fatal_page=2)

    first = start_daemon(config)
    deaths = first.wait_for("document.engine_died", timeout=60, count=2)
    assert first.process.wait(timeout=60) == 70  # the engine died: systemd restarts ocrd
    assert {(d["path"], d["page"]) for d in deaths} >= {("poison.pdf", 2)}
    assert {d["path"] for d in deaths} == {"poison.pdf", "bystander.pdf"}

    second = start_daemon(config)  # each struck document runs alone, one after the other
    [died] = second.wait_for("document.engine_died", timeout=60)
    assert second.process.wait(timeout=60) == 70
    assert (died["path"], died["page"], died["deaths"]) == ("poison.pdf", 2, 2)
    started = second.find("document.started")
    assert started and all(event["alone"] for event in started)

    third = start_daemon(config)
    make_pdf(data / "inbox" / "healthy.pdf", 1)
    [summary] = third.wait_for("document.finished", timeout=60, path="poison.pdf")
    third.wait_for("document.finished", timeout=60, path="healthy.pdf")
    wait_until(lambda: (data / "done" / "bystander.pdf").exists(), 60, "the bystander done")
    assert third.stop() == 0
    assert summary["outcome"] == "failed" and summary["stage"] == "crash"
    report = json.loads((data / "failed" / "poison.error.json").read_text())
    assert report["message"].startswith("the engine crashed on page 2 twice")
    assert report["error_type"] == "PoisonDocument" and report["page"] == 2
    assert sorted(p.name for p in (data / "done").iterdir()) == ["bystander.pdf", "healthy.pdf"]
    assert (data / "outbox" / "bystander.md").read_text().count("# Simulated page") == 3


def test_a_daemon_killed_from_outside_blames_no_document(tmp_path: Path, start_daemon) -> None:
    """SIGKILL (the OOM killer, a reboot) while documents are in flight is no evidence
    against them: they resume side by side, none runs alone, none is set aside."""
    engine = {"kind": "simulated", "simulated": {"seconds_per_page": 1.0, "capacity": 4}}
    config = write_config(tmp_path, engine=engine)
    data = tmp_path / "data"
    for index in range(4):
        make_pdf(data / "inbox" / f"doc{index}.pdf", 8)
    for kill_number in range(1, 3):
        daemon = start_daemon(config)
        daemon.wait_for("page.recognised", timeout=60)
        kill(daemon)
        assert len(list((data / "done").glob("*.pdf"))) < 4, f"all done by kill {kill_number}"

    # A document may have finished before a kill: the last daemon finishes the others.
    last = start_daemon(config)
    wait_until(lambda: len(list((data / "done").glob("*.pdf"))) == 4, 120, lambda: last.output())
    assert last.stop() == 0
    assert {event["outcome"] for event in last.find("document.finished")} == {"done"}
    assert not any(event["alone"] for event in last.find("document.started"))
    assert list((data / "failed").iterdir()) == []
