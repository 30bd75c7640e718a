"""Searchable PDFs of real files: the original pages untouched, the recognised text invisible
over them where the page shows it, found by poppler's pdftotext in reading order.

Line-level text comes from the real RapidOCR engine through the real pipeline; block-level
text is DeepSeek-OCR-2-style grounding output made by hand from born-digital pages (the real
model cannot run here), laid over those pages rasterised as scans.
"""

from __future__ import annotations

import asyncio
import html
import io
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pikepdf
import pymupdf
import pytest
from helpers import pdf_problems, with_broken_xref, without_trailer
from PIL import Image
from separator_sheets import Sheet, stack_pdf

from ocrd.config import DocumentOptions, PipelineConfig, PromptMode, RapidOcrConfig
from ocrd.documents.pipeline import DocumentContext, Pipeline
from ocrd.documents.sources import SourceKind, Sources, page_files, page_order
from ocrd.domain import (
    InputFormat,
    PageInfo,
    PageResult,
    PageSource,
    PageText,
)
from ocrd.engines.rapidocr import RapidOcrEngine
from ocrd.output.page import assemble_page
from ocrd.output.searchable import (
    PdfSettings,
    SearchablePdfError,
    SearchablePdfResult,
    image_pdf,
    write_searchable_pdf,
)
from ocrd.text.grounding import SCALE
from ocrd.text.markdown import page_markdown
from ocrd.text.plain import block_lines

PASSWORD = "ELXRTQWS"  # corpus/hostile/pdf-js__issue3371.pdf (corpus README)
MIN_RECALL = 0.98
MIN_IN_BOX = 0.95
BOX_TOLERANCE_PT = 1.0
RENDER_DPI = 150

Region = tuple[float, float, float, float]


# --- what a reader of the PDF sees ----------------------------------------------------------


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def markdown_words(page: PageResult) -> list[str]:
    """The words of a page's Markdown as a person reads them: not its HTML tags or the
    names of its LaTeX commands."""
    markdown = page_markdown(page.blocks, "markdown")
    return words(re.sub(r"\\[A-Za-z]+|</?[A-Za-z][^<>]*>", " ", markdown))


def pdftotext(pdf: Path, number: int, *options: str) -> str:
    if shutil.which("pdftotext") is None:
        pytest.fail("pdftotext is missing: run scripts/install_test_packages.sh (poppler-utils)")
    command = ["pdftotext", "-cropbox", "-f", str(number), "-l", str(number), *options]
    command += ["-upw", PASSWORD, str(pdf), "-"]  # the password is ignored where none is needed
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout


def pdf_words(pdf: Path, number: int, *options: str) -> list[str]:
    """pdftotext's words; a word hyphenated at the end of a line joined again, as the
    Markdown joins it (poppler's reading order does that itself, -raw does not)."""
    return words(re.sub(r"-\n(?=[a-z])", "", pdftotext(pdf, number, *options)))


def bbox_words(pdf: Path, number: int) -> list[tuple[str, Region]]:
    """pdftotext's words (unescaped from its XHTML) with their boxes, in points of the page
    as shown."""
    found = re.findall(
        r'<word xMin="([-\d.]+)" yMin="([-\d.]+)" xMax="([-\d.]+)" yMax="([-\d.]+)">(.*?)</word>',
        pdftotext(pdf, number, "-bbox"),
    )
    return [
        (html.unescape(text), (float(a), float(b), float(c), float(d)))
        for a, b, c, d, text in found
    ]


def in_order_recall(expected: Sequence[str], found: Sequence[str]) -> float:
    """The share of `expected` that `found` holds in the same order (longest common
    subsequence)."""
    if not expected:
        return 1.0
    previous = [0] * (len(found) + 1)
    for word in expected:
        current = [0]
        for j, other in enumerate(found):
            current.append(previous[j] + 1 if word == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1] / len(expected)


def engine_boxes(page: PageResult) -> list[tuple[set[str], Region]]:
    """The engine's own boxes (RapidOCR's lines, or the model's blocks) with their words,
    as fractions of the page."""
    blocks = page.text.blocks if page.text.blocks is not None else page.blocks
    return [
        (set(words(" ".join(block_lines(block)))), box.scaled(1.0, 1.0))
        for block in blocks
        for box in block.boxes
    ]


def counted_in_boxes(
    pdf: Path, number: int, page: PageResult, shown: tuple[float, float]
) -> tuple[int, int]:
    """(words inside a box of the engine that holds them, words) on one page."""
    boxes = engine_boxes(page)
    width, height = shown
    inside = total = 0
    for text, (x0, y0, x1, y1) in bbox_words(pdf, number):
        tokens = set(words(text))
        if not tokens:
            continue  # punctuation alone
        total += 1
        inside += any(
            tokens <= known
            and x0 >= left * width - BOX_TOLERANCE_PT
            and x1 <= right * width + BOX_TOLERANCE_PT
            and y0 >= top * height - BOX_TOLERANCE_PT
            and y1 <= bottom * height + BOX_TOLERANCE_PT
            for known, (left, top, right, bottom) in boxes
        )
    return inside, total


def render(pdf: Path | pymupdf.Document, number: int) -> bytes:
    doc = pdf if isinstance(pdf, pymupdf.Document) else pymupdf.open(pdf)
    if doc.needs_pass:
        doc.authenticate(PASSWORD)
    return doc[number - 1].get_pixmap(dpi=RENDER_DPI, alpha=False).samples


