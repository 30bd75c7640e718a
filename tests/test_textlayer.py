"""Where the searchable PDF's text goes: a page's blocks as plain lines in boxes (no PDF)."""

from __future__ import annotations

import itertools
import re

from ocrd.config import PromptMode
from ocrd.domain import PageInfo, PageResult, PageSource, PageText
from ocrd.output.page import assemble_page
from ocrd.output.textlayer import (
    PAGE_REGION,
    PlacedLine,
    block_placements,
    lay_out_block,
    page_lines,
    row_counts,
    skew_slope,
    wrap_filled,
)
from ocrd.text.grounding import Block, Box, parse_page
from ocrd.text.lines import TextLine, lines_to_markdown
from ocrd.text.markdown import page_markdown
from ocrd.text.plain import block_lines, latex_to_plain, markdown_line_to_plain

LETTER = (612.0, 792.0)
PAGE = """<|ref|>title<|/ref|><|det|>[[62, 38, 934, 71]]<|/det|>
# Quarterly Report &amp; Outlook

<|ref|>text<|/ref|><|det|>[[62, 90, 934, 160]]<|/det|>
Revenue grew by **12%** in Q3 &lt;unaudited&gt;. The board met on 3 October and agreed to \
expand the northern plant, hire forty engineers and review the pricing of the older lines.

<|ref|>equation<|/ref|><|det|>[[300, 170, 700, 200]]<|/det|>
\\[ E = mc^2 + \\frac{a}{\\sqrt{b}} \\leq \\alpha \\]

<|ref|>table<|/ref|><|det|>[[62, 210, 934, 400]]<|/det|>
<table><tr><td>Region</td><td>Q3</td></tr><tr><td>North &amp; East</td><td>1.2</td></tr></table>

<|ref|>image<|/ref|><|det|>[[100, 420, 500, 700]]<|/det|>


<|ref|>image_caption<|/ref|><|det|>[[100, 705, 500, 730]]<|/det|>
Figure 1: Sales by *region*.
"""


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def grounded_page(raw: str, size: tuple[float, float] = LETTER) -> PageResult:
    info = PageInfo(1, (round(size[0] * 2), round(size[1] * 2)), size[0], size[1])
    return assemble_page(info, PageText(raw, "stop"), PromptMode.layout)


def inside(line: PlacedLine, box: Box) -> bool:
    epsilon = 1e-9
    return (
        box.x1 / 999 - epsilon <= line.left <= line.right <= box.x2 / 999 + epsilon
        and box.y1 / 999 - epsilon <= line.top <= line.bottom <= box.y2 / 999 + epsilon
    )


def test_a_table_is_a_line_a_row_and_a_formula_its_plain_text() -> None:
    blocks = parse_page(PAGE)
    assert block_lines(blocks[3]) == ["Region Q3", "North & East 1.2"]
    assert block_lines(blocks[2]) == ["E = mc^2 + a/√b ≤ α"]
    assert block_lines(blocks[4]) == []  # a figure has no text
    assert latex_to_plain(r"\text{speed } v_{max} = \dfrac{d}{t}\,\mathrm{m/s}") == (
        "speed v_max = d/t m/s"
    )
    cut_off = "<table><tr><th>a</th><th>b<br>c</th></tr><tr><td>1"
    assert block_lines(Block("table", (), cut_off)) == ["a b c", "1"]


def test_markdown_markup_goes_and_every_word_of_the_markdown_stays() -> None:
    assert markdown_line_to_plain("## **Bold** and _it_ [a link](http://x.org) `code`") == (
        "Bold and it a link code"
    )
    assert markdown_line_to_plain("- an item with snake_case_names and 2 * 3") == (
        "an item with snake_case_names and 2 * 3"
    )
    assert markdown_line_to_plain("| a | b \\| c |") == "a b | c"
    assert markdown_line_to_plain("| --- | :---: |") == ""
    page = grounded_page(PAGE)
    layer = " ".join(line.text for line in page_lines(page))
    markdown = page_markdown(page.blocks, "markdown")
    missing = set(words(markdown)) - set(words(layer)) - {"frac", "sqrt", "leq", "alpha"}
    assert not missing, f"{missing} are in the Markdown but not in the layer"


def test_a_paragraph_fills_as_many_rows_of_its_box_as_its_type_size_suggests() -> None:
    text = " ".join(f"word{i % 10}" for i in range(60))  # 359 characters
    # Body text: 60 words of 10 pt type (pitch 12 pt) in a 250 pt column need about six rows.
    region = (0.1, 0.1, 0.1 + 250 / 612, 0.1 + 72 / 792)
    rows = lay_out_block([text], region, LETTER)
    assert 5 <= len(rows) <= 7
    assert rows[0].top == 0.1 and abs(rows[-1].bottom - region[3]) < 1e-12
    assert all(a.bottom == b.top for a, b in itertools.pairwise(rows))
    assert " ".join(row.text for row in rows) == text  # nothing lost, order kept
    # Set as type is: full rows as wide as the box, the last one as long as its text.
    full = [len(row.text) for row in rows[:-1]]
    assert max(full) - min(full) <= 6
    assert all(row.right == region[2] for row in rows[:-1])
    share = (rows[-1].right - region[0]) / (region[2] - region[0])
    assert share < 1 and abs(share - len(rows[-1].text) / max(full)) < 0.15
    # A heading in its own tight box stays one row, as wide as the box.
    assert row_counts([26], 400, 24) == [1]


