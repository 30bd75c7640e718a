"""Text of a model that gives no positions, laid over the lines found on the page's image:
the pure sharing out (`linefit.py`), and real pages through RapidOCR and PyMuPDF."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pymupdf
import pytest

from ocrd.config import PdfLines, PromptMode
from ocrd.documents.pipeline import PDF_SECONDS_PER_PAGE
from ocrd.domain import InputFormat, PageInfo, PageResult, PageText
from ocrd.output.linefind import LineFinder
from ocrd.output.linefit import by_reading, runs
from ocrd.output.page import assemble_page
from ocrd.output.searchable import PdfSettings, write_searchable_pdf
from ocrd.output.textlayer import FoundLine, page_lines
from ocrd.render.pool import RenderPool
from ocrd.render.protocol import RenderLimits, WriteSearchablePdf

PAGE_SIZE = (420.0, 300.0)
DPI = 150
PARAGRAPHS = [
    ["Harbour dues were raised twice", "in the spring, and the pilots", "asked for a new tender."],
    ["Seven clerks filed the yearly", "report before the vote."],
]


def test_words_are_cut_into_runs_as_long_as_each_line_holds() -> None:
    cut = runs([1.0] * 10, [False] * 9 + [True], [3.0, 5.0, 2.0])
    assert [len(run) for run in cut] == [3, 5, 2]
    assert [run.start for run in cut] == [0, 3, 8]


def test_a_cut_falls_where_the_models_own_line_ends() -> None:
    # Two lines that hold ten words each; the model's first line has nine: the cut goes
    # to its end, not a word later where the lengths alone would put it.
    ends = [index in (8, 19) for index in range(20)]
    assert [len(run) for run in runs([1.0] * 20, ends, [1.0, 1.0])] == [9, 11]
    assert [len(run) for run in runs([1.0] * 20, [False] * 19 + [True], [1.0, 1.0])] == [10, 10]


def test_a_line_without_text_gets_no_words() -> None:
    cut = runs([1.0] * 6, [False] * 5 + [True], [3.0, 0.0, 3.0])
    assert [len(run) for run in cut] == [3, 0, 3]


def test_words_read_on_the_lines_say_where_the_models_words_lie() -> None:
    model = ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
    read = [["The", "qu1ck", "brown"], ["fox", "jumps", "ovr"], ["the", "lazy", "dog."]]
    assert by_reading(model, read) == [0, 0, 0, 1, 1, 1, 2, 2, 2]


def test_a_word_not_read_goes_to_the_line_its_models_line_says() -> None:
    # "fox" and "over" are misread on the image; the model's lines end after "brown" and
    # "over", so "fox" starts the second line and "over" ends it.
    model = ["The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]
    read = [["The", "quick", "brown"], ["f0x", "jumps", "0ver"], ["the", "lazy", "dog"]]
    ends = [False, False, True, False, False, True, False, False, True]
    assert by_reading(model, read, ends) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # Without the model's line ends, each goes to the nearer anchor's line (a tie: the earlier).
    assert by_reading(model, read) == [0, 0, 0, 0, 1, 1, 2, 2, 2]


def test_a_reading_that_shares_too_few_words_places_nothing() -> None:
    assert by_reading(["one", "two", "three", "four"], [["uno"], ["dos"], ["four"]]) is None


def lightonocr_page(size_px: tuple[int, int]) -> PageResult:
    markdown = "\n\n".join("\n".join(lines) for lines in PARAGRAPHS)
    info = PageInfo(1, size_px, *PAGE_SIZE)
    return assemble_page(info, PageText(markdown, "stop", model="lightonocr-2"), PromptMode.layout)


Printed = list[tuple[str, pymupdf.Rect]]


def printed_scan(path: Path, heading: str | None = None) -> Printed:
    """A page of printed paragraphs (under `heading`, where given) written to `path` as a
    PNG scan; where each of its words is."""
    doc = pymupdf.open()
    page = doc.new_page(width=PAGE_SIZE[0], height=PAGE_SIZE[1])
    y = 50.0
    if heading is not None:
        page.insert_text((40, 30), heading, fontsize=16, fontname="helv")
        y += 20
    for lines in PARAGRAPHS:
        for line in lines:
            page.insert_text((40, y), line, fontsize=16, fontname="helv")
            y += 24
        y += 30
    printed = [(w[4], pymupdf.Rect(w[:4])) for w in page.get_text("words")]
    pixmap = page.get_pixmap(dpi=DPI)
    pixmap.set_dpi(DPI, DPI)
    pixmap.save(path)
    doc.close()
    return printed


@pytest.fixture
def scan(tmp_path: Path) -> tuple[Path, Printed]:
    """A page of printed paragraphs as a PNG scan, and where each of its words is."""
    path = tmp_path / "scan.png"
    return path, printed_scan(path)


def image_size(path: Path) -> tuple[int, int]:
    pixmap = pymupdf.Pixmap(str(path))
    return pixmap.width, pixmap.height


def layer_words(pdf: Path) -> list[tuple[str, pymupdf.Rect]]:
    with pymupdf.open(pdf) as doc:
        return [(w[4], pymupdf.Rect(w[:4])) for w in doc[0].get_text("words")]


def centres_on_their_words(
    layer: list[tuple[str, pymupdf.Rect]], printed: list[tuple[str, pymupdf.Rect]]
) -> float:
    """The share of the layer's words whose centre lies on the printed word (in order)."""
    assert [text for text, _ in layer] == [text for text, _ in printed]
    hits = sum(
        box.contains((ours.tl + ours.br) / 2)
        for (_, ours), (_, box) in zip(layer, printed, strict=True)
    )
    return hits / len(printed)