def shown_size(pdf: Path, number: int) -> tuple[float, float]:
    doc = pymupdf.open(pdf)
    doc.authenticate(PASSWORD)
    rect = doc[number - 1].rect
    return rect.width, rect.height


def image_streams(doc: pymupdf.Document, number: int) -> list[bytes]:
    """The raw (still encoded) data of the images a page shows."""
    return sorted(doc.xref_stream_raw(xref) for xref, *_ in doc[number - 1].get_images(full=True))


def opened(path: Path) -> pymupdf.Document:
    doc = pymupdf.open(path)
    doc.authenticate(PASSWORD)
    return doc


# --- the documents --------------------------------------------------------------------------


@dataclass
class Converted:
    files: list[tuple[Path, InputFormat]]
    order: list[tuple[int, int]]
    pages: list[PageResult]
    pdf: Path
    result: SearchablePdfResult

    def source_page(self, number: int) -> tuple[Path, InputFormat, int]:
        file_index, in_file = self.order[number - 1]
        return (*self.files[file_index], in_file)


def page_counts(files: Sequence[tuple[Path, InputFormat]]) -> list[int]:
    counts = []
    for path, fmt in files:
        if fmt is InputFormat.pdf:
            counts.append(opened(path).page_count)
        else:
            with Image.open(path) as image:
                counts.append(getattr(image, "n_frames", 1))
    return counts


def write_pdf(sources: Sources, pages: list[PageResult], target: Path, **options: Any) -> Converted:
    files, _ = page_files(sources)
    order = page_order(page_counts(files), sources.kind is SourceKind.duplex)
    result = write_searchable_pdf(
        files, order, pages, target, PdfSettings(passwords=[PASSWORD], **options)
    )
    return Converted(files, order, pages, target, result)


def pdf_of_pages(target: Path, pages: Sequence[tuple[Path, int]]) -> Path:
    """A PDF made of pages of corpus PDFs, copied as they are."""
    out = pymupdf.open()
    for path, number in pages:
        out.insert_pdf(pymupdf.open(path), from_page=number - 1, to_page=number - 1)
    out.save(target)
    return target


def cropped_and_turned(corpus: Path, target: Path) -> Path:
    """The French scan as a page stored on its side: its content turned a quarter clockwise,
    /Rotate 270 turning it upright again for the reader, its MediaBox moved off the origin
    and a CropBox inside it offset on both axes: where a layer in the wrong coordinates
    shows."""
    doc = pymupdf.open(corpus / "real" / "ocrmypdf__francais.pdf")
    page = doc[0]
    turn, back = doc.get_new_xref(), doc.get_new_xref()
    for xref, data in ((turn, b"q 0 -1 1 0 0 216 cm\n"), (back, b"\nQ\n")):
        doc.update_object(xref, "<<>>")
        doc.update_stream(xref, data)
    streams = [turn, *page.get_contents(), back]
    doc.xref_set_key(page.xref, "Contents", "[" + " ".join(f"{x} 0 R" for x in streams) + "]")
    doc.xref_set_key(page.xref, "MediaBox", "[-50 -40 266 256]")
    doc.xref_set_key(page.xref, "CropBox", "[-30 -20 230 226]")
    doc.xref_set_key(page.xref, "Rotate", "270")
    doc.save(target)
    return target


def job_folder(corpus: Path, folder: Path) -> Path:
    """A scan job: a TIFF, a JPEG, a blank sheet and a PDF, in natural order."""
    folder.mkdir()
    shutil.copyfile(corpus / "scans" / "phototest.tif", folder / "p1.tif")
    with Image.open(corpus / "scans" / "eurotext.tif") as image:
        image.convert("L").save(folder / "p2.jpg", quality=90, dpi=(300, 300))
    Image.new("L", (1240, 1754), 255).save(folder / "p3.png", dpi=(150, 150))
    shutil.copyfile(corpus / "real" / "ocrmypdf__francais.pdf", folder / "p10.pdf")
    return folder


RASTER_DPI = 150


def rasterised(pdf: Path, number: int, target: Path) -> Path:
    """A born-digital page as a scan would give it: a PNG at 150 DPI."""
    pixmap = pymupdf.open(pdf)[number - 1].get_pixmap(dpi=RASTER_DPI, alpha=False)
    Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples).save(
        target, dpi=(RASTER_DPI, RASTER_DPI)
    )
    return target


def grounding_of(page: pymupdf.Page) -> str:
    """DeepSeek-OCR-2-style output for a born-digital page: its paragraphs as `text` blocks
    (the first a title) with their boxes in 0..999, each paragraph's lines joined as the
    model writes them (hyphenation undone)."""
    rect = page.rect
    parts = []
    for index, (x0, y0, x1, y1, text, _, kind) in enumerate(page.get_text("blocks")):
        if kind != 0:
            continue
        numbers = (x0 / rect.width, y0 / rect.height, x1 / rect.width, y1 / rect.height)
        box = "[[" + ", ".join(str(round(v * SCALE)) for v in numbers) + "]]"
        paragraph = re.sub(r"-\n(?=[a-z])", "", text.strip()).replace("\n", " ")
        label = "title" if index == 0 else "text"
        parts.append(f"<|ref|>{label}<|/ref|><|det|>{box}<|/det|>\n{paragraph}")
    return "\n\n".join(parts)


