"""What a user finds in the outbox through `ocrd run`: batch scans split at separator sheets
into documents of their own, and searchable PDFs beside the Markdown, also after a kill
and with `ocrd rerender`."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pymupdf
import pytest
from conftest import claims_left, files_under, markdown_under, write_config
from helpers import make_pdf
from separator_sheets import LETTERS, Sheet, stack_folder, stack_pdf
from test_http import base_url, metric
from test_uploads import AUTH, upload, uploading_daemon

pytestmark = pytest.mark.slow

SPLIT = {"split_on": ["patch_t", "barcode"], "split_barcode": r"SPLIT-\d{4}"}
STACK = [
    Sheet("scan", "phototest.tif"),  # document 1: a scan and a PDF page
    Sheet("pdf", "ocrmypdf__linn.pdf"),
    Sheet("patch_t"),
    Sheet("scan", "eurotext.tif"),  # document 2: a scan and an invoice with its own barcode
    Sheet("invoice", "INV-2024-0815"),
    Sheet("qr", "SPLIT-0007"),
    Sheet("nearly_blank"),  # document 3
    Sheet("pdf", "ocrmypdf__linn.pdf"),
    Sheet("scan", "8087_054.3B.tif"),
    Sheet("code128", "SPLIT-0008"),  # a trailing separator leaves no empty part
]
PARTS = [[1, 2], [4, 5], [7, 8, 9]]


def page_numbers(markdown: str) -> list[int]:
    """The document pages a simulated engine's Markdown holds (its "Simulated page N")."""
    return [
        int(line.split()[-1])
        for line in markdown.splitlines()
        if line.startswith("# Simulated page")
    ]


def test_a_batch_scan_splits_into_documents_at_its_separator_sheets(
    tmp_path: Path, start_daemon
) -> None:
    inbox = {**SPLIT, "layout_file": True, "keep_raw": True, "job_folders": ["scan-*"]}
    config = write_config(tmp_path, inbox)
    data = tmp_path / "data"
    stack_pdf(STACK, tmp_path / "batch.pdf").rename(data / "inbox" / "batch.pdf")
    stack_folder(STACK, tmp_path / "job", dpi=300, suffix=".tif")
    (tmp_path / "job").rename(data / "inbox" / "scan-0042")
    daemon = start_daemon(config)
    finished = daemon.wait_for("document.finished", count=2, timeout=300)
    assert daemon.stop() == 0

    assert {e["outcome"] for e in finished} == {"done"}
    for name, path in (("batch", "batch.pdf"), ("scan-0042", "scan-0042")):
        event = by(finished, path)
        assert [part["pages"] for part in event["parts"]] == PARTS
        assert [s["page"] for s in event["separators"]] == [3, 6, 10]
        for index, part in enumerate(event["parts"], start=1):
            markdown = Path(part["markdown"])
            assert markdown.name == f"{name}-{index}.md"
            assert page_numbers(markdown.read_text()) == PARTS[index - 1]
            layout = json.loads(markdown.with_suffix(".layout.json").read_text())
            assert layout["split"]["part"] == index and layout["split"]["of"] == 3
            assert [p["page"] for p in layout["pages"]] == PARTS[index - 1]
    assert sorted(markdown_under(data / "outbox")) == sorted(
        [f"{n}-{k}.md" for n in ("batch", "scan-0042") for k in (1, 2, 3)]
    )
    assert files_under(data / "done") == [
        "batch.pdf",
        *sorted(f"scan-0042/{p.name}" for p in (data / "done" / "scan-0042").iterdir()),
    ]
    assert claims_left(data / "work") == []


def by(events: list[dict[str, object]], path: str) -> dict[str, object]:
    [event] = [e for e in events if e["path"] == path]
    return event