@pytest.mark.parametrize("read", [True, False], ids=["read", "detected"])
def test_the_words_of_a_page_land_on_their_printed_lines(
    scan: tuple[Path, list[tuple[str, pymupdf.Rect]]], tmp_path: Path, read: bool
) -> None:
    path, printed = scan
    page = lightonocr_page(image_size(path))
    target = tmp_path / "out.pdf"
    settings = PdfSettings(line_finder=LineFinder(read=read))
    result = write_searchable_pdf([(path, InputFormat.png)], [(0, 1)], [page], target, settings)
    assert result.layered_pages == [1]
    assert centres_on_their_words(layer_words(target), printed) >= 0.9


def test_without_found_lines_the_paragraphs_are_stacked_down_the_page() -> None:
    placed = page_lines(lightonocr_page((875, 625)))
    texts = [line.text for line in placed]
    assert " ".join(texts).split() == " ".join(" ".join(lines) for lines in PARAGRAPHS).split()
    tops = [line.top for line in placed]
    assert tops == sorted(tops) and len(set(tops)) == len(tops)  # no two rows overlap


def test_found_lines_that_fail_leave_the_text_stacked(
    scan: tuple[Path, list[tuple[str, pymupdf.Rect]]], tmp_path: Path
) -> None:
    class BrokenFinder(LineFinder):
        def find(self, pixels: np.ndarray) -> list[FoundLine]:  # type: ignore[type-arg]
            raise RuntimeError("the detector's model cannot be loaded")

    path, printed = scan
    target = tmp_path / "out.pdf"
    settings = PdfSettings(line_finder=BrokenFinder())
    page = lightonocr_page(image_size(path))
    write_searchable_pdf([(path, InputFormat.png)], [(0, 1)], [page], target, settings)
    assert [text for text, _ in layer_words(target)] == [text for text, _ in printed]


def written_by_a_render_worker(
    scan: Path, page: PageResult, folder: Path, modes: list[PdfLines]
) -> dict[PdfLines, Printed]:
    """The layer's words of the searchable PDF a real render worker writes for the scan
    with each `pdf_lines` mode, asked as the pipeline asks it."""

    async def run() -> dict[PdfLines, Printed]:
        pool = RenderPool(1, RenderLimits())
        try:
            written = {}
            for mode in modes:
                target = folder / f"{mode.value}.pdf"
                files = ((scan, InputFormat.png),)
                request = WriteSearchablePdf(
                    files, ((0, 1),), (page,), target, False, (), None, mode
                )
                seconds = pool.limits.page_timeout_seconds + PDF_SECONDS_PER_PAGE  # as asked
                result = await pool.searchable_pdf(request, seconds)
                assert result.layered_pages == [1]
                written[mode] = layer_words(target)
            return written
        finally:
            pool.shutdown()

    return asyncio.run(run())


def test_pdf_lines_read_detect_or_skip_finding_the_lines(tmp_path: Path) -> None:
    # The model's text leaves out the page's heading: read lines put its words where they
    # are printed; lines cut by length alone start on the heading's line and stay one line
    # off; with `off` the paragraphs are stacked as if no line had been found.
    scan = tmp_path / "scan.png"
    printed = printed_scan(scan, heading="MINUTES OF THE BOARD")
    heading, body = printed[:4], printed[4:]
    page = lightonocr_page(image_size(scan))
    written = written_by_a_render_worker(scan, page, tmp_path, list(PdfLines))

    assert centres_on_their_words(written[PdfLines.read], body) >= 0.9

    detected = written[PdfLines.detect]
    assert centres_on_their_words(detected, body) < 0.5
    first = detected[0][1]
    assert heading[0][1].y0 <= (first.y0 + first.y1) / 2 <= heading[0][1].y1

    stacked = tmp_path / "stacked.pdf"
    write_searchable_pdf([(scan, InputFormat.png)], [(0, 1)], [page], stacked, PdfSettings())
    assert written[PdfLines.off] == layer_words(stacked)