def test_text_without_spaces_wraps_between_wide_characters() -> None:
    text = "日本語のテキストは単語の間に空白がありません"
    rows = wrap_filled(text, 3)
    assert len(rows) == 3 and "".join(row.text for row in rows) == text
    assert [row.text for row in wrap_filled("short", 4)] == ["short"]


def test_a_block_with_two_boxes_shares_its_lines_between_them_in_order() -> None:
    first, second = Box(50, 100, 480, 130), Box(520, 100, 950, 130)
    block = Block("text", (first, second), "one two three\nfour five six")
    placed = block_placements(block, LETTER)
    assert [line.text for line in placed] == ["one two three", "four five six"]
    assert inside(placed[0], first) and inside(placed[1], second)


def test_text_without_a_box_is_spread_over_the_page_so_it_can_still_be_found() -> None:
    text = "A plain-text answer\nwith two lines and no grounding at all."
    placed = page_lines(grounded_page(text))
    assert words(" ".join(line.text for line in placed)) == words(text)
    left, top, right, bottom = PAGE_REGION
    assert placed[0].top == top and placed[-1].bottom == bottom
    assert all(left == line.left < line.right <= right for line in placed)


def test_pages_from_a_text_layer_blank_or_failed_get_no_layer() -> None:
    page = grounded_page(PAGE)
    assert page_lines(page)
    for source in (PageSource.text_layer, PageSource.blank):
        page.source = source
        assert page_lines(page) == []
    failed = grounded_page(PAGE)
    failed.text = PageText(PAGE, "error")
    assert page_lines(failed) == []
    assert page_lines(grounded_page("")) == []


def rapid_page(lines: list[TextLine], size: tuple[float, float] = LETTER) -> PageResult:
    """A page as the RapidOCR engine gives it: its Markdown, and its lines as blocks."""
    blocks = tuple(
        Block("text", (Box.from_pixels(ln.x0, ln.y0, ln.x1, ln.y1, *size),), ln.text)
        for ln in lines
    )
    text = PageText(lines_to_markdown(lines), "stop", blocks=blocks)
    return assemble_page(PageInfo(1, (612, 792), *size), text, PromptMode.layout)


def test_engine_lines_come_in_the_reading_order_of_the_markdown_each_in_its_box() -> None:
    # Two columns, given row by row (as a detector may): read column by column.
    lines = [
        TextLine(50, 100 + 20 * row, 290, 114 + 20 * row, f"left{row} text") for row in range(5)
    ] + [TextLine(320, 100 + 20 * row, 560, 114 + 20 * row, f"right{row} text") for row in range(5)]
    shuffled = [lines[i // 2 + (5 if i % 2 else 0)] for i in range(10)]
    page = rapid_page(shuffled)
    placed = page_lines(page)
    layer_words = words(" ".join(line.text for line in placed))
    assert layer_words == words(page_markdown(page.blocks, "markdown"))
    by_text = {line.text: line for line in lines}
    for line in placed:
        source = by_text[line.text]
        assert abs(line.left * 612 - source.x0) < 1 and abs(line.right * 612 - source.x1) < 1
        assert source.y0 - 1 <= line.top * 792 < line.bottom * 792 <= source.y1 + 1


def test_lines_of_a_skewed_scan_keep_their_text_height_and_their_order() -> None:
    # Lines of 14 pt type 18 pt apart, on a scan turned by 3 % (1.7 degrees): each line's
    # upright box is taller than its text by 3 % of its width, and neighbouring boxes overlap.
    slope = 0.03
    lines = []
    for row, width in enumerate([500, 320, 480, 150, 510, 260, 400, 90]):
        baseline = 130 + 18 * row  # at the line's left end; it rises to the right
        lines.append(TextLine(50, baseline - 14 - slope * width, 50 + width, baseline, f"l{row}"))
    assert any(a.y1 > b.y0 + 5 for a, b in itertools.pairwise(lines))
    assert abs(skew_slope(lines) - slope) < 1e-6
    placed = page_lines(rapid_page(lines))
    assert [line.text for line in placed] == [f"l{row}" for row in range(8)]
    for line, box in zip(placed, lines, strict=True):
        assert abs((line.bottom - line.top) * 792 - 14) < 0.01  # the type's height
        assert box.y0 <= line.top * 792 and line.bottom * 792 <= box.y1 + 1e-9
    for above, below in itertools.pairwise(placed):
        overlap = (above.bottom - below.top) * 792
        assert overlap < 14 / 2  # far less than the boxes' overlap
    upright = [
        TextLine(50, 100 + 18 * row, 50 + width, 114 + 18 * row, "x")
        for row, width in enumerate([90, 400, 250])
    ]
    assert skew_slope(upright) == 0.0