def test_a_searchable_pdf_lands_beside_the_markdown_and_survives_a_kill(
    corpus: Path, tmp_path: Path, start_daemon
) -> None:
    """RapidOCR's lines laid invisibly over a real scan: the PDF is in place before the
    Markdown, shows the original's pixels, and finds the recognised words; a daemon killed
    while writing leaves no half-written PDF, and the next start writes it once."""
    config = write_config(
        tmp_path,
        {"outputs": ["markdown", "pdf"], "keep_raw": True},
        engine={"kind": "rapidocr"},
    )
    data = tmp_path / "data"
    scan = (corpus / "scans" / "phototest.tif").read_bytes()
    (data / "inbox" / "phototest.tif").write_bytes(scan)
    make_pdf(data / "inbox" / "letter.pdf", 3)
    first = start_daemon(config)
    first.wait_for("page.recognised", count=2, timeout=120)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(timeout=30)

    second = start_daemon(config)
    finished = second.wait_for("document.finished", count=2, timeout=300)
    assert second.stop() == 0
    event = by(finished, "phototest.tif")
    assert event["outcome"] == "done" and event["pdf"] == str(data / "outbox" / "phototest.pdf")
    text = subprocess.run(
        ["pdftotext", "-raw", str(data / "outbox" / "phototest.pdf"), "-"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for word in ("quick", "brown", "jumped", "lazy"):
        assert word in text
    with pymupdf.open(data / "outbox" / "phototest.pdf") as out:
        assert out.page_count == 1
    assert files_under(data / "outbox") == [
        "letter.md",
        "letter.pdf",
        "letter.raw.jsonl",
        "phototest.md",
        "phototest.pdf",
        "phototest.raw.jsonl",
    ]  # one of each, nothing half-written left by the kill

    rerendered = tmp_path / "rerendered"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ocrd",
            "rerender",
            str(data / "done" / "phototest.tif"),
            str(data / "outbox" / "phototest.raw.jsonl"),
            "--out",
            str(rerendered),
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert (rerendered / "phototest.pdf").is_file()
    assert (rerendered / "phototest.md").read_text() == (
        data / "outbox" / "phototest.md"
    ).read_text()


def assert_parts_listed_and_served(status: dict[str, Any], outbox: Path, stem: str) -> None:
    """The API's answer for a document split into three parts: each part with its files,
    each file as it is in the outbox, and `/markdown` every part's in order."""
    assert status["state"] == "done"
    parts = status["links"]["parts"]
    assert [Path(part["markdown"]).name for part in parts] == [f"{stem}-{k}.md" for k in (1, 2, 3)]
    for number, part in enumerate(parts, start=1):
        own = [name for name in files_under(outbox) if name.startswith(f"{stem}-{number}.")]
        assert sorted(part["files"]) == own
        expected = {f"{stem}-{number}{suffix}" for suffix in (".md", ".pdf", ".layout.json")}
        assert expected <= set(own)
        for name, url in part["files"].items():
            answer = httpx.get(url, headers=AUTH, timeout=30)
            assert answer.status_code == 200, (name, answer.text)
            assert answer.content == (outbox / name).read_bytes(), name
        assert (
            status["links"]["files"][f"{stem}-{number}.pdf"]
            == part["files"][f"{stem}-{number}.pdf"]
        )
    joined = httpx.get(status["links"]["markdown"], headers=AUTH, timeout=30)
    assert joined.status_code == 200 and joined.headers["Content-Type"].startswith("text/markdown")
    expected = "\n\n".join(
        f"<!-- part {k} of 3: {stem}-{k}.md -->\n\n" + (outbox / f"{stem}-{k}.md").read_text()
        for k in (1, 2, 3)
    )
    assert joined.text == expected


def test_a_split_upload_lists_every_part_with_its_files_and_serves_them(
    tmp_path: Path, start_daemon
) -> None:
    """An upload cut at separator sheets, and a dropped batch found by its claim id: each
    part is listed with its Markdown, searchable PDF and layout file, all served; so is an
    upload's searchable PDF; after a restart (memory gone) the upload's answer is the same,
    read from the files."""
    inbox = {"outputs": ["markdown", "pdf"], "split_on": ["patch_t"], "layout_file": True}
    daemon, url = uploading_daemon(tmp_path, start_daemon, inbox=inbox)
    batch = stack_pdf(LETTERS, tmp_path / "batch.pdf")
    split = upload(url, batch).json()
    whole = upload(url, make_pdf(tmp_path / "scan.pdf", 2)).json()
    stack_pdf(LETTERS, tmp_path / "data" / "inbox" / "dropped.pdf")
    outbox = tmp_path / "data" / "outbox"
    for accepted in (split, whole):
        httpx.get(f"{accepted['status_url']}?wait=120", headers=AUTH, timeout=130)
    [dropped] = daemon.wait_for("document.finished", path="dropped.pdf", timeout=120)

    status = httpx.get(split["status_url"], headers=AUTH).json()
    assert_parts_listed_and_served(status, outbox / "uploads" / split["id"], "batch")
    by_claim = httpx.get(f"{url}/api/documents/{dropped['doc']}", headers=AUTH).json()
    assert_parts_listed_and_served(by_claim, outbox, "dropped")
    single = httpx.get(whole["status_url"], headers=AUTH).json()
    assert single["links"]["parts"] == [] and "scan.pdf" in single["links"]["files"]
    pdf = httpx.get(single["links"]["files"]["scan.pdf"], headers=AUTH)
    assert pdf.headers["Content-Type"] == "application/pdf"
    assert pdf.content == (outbox / "uploads" / whole["id"] / "scan.pdf").read_bytes()
    assert daemon.stop() == 0

    again, new_url = uploading_daemon(tmp_path, start_daemon, inbox=inbox)
    after = httpx.get(f"{new_url}/api/documents/{split['id']}", headers=AUTH).json()
    assert json.dumps(after["links"]) == json.dumps(status["links"]).replace(url, new_url)
    assert again.stop() == 0


def shapes(page: pymupdf.Page) -> None:
    """Ink without a letter: circles and a bar, as a chart or a drawing would be."""
    for index in range(8):
        page.draw_circle(
            (150 + index * 40, 300 + (index % 3) * 60),
            30 + index * 3,
            color=(0.2, 0.3, 0.6),
            fill=(0.5, 0.7, 0.9),
        )
    page.draw_rect(pymupdf.Rect(80, 500, 520, 700), color=(0, 0, 0), fill=(0.9, 0.6, 0.2))


def short_lines_and_shapes(folder: Path) -> dict[str, Path]:
    """A letter whose pages each carry one short line of real 16 pt text; a report whose
    second page is a drawing without a word; a document that is nothing but a drawing."""
    made = {}
    for name, pages in (
        ("notes", ["Meeting notes, page 1", "Meeting notes, page 2"]),
        ("report", ["Quarterly report, second edition", None]),
        ("drawing", [None]),
    ):
        doc = pymupdf.open()
        for line in pages:
            page = doc.new_page(width=595, height=842)
            if line is None:
                shapes(page)
            else:
                page.insert_text((72, 100), line, fontsize=16)
        doc.save(folder / f"{name}.pdf")
        made[name] = folder / f"{name}.pdf"
    return made


def test_no_page_with_content_is_silently_empty(tmp_path: Path, start_daemon) -> None:
    """One short line of text is taken from the text layer, not refused; a page with ink
    but no text is named in the Markdown, the summary, the metrics and the status page; a
    document from which no text came at all fails, saying so (RapidOCR reads the pixels)."""
    config = write_config(tmp_path, {"outputs": ["markdown", "pdf"]}, engine={"kind": "rapidocr"})
    data = tmp_path / "data"
    for path in short_lines_and_shapes(tmp_path).values():
        path.rename(data / "inbox" / path.name)
    daemon = start_daemon(config)
    url = base_url(daemon)
    finished = daemon.wait_for("document.finished", count=3, timeout=300)
    metrics = httpx.get(f"{url}/metrics").text
    page = httpx.get(f"{url}/").text
    assert daemon.stop() == 0

    notes, report, drawing = (by(finished, f"{n}.pdf") for n in ("notes", "report", "drawing"))
    assert notes["outcome"] == "done" and notes["text_layer_pages"] == [1, 2]
    assert notes["pages_without_text"] == []
    assert "Meeting notes, page 1" in (data / "outbox" / "notes.md").read_text()
    assert report["outcome"] == "done" and report["pages_without_text"] == [2]
    markdown = (data / "outbox" / "report.md").read_text()
    assert "Quarterly report, second edition" in markdown
    assert (
        "<!-- ocrd: page 2 has content, but no text came from it: the engine read no text"
        in markdown
    )
    assert drawing["outcome"] == "failed" and drawing["stage"] == "recognise"
    assert drawing["reason"].startswith("no text came from any page with content (page 1")
    error = json.loads((data / "failed" / "drawing.error.json").read_text())
    assert error["message"] == drawing["reason"]
    assert metric(metrics, "ocrd_pages_without_text_total") == 2
    assert "no text from page 2" in page
