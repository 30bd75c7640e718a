"""`ocrd run` as users run it: a subprocess, real files dropped into a real inbox, real signals."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import (
    NotifySocket,
    claimed_originals,
    claims_left,
    files_under,
    markdown_under,
    wait_until,
    write_config,
)
from helpers import make_pdf

pytestmark = pytest.mark.slow


def write_slowly(source: Path, target: Path, chunks: int = 10, pause: float = 0.3) -> None:
    """Copy like a scanner or a slow network share: the file grows for chunks x pause seconds."""
    data = source.read_bytes()
    size = len(data) // chunks + 1
    with target.open("wb") as handle:
        for start in range(0, len(data), size):
            handle.write(data[start : start + size])
            handle.flush()
            time.sleep(pause)


def test_rapidocr_end_to_end_with_a_slow_writer_and_a_corrupt_file(
    tmp_path: Path, corpus: Path, start_daemon
) -> None:
    config = write_config(
        tmp_path, {"settle_seconds": 1.0, "layout_file": True}, engine={"kind": "rapidocr"}
    )
    data = tmp_path / "data"
    inbox = data / "inbox"
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready", timeout=60)

    (inbox / "broken.pdf").write_bytes(b"%PDF-1.7\n1 0 obj\n<< /Type /Catalog" + b"\x00" * 50)
    (inbox / "sub").mkdir()
    shutil.copy(corpus / "real" / "ocrmypdf__linn.pdf", inbox / "sub" / "linn.pdf")
    writer = threading.Thread(
        target=write_slowly, args=(corpus / "scans" / "phototest.tif", inbox / "phototest.tif")
    )
    writer.start()
    writer.join()

    finished = daemon.wait_for("document.finished", timeout=180, count=3)
    outcomes = {e["path"]: e["outcome"] for e in finished}
    assert outcomes == {"broken.pdf": "failed", "sub/linn.pdf": "done", "phototest.tif": "done"}

    assert markdown_under(data / "outbox") == ["phototest.md", "sub/linn.md"]
    layout = json.loads((data / "outbox" / "phototest.layout.json").read_text())
    [page] = layout["pages"]
    assert (page["image_width"], page["image_height"], page["finish_reason"]) == (640, 480, "stop")
    lines = page["blocks"]
    assert lines[0]["label"] == "text"
    assert lines[0]["text"] == "This is a lot of 12 point text to test the"
    x1, y1, x2, y2 = lines[0]["boxes_px"][0]
    assert 20 < x1 < x2 < 640 and 70 < y1 < y2 < 140
    assert files_under(data / "done") == ["phototest.tif", "sub/linn.pdf"]
    assert files_under(data / "failed") == ["broken.error.json", "broken.pdf"]
    assert files_under(inbox) == [] and claims_left(data / "work") == []
    assert (data / "done" / "phototest.tif").read_bytes() == (
        corpus / "scans" / "phototest.tif"
    ).read_bytes()

    markdown = (data / "outbox" / "phototest.md").read_text()
    assert "The quick brown dog jumped over the lazy fox." in markdown
    assert "LinnSequencer" in (data / "outbox" / "sub" / "linn.md").read_text()

    report = json.loads((data / "failed" / "broken.error.json").read_text())
    assert report["file"] == "broken.pdf"
    assert report["stage"] == "render"
    assert report["engine"] == "rapidocr"
    assert report["attempts"] == 1
    assert report["message"]
    assert report["claimed_at"] <= report["failed_at"]

    summary = daemon.find("document.finished", path="phototest.tif")[0]
    assert summary["pages"] == 1 and summary["finish_reasons"] == {"stop": 1}
    assert summary["doc"] and summary["pages_per_second"] > 0
    assert all(e.get("doc") for e in daemon.events if e["event"].startswith(("document.", "page.")))

    assert daemon.stop(signal.SIGTERM) == 0


def test_same_names_never_overwrite_each_other(tmp_path: Path, start_daemon) -> None:
    config = write_config(tmp_path)
    inbox = tmp_path / "data" / "inbox"
    for folder in ("a", "b"):
        (inbox / folder).mkdir()
        make_pdf(inbox / folder / "scan.pdf", 1, label=folder)
    daemon = start_daemon(config)
    daemon.wait_for("document.finished", count=2)
    make_pdf(inbox / "a" / "scan.pdf", 2, label="again")  # the same name, dropped again later
    daemon.wait_for("document.finished", count=3)
    assert daemon.stop() == 0

    outbox = tmp_path / "data" / "outbox"
    assert markdown_under(outbox) == ["a/scan-2.md", "a/scan.md", "b/scan.md"]
    assert (outbox / "a" / "scan-2.assets" / "page2-figure1.png").is_file()  # its own figures
    assert "](scan-2.assets/page1-figure1.png)" in (outbox / "a" / "scan-2.md").read_text()
    assert files_under(tmp_path / "data" / "done") == ["a/scan-2.pdf", "a/scan.pdf", "b/scan.pdf"]
    assert "<!-- page 2 -->" in (outbox / "a" / "scan-2.md").read_text()
    assert "<!-- page 2 -->" not in (outbox / "a" / "scan.md").read_text()


def test_sigterm_leaves_unfinished_documents_claimed_and_a_restart_finishes_them(
    tmp_path: Path, start_daemon
) -> None:
    slow = {"kind": "simulated", "simulated": {"seconds_per_page": 5.0}}
    config = write_config(tmp_path, engine=slow, pipeline={"shutdown_grace_seconds": 0.5})
    data = tmp_path / "data"
    make_pdf(data / "inbox" / "long.pdf", 3)
    daemon = start_daemon(config)
    daemon.wait_for("document.opened")
    assert daemon.stop(signal.SIGTERM, timeout=30) == 0
    assert daemon.find("document.interrupted")
    assert claimed_originals(data / "work") == ["long.pdf"]
    assert files_under(data / "outbox") == [] and files_under(data / "inbox") == []

    config = write_config(tmp_path)
    again = start_daemon(config)
    again.wait_for("document.finished")
    assert again.find("document.recovered", path="long.pdf")
    assert again.stop() == 0
    assert markdown_under(data / "outbox") == ["long.md"]
    assert files_under(data / "done") == ["long.pdf"]
    assert files_under(data / "work") == []


def test_systemd_notifications(tmp_path: Path, start_daemon) -> None:
    notify = NotifySocket(tmp_path / "notify.sock")
    try:
        config = write_config(tmp_path)
        env = {"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "1000000"}
        daemon = start_daemon(config, env=env)
        wait_until(lambda: any("READY=1" in m for m in notify.messages), 60, "READY=1")
        ready_index = next(i for i, m in enumerate(notify.messages) if "READY=1" in m)
        assert any("loading the simulated engine" in m for m in notify.messages[:ready_index])
        assert daemon.find("engine.ready") and daemon.find("inbox.watching")

        make_pdf(tmp_path / "data" / "inbox" / "doc.pdf", 2)
        daemon.wait_for("document.finished")
        wait_until(
            lambda: sum(m == "WATCHDOG=1" for m in notify.messages) >= 3, 10, "watchdog pings"
        )
        status = [m for m in notify.messages if m.startswith("STATUS=") and "waiting" in m]
        assert status and "pages/s" in status[-1]

        assert daemon.stop() == 0
        wait_until(lambda: any("STOPPING=1" in m for m in notify.messages), 30, "STOPPING=1")
    finally:
        notify.close()


def test_convert_command(tmp_path: Path, corpus: Path) -> None:
    import subprocess
    import sys

    original = corpus / "real" / "ocrmypdf__linn.pdf"
    before = original.read_bytes()
    bad = tmp_path / "notes.pdf"
    bad.write_text("not a pdf")
    out = tmp_path / "out"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ocrd",
            "convert",
            str(original),
            str(bad),
            "--out",
            str(out),
            "--engine",
            "simulated",
            "--log-format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert files_under(out) == [
        "notes.error.json",
        "ocrmypdf__linn.assets/page1-figure1.png",
        "ocrmypdf__linn.md",
    ]
    assert "Simulated page 1" in (out / "ocrmypdf__linn.md").read_text()
    assert json.loads((out / "notes.error.json").read_text())["stage"] == "detect"
    assert original.read_bytes() == before and bad.exists()
    assert "1 of 2 files failed" in result.stderr
    # Not a terminal: plain progress lines, one when each file is done.
    assert "ocrmypdf__linn.pdf: page 1/1, done" in result.stderr
    assert "notes.pdf: page ?, failed" in result.stderr


def test_convert_shows_a_progress_bar_per_file_on_a_terminal(tmp_path: Path) -> None:
    import os
    import pty
    import subprocess
    import sys

    pdfs = [make_pdf(tmp_path / f"volume{n}.pdf", 6) for n in (1, 2)]
    config = write_config(tmp_path, engine={"simulated": {"seconds_per_page": 0.3, "capacity": 2}})
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ocrd",
            "convert",
            *map(str, pdfs),
            "--out",
            str(tmp_path / "out"),
            "--config",
            str(config),
            "--engine",
            "simulated",
            "--log-level",
            "warning",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=terminal,
        env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
    )
    os.close(terminal)
    screen = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed: the command is done
            break
        if not chunk:
            break
        screen += chunk
    os.close(controller)
    assert process.wait(timeout=120) == 0
    text = screen.decode(errors="replace")
    for name in ("volume1.pdf", "volume2.pdf"):
        assert name in text
    assert "6/6 pages" in text and "pages/s" in text and "s left" in text
    assert "━" in text  # rich's bar
