"""What a page becomes besides an engine's answer: a born-digital page's own text layer,
a blank page that is not sent to the engine, and figures cut at the source's resolution.
Real PDFs and scans from ../shared/corpus, real PyMuPDF, RapidOCR's real models."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from pathlib import Path

import pymupdf
import pytest
from PIL import Image, ImageDraw

from ocrd.config import DocumentOptions, PipelineConfig, RapidOcrConfig, SimulatedConfig
from ocrd.documents.pipeline import DocumentContext, Pipeline
from ocrd.domain import DocumentFailed, DocumentResult, PageSource
from ocrd.engines.rapidocr import RapidOcrEngine
from ocrd.engines.simulated import SimulatedEngine
from ocrd.output.write import BLANK_MARKER, render_markdown, write_document

BORN_DIGITAL = ["earnings.pdf", "multi_column_miss.pdf", "olmo2-pg4.pdf", "math_2503_04086.pdf"]


def words(text: str) -> Counter[str]:
    return Counter(re.findall(r"[a-z0-9]+", text.lower()))


def word_recall(found: str, reference: str) -> float:
    """Share of the reference's words (with repeats) that the found text has."""
    expected = words(reference)
    return sum((words(found) & expected).values()) / max(1, sum(expected.values()))


def convert(engine, paths: list[Path], settings: DocumentOptions, scratch: Path) -> list:  # type: ignore[no-untyped-def]
    async def run() -> list:
        await engine.start()
        pipeline = Pipeline.create(engine, PipelineConfig(render_workers=2))
        try:
            return await asyncio.gather(
                *(
                    pipeline.convert(DocumentContext.of(p, settings, scratch / p.stem))
                    for p in paths
                ),
                return_exceptions=True,
            )
        finally:
            pipeline.renderers.shutdown()
            await engine.stop()

    return asyncio.run(run())


def markdown_of(result: DocumentResult, settings: DocumentOptions) -> str:
    return render_markdown(result, settings, "assets")


def test_born_digital_pages_come_from_their_text_layer_with_every_word(
    corpus: Path, tmp_path: Path
) -> None:
    """On the CPU engine `auto` prefers the text layer: every word of these born-digital
    PDFs arrives, and tables stay tables; recognising their pixels with RapidOCR instead
    loses words (both measured here, side by side)."""
    paths = [corpus / "olmocr-bench" / "pdfs" / name for name in BORN_DIGITAL]
    inbox = DocumentOptions()
    preferred = inbox.for_engine("rapidocr")
    assert preferred.pdf_text == "prefer"
    assert inbox.for_engine("vllm").pdf_text == "ocr"
    engine = RapidOcrEngine(RapidOcrConfig())
    from_text = convert(engine, paths, preferred, tmp_path)
    forced = inbox.model_copy(update={"pdf_text": "ocr"}).for_engine("rapidocr")
    from_pixels = convert(RapidOcrEngine(RapidOcrConfig()), paths, forced, tmp_path / "ocr")

    recalls = {}
    for path, text_result, ocr_result in zip(paths, from_text, from_pixels, strict=True):
        with pymupdf.open(path) as doc:
            reference = doc[0].get_text()
        assert text_result.text_layer_pages == [1] and ocr_result.text_layer_pages == []
        recalls[path.name] = (
            word_recall(markdown_of(text_result, preferred), reference),
            word_recall(markdown_of(ocr_result, forced), reference),
        )
    print(json.dumps(recalls, indent=1))
    for name, (text_layer, _) in recalls.items():
        assert text_layer >= 0.97, name
    assert sum(t for t, _ in recalls.values()) > sum(p for _, p in recalls.values())
    earnings = markdown_of(from_text[0], preferred)
    assert "|Research and development|3,423|2,532|1,892|" in earnings.replace(" |", "|")


def unmapped_glyphs(path: Path) -> Path:
    """A PDF whose font renames its glyphs without saying which letters they are (no
    ToUnicode map, made-up glyph names): its text layer reads as a jumble of symbols."""
    doc = pymupdf.open()
    page = doc.new_page()
    font = doc.get_new_xref()
    names = " ".join(f"/g{n:03d}" for n in range(26))
    doc.update_object(
        font,
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica "
        f"/Encoding << /Type /Encoding /Differences [65 {names}] >> >>",
    )
    lines = " ".join("(THE QUICK BROWN FOX JUMPS) Tj 0 -14 Td" for _ in range(12))
    content = doc.get_new_xref()
    doc.update_object(content, "<< >>")
    doc.update_stream(content, f"BT /F1 10 Tf 72 720 Td {lines} ET".encode())
    doc.xref_set_key(page.xref, "Contents", f"{content} 0 R")
    doc.xref_set_key(page.xref, "Resources", f"<< /Font << /F1 {font} 0 R >> >>")
    doc.save(path)
    return path


def test_untrustworthy_text_layers_are_recognised_instead(corpus: Path, tmp_path: Path) -> None:
    """An invisible OCR layer from another tool, a page that is one big image, and text
    whose glyphs map to no letters all go to the engine even where the layer is preferred."""
    paths = [
        corpus / "olmocr-bench" / "pdfs" / "small_page_size.pdf",  # invisible text layer
        corpus / "olmocr-bench" / "pdfs" / "test-graphical-text.pdf",  # images over the page
        unmapped_glyphs(tmp_path / "unmapped.pdf"),
    ]
    settings = DocumentOptions(pdf_text="prefer")
    engine = SimulatedEngine(SimulatedConfig(seconds_per_page=0.0))
    results = convert(engine, paths, settings, tmp_path)
    for path, result in zip(paths, results, strict=True):
        assert not isinstance(result, BaseException), f"{path.name}: {result!r}"
        assert result.text_layer_pages == [], path.name
        assert all(page.source is PageSource.engine for page in result.pages)