# The model's answer for page 3 of sample-files__multicolumn.pdf, written by hand: a table
# (boxes measured on the page), its caption and the page number.
TABLE_PAGE = """<|ref|>table_caption<|/ref|><|det|>[[183, 160, 441, 171]]<|/det|>
Table 1: EU Countries Information

<|ref|>table<|/ref|><|det|>[[131, 173, 861, 262]]<|/det|>
<table><tr><td>Country</td><td>Population (millions)</td><td>Area (km2)</td><td>Capital</td>\
<td>Official Language</td></tr><tr><td>Austria</td><td>8.9</td><td>83,879</td><td>Vienna</td>\
<td>German</td></tr><tr><td>Belgium</td><td>11.5</td><td>30,689</td><td>Brussels</td>\
<td>Dutch, French, German</td></tr><tr><td>Czech Republic</td><td>10.7</td><td>78,866</td>\
<td>Prague</td><td>Czech</td></tr><tr><td>Denmark</td><td>5.8</td><td>42,951</td>\
<td>Copenhagen</td><td>Danish</td></tr><tr><td>Finland</td><td>5.5</td><td>338,424</td>\
<td>Helsinki</td><td>Finnish, Swedish</td></tr></table>

<|ref|>text<|/ref|><|det|>[[508, 826, 517, 837]]<|/det|>
3
"""


def grounded_pages(images: Sequence[Path], answers: Sequence[str]) -> list[PageResult]:
    """Pages as the daemon assembles them from the model's answers (sizes as render.py
    gives them for images)."""
    pages = []
    for number, (image_path, answer) in enumerate(zip(images, answers, strict=True), start=1):
        with Image.open(image_path) as image:
            dpi = float(image.info.get("dpi", (72, 72))[0])
            info = PageInfo(number, image.size, image.width * 72 / dpi, image.height * 72 / dpi)
        pages.append(assemble_page(info, PageText(answer, "stop"), PromptMode.layout))
    return pages


Jobs = dict[str, tuple[Sources, DocumentOptions]]


async def _recognise(jobs: Jobs) -> dict[str, list[PageResult]]:
    engine = RapidOcrEngine(RapidOcrConfig())
    await engine.start()
    pipeline = Pipeline.create(engine, PipelineConfig(), 2048)
    try:

        async def one(sources: Sources, settings: DocumentOptions) -> list[PageResult]:
            with tempfile.TemporaryDirectory() as scratch:
                return (
                    await pipeline.convert(DocumentContext.of(sources, settings, Path(scratch)))
                ).pages

        results = await asyncio.gather(*(one(*job) for job in jobs.values()))
        return dict(zip(jobs, results, strict=True))
    finally:
        pipeline.renderers.shutdown()
        await engine.stop()


@pytest.fixture(scope="module")
def recognised(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Converted]:
    """Every document through the real pipeline with the real RapidOCR engine, then into
    its searchable PDF."""
    folder = tmp_path_factory.mktemp("inputs")
    real = corpus / "real"
    settings = DocumentOptions(pdf_text="prefer", passwords=(PASSWORD,))
    sources = {
        "multipage-scan.tif": Sources((corpus / "scans" / "multipage-scan.tif",)),
        "rotated_skew.pdf": Sources((real / "ocrmypdf__rotated_skew.pdf",)),
        # born-digital text, a scanned page, born-digital text
        "mixed.pdf": Sources(
            (
                pdf_of_pages(
                    folder / "mixed.pdf",
                    [
                        (real / "sample-files__pdflatex-4-pages.pdf", 1),
                        (real / "ocrmypdf__francais.pdf", 1),
                        (real / "sample-files__pdflatex-4-pages.pdf", 2),
                    ],
                ),
            )
        ),
        "cropped_rotated.pdf": Sources((cropped_and_turned(corpus, folder / "crop.pdf"),)),
        "job folder": Sources.of(job_folder(corpus, folder / "scan-0007")),
        "duplex": Sources(
            (
                real / "ocrmypdf__3small.pdf",
                pdf_of_pages(
                    folder / "backs.pdf",
                    [
                        (real / "ocrmypdf__francais.pdf", 1),
                        (real / "ocrmypdf__c02-22.pdf", 1),
                        (real / "ocrmypdf__aspect.pdf", 1),
                    ],
                ),
            ),
            SourceKind.duplex,
        ),
        "encrypted.pdf": Sources((corpus / "hostile" / "pdf-js__issue3371.pdf",)),
    }
    pages = asyncio.run(_recognise({name: (s, settings) for name, s in sources.items()}))
    out = tmp_path_factory.mktemp("searchable")
    return {
        name: write_pdf(s, pages[name], out / f"{index}.pdf")
        for index, (name, s) in enumerate(sources.items())
    }


