"""Scanner-like arrivals through `ocrd run`: a scan job written page by page into a folder,
and a fronts file then a backs file from a single-sided feeder."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pymupdf
import pytest
from conftest import files_under, markdown_under, write_config
from PIL import Image, ImageDraw

pytestmark = pytest.mark.slow


def text_pdf(path: Path, *pages: str) -> Path:
    """A PDF with a text layer: one page per text (each a few lines, so the layer is used)."""
    doc = pymupdf.open()
    for text in pages:
        page = doc.new_page()
        for line in range(5):
            page.insert_text((72, 100 + 20 * line), f"{text}, line {line + 1} of this sheet.")
    doc.save(path)
    return path


def drawing(path: Path) -> Path:
    image = Image.new("RGB", (800, 1100), "white")
    ImageDraw.Draw(image).rectangle((100, 100, 700, 500), outline="black", width=8)
    image.save(path)
    return path


def positions(markdown: str, *texts: str) -> list[int]:
    return [markdown.index(text) for text in texts]


def test_a_scan_job_folder_becomes_one_document_in_natural_page_order(
    tmp_path: Path, start_daemon
) -> None:
    config = write_config(tmp_path, {"job_folders": ["scan-*"], "pdf_text": "prefer"})
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready")
    inbox = tmp_path / "data" / "inbox"
    staging = tmp_path / "staging"
    staging.mkdir()
    job = inbox / "scan-0001"
    job.mkdir()
    # The scanner writes one file after the other, each under 0.5 s (the settle time) apart.
    for name, make in (
        ("p1.pdf", lambda p: text_pdf(p, "First sheet")),
        ("p2.pdf", lambda p: text_pdf(p, "Second sheet")),
        ("p3.png", drawing),
        ("p10.pdf", lambda p: text_pdf(p, "Tenth sheet")),
        ("scan.xml", lambda p: p.write_text("<job pages='4'/>")),
    ):
        make(staging / name)
        (staging / name).rename(job / name)
        time.sleep(0.3)
    assert not daemon.find("document.claimed")  # nothing taken while it was being written
    bad = inbox / "scan-0002"
    bad.mkdir()
    (bad / "p1.pdf").write_text("not a PDF")
    finished = daemon.wait_for("document.finished", count=2, timeout=60)
    assert daemon.stop() == 0

    by_path = {event["path"]: event for event in finished}
    good = by_path["scan-0001"]
    assert good["outcome"] == "done" and good["pages"] == 4
    assert good["text_layer_pages"] == [1, 2, 4]
    [skipped] = daemon.find("document.files_skipped", path="scan-0001")
    [xml] = skipped["files"]  # named, with why it is no page
    assert xml.startswith("scan.xml: not a PDF, TIFF, PNG or JPEG file")
    data = tmp_path / "data"
    markdown = (data / "outbox" / "scan-0001.md").read_text()
    first, second, drawn, tenth = positions(
        markdown, "First sheet", "Second sheet", "Simulated page 3", "Tenth sheet"
    )
    assert first < second < drawn < tenth
    assert files_under(data / "done") == [
        "scan-0001/p1.pdf",
        "scan-0001/p10.pdf",
        "scan-0001/p2.pdf",
        "scan-0001/p3.png",
        "scan-0001/scan.xml",
    ]
    assert by_path["scan-0002"]["outcome"] == "failed"
    assert files_under(data / "failed") == ["scan-0002.error.json", "scan-0002/p1.pdf"]
    report = json.loads((data / "failed" / "scan-0002.error.json").read_text())
    assert "no PDF, TIFF, PNG or JPEG" in report["message"]
    assert files_under(inbox) == [] and files_under(data / "work") == []


def test_a_job_folder_killed_in_flight_ends_once(tmp_path: Path, start_daemon) -> None:
    engine = {"kind": "simulated", "simulated": {"seconds_per_page": 1.0, "capacity": 2}}
    config = write_config(tmp_path, {"job_folders": ["*.pages"]}, engine=engine)
    inbox = tmp_path / "data" / "inbox"
    job = inbox / "ledger.pages"
    job.mkdir(parents=True)
    for number in range(1, 7):
        drawing(job / f"page{number}.png")
    first = start_daemon(config)
    first.wait_for("page.recognised", count=2, timeout=60)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=30)
    second = start_daemon(config)
    [summary] = second.wait_for("document.finished", timeout=120)
    assert second.stop() == 0
    assert summary["outcome"] == "done" and summary["pages"] == 6
    [opened] = second.find("document.opened")
    assert opened["resumed_pages"] >= 2
    data = tmp_path / "data"
    assert markdown_under(data / "outbox") == ["ledger.md"]
    assert files_under(data / "done") == [f"ledger.pages/page{n}.png" for n in range(1, 7)]
    assert files_under(inbox) == [] and files_under(data / "work") == []


def test_fronts_then_backs_are_collated_and_a_lone_fronts_file_goes_alone(
    tmp_path: Path, start_daemon
) -> None:
    config = write_config(
        tmp_path, {"collate": True, "collate_window_seconds": 3, "pdf_text": "prefer"}
    )
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready")
    inbox = tmp_path / "data" / "inbox"
    staging = tmp_path / "staging"
    staging.mkdir()
    text_pdf(staging / "fronts.pdf", "Front 1", "Front 2", "Front 3")
    # The turned-over stack is scanned from its last sheet: the backs come in reverse.
    text_pdf(staging / "backs.pdf", "Back 3", "Back 2", "Back 1")
    (staging / "fronts.pdf").rename(inbox / "fronts.pdf")
    daemon.wait_for("collate.fronts_waiting", timeout=30)
    time.sleep(1.0)
    (staging / "backs.pdf").rename(inbox / "backs.pdf")
    [paired] = daemon.wait_for("document.finished", timeout=60)
    text_pdf(inbox / "lone.pdf", "Only fronts")
    [alone] = daemon.wait_for("collate.alone", timeout=30)
    daemon.wait_for("document.finished", count=2, timeout=60)
    assert daemon.stop() == 0

    assert paired["path"] == "fronts.pdf" and paired["pages"] == 6
    data = tmp_path / "data"
    markdown = (data / "outbox" / "fronts.md").read_text()
    order = positions(markdown, "Front 1", "Back 1", "Front 2", "Back 2", "Front 3", "Back 3")
    assert order == sorted(order)
    assert alone["path"].endswith("lone.pdf") and "no backs file" in alone["reason"]
    assert markdown_under(data / "outbox") == ["fronts.md", "lone.md"]
    assert files_under(data / "done") == ["backs.pdf", "fronts.pdf", "lone.pdf"]
    assert files_under(inbox) == [] and files_under(data / "work") == []