def scanned_blank(path: Path, seed: int = 3) -> Path:
    """A page as a scanner delivers a blank back: paper tone, noise, a few specks of dust."""
    import random

    rng = random.Random(seed)
    image = Image.new("L", (1240, 1754), 232)
    pixels = image.load()
    for _ in range(40000):
        x, y = rng.randrange(1240), rng.randrange(1754)
        pixels[x, y] = max(0, min(255, 232 + rng.randint(-18, 18)))
    draw = ImageDraw.Draw(image)
    for _ in range(4):
        x, y = rng.randrange(100, 1100), rng.randrange(100, 1600)
        draw.ellipse((x, y, x + 2, y + 2), fill=90)
    image.save(path, dpi=(150, 150))
    return path


def test_blank_pages_are_not_sent_to_the_engine_but_nearly_blank_ones_are(
    corpus: Path, tmp_path: Path
) -> None:
    nearly = tmp_path / "nearly-blank.pdf"
    doc = pymupdf.open()
    doc.new_page().insert_text((300, 420), "Notes", fontsize=11)
    doc.new_page().insert_text((290, 800), "7", fontsize=10)  # only a page number
    doc.new_page()  # a truly empty page between them
    doc.save(nearly)
    paths = [
        corpus / "olmocr-bench" / "pdfs" / "blank_book_pg1.pdf",  # bleed-through only
        scanned_blank(tmp_path / "back.png"),
        nearly,
        corpus / "scans" / "multipage-scan.tif",
    ]
    engine = SimulatedEngine(SimulatedConfig(seconds_per_page=0.0))
    marked = DocumentOptions(blank_pages="mark")
    book, back, pages, scans = convert(engine, paths, marked, tmp_path)
    assert book.blank_pages == [1] and back.blank_pages == [1]
    assert pages.blank_pages == [3]  # "Notes" and a lone page number are content
    assert scans.blank_pages == []
    assert markdown_of(book, marked).strip() == BLANK_MARKER
    dropped = DocumentOptions(blank_pages="drop")
    assert len(markdown_of(book, dropped)) <= 10  # olmOCR-Bench's test for this page
    kept = convert(
        SimulatedEngine(SimulatedConfig(seconds_per_page=0.0)),
        paths[:1],
        DocumentOptions(blank_pages="keep"),
        tmp_path / "keep",
    )
    assert kept[0].blank_pages == [] and "Simulated page 1" in markdown_of(kept[0], marked)


def test_figures_are_cut_from_the_source_at_its_resolution(corpus: Path, tmp_path: Path) -> None:
    """A 3520x1980 photo sent to the engine at 2048 px: the figure comes from the photo's
    own pixels. A 300 DPI scan in a PDF: from the embedded image, not a 288 DPI render.
    The layout file records each figure's box and size in the source."""
    photo = tmp_path / "whiteboard.png"
    image = Image.new("RGB", (3520, 1980), "white")
    ImageDraw.Draw(image).rectangle((400, 600, 2100, 1380), outline="black", width=12)
    image.save(photo)
    scan = corpus / "real" / "ocrmypdf__linn.pdf"  # a 2550x3300 page image (300 DPI)
    settings = DocumentOptions(layout_file=True)
    engine = SimulatedEngine(SimulatedConfig(seconds_per_page=0.0))
    photo_result, scan_result = convert(engine, [photo, scan], settings, tmp_path)

    # The simulated engine reports one figure at [100, 300, 600, 700] of 999.
    [figure] = photo_result.pages[0].figures.values()
    assert photo_result.pages[0].image_size == (2048, 1152)
    assert (figure.width, figure.height) == pytest.approx((0.5005 * 3520, 0.4004 * 1980), abs=2)
    with Image.open(figure.path) as image:
        assert image.size == (figure.width, figure.height)
    [figure] = scan_result.pages[0].figures.values()
    assert figure.source_dpi == 300
    assert (figure.width, figure.height) == pytest.approx((0.5005 * 2550, 0.4004 * 3300), abs=2)

    markdown = tmp_path / "out" / "whiteboard.md"
    write_document(photo_result, settings, markdown, photo.name)
    layout = json.loads((tmp_path / "out" / "whiteboard.layout.json").read_text())
    [block] = [b for b in layout["pages"][0]["blocks"] if b["label"] == "image"]
    photo_figure = photo_result.pages[0].figures[2]  # the image block is the third
    assert block["figure_size"] == [photo_figure.width, photo_figure.height]
    x1, y1, x2, y2 = block["figure_source_box"]
    assert (x2 - x1, y2 - y1) == (photo_figure.width, photo_figure.height)


def test_preferring_the_layer_keeps_every_page_and_its_order(tmp_path: Path) -> None:
    """A text-only PDF has a perfect layer: `prefer` takes every page from it, none goes
    to the engine, and the pages keep their order."""
    pdf = tmp_path / "letter.pdf"
    doc = pymupdf.open()
    for number in range(1, 5):
        page = doc.new_page()
        page.insert_text((72, 80), f"Page {number}", fontsize=20)
        body = "This letter was written with a word processor, so its text layer is exact."
        for line in range(6):
            page.insert_text((72, 130 + 20 * line), body, fontsize=10)
    doc.save(pdf)
    engine = SimulatedEngine(SimulatedConfig(seconds_per_page=0.0))
    [result] = convert(engine, [pdf], DocumentOptions(pdf_text="prefer"), tmp_path)
    assert not isinstance(result, DocumentFailed)
    assert result.text_layer_pages == [1, 2, 3, 4]
    text = markdown_of(result, DocumentOptions())
    assert [int(n) for n in re.findall(r"Page (\d)", text)] == [1, 2, 3, 4]
    assert "Simulated page" not in text