@pytest.fixture(scope="module")
def grounded(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Converted:
    """A two-page job folder of rasterised born-digital pages (two columns; a table) with
    DeepSeek-style block answers."""
    multicolumn = corpus / "real" / "sample-files__multicolumn.pdf"
    folder = tmp_path_factory.mktemp("grounded") / "scan-0008"
    folder.mkdir()
    images = [rasterised(multicolumn, n, folder / f"p{i}.png") for i, n in ((1, 1), (2, 3))]
    doc = pymupdf.open(multicolumn)
    pages = grounded_pages(images, [grounding_of(doc[0]), TABLE_PAGE])
    return write_pdf(Sources.of(folder), pages, folder.parent / "grounded.pdf")


ALL = [
    "multipage-scan.tif",
    "rotated_skew.pdf",
    "mixed.pdf",
    "cropped_rotated.pdf",
    "job folder",
    "duplex",
    "encrypted.pdf",
]
PDF_INPUTS = ["rotated_skew.pdf", "mixed.pdf", "cropped_rotated.pdf", "encrypted.pdf"]


# --- the tests ------------------------------------------------------------------------------


def assert_found_in_order_and_in_place(doc: Converted) -> None:
    """Over the pages with a layer: pdftotext finds the Markdown's words (`-raw`: in the
    layer's order, which a selection copies; by default in poppler's own reading order,
    which on pages of several columns is poppler's guess, so there only as words), and
    pdftotext -bbox puts them inside the engine's box (line or block) that holds them."""
    words_total = in_order = found = inside = placed = 0
    for number in doc.result.layered_pages:
        page = doc.pages[number - 1]
        expected = markdown_words(page)
        raw = pdf_words(doc.pdf, number, "-raw")
        recall = in_order_recall(expected, raw)
        assert recall >= 0.9, (
            f"page {number}: {recall:.3f} of the Markdown's words in order\n"
            f"Markdown: {' '.join(expected)}\npdftotext -raw: {' '.join(raw)}"
        )
        poppler = set(pdf_words(doc.pdf, number))
        words_total += len(expected)
        in_order += round(recall * len(expected))
        found += sum(1 for word in expected if word in poppler)
        counted = counted_in_boxes(doc.pdf, number, page, shown_size(doc.pdf, number))
        inside, placed = inside + counted[0], placed + counted[1]
    assert words_total > 0 and placed > 0
    assert in_order / words_total >= MIN_RECALL, f"{in_order} of {words_total} words in order"
    assert found / words_total >= MIN_RECALL, f"poppler finds {found} of {words_total} words"
    assert inside / placed >= MIN_IN_BOX, f"{inside} of {placed} words inside their boxes"


@pytest.mark.parametrize("name", ALL)
def test_the_recognised_words_are_found_in_reading_order_inside_their_lines(
    recognised: dict[str, Converted], name: str
) -> None:
    doc = recognised[name]
    expected_layers = [n for n, page in enumerate(doc.pages, 1) if page.source is PageSource.engine]
    assert doc.result.layered_pages == expected_layers
    assert_found_in_order_and_in_place(doc)


def test_block_level_text_is_found_in_reading_order_inside_its_blocks(
    grounded: Converted, corpus: Path
) -> None:
    assert grounded.result.layered_pages == [1, 2]
    assert_found_in_order_and_in_place(grounded)
    # In poppler's reading order: the table page fully; the two-column page as well as
    # poppler reads the born-digital original it was made from.
    table_page = grounded.pages[1]
    assert in_order_recall(markdown_words(table_page), pdf_words(grounded.pdf, 2)) >= MIN_RECALL
    original = corpus / "real" / "sample-files__multicolumn.pdf"
    expected = markdown_words(grounded.pages[0])
    ours = in_order_recall(expected, pdf_words(grounded.pdf, 1))
    theirs = in_order_recall(expected, pdf_words(original, 1))
    assert ours >= theirs - 0.05, f"{ours:.3f} against {theirs:.3f} for the born-digital page"
    # A row of the table is a line of the layer.
    table = pdftotext(grounded.pdf, 2)
    assert re.search(r"Austria\s+8\.9\s+83,879\s+Vienna\s+German", table), table
    # The layer is invisible: each page looks as its image alone.
    for number, (image, _) in enumerate(grounded.files, start=1):
        assert render(grounded.pdf, number) == render(pymupdf.open("pdf", image_pdf(image)), 1)


@pytest.mark.parametrize("name", PDF_INPUTS)
def test_a_pdf_keeps_its_bytes_images_and_looks_and_only_gains_its_text(
    recognised: dict[str, Converted], name: str
) -> None:
    doc = recognised[name]
    [(original, _)] = doc.files
    data = original.read_bytes()
    output = doc.pdf.read_bytes()
    assert doc.result.incremental
    assert output[: len(data)] == data  # the original, byte for byte, then the update
    added = len(output) - len(data)
    assert 0 < added < 8000 + 2500 * len(doc.result.layered_pages)
    before, after = opened(original), opened(doc.pdf)
    assert after.metadata == before.metadata
    assert after.needs_pass == before.needs_pass
    for number in range(1, before.page_count + 1):
        assert image_streams(after, number) == image_streams(before, number)
        assert [a.info for a in after[number - 1].annots()] == [
            a.info for a in before[number - 1].annots()
        ]
        assert render(after, number) == render(before, number), f"page {number} looks different"


def test_a_born_digital_pdf_with_one_scanned_page_gets_a_layer_on_that_page_only(
    recognised: dict[str, Converted],
) -> None:
    doc = recognised["mixed.pdf"]
    assert [page.source for page in doc.pages] == [
        PageSource.text_layer,
        PageSource.engine,
        PageSource.text_layer,
    ]
    assert doc.result.layered_pages == [2]
    [(original, _)] = doc.files
    for number in (1, 3):  # their own text, once: never a second layer
        assert pdftotext(doc.pdf, number) == pdftotext(original, number)
    assert pdftotext(original, 2).strip() == ""
    assert len(pdf_words(doc.pdf, 2)) > 30


def test_a_multipage_tiff_becomes_a_page_per_frame_each_the_original_image(
    recognised: dict[str, Converted], corpus: Path
) -> None:
    doc = recognised["multipage-scan.tif"]
    out = opened(doc.pdf)
    assert out.page_count == 3 and not doc.result.incremental
    reference = pymupdf.open("pdf", image_pdf(corpus / "scans" / "multipage-scan.tif"))
    with Image.open(corpus / "scans" / "multipage-scan.tif") as tiff:
        for number in range(1, 4):
            tiff.seek(number - 1)
            page = out[number - 1]
            dpi = tiff.info["dpi"]
            assert page.rect.width == pytest.approx(tiff.width * 72 / dpi[0], abs=0.01)
            assert page.rect.height == pytest.approx(tiff.height * 72 / dpi[1], abs=0.01)
            [(xref, *_)] = page.get_images(full=True)
            pixmap = pymupdf.Pixmap(out, xref)
            assert (pixmap.width, pixmap.height) == tiff.size
            assert pixmap.samples == tiff.convert("L").tobytes()  # lossless
            assert render(out, number) == render(reference, number)  # the layer is invisible


def test_a_job_folder_becomes_one_pdf_in_natural_order_with_a_jpeg_kept_as_it_is(
    recognised: dict[str, Converted],
) -> None:
    doc = recognised["job folder"]
    out = opened(doc.pdf)
    names = [path.name for path, _ in doc.files]
    assert names == ["p1.tif", "p2.jpg", "p3.png", "p10.pdf"]
    assert out.page_count == 4
    # The JPEG's bytes are the page's image stream, as they are.
    jpeg = doc.files[1][0].read_bytes()
    assert image_streams(out, 2) == [jpeg]
    # A 150 DPI blank sheet: an A4 page, and no layer (it was not recognised).
    assert doc.pages[2].source is PageSource.blank
    assert out[2].rect.width == pytest.approx(1240 * 72 / 150, abs=0.1)
    assert 3 not in doc.result.layered_pages and pdftotext(doc.pdf, 3).strip() == ""
    # The PDF's page: its image stream copied as it is, and it looks the same.
    francais = opened(doc.files[3][0])
    assert image_streams(out, 4) == image_streams(francais, 1)
    assert render(out, 4) == render(francais, 1)


def test_a_duplex_pair_becomes_fronts_and_backs_interleaved_each_page_as_it_was(
    recognised: dict[str, Converted],
) -> None:
    doc = recognised["duplex"]
    out = opened(doc.pdf)
    # front 1, back 3 (the backs were scanned last page first), front 2, back 2, ...
    assert doc.order == [(0, 1), (1, 3), (0, 2), (1, 2), (0, 3), (1, 1)]
    for number in range(1, out.page_count + 1):
        path, _, in_file = doc.source_page(number)
        source = opened(path)
        assert image_streams(out, number) == image_streams(source, in_file)
        assert render(out, number) == render(source, in_file), f"page {number}"


def test_an_encrypted_pdf_stays_encrypted_and_its_password_opens_the_text(
    recognised: dict[str, Converted],
) -> None:
    doc = recognised["encrypted.pdf"]
    assert pymupdf.open(doc.pdf).needs_pass
    assert "simple" in pdf_words(doc.pdf, 1)


def test_a_pdf_that_already_has_a_text_layer_gets_no_second_one(
    recognised: dict[str, Converted], tmp_path: Path
) -> None:
    # The searchable PDF given as input again (as a scanner's own OCR would be): its pages
    # have text of their own, so nothing is added, and the output is the input, unchanged.
    doc = recognised["rotated_skew.pdf"]
    again = write_searchable_pdf(
        [(doc.pdf, InputFormat.pdf)], doc.order, doc.pages, tmp_path / "again.pdf"
    )
    assert again.layered_pages == [] and again.own_text_pages == [1]
    assert (tmp_path / "again.pdf").read_bytes() == doc.pdf.read_bytes()


def test_a_damaged_pdf_that_needs_repair_is_saved_whole_with_its_layer(
    corpus: Path, tmp_path: Path
) -> None:
    source = corpus / "hostile" / "qpdf__bad-xref.pdf"  # its cross-reference table is broken
    assert pymupdf.open(source).is_repaired
    [page] = grounded_pages(
        [corpus / "scans" / "phototest.tif"],
        ["<|ref|>text<|/ref|><|det|>[[100, 500, 900, 540]]<|/det|>\nrecognised words here"],
    )
    target = tmp_path / "out.pdf"
    result = write_searchable_pdf([(source, InputFormat.pdf)], [(0, 1)], [page], target)
    assert result.layered_pages == [1] and not result.incremental
    assert "recognised words here" in pdftotext(target, 1)
    assert render(target, 1) == render(source, 1)


def one_line_pages(pdf: Path, password: str = "") -> list[PageResult]:
    """A page result for each page of `pdf` whose engine read one line, 'words on page N'
    (where the page shows it does not matter here)."""
    doc = pymupdf.open(pdf)
    doc.authenticate(password)
    answers = [
        f"<|ref|>text<|/ref|><|det|>[[100, 100, 900, 140]]<|/det|>\nwords on page {n}"
        for n in range(1, doc.page_count + 1)
    ]
    return [
        assemble_page(
            PageInfo(n, (600, 800), page.rect.width, page.rect.height),
            PageText(answer, "stop"),
            PromptMode.layout,
        )
        for n, (page, answer) in enumerate(zip(doc, answers, strict=True), start=1)
    ]


OWNER_PASSWORD = "owner-secret"


@pytest.mark.parametrize("protection", ["plain", "owner password"])
@pytest.mark.parametrize("archive", [False, True], ids=["pdf", "pdf_archive"])
def test_each_part_of_a_split_pdf_is_made_of_its_own_pages(
    tmp_path: Path, protection: str, archive: bool
) -> None:
    """A batch of five pages cut at a PATCH-T sheet (page 3): each part's PDF holds that
    part's pages, looking as they did, with that part's text; an owner password (which
    readers open without) does not stand in the way."""
    batch = stack_pdf(
        [
            Sheet("scan", "phototest.tif"),
            Sheet("pdf", "ocrmypdf__linn.pdf"),
            Sheet("patch_t"),
            Sheet("scan", "eurotext.tif"),
            Sheet("scan", "8087_054.3B.tif"),
        ],
        tmp_path / "batch.pdf",
    )
    if protection == "owner password":
        with pymupdf.open(tmp_path / "batch.pdf") as doc:
            doc.save(
                tmp_path / "owner.pdf",
                encryption=pymupdf.PDF_ENCRYPT_AES_256,
                owner_pw=OWNER_PASSWORD,
                user_pw="",
                permissions=pymupdf.PDF_PERM_PRINT,
            )
        batch = tmp_path / "owner.pdf"
    pages = one_line_pages(batch)
    for index, part in enumerate(([1, 2], [4, 5]), start=1):
        target = tmp_path / f"batch-{index}.pdf"
        result = write_searchable_pdf(
            [(batch, InputFormat.pdf)],
            [(0, n) for n in part],
            [pages[n - 1] for n in part],
            target,
            PdfSettings(archive=archive),
        )
        assert result.pages == 2 and result.layered_pages == [1, 2] and not result.incremental
        assert pdf_problems(target) == []
        out = pymupdf.open(target)
        assert out.page_count == 2
        for number, original in enumerate(part, start=1):
            assert pdf_words(target, number) == ["words", "on", "page", str(original)]
            assert render(out, number) == render(opened(batch), original)
        if archive:
            assert_pdfa_2b(target)


def damaged_originals(corpus: Path, folder: Path) -> dict[str, Path]:
    """Real PDFs damaged as transfers and careless tools leave them, and damaged files of
    the corpus that still open."""
    real, hostile = corpus / "real", corpus / "hostile"
    return {
        "no trailer": without_trailer(real / "ocrmypdf__cardinal.pdf", folder / "a.pdf"),
        "broken xref": with_broken_xref(
            real / "sample-files__google-doc-document.pdf", folder / "b.pdf"
        ),
        **{
            name: hostile / f"{name}.pdf"
            for name in (
                "qpdf__bad-xref-entry",
                "qpdf__bad12",
                "qpdf__bad-data",
                "qpdf__bad2",
                "pdf-js__helloworld-bad",
                "pdf-js__multiple-filters-length-zero",
                "pdf-js__PDFBOX-3148-2-fuzzed",
                "qpdf__damaged-stream",
            )
        },
    }


# Its image's stream has a wrong length: MuPDF reading the original stops short of the
# image's end (a grey band), the rewrite holds the whole stream and shows all of it.
SHOWS_MORE_REWRITTEN = {"pdf-js__multiple-filters-length-zero"}
# Sound but for an image's data, which is what the page shows: kept as it is.
IMAGE_DATA_DAMAGED = {"qpdf__damaged-stream"}


@pytest.mark.parametrize("layer", [True, False], ids=["with a layer", "no page layered"])
def test_a_damaged_pdf_is_rewritten_and_opens_cleanly_in_every_reader(
    corpus: Path, tmp_path: Path, layer: bool
) -> None:
    """Whether or not a page gets a layer, a damaged original is never copied as it is: what
    comes out passes `qpdf --check` (damage inside an image's data, which the page shows
    as it is, aside) and opens in pikepdf without repair, and its pages look as MuPDF
    shows the original's."""
    for name, source in damaged_originals(corpus, tmp_path).items():
        pages = one_line_pages(source)
        if not layer:  # pages read from their own text layer: nothing to add
            pages = [replace(page, source=PageSource.text_layer) for page in pages]
        target = tmp_path / f"{name}.pdf"
        order = [(0, n) for n in range(1, len(pages) + 1)]
        result = write_searchable_pdf([(source, InputFormat.pdf)], order, pages, target)
        assert pdf_problems(target) == [], name
        if name in IMAGE_DATA_DAMAGED:  # the page as it is: updated like a sound file
            assert result.incremental, name
        else:
            assert not result.incremental and target.read_bytes() != source.read_bytes(), name
        for number in range(1, len(pages) + 1):
            if name in SHOWS_MORE_REWRITTEN:
                continue
            assert render(target, number) == render(source, number), f"{name}, page {number}"
        if layer:  # every page that has no text of its own
            every = sorted(result.layered_pages + result.own_text_pages)
            assert every == list(range(1, len(pages) + 1)), name
            for number in result.layered_pages:
                words = " ".join(pdf_words(target, number))
                assert f"words on page {number}" in words, (name, words)


@pytest.mark.parametrize("user_password", ["", PASSWORD], ids=["owner password", "user password"])
def test_a_damaged_encrypted_pdf_is_rewritten_and_stays_encrypted(
    corpus: Path, tmp_path: Path, user_password: str
) -> None:
    """A rewrite keeps the original's protection: the same password opens it, with the same
    permissions."""
    with pymupdf.open(corpus / "real" / "ocrmypdf__cardinal.pdf") as doc:
        doc.save(
            tmp_path / "sound.pdf",
            encryption=pymupdf.PDF_ENCRYPT_AES_256,
            owner_pw=OWNER_PASSWORD,
            user_pw=user_password,
            permissions=pymupdf.PDF_PERM_PRINT | pymupdf.PDF_PERM_COPY,
        )
    source = with_broken_xref(tmp_path / "sound.pdf", tmp_path / "damaged.pdf")
    pages = one_line_pages(source, user_password)
    target = tmp_path / "out.pdf"
    order = [(0, n) for n in range(1, len(pages) + 1)]
    result = write_searchable_pdf(
        [(source, InputFormat.pdf)], order, pages, target, PdfSettings(passwords=[PASSWORD])
    )
    assert not result.incremental and pdf_problems(target, user_password) == []
    before, after = pymupdf.open(tmp_path / "sound.pdf"), pymupdf.open(target)
    assert after.needs_pass == bool(user_password)
    assert after.authenticate(user_password) and before.authenticate(user_password)
    assert after.metadata["encryption"] and after.permissions == before.permissions
    assert "words on page 2" in after[1].get_text()


@pytest.mark.parametrize("rotation", [0, 90, 180, 270])
@pytest.mark.parametrize(
    ("media", "crop"),
    [("[0 0 612 792]", None), ("[-50 -30 562 762]", "[20 40 500 700]")],
    ids=["plain", "offset boxes"],
)
def test_text_lands_where_the_page_shows_it_for_any_rotation_and_crop_box(
    tmp_path: Path, rotation: int, media: str, crop: str | None
) -> None:
    doc = pymupdf.open()
    page = doc.new_page()
    doc.xref_set_key(page.xref, "MediaBox", media)
    if crop:
        doc.xref_set_key(page.xref, "CropBox", crop)
    doc.xref_set_key(page.xref, "Rotate", str(rotation))
    doc.save(tmp_path / "in.pdf")
    width, height = shown_size(tmp_path / "in.pdf", 1)
    box = (100, 200, 700, 240)  # of 999, on the page as shown
    answer = f"<|ref|>text<|/ref|><|det|>[[{', '.join(map(str, box))}]]<|/det|>\nfound here"
    page_result = assemble_page(
        PageInfo(1, (round(width), round(height)), width, height),
        PageText(answer, "stop"),
        PromptMode.layout,
    )
    target = tmp_path / "out.pdf"
    write_searchable_pdf([(tmp_path / "in.pdf", InputFormat.pdf)], [(0, 1)], [page_result], target)
    [(first, (x0, y0, _, y1)), (second, (_, _, x1, _))] = bbox_words(target, 1)
    assert (first, second) == ("found", "here")
    expected = (
        box[0] / 999 * width,
        box[1] / 999 * height,
        box[2] / 999 * width,
        box[3] / 999 * height,
    )
    assert (x0, y0, x1, y1) == pytest.approx(expected, abs=0.5)


def test_characters_of_any_script_copy_back_exactly(tmp_path: Path, corpus: Path) -> None:
    text = "Grüße ÆØÅ ﬁ — “quotes” Ελληνικά русский עברית العربية 中文文本 한국어 😀 𝔸 e\u0301"
    page = grounded_pages(
        [corpus / "scans" / "phototest.tif"],
        [f"<|ref|>text<|/ref|><|det|>[[50, 100, 950, 140]]<|/det|>\n{text}"],
    )
    source = corpus / "scans" / "phototest.tif"
    write_searchable_pdf([(source, InputFormat.tiff)], [(0, 1)], page, tmp_path / "any.pdf")
    copied = " ".join(pdftotext(tmp_path / "any.pdf", 1, "-raw").split())
    for word in text.split():
        if not re.search(r"[\u0590-\u06ff]", word):  # pdftotext reorders right-to-left runs
            assert word in copied, f"{word!r} not in {copied!r}"


def test_a_page_count_that_does_not_match_is_refused_and_leaves_no_file(
    tmp_path: Path, corpus: Path
) -> None:
    source = corpus / "real" / "ocrmypdf__francais.pdf"
    target = tmp_path / "out.pdf"
    page = grounded_pages([corpus / "scans" / "phototest.tif"], ["x"])
    with pytest.raises(SearchablePdfError, match="2 pages in the document, but 1 recognised"):
        write_searchable_pdf([(source, InputFormat.pdf)], [(0, 1), (0, 2)], page, target)
    with pytest.raises(SearchablePdfError, match="has no page 2"):
        write_searchable_pdf([(source, InputFormat.pdf)], [(0, 2)], page, target)
    assert not target.exists()


# --- PDF/A ----------------------------------------------------------------------------------


def assert_pdfa_2b(path: Path) -> None:
    """What PDF/A-2b asks, checked by pikepdf's validator (the veraPDF rules; it refuses
    what it cannot check) and by hand for the main structures."""
    import pikepdf.pdfa

    report = pikepdf.pdfa.validate_written(path, "2b")
    assert report.passed, report.summary()
    with pikepdf.open(path) as pdf:
        assert not pdf.is_encrypted
        with pdf.open_metadata() as xmp:
            assert xmp["pdfaid:part"] == "2" and xmp["pdfaid:conformance"] == "B"
        [intent] = pdf.Root.OutputIntents
        assert intent.S == "/GTS_PDFA1"
        assert len(intent.DestOutputProfile.read_bytes()) > 0
        for page in pdf.pages:
            for font in page.Resources.get("/Font", {}).values():
                for descendant in font.get("/DescendantFonts", [font]):
                    descriptor = descendant.get("/FontDescriptor")
                    if descriptor is not None:
                        assert any(
                            k in descriptor for k in ("/FontFile", "/FontFile2", "/FontFile3")
                        )


def archived(doc: Converted, target: Path) -> Converted:
    return write_pdf(Sources(tuple(path for path, _ in doc.files)), doc.pages, target, archive=True)


def difference(first: bytes, second: bytes) -> float:
    """Mean difference of two renderings of the same size, in levels of 255."""
    assert len(first) == len(second)
    return sum(abs(a - b) for a, b in zip(first, second, strict=True)) / len(first)


@pytest.mark.parametrize("name", ["multipage-scan.tif", "rotated_skew.pdf", "job folder"])
def test_an_archival_pdf_is_pdfa_2b_and_keeps_its_text_images_and_looks(
    recognised: dict[str, Converted], name: str, tmp_path: Path
) -> None:
    doc = recognised[name]
    archive = archived(doc, tmp_path / "archive.pdf")
    assert archive.result.archive == "pikepdf"  # structure and metadata only
    assert archive.result.layered_pages == doc.result.layered_pages
    assert_pdfa_2b(archive.pdf)
    assert_found_in_order_and_in_place(archive)
    plain, pdfa = opened(doc.pdf), opened(archive.pdf)
    for number in range(1, plain.page_count + 1):
        assert image_streams(pdfa, number) == image_streams(plain, number)
        assert render(pdfa, number) == render(plain, number)


def test_an_archival_pdf_that_pikepdf_refuses_is_made_again_by_ghostscript_with_its_layer(
    recognised: dict[str, Converted], tmp_path: Path
) -> None:
    # An encrypted scan with JPEG 2000 images, which pikepdf's validator cannot check:
    # Ghostscript decrypts it and stores the images as Flate; the layer is laid over that.
    doc = recognised["encrypted.pdf"]
    archive = archived(doc, tmp_path / "archive.pdf")
    assert archive.result.archive == "ghostscript"
    assert_pdfa_2b(archive.pdf)
    assert_found_in_order_and_in_place(archive)
    assert difference(render(archive.pdf, 1), render(doc.pdf, 1)) < 0.5
    # Before and after Ghostscript, every word of the layer is in the same place.
    assert bbox_words(archive.pdf, 1) == bbox_words(doc.pdf, 1)


def test_an_archival_pdf_with_fonts_not_embedded_goes_through_ghostscript(
    corpus: Path, tmp_path: Path, recognised: dict[str, Converted]
) -> None:
    # A scanned page (with its layer) and a born-digital page whose fonts are not embedded.
    mixed = pdf_of_pages(
        tmp_path / "mixed.pdf",
        [
            (corpus / "real" / "ocrmypdf__francais.pdf", 1),
            (corpus / "real" / "sample-files__pdfkit.pdf", 1),
        ],
    )
    text_page = assemble_page(
        PageInfo(2, (100, 100), 595, 842),
        PageText("", "stop"),
        PromptMode.layout,
        source=PageSource.text_layer,
    )
    francais = recognised["job folder"].pages[3]
    plain = write_pdf(Sources((mixed,)), [francais, text_page], tmp_path / "plain.pdf")
    archive = write_pdf(Sources((mixed,)), [francais, text_page], tmp_path / "a.pdf", archive=True)
    assert archive.result.archive == "ghostscript"
    assert_pdfa_2b(archive.pdf)
    assert_found_in_order_and_in_place(archive)
    assert bbox_words(archive.pdf, 1) == bbox_words(plain.pdf, 1)
    assert pdf_words(archive.pdf, 2) == pdf_words(plain.pdf, 2)  # its own text, kept
    for number in (1, 2):
        assert difference(render(archive.pdf, number), render(plain.pdf, number)) < 0.5


def test_a_pdf_that_cannot_be_pdfa_is_refused_with_the_reasons_and_leaves_no_file(
    corpus: Path, tmp_path: Path
) -> None:
    source = corpus / "real" / "sample-files__annotated_pdf.pdf"
    page = assemble_page(
        PageInfo(1, (100, 100), 595, 842),
        PageText("", "stop"),
        PromptMode.layout,
        source=PageSource.text_layer,
    )
    target = tmp_path / "a.pdf"
    with pytest.raises(SearchablePdfError, match="cannot be made PDF/A-2b") as raised:
        write_searchable_pdf(
            [(source, InputFormat.pdf)], [(0, 1)], [page], target, PdfSettings(archive=True)
        )
    assert any("appearance" in finding for finding in raised.value.findings)
    assert not target.exists()
    assert not list(tmp_path.iterdir())  # no temporary left behind


def test_pdfa_keeps_jpeg_bytes_of_an_image_input(corpus: Path, tmp_path: Path) -> None:
    with Image.open(corpus / "real" / "ocrmypdf__baiona.png") as image:
        buffer = io.BytesIO()
        image.convert("RGB").save(buffer, "JPEG", quality=85)
    jpeg = tmp_path / "photo.jpg"
    jpeg.write_bytes(buffer.getvalue())
    [page] = grounded_pages(
        [jpeg], ["<|ref|>text<|/ref|><|det|>[[60, 60, 400, 100]]<|/det|>\nBAIONA"]
    )
    result = write_searchable_pdf(
        [(jpeg, InputFormat.jpeg)], [(0, 1)], [page], tmp_path / "a.pdf", PdfSettings(archive=True)
    )
    assert result.archive == "pikepdf"
    assert_pdfa_2b(tmp_path / "a.pdf")
    assert image_streams(pymupdf.open(tmp_path / "a.pdf"), 1) == [jpeg.read_bytes()]
    with pikepdf.open(tmp_path / "a.pdf") as pdf:
        assert pdf.pages[0].mediabox[2] == pytest.approx(640)  # no DPI: 72, a point a pixel
