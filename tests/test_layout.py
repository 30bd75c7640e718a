"""The layout stage (ocrd/layout/, ocrd/engines/layout.py): a real RT-DETR detector run by
transformers in a process of its own (a tiny one, random weights, made here:
tests/tiny_layout.py), each region cut from the rendered page and sent to the engine with
its element's prompt, the answers assembled in reading order with the regions' boxes.

The engine answering the regions is ocrd's simulated one (it answers each element as the
model writes one: ocrd/engines/simulated_answers.py), so these tests show ocrd's own logic:
which region goes with which prompt, in which order, where its block lands.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import math
import os
import random
import shutil
import signal
from pathlib import Path
from typing import Any

import pymupdf
import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from conftest import files_under, write_config
from PIL import Image
from tiny_layout import build_tiny_detector

from ocrd.config import EngineConfig, LayoutConfig, PromptMode, SimulatedConfig
from ocrd.domain import PageImage
from ocrd.engines import create_engine
from ocrd.engines.base import EngineDeadError, EngineStartError, EngineState
from ocrd.engines.layout import LayoutEngine
from ocrd.engines.simulated import SimulatedEngine
from ocrd.engines.simulated_server import SimulatedReplica, parse_args
from ocrd.layout import Detection, Region, cleaned, reading_order
from ocrd.layout.regions import MIN_SIDE
from ocrd.models import model
from ocrd.output.page import page_blocks
from ocrd.text.grounding import SCALE, Box

SOURCE = "sample-files__multicolumn.pdf"
SCAN = "ocrmypdf__linn.pdf"  # one scanned page: its searchable PDF gets ocrd's text layer


@pytest.fixture(scope="module")
def detector(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_detector(tmp_path_factory.mktemp("layout") / "tiny-rtdetr")


def rendered_page(corpus: Path, model_name: str) -> PageImage:
    """Page 1 of a real two-column PDF, rendered as the render workers do (pixels)."""
    with pymupdf.open(corpus / "real" / SOURCE) as document:
        page = document[0]
        pixmap = page.get_pixmap(dpi=100)
        image = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples)
        return PageImage(1, image, page.rect.width, page.rect.height, model=model_name)


def expected_answer(name: str, task: str, region: Region) -> str:
    """What the simulated engine answers for a region read with `task`: the text names the
    task and the size the crop was sent at (the model's image rule applied to it)."""
    recipe = model(name)
    width, height = recipe.image.fitted(
        round(region.x2) - int(region.x1), round(region.y2) - int(region.y1)
    )
    if task == "table":
        return f"<td>{width}x{height}</td>"
    if task == "formula":
        return f"{width} \\times {height}"
    return f"Simulated {task} of page 1: region {width}x{height} px"


def test_regions_are_read_with_their_element_prompts_in_order_with_their_boxes(
    detector: Path, corpus: Path
) -> None:
    recipe = model("glm-ocr")
    settings = LayoutConfig(detector=str(detector), threshold=0.0, device="cpu")
    inner = SimulatedEngine(SimulatedConfig(seconds_per_page=0.01, capacity=64), recipe)
    engine = LayoutEngine(inner, recipe, settings)
    page = rendered_page(corpus, "glm-ocr")

    async def read() -> tuple[list[Any], Any, Any]:
        await engine.start()
        try:
            regions = await engine.regions(page)
            text = await engine.recognise(page, PromptMode.layout)
            return regions, text, await after_a_detector_death()
        finally:
            await engine.stop()

    async def after_a_detector_death() -> Any:
        """The detector process killed: the next page starts a new one, which finds the
        same regions."""
        [process] = [worker.process for worker in engine.detectors._all]
        os.kill(process.pid, signal.SIGKILL)  # type: ignore[arg-type]
        await asyncio.to_thread(process.join)
        found = await engine.regions(page)
        [restarted] = [worker.process for worker in engine.detectors._all]
        assert restarted.pid != process.pid and restarted.is_alive()
        return found

    regions, text, again = asyncio.run(read())
    assert again == regions
    # The detector's regions, less those the SDK abandons, each read once (images not).
    read_regions = [region for region, element in regions if element.task is not None]
    assert len(read_regions) >= 5 and inner._done == len(read_regions)
    assert text.model == "glm-ocr" and text.finish_reason == "stop"
    # What comes out is what GLM-OCR's SDK publishes per page, read by its own parser.
    published = json.loads(text.text)
    assert [entry["index"] for entry in published[0]] == list(range(len(regions)))
    blocks = page_blocks(text, page.image.size)
    assert len(blocks) == len(regions)
    width, height = page.image.size
    for block, (region, element) in zip(blocks, regions, strict=True):
        assert block.label == element.label
        [box] = block.boxes
        placed = Box.from_pixels(region.x1, region.y1, region.x2, region.y2, width, height)
        # GLM-OCR's boxes are whole thousandths of the page
        corners = zip(box.scaled(1, 1), placed.scaled(1, 1), strict=True)
        assert max(abs(a - b) for a, b in corners) < 0.002
        if element.task is None:
            assert block.content == ""
        else:
            assert expected_answer("glm-ocr", element.task, region) in block.content
    # The dropped labels are gone; the rest keep the detector's regions in reading order.
    assert not {r.label for r, _ in regions} & recipe.layout.dropped  # type: ignore[union-attr]
    assert [r for r, _ in regions] == reading_order([r for r, _ in regions])


def test_a_two_column_page_is_read_column_by_column_between_full_width_parts() -> None:
    def box(label: str, x1: float, y1: float, x2: float, y2: float) -> Region:
        return Region(label, 0.9, x1, y1, x2, y2)

    page = [
        box("doc_title", 100, 50, 1100, 120),
        box("text", 100, 150, 580, 300),  # left column, above the figure
        box("text", 100, 320, 580, 500),
        box("text", 620, 150, 1100, 260),  # right column, above the figure
        box("text", 620, 280, 1100, 500),
        box("image", 100, 540, 1100, 900),  # full width
        box("figure_title", 100, 910, 1100, 950),
        box("paragraph_title", 100, 980, 580, 1010),  # left column, below
        box("text", 100, 1020, 580, 1400),
        box("text", 620, 980, 1100, 1200),  # right column, below
        box("table", 620, 1220, 1100, 1400),
        box("number", 560, 1500, 640, 1530),  # page number, centred at the foot
    ]
    shuffled = page[:]
    random.Random(3).shuffle(shuffled)
    assert reading_order(shuffled) == page
    # Rows of a left and a right paragraph that line up are still read by column.
    rows = [box("text", x, y, x + 400, y + 80) for x in (50, 550) for y in (100, 200, 300)]
    assert reading_order(list(reversed(rows))) == rows


def test_hostile_detector_output_is_bounded_and_kept_on_the_page() -> None:
    width, height = 1200, 1600
    chance = random.Random(11)
    hostile = [
        Region("text", chance.random(), *(chance.uniform(-5000, 5000) for _ in range(4)))
        for _ in range(5000)
    ]
    hostile += [Region("table", 1.0, 10, 10, 10, 900)] * 50  # no width
    hostile += [Region("x" * 10_000, 1.0, 0, 0, 2e9, 2e9)]  # the whole page, a huge label
    hostile += [Region("text", math.nan, 0, 0, 100, 100), Region("text", 0.5, math.inf, 0, 1, 1)]
    kept = cleaned(hostile, width, height, max_regions=200)
    assert 0 < len(kept) <= 200
    for region in kept:
        assert 0 <= region.x1 < region.x2 <= width and 0 <= region.y1 < region.y2 <= height
        assert region.x2 - region.x1 >= MIN_SIDE and region.y2 - region.y1 >= MIN_SIDE
        assert len(region.label) <= 40
    assert len(reading_order(kept)) == len(kept)


class HostileDetectors:
    """Stands in for the detector processes: thousands of regions, most of them no region
    of the page at all."""

    def __init__(self, regions: list[Region]) -> None:
        self.regions = regions

    async def detect(self, image: Image.Image) -> Detection:
        return Detection(tuple(self.regions), ordered=False)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


def test_a_page_with_thousands_of_regions_sends_at_most_max_regions_requests() -> None:
    recipe = model("paddleocr-vl-1.5")
    inner = SimulatedEngine(SimulatedConfig(seconds_per_page=0.0, capacity=256), recipe)
    settings = LayoutConfig(detector="never/loaded", max_regions=30)
    engine = LayoutEngine(inner, recipe, settings)
    chance = random.Random(5)
    boxes = [
        Region("text", chance.random(), x, y, x + chance.uniform(-20, 60), y + 30)
        for x in range(-100, 900, 20)
        for y in range(-100, 1200, 25)
    ]
    engine.detectors = HostileDetectors(boxes)  # type: ignore[assignment]
    page = PageImage(1, Image.new("RGB", (800, 1100), "white"), 576, 792, model=recipe.name)
    text = asyncio.run(engine.recognise(page, PromptMode.layout))
    blocks = page_blocks(text, page.image.size)
    assert 0 < inner._done <= 30 and len(blocks) == inner._done
    assert all(0 <= b.boxes[0].x1 < b.boxes[0].x2 <= SCALE for b in blocks)
    # A page on which nothing is found is read whole, as without a detector.
    engine.detectors = HostileDetectors([Region("text", 1.0, 5, 5, 5, 5)])  # type: ignore[assignment]
    whole = asyncio.run(engine.recognise(page, PromptMode.layout))
    assert "Simulated page 1" in whole.text and inner._done == len(blocks) + 1
    # A region the engine fails on fails the page with the engine's own error.
    engine.detectors = HostileDetectors(boxes)  # type: ignore[assignment]
    inner.health.set(EngineState.dead, "the simulated engine was stopped")
    with pytest.raises(EngineDeadError, match="was stopped"):
        asyncio.run(engine.recognise(page, PromptMode.layout))


def glm_layout_engine(detector: Path) -> LayoutEngine:
    """GLM-OCR's layout stage over the simulated engine, with the detector at `detector`."""
    recipe = model("glm-ocr")
    return LayoutEngine(
        SimulatedEngine(SimulatedConfig(), recipe),
        recipe,
        LayoutConfig(detector=str(detector), device="cpu", timeout_seconds=120),
    )


def test_a_detector_checkpoint_in_pickle_format_is_refused_with_the_reason(
    tmp_path: Path,
) -> None:
    # Pickled weights can run code when loaded: only safetensors are read.
    folder = build_tiny_detector(tmp_path / "pickled", queries=4, safetensors=False)
    assert (folder / "pytorch_model.bin").exists()
    engine = glm_layout_engine(folder)
    with pytest.raises(EngineStartError) as refused:
        asyncio.run(engine.start())
    message = str(refused.value)
    assert str(folder) in message and "safetensors" in message
    assert engine.detectors._all == []  # no detector process left behind


def test_a_detector_checkpoint_with_remote_code_is_refused_and_its_code_never_runs(
    tmp_path: Path,
) -> None:
    """A checkpoint whose image processor and model are classes in its own Python file:
    transformers would import that file; the detector refuses it instead (no remote code),
    so a checkpoint is data, never a program."""
    folder = build_tiny_detector(tmp_path / "remote", queries=4)
    marker = tmp_path / "code-ran"
    (folder / "acme_layout.py").write_text(
        f"open({str(marker)!r}, 'w').write('ran')\nclass AcmeProcessor: ...\nclass Acme: ...\n"
    )
    for name, auto in (
        ("preprocessor_config.json", {"AutoImageProcessor": "acme_layout.AcmeProcessor"}),
        ("config.json", {"AutoModelForObjectDetection": "acme_layout.Acme"}),
    ):
        settings = json.loads((folder / name).read_text())
        settings.pop("image_processor_type", None)  # nothing but the checkpoint's own code
        (folder / name).write_text(json.dumps({**settings, "auto_map": auto}))
    engine = glm_layout_engine(folder)
    with pytest.raises(EngineStartError) as refused:
        asyncio.run(engine.start())
    assert "trust_remote_code" in str(refused.value)
    assert not marker.exists()


def test_a_detector_is_configured_per_model_and_refused_for_a_whole_page_model() -> None:
    config = EngineConfig.model_validate(
        {
            "kind": "simulated",
            "model": "glm-ocr",
            "layout": {"detector": "/srv/models/pp-doclayoutv3"},
            "models": {"paddleocr-vl-1.5": {"layout": {"detector": "published"}}},
        }
    )
    engines = create_engine(config, "simulated")
    chosen = {e.recipe.name: e.engine for e in engines.engines.values()}  # type: ignore[attr-defined]
    assert chosen["glm-ocr"].detector.source == "/srv/models/pp-doclayoutv3"
    assert chosen["glm-ocr"].detector.threshold == 0.3  # GLM-OCR's own
    paddle = chosen["paddleocr-vl-1.5"].detector
    assert (paddle.source, paddle.threshold) == ("PaddlePaddle/PP-DocLayoutV3_safetensors", 0.5)
    whole_pages = EngineConfig.model_validate({"kind": "simulated", "model": "glm-ocr"})
    assert not isinstance(create_engine(whole_pages, "simulated"), LayoutEngine)
    refused = EngineConfig.model_validate(
        {"kind": "simulated", "model": "deepseek-ocr-2", "layout": {"detector": "published"}}
    )
    with pytest.raises(ValueError, match="deepseek-ocr-2 reads whole pages"):
        create_engine(refused, "simulated")


@pytest.mark.slow
def test_daemon_reads_a_scan_region_by_region_into_every_output(
    detector: Path, tmp_path: Path, corpus: Path, start_daemon: Any
) -> None:
    config = write_config(
        tmp_path,
        inbox={
            "model": "paddleocr-vl-1.5",
            "outputs": ["markdown", "pdf", "docling", "chunks"],
            "keep_raw": True,
        },
        engine={
            "model": "paddleocr-vl-1.5",
            "layout": {"detector": str(detector), "threshold": 0.0, "device": "cpu"},
        },
    )
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready", timeout=180)
    shutil.copy(corpus / "real" / SCAN, tmp_path / "data" / "inbox" / SCAN)
    [finished] = daemon.wait_for("document.finished", timeout=300)
    assert finished["outcome"] == "done", finished
    outbox = tmp_path / "data" / "outbox"
    stem = Path(SCAN).stem
    written = files_under(outbox)
    for suffix in (".md", ".pdf", ".docling.json", ".chunks.jsonl", ".raw.jsonl"):
        assert f"{stem}{suffix}" in written, written
    # Each page's answer is PaddleOCR-VL's published page JSON, one entry per region.
    raw = [json.loads(line) for line in (outbox / f"{stem}.raw.jsonl").open()]
    pages = [record for record in raw if "page" in record and "text" in record]
    assert len(pages) == 1
    regions = json.loads(pages[0]["text"])["parsing_res_list"]
    read = [r for r in regions if r["block_content"]]
    assert len(read) >= 5
    assert all(r["block_content"].startswith(("Simulated ocr", "<table>", "$$")) for r in read)
    # The Markdown holds the regions' answers in their order (one after another: two
    # regions of the same size and look get the same answer).
    markdown = (outbox / f"{stem}.md").read_text()
    place = -1
    for region in read:
        place = markdown.find(region["block_content"].strip("$\n").split("\n")[0], place + 1)
        assert place != -1, (region, markdown)
    # DoclingDocument items carry the regions' boxes as provenance on page 1.
    docling = json.loads((outbox / f"{stem}.docling.json").read_text())
    placed = [
        prov["bbox"]
        for item in docling["texts"]
        if item["text"].startswith("Simulated ocr of page 1")
        for prov in item.get("prov", [])
    ]
    assert len({(b["l"], b["t"]) for b in placed}) >= 3
    # The searchable PDF's text layer holds each region's words inside its region.
    scale = 72 / 144  # block_bbox is in pixels of the page rendered at the default 144 dpi
    with pymupdf.open(outbox / f"{stem}.pdf") as searchable:
        page = searchable[0]
        boxes = [
            pymupdf.Rect(x1 * scale - 1, y1 * scale - 1, x2 * scale + 1, y2 * scale + 1)
            for x1, y1, x2, y2 in (r["block_bbox"] for r in read)
        ]
        words = [w for w in page.get_text("words") if w[4] == "Simulated"]
    assert len(words) == sum(r["block_content"].startswith("Simulated") for r in read)
    for word in words:
        assert any(box.contains(pymupdf.Rect(word[:4])) for box in boxes), word
    assert daemon.stop() == 0


def test_simulated_server_answers_each_element_prompt_as_one_element() -> None:
    """The stand-in `vllm serve` (ocrd/engines/simulated_server.py) started with
    --reads-elements answers a region as the model answers one; without it, a page."""

    async def ask(flags: list[str], prompt: str) -> str:
        args = parse_args(["--replica", "1", "--port", "1", "--model", "glm-ocr", *flags])
        args.seconds_per_page = 0.0
        picture = io.BytesIO()
        Image.new("RGB", (300, 120), "white").save(picture, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(picture.getvalue()).decode()
        content = [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": prompt},
        ]
        body = {"model": "glm-ocr", "messages": [{"role": "user", "content": content}]}
        async with TestServer(SimulatedReplica(args).app()) as server, ClientSession() as client:
            answer = await client.post(server.make_url("/v1/chat/completions"), json=body)
            assert answer.status == 200
            data = await answer.json()
        return str(data["choices"][0]["message"]["content"])

    table = asyncio.run(ask(["--reads-elements"], "Table Recognition:"))
    assert table.startswith("<table>") and "<td>300x120</td>" in table
    formula = asyncio.run(ask(["--reads-elements"], "Formula Recognition:"))
    assert formula == "x_{0} = 300 \\times 120"
    text = asyncio.run(ask(["--reads-elements"], "Text Recognition:"))
    assert text.startswith("Simulated text of page 0: region 300x120 px")
    page = asyncio.run(ask([], "Text Recognition:"))
    assert json.loads(page)[0][0]["content"] == "# Simulated page 0"


def test_paddleocr_vl_tables_in_otsl_become_html_tables_with_their_spans() -> None:
    layout = model("paddleocr-vl-1.5").layout
    assert layout is not None
    otsl = "<fcel>Name<fcel>Q1<lcel><nl><fcel>A<fcel>1<fcel>2<nl><ucel><fcel>3<ecel><nl>"
    assert layout.content("table", otsl) == (
        '<table><tr><td>Name</td><td colspan="2">Q1</td></tr>'
        '<tr><td rowspan="2">A</td><td>1</td><td>2</td></tr>'
        "<tr><td>3</td><td></td></tr></table>"
    )
    # A cell's text is text, never markup; other tasks' answers and HTML stay as they are.
    hostile = layout.content("table", "<fcel><script>alert(1)</script><nl>")
    assert hostile == "<table><tr><td>&lt;script&gt;alert(1)&lt;/script&gt;</td></tr></table>"
    assert layout.content("ocr", "<fcel>x") == "<fcel>x"
    assert layout.content("table", "<table><tr><td>x</td></tr></table>").count("<table>") == 1
    # A tall merged column is one cell, worked out in one pass.
    tall = layout.content("table", "<fcel>top<nl>" + "<ucel><nl>" * 20_000)
    assert (
        tall == '<table><tr><td rowspan="20001">top</td></tr>' + "<tr></tr>" * 20_000 + "</table>"
    )
