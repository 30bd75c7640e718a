"""Awkward names and files that change or vanish under the daemon: no loss, no crash."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import files_under, markdown_under, write_config
from helpers import make_pdf

pytestmark = pytest.mark.slow

NAMES = [
    "scan 1 (copy).pdf",
    "Ünïcødé 文件 تقرير.pdf",
    "line\nbreak.pdf",
    "x" * 240 + ".pdf",
]


def test_awkward_names_convert_without_loss(tmp_path: Path, start_daemon) -> None:
    config = write_config(tmp_path, {"layout_file": True})
    data = tmp_path / "data"
    for name in NAMES:
        make_pdf(data / "inbox" / name, 1)
    daemon = start_daemon(config)
    finished = daemon.wait_for("document.finished", count=len(NAMES))
    assert daemon.stop() == 0
    assert {e["outcome"] for e in finished} == {"done"}
    long_stem = "x" * 200  # shortened so every companion name fits the filesystem's limit
    assert markdown_under(data / "outbox") == sorted(
        [f"{long_stem}.md", "line\nbreak.md", "scan 1 (copy).md", "Ünïcødé 文件 تقرير.md"]
    )
    assert files_under(data / "done") == sorted(
        [f"{long_stem}.pdf", "line\nbreak.pdf", "scan 1 (copy).pdf", "Ünïcødé 文件 تقرير.pdf"]
    )
    assert (data / "outbox" / f"{long_stem}.layout.json").is_file()
    assert (
        "](scan%201%20%28copy%29.assets/page1-figure1.png)"
        in (data / "outbox" / "scan 1 (copy).md").read_text()
    )


def test_a_file_deleted_while_processed_is_logged_and_nothing_is_written(
    tmp_path: Path, start_daemon
) -> None:
    engine = {"kind": "simulated", "simulated": {"seconds_per_page": 1.0}}
    config = write_config(tmp_path, engine=engine)
    data = tmp_path / "data"
    make_pdf(data / "inbox" / "gone.pdf", 3)
    daemon = start_daemon(config)
    daemon.wait_for("document.opened")
    [original] = [p for p in (data / "work").rglob("gone.pdf")]
    original.unlink()
    daemon.wait_for("document.vanished", timeout=60)
    make_pdf(data / "inbox" / "next.pdf", 1)
    daemon.wait_for("document.finished", path="next.pdf")
    assert daemon.stop() == 0
    assert markdown_under(data / "outbox") == ["next.md"]
    assert files_under(data / "work") == [] and files_under(data / "failed") == []


def test_a_file_that_keeps_growing_ends_in_failed_with_the_reason(
    tmp_path: Path, start_daemon
) -> None:
    config = write_config(tmp_path, {"settle_seconds": 1.0, "max_settle_wait_seconds": 2.0})
    data = tmp_path / "data"
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready")
    growing = data / "inbox" / "endless.pdf"
    deadline = time.monotonic() + 15
    with growing.open("wb") as handle:
        while time.monotonic() < deadline and not daemon.find("document.finished"):
            handle.write(b"%PDF-1.4 still writing\n")
            handle.flush()
            time.sleep(0.3)
    [summary] = daemon.wait_for("document.finished")
    assert daemon.stop() == 0
    assert summary["outcome"] == "failed"
    report = json.loads((data / "failed" / "endless.error.json").read_text())
    assert report["error_type"] == "StillGrowing"
    assert "still being written" in report["message"]
