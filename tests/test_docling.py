"""DoclingDocument from ocrd's pages, as a docling user reads it: loaded and validated by
docling-core, its items' labels, text, tables' cells, pictures and provenance (page and box)
checked against the page they came from; and `outputs: [docling, chunks]` from `ocrd
convert` of a real scan (RapidOCR) and a real born-digital PDF (its text layer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from docling_core.types.doc.base import CoordOrigin
from docling_core.types.doc.document import DoclingDocument
from docling_core.types.doc.items.picture.picture import PictureItem
from docling_core.types.doc.items.table.table import TableItem
from docling_core.types.doc.items.text import TextItem
from docling_core.types.doc.labels import DocItemLabel
from test_grounding import PAGE

from ocrd.config import PromptMode
from ocrd.domain import Figure, PageInfo, PageText
from ocrd.output.chunks import chunk_records
from ocrd.output.docling import build_document
from ocrd.output.page import assemble_page
from ocrd.text.elements import ElementKind, elements
from ocrd.text.tables import html_grid

LISTS = """<|ref|>sub_title<|/ref|><|det|>[[62, 740, 600, 760]]<|/det|>
## Findings

<|ref|>text<|/ref|><|det|>[[62, 770, 934, 860]]<|/det|>
- one
- two

<|ref|>table_caption<|/ref|><|det|>[[62, 870, 500, 880]]<|/det|>
Table 2: Spans.

<|ref|>table<|/ref|><|det|>[[62, 885, 934, 990]]<|/det|>
<table><tr><td rowspan="2">A</td><td colspan="2">B</td></tr><tr><td>c</td><td>d</td></tr></table>

