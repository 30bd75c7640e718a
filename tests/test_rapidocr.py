"""The CPU engine, with RapidOCR's real models, on real scans."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from PIL import Image

from ocrd.config import PromptMode, RapidOcrConfig
from ocrd.domain import PageImage
from ocrd.engines.rapidocr import RapidOcrEngine
from ocrd.text.lines import TextLine, lines_to_markdown


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def recognise(scan: Path) -> str:
    image = Image.open(scan).convert("RGB")

    async def run() -> str:
        engine = RapidOcrEngine(RapidOcrConfig())
        await engine.start()
        try:
            page = PageImage(1, image, image.width, image.height)
            return (await engine.recognise(page, PromptMode.layout)).text
        finally:
            await engine.stop()

    return asyncio.run(run())


def test_phototest_markdown_contains_every_word_of_the_ground_truth(corpus: Path) -> None:
    markdown = recognise(corpus / "scans" / "phototest.tif")
    expected = words((corpus / "scans" / "phototest.txt").read_text())
    found = set(words(markdown))
    missing = [word for word in expected if word not in found]
    assert not missing, f"missing {missing} in:\n{markdown}"
    assert "\n\n" in markdown  # more than one paragraph


def test_a_magazine_page_is_read_column_by_column_around_its_photo_and_caption(
    corpus: Path,
) -> None:
    # Two columns narrowed around a photo, with its caption across the gutter: each column is
    # read top to bottom, then the caption, as in the page's ground truth.
    text = " ".join(words(recognise(corpus / "scans" / "8087_054.3B.tif")))
    for seam in [
        "once a month any person in need receives flour",  # left column into right column
        "the classic argentina but several thousand beds",  # right column, around the photo
        "with its splendid view over the city s western walls",
        "accused of raping torturing and the terra cotta roofs",  # then the caption
    ]:
        assert seam in text, f"{seam!r} not in reading order in:\n{text}"


def line(x0: float, y0: float, text: str, height: float = 20, width: float = 300) -> TextLine:
    return TextLine(x0, y0, x0 + width, y0 + height, text)


def test_two_columns_are_read_column_by_column_under_a_full_width_title() -> None:
    lines = [
        line(0, 0, "A Title Across The Page", height=45, width=700),
        line(0, 80, "left one"),
        line(400, 80, "right one"),
        line(0, 105, "left two"),
        line(400, 105, "right two"),
        line(0, 130, "left three-"),
        line(400, 130, "right three"),
        line(0, 155, "word"),
    ]
    assert lines_to_markdown(lines).split("\n\n") == [
        "## A Title Across The Page",
        "left one left two left threeword",
        "right one right two right three",
    ]


def test_a_large_gap_starts_a_new_paragraph() -> None:
    lines = [line(0, 0, "first"), line(0, 25, "still first"), line(0, 90, "second")]
    assert lines_to_markdown(lines) == "first still first\n\nsecond"
    assert lines_to_markdown([]) == ""


def test_a_caption_across_the_gutter_is_read_after_both_columns() -> None:
    lines = [line(200, 0, "Title Above Both", height=45, width=300)]  # no gap to cut under it
    for row in range(10):
        lines += [line(0, 50 + 25 * row, f"left {row}"), line(400, 50 + 25 * row, f"right {row}")]
    lines.append(line(250, 85, "caption", width=200))  # across the gutter from 300 to 400
    assert lines_to_markdown(lines).split("\n\n") == [
        "## Title Above Both",
        " ".join(f"left {row}" for row in range(10)),
        " ".join(f"right {row}" for row in range(10)),
        "caption",
    ]
