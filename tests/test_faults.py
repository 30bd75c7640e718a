"""Storage faults and vanishing folders: the original is never lost, ocrd recovers by itself."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import files_under, markdown_under, write_config
from helpers import make_pdf

pytestmark = pytest.mark.slow


def test_an_unusable_outbox_is_retried_until_it_works_again(tmp_path: Path, start_daemon) -> None:
    config = write_config(tmp_path)
    data = tmp_path / "data"
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready")
    outbox = data / "outbox"
    outbox.rename(data / "outbox.away")
    outbox.write_text("a file where the outbox should be")  # every write below it fails

    make_pdf(data / "inbox" / "doc.pdf", 2)
    daemon.wait_for("storage.fault", timeout=60, count=2)
    claimed = [p for p in files_under(data / "work") if p.endswith("doc.pdf")]
    assert len(claimed) == 1  # the original is safe in the work area
    assert files_under(data / "done") == []

    outbox.unlink()
    (data / "outbox.away").rename(outbox)
    [summary] = daemon.wait_for("document.finished", timeout=120)
    assert summary["outcome"] == "done"
    assert daemon.find("storage.recovered")
    assert daemon.stop() == 0
    assert markdown_under(outbox) == ["doc.md"]
    assert files_under(data / "done") == ["doc.pdf"]
    assert files_under(data / "work") == []


def test_an_inbox_removed_and_created_again_is_watched_again(tmp_path: Path, start_daemon) -> None:
    config = write_config(tmp_path, pipeline={"rescan_interval_seconds": 0.5})
    data = tmp_path / "data"
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready")
    shutil.rmtree(data / "inbox")
    daemon.wait_for("inbox.missing", timeout=30)
    (data / "inbox").mkdir()
    daemon.wait_for("inbox.restored", timeout=30)
    make_pdf(data / "inbox" / "back.pdf", 1)
    daemon.wait_for("document.finished", timeout=60, path="back.pdf")
    assert daemon.stop() == 0
    assert files_under(data / "done") == ["back.pdf"]