<|ref|>footer<|/ref|><|det|>[[450, 992, 550, 999]]<|/det|>
7
"""


def roundtrip(doc: DoclingDocument) -> DoclingDocument:
    """The document as a client gets it: JSON, loaded and validated by docling-core."""
    return DoclingDocument.model_validate_json(json.dumps(doc.export_to_dict()))


def grounded_document(tmp_path: Path) -> DoclingDocument:
    figure = Figure(tmp_path / "page1-figure1.png", 400, 280, (100, 420, 500, 700), 288.0)
    page = assemble_page(
        PageInfo(1, (1000, 1294), 612.0, 792.0), PageText(PAGE + LISTS, "stop"), PromptMode.layout
    )
    page.figures = {4: figure}
    return roundtrip(build_document([page], "report", [{4: "report.assets/page1-figure1.png"}]))


def test_grounding_blocks_become_labelled_items_in_reading_order(tmp_path: Path) -> None:
    doc = grounded_document(tmp_path)
    body = [
        (item.label, getattr(item, "text", None))
        for item, _ in doc.iterate_items()
        if not (isinstance(item, TextItem) and item.label is DocItemLabel.CAPTION)
    ]
    assert body == [
        (DocItemLabel.TITLE, "Quarterly Report & Outlook"),
        (DocItemLabel.TEXT, "Revenue grew by 12% in Q3 <unaudited>. The board met on 3 October."),
        (DocItemLabel.FORMULA, "E = mc^2"),
        (DocItemLabel.TABLE, None),
        (DocItemLabel.PICTURE, None),
        (DocItemLabel.SECTION_HEADER, "Findings"),
        (DocItemLabel.LIST_ITEM, "one"),
        (DocItemLabel.LIST_ITEM, "two"),
        (DocItemLabel.TABLE, None),
    ]
    [footer] = [item for item in doc.texts if item.label is DocItemLabel.PAGE_FOOTER]
    assert footer.text == "7" and footer.content_layer.value == "furniture"
    markdown = doc.export_to_markdown()
    assert "| North & East" in markdown and "- one\n- two" in markdown


def test_boxes_become_provenance_in_pdf_points_and_captions_find_their_item(
    tmp_path: Path,
) -> None:
    doc = grounded_document(tmp_path)
    title = doc.texts[0]
    [prov] = title.prov
    assert prov.page_no == 1 and prov.bbox.coord_origin is CoordOrigin.BOTTOMLEFT
    # the model's [62, 38, 934, 71] of 999 on a 612 x 792 pt page, origin bottom left
    expected = (62 / 999 * 612, 792 - 38 / 999 * 792, 934 / 999 * 612, 792 - 71 / 999 * 792)
    bbox = prov.bbox
    assert (bbox.l, bbox.t, bbox.r, bbox.b) == pytest.approx(expected)
    assert doc.pages[1].size.width == 612 and doc.pages[1].size.height == 792

    picture = doc.pictures[0]
    assert isinstance(picture, PictureItem) and picture.image is not None
    assert str(picture.image.uri) == "report.assets/page1-figure1.png"
    image = picture.image
    assert (image.size.width, image.size.height, image.dpi) == (400, 280, 288)
    assert picture.caption_text(doc) == "Figure 1: Sales by region."
    # a table's caption written before it is found by the table
    spans = doc.tables[1]
    assert isinstance(spans, TableItem) and spans.caption_text(doc) == "Table 2: Spans."


def test_table_cells_keep_their_spans() -> None:
    grid = html_grid(
        '<table><tr><td rowspan="2">A</td><td colspan="2">B</td></tr><tr><td>c</td><td>d</td>'
        "</tr></table>"
    )
    placed = [(c.text, c.row, c.column, c.row_span, c.column_span) for c in grid.cells]
    assert placed == [("A", 0, 0, 2, 1), ("B", 0, 1, 1, 2), ("c", 1, 1, 1, 1), ("d", 1, 2, 1, 1)]
    assert (grid.rows, grid.columns) == (2, 3)


def test_markdown_elements_of_a_text_layer_page() -> None:
    found = elements(
        "# Title\n\nSome **bold** text\ncontinues.\n\n1. first\n2. second\n\n"
        "| a | b |\n|---|---|\n| 1 | 2 |\n\n$$\nx^2\n$$\n\n> 1 2021 estimate\n"
    )
    assert [(e.kind, e.text) for e in found if e.kind is not ElementKind.table] == [
        (ElementKind.heading, "Title"),
        (ElementKind.paragraph, "Some bold text continues."),
        (ElementKind.list_item, "first"),
        (ElementKind.list_item, "second"),
        (ElementKind.formula, "x^2"),
        (ElementKind.paragraph, "1 2021 estimate"),
    ]
    [table] = [e for e in found if e.kind is ElementKind.table]
    assert table.grid is not None and [c.text for c in table.grid.cells] == ["a", "b", "1", "2"]


def test_chunks_carry_their_headings_pages_and_boxes(tmp_path: Path) -> None:
    records = chunk_records(grounded_document(tmp_path), "report.pdf")
    revenue = next(r for r in records if r["raw_text"].startswith("Revenue"))
    assert revenue["headings"] == ["Quarterly Report & Outlook"]
    assert revenue["text"].startswith("Quarterly Report & Outlook\nRevenue grew")
    assert revenue["page_numbers"] == [1]
    # origin top left in points, as ocrd's layout file measures boxes
    assert revenue["boxes"] == [
        {
            "page": 1,
            "box_pt": pytest.approx(
                [62 / 999 * 612, 90 / 999 * 792, 934 / 999 * 612, 160 / 999 * 792], abs=0.01
            ),
        }
    ]
    listed = next(r for r in records if r["raw_text"] == "- one\n- two")
    assert listed["headings"] == ["Quarterly Report & Outlook", "Findings"]
    assert len(listed["doc_items"]) == 2


@pytest.mark.slow
def test_ocrd_convert_writes_docling_and_chunks_for_a_scan_and_a_born_digital_pdf(
    tmp_path: Path, corpus: Path
) -> None:
    """RapidOCR reads the scan; the PDF's text layer stands in for OCR: both give a valid
    DoclingDocument whose items have boxes around their words, and chunks beside it."""
    config = tmp_path / "config.yaml"
    (tmp_path / "inbox").mkdir()
    config.write_text(
        yaml.safe_dump(
            {
                "inboxes": [
                    {
                        "path": "inbox",
                        "outputs": ["markdown", "docling", "chunks"],
                        "pdf_text": "prefer",
                    }
                ],
                "engine": {"kind": "rapidocr"},
            }
        )
    )
    scan = corpus / "scans" / "phototest.tif"
    pdf = corpus / "real" / "sample-files__google-doc-document.pdf"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "ocrd",
            "convert",
            str(scan),
            str(pdf),
            "--out",
            str(tmp_path / "out"),
            "--config",
            str(config),
            "--log-format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = tmp_path / "out"

    scanned = DoclingDocument.load_from_json(out / "phototest.docling.json")
    texts = [item.text for item in scanned.texts]
    assert texts[0].startswith("This is a lot of 12 point text")
    assert all(item.prov and item.prov[0].page_no == 1 for item in scanned.texts)
    # the first paragraph's box lies above the second's on the page
    first, second = (item.prov[0].bbox for item in scanned.texts[:2])
    assert first.t > second.t  # origin bottom left
    assert (scanned.pages[1].size.width, scanned.pages[1].size.height) > (0, 0)

    digital = DoclingDocument.load_from_json(out / "sample-files__google-doc-document.docling.json")
    headers = [item.text for item in digital.texts if item.label is DocItemLabel.SECTION_HEADER]
    assert headers == ["Example document"]
    [table] = digital.tables
    cells = {cell.text for cell in table.data.table_cells}
    assert {"Capital", "Jakarta", "Berlin", "Vatican City"} <= cells
    assert table.prov and table.prov[0].page_no == 1
    assert all(item.prov for item in digital.texts)

    lines = (out / "sample-files__google-doc-document.chunks.jsonl").read_text().splitlines()
    chunks = [json.loads(line) for line in lines]
    assert chunks and all(c["page_numbers"] == [1] and c["boxes"] for c in chunks)
    assert chunks[0]["headings"] == ["Example document"]
    assert (out / "phototest.chunks.jsonl").read_text().count("\n") == len(scanned.texts)
