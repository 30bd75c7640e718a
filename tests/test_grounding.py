"""Parsing the model's grounding output, and the Markdown made from it."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ocrd.text.grounding import Block, Box, parse_page
from ocrd.text.markdown import (
    html_table_to_pipes,
    looks_repetitive,
    page_markdown,
    strip_running_lines,
)

PAGE = """<|ref|>title<|/ref|><|det|>[[62, 38, 934, 71]]<|/det|>
# Quarterly Report &amp; Outlook

<|ref|>text<|/ref|><|det|>[[62, 90, 934, 160]]<|/det|>
Revenue grew by 12% in Q3 &lt;unaudited&gt;. The board met on 3 October.

<|ref|>equation<|/ref|><|det|>[[300, 170, 700, 200]]<|/det|>
\\[ E = mc^2 \\]

<|ref|>table<|/ref|><|det|>[[62, 210, 934, 400]]<|/det|>
<table><tr><td>Region</td><td>Q3</td></tr><tr><td>North &amp; East</td><td>1.2</td></tr></table>

<|ref|>image<|/ref|><|det|>[[100, 420, 500, 700]]<|/det|>


<|ref|>image_caption<|/ref|><|det|>[[100, 705, 500, 730]]<|/det|>
Figure 1: Sales by region.
"""


def test_a_realistic_page_parses_into_its_blocks() -> None:
    blocks = parse_page(PAGE)
    assert [b.label for b in blocks] == [
        "title",
        "text",
        "equation",
        "table",
        "image",
        "image_caption",
    ]
    assert blocks[0].boxes == (Box(62, 38, 934, 71),)
    assert blocks[0].content == "# Quarterly Report &amp; Outlook"
    assert blocks[4].content == ""


def test_markdown_keeps_structure_and_decodes_entities_outside_tables() -> None:
    markdown = page_markdown(parse_page(PAGE), "html", {4: "report.assets/page1-figure1.png"})
    assert markdown.startswith(
        "# Quarterly Report & Outlook\n\nRevenue grew by 12% in Q3 <unaudited>."
    )
    assert "\\[ E = mc^2 \\]" in markdown
    assert "<td>North &amp; East</td>" in markdown  # tables keep their HTML escaping
    assert "![](report.assets/page1-figure1.png)\n\nFigure 1: Sales by region." in markdown
    assert "<|" not in markdown and "\n\n\n" not in markdown


def test_simple_tables_become_pipe_tables_and_complex_ones_stay_html() -> None:
    markdown = page_markdown(parse_page(PAGE), "markdown")
    assert "| Region | Q3 |\n| --- | --- |\n| North & East | 1.2 |" in markdown
    spanned = '<table><tr><td colspan="2">Both</td></tr><tr><td>a</td><td>b</td></tr></table>'
    assert html_table_to_pipes(spanned) is None
    cut_off = "<table><tr><td>a</td><td>b"
    assert html_table_to_pipes(cut_off) is None
    pipes = html_table_to_pipes("<table><tr><th>x|y</th></tr><tr><td>1<br>2</td></tr></table>")
    assert pipes == "| x\\|y |\n| --- |\n| 1 2 |"


def test_several_boxes_out_of_range_and_inverted_are_clamped_and_ordered() -> None:
    [block] = parse_page(
        "<|ref|>text<|/ref|><|det|>[[500, 900, 100, 1200], [-5, 3, 20.5, 8]]<|/det|>x"
    )
    assert block.boxes == (Box(100, 900, 500, 999), Box(0, 3, 20.5, 8))
    assert block.boxes[0].scaled(999, 1998) == pytest.approx((100, 1800, 500, 1998))


def test_broken_tags_text_before_tags_and_unknown_labels() -> None:
    blocks = parse_page(
        "Intro before any tag.\n"
        "<|ref|>Weird Label!<|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>odd\n"
        "<|ref|>text<|det|>[[5, 6, 7, 8]]<|/det|>no closing ref\n"
        "<|ref|>text<|/ref|><|det|>[[9, 10, 11, 12]] unclosed det\n"
        "<|ref|>footnote<|/ref|>no det at all\n"
    )
    assert [(b.label, b.content.strip()) for b in blocks] == [
        ("text", "Intro before any tag."),
        ("weird label", "odd"),
        ("text", "no closing ref"),
        ("text", "unclosed det"),
        ("footnote", "no det at all"),
    ]
    assert blocks[3].boxes == (Box(9, 10, 11, 12),)


def test_output_cut_off_mid_block_keeps_what_was_written() -> None:
    for raw, expected in [
        (
            "<|ref|>text<|/ref|><|det|>[[1, 2, 3, 4]]<|/det|>The sentence stops mid",
            "The sentence stops mid",
        ),
        ("<|ref|>text<|/ref|><|det|>[[1, 2, 3", ""),
        ("<|ref|>tex", ""),
    ]:
        blocks = parse_page(raw)
        assert (blocks[-1].content.strip() if blocks else "") == expected
        assert "<|" not in page_markdown(blocks, "markdown")


def test_hostile_text_is_never_evaluated() -> None:
    raw = '<|ref|>text<|/ref|><|det|>__import__("os").system("touch /tmp/ocrd-pwned")<|/det|>hi'
    [block] = parse_page(raw)
    assert block.boxes == () and block.content == "hi"
    assert page_markdown([Block("text", (), "<|re<|ref|>f|>x<|det|>")], "html") == "x"


tag_soup = st.lists(
    st.one_of(
        st.sampled_from(
            [
                "<|ref|>",
                "<|/ref|>",
                "<|det|>",
                "<|/det|>",
                "[[",
                "]]",
                ",",
                "\n",
                "<table>",
                "</table>",
                "<tr>",
                "<td>",
                "</td>",
                "&amp;",
                "<|",
                "|>",
                "<｜end▁of▁sentence｜>",
                "image",
                "text",
                "999",
                "-3",
                "<|grounding|>",
            ]
        ),
        st.text(max_size=8),
        st.integers(-2000, 2000).map(str),
    ),
    max_size=60,
).map("".join)


@settings(max_examples=400, deadline=None)
@given(tag_soup)
def test_no_input_crashes_the_parser_and_no_tag_survives(raw: str) -> None:
    blocks = parse_page(raw)
    for block in blocks:
        for box in block.boxes:
            assert 0 <= box.x1 <= box.x2 <= 999 and 0 <= box.y1 <= box.y2 <= 999
    for table_format in ("markdown", "html"):
        markdown = page_markdown(blocks, table_format, {})
        assert not re.search(r"<\|/?(ref|det|grounding)\|>", markdown)
        assert "<｜" not in markdown


def test_running_headers_and_page_numbers_are_removed() -> None:
    bodies = ["Apples grow on trees.", "Rivers run to the sea.", "Stars shine.", "The end."]
    pages = [
        f"ACME Annual Report 2026\n\n{body}\n\nPage {n} of 4"
        for n, body in enumerate(bodies, start=1)
    ]
    stripped = strip_running_lines(pages)
    assert stripped == bodies
    assert strip_running_lines(pages[:2]) == pages[:2]  # too few pages to tell


def test_repetition_loops_are_recognised() -> None:
    assert looks_repetitive("Intro. " + "the same row | 1 | 2 |\n" * 40)
    assert not looks_repetitive("An ordinary page of text. " * 3 + "It ends here.")
