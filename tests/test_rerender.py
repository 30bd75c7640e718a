"""`ocrd rerender`: output from raw text without an engine, the same as the daemon writes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import files_under, write_config
from PIL import Image

pytestmark = pytest.mark.slow

FIGURE = [100, 200, 600, 500]  # in the model's 0..999 coordinates
RAW_PAGE = (
    "<|ref|>title<|/ref|><|det|>[[80, 40, 920, 80]]<|/det|>\n# The LinnSequencer\n\n"
    f"<|ref|>image<|/ref|><|det|>[[{FIGURE[2]}, {FIGURE[1]}, {FIGURE[0]}, {FIGURE[3]}]]<|/det|>\n\n"
    "<|ref|>image<|/ref|><|det|>[[10, 10, 11, 11]]<|/det|>\n\n"  # degenerate: skipped
    "<|ref|>table<|/ref|><|det|>[[80, 600, 920, 700]]<|/det|>\n"
    "<table><tr><td>Tracks</td><td>32</td></tr><tr><td>Sequences</td><td>100</td></tr></table>\n"
    "<|ref|>text<|/ref|><|det|>[[80, 720, 920, 800]]<|/det|>\nSee your Linn dealer &amp; more"
)


def ocrd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocrd", *args], capture_output=True, text=True, timeout=300
    )


def test_rerender_crops_links_and_lays_out_figures(corpus: Path, tmp_path: Path) -> None:
    document = corpus / "real" / "ocrmypdf__linn.pdf"
    raw = tmp_path / "linn.raw.jsonl"
    line = {"page": 1, "text": RAW_PAGE, "finish_reason": "length", "prompt": "layout"}
    raw.write_text(json.dumps(line) + "\n")
    config = write_config(tmp_path, {"layout_file": True, "dpi": 144, "max_image_side": 2048})
    out = tmp_path / "out"

    result = ocrd("rerender", str(document), str(raw), "--out", str(out), "--config", str(config))
    assert result.returncode == 0, result.stderr
    assert files_under(out) == [
        "ocrmypdf__linn.assets/page1-figure1.png",
        "ocrmypdf__linn.layout.json",
        "ocrmypdf__linn.md",
    ]
    markdown = (out / "ocrmypdf__linn.md").read_text()
    assert markdown.startswith(
        "# The LinnSequencer\n\n![](ocrmypdf__linn.assets/page1-figure1.png)"
    )
    assert "| Tracks | 32 |\n| --- | --- |\n| Sequences | 100 |" in markdown
    assert "See your Linn dealer & more" in markdown
    assert "page 1 is incomplete" in markdown  # finish_reason length

    # The page went to the engine as US Letter at 144 DPI; the figure is cut from the scan
    # embedded in the PDF, at its own 300 DPI (more than the 288 DPI a render would give).
    width, height = 1224, 1584
    left, top = round(FIGURE[0] / 999 * width), round(FIGURE[1] / 999 * height)
    right, bottom = round(FIGURE[2] / 999 * width), round(FIGURE[3] / 999 * height)
    scale = 300 / 144
    with Image.open(out / "ocrmypdf__linn.assets" / "page1-figure1.png") as figure:
        expected = (scale * (right - left), scale * (bottom - top))
        assert figure.size == pytest.approx(expected, abs=3)
        figure_size = list(figure.size)

    layout = json.loads((out / "ocrmypdf__linn.layout.json").read_text())
    [page] = layout["pages"]
    assert (page["image_width"], page["image_height"]) == (width, height)
    assert (page["width_pt"], page["height_pt"]) == (612, 792)
    assert page["finish_reason"] == "length" and page["unfinished"] is True
    image = page["blocks"][1]
    assert image["label"] == "image"
    assert image["boxes_px"] == [[left, top, right, bottom]]
    expected_pt = [v / 999 * size for v, size in zip(FIGURE, [612, 792] * 2, strict=True)]
    assert image["boxes_pt"][0] == pytest.approx(expected_pt, abs=0.01)
    assert image["figure"] == "ocrmypdf__linn.assets/page1-figure1.png"
    assert image["figure_size"] == figure_size and image["figure_source_dpi"] == 300
    x1, y1, x2, y2 = image["figure_source_box"]  # in pixels of the embedded 300 DPI scan
    assert (x2 - x1, y2 - y1) == pytest.approx(figure_size, abs=1)
    assert (x1, y1) == pytest.approx((scale * left, scale * top), abs=3)
    assert [b["label"] for b in page["blocks"]] == ["title", "image", "image", "table", "text"]


def test_a_raw_file_without_every_page_is_refused(corpus: Path, tmp_path: Path) -> None:
    raw = tmp_path / "short.raw.jsonl"
    raw.write_text(json.dumps({"page": 1, "text": "only one"}) + "\n")
    document = corpus / "scans" / "multipage-scan.tif"
    result = ocrd("rerender", str(document), str(raw), "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert "no line for page 2" in result.stderr


def test_rerender_writes_what_the_daemon_wrote(corpus: Path, tmp_path: Path, start_daemon) -> None:
    inbox_options = {
        "layout_file": True,
        "keep_raw": True,
        "strip_headers_footers": True,
        "max_image_side": 1000,
    }
    engine = {"kind": "simulated", "simulated": {"seconds_per_page": 0.05, "unfinished_every": 2}}
    config = write_config(tmp_path, inbox_options, engine=engine)
    data = tmp_path / "data"
    shutil.copy(corpus / "scans" / "multipage-scan.tif", data / "inbox" / "scans.tif")
    daemon = start_daemon(config)
    [summary] = daemon.wait_for("document.finished", timeout=120)
    assert daemon.stop() == 0
    assert summary["retried_pages"] == [2]  # page 2 stopped at max_tokens, retried as text
    assert summary["unfinished_pages"] == []

    out = tmp_path / "again"
    raw = data / "outbox" / "scans.raw.jsonl"
    result = ocrd(
        "rerender",
        str(data / "done" / "scans.tif"),
        str(raw),
        "--out",
        str(out),
        "--config",
        str(config),
    )
    assert result.returncode == 0, result.stderr
    daemon_files = files_under(data / "outbox")
    assert daemon_files == [
        "scans.assets/page1-figure1.png",
        "scans.assets/page3-figure1.png",  # page 2's text retry has no figure
        "scans.layout.json",
        "scans.md",
        "scans.raw.jsonl",
    ]
    assert files_under(out) == daemon_files
    for name in daemon_files:
        assert (out / name).read_bytes() == (data / "outbox" / name).read_bytes(), name
    layout = json.loads((out / "scans.layout.json").read_text())
    assert [(p["prompt"], p["retried"]) for p in layout["pages"]] == [
        ("layout", False),
        ("text", True),
        ("layout", False),
    ]
