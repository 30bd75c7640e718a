"""Nothing lost, nothing twice: SIGKILL at random moments, then the invariants."""

from __future__ import annotations

import random
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
from conftest import CORPUS, files_under, wait_until, write_config
from helpers import make_pdf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from check_invariants import check

pytestmark = pytest.mark.slow

KILLS = 50


def make_backlog(inputs: Path, rng: random.Random) -> None:
    """PDFs of 1 to 4 pages, same names in different folders, and a few bad files."""
    for index in range(24):
        folder = inputs / ("a" if index % 3 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        make_pdf(folder / f"doc{index % 8}-{index}.pdf", rng.randint(1, 4), label=f"File {index}")
    (inputs / "a" / "same.pdf").parent.mkdir(exist_ok=True)
    make_pdf(inputs / "a" / "same.pdf", 2, label="A")
    make_pdf(inputs / "b" / "same.pdf", 2, label="B")
    (inputs / "a" / "notes.pdf").write_text("not a PDF at all")
    (inputs / "b" / "empty.pdf").touch()
    shutil.copy(CORPUS / "hostile" / "qpdf__bad1.pdf", inputs / "b" / "hostile.pdf")


def test_kill_loop_keeps_every_invariant(tmp_path: Path, start_daemon) -> None:
    rng = random.Random(20261122)
    backlog = tmp_path / "backlog"
    make_backlog(backlog, rng)
    config = write_config(
        tmp_path,
        {"settle_seconds": 0.2, "layout_file": True, "keep_raw": True},
        engine={"kind": "simulated", "simulated": {"seconds_per_page": 0.1, "capacity": 4}},
        pipeline={"max_documents_in_flight": 3, "rescan_interval_seconds": 1},
    )
    data = tmp_path / "data"
    dropped = tmp_path / "dropped"  # a copy of everything that went into the inbox
    rounds = 0

    def drop_backlog() -> None:
        nonlocal rounds
        rounds += 1
        shutil.copytree(backlog, dropped / f"round{rounds}")
        shutil.copytree(backlog, data / "inbox" / f"round{rounds}")

    def idle() -> bool:
        return not files_under(data / "inbox") and not any((data / "work").iterdir())

    drop_backlog()
    for _ in range(KILLS):
        if idle():
            drop_backlog()  # keep the daemon busy for every kill
        daemon = start_daemon(config)
        daemon.wait_for("daemon.ready", timeout=60)
        time.sleep(rng.uniform(0.05, 1.0))
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(timeout=30)

    final = start_daemon(config)
    final.wait_for("daemon.ready", timeout=60)
    wait_until(idle, 300, "the backlog to drain")
    assert final.stop() == 0

    problems, summary = check(
        dropped, data / "inbox", data / "outbox", data / "done", data / "failed", data / "work"
    )
    assert problems == [], "\n".join(problems)
    print(f"{KILLS} kills over {rounds} backlogs: {summary}")
    inputs = 29 * rounds
    assert summary["inputs"] == summary["done"] + summary["failed"] == inputs
    assert summary["markdown"] == summary["done"]
    assert summary["failed"] >= 3 * rounds  # at least the three bad files of each round


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
