"""A converted document as a DoclingDocument (docling-core's types): what the docling-serve
API answers as `json_content`, what `outputs: [docling]` writes as `<name>.docling.json`,
and what `outputs: [chunks]` cuts into chunks.

Every page becomes a page item with its size in PDF points, and its content items in the
reading order the page was read in:

- DeepSeek-OCR-2's grounding blocks give the items and their boxes: `title` a title,
  `sub_title` a section header, `text` paragraphs, headings and list items as its Markdown
  says, `table` a table item with its cells (spans kept), `image` a picture (its crop as the
  image), equations formulas, captions attached to their picture or table, page headers
  and footers in the furniture layer. Each box becomes a provenance (page and bounding box,
  PDF points, origin bottom left, as docling's own converter writes them).
- A text layer's page (pymupdf4llm's Markdown) and a RapidOCR page (its lines' Markdown)
  give the items from their Markdown, and their boxes from the pieces of text the layer or
  the engine placed on the page: an item's box covers the pieces whose words it holds.
- A page read with the plain-text prompt has no boxes: its items have no provenance.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

from docling_core.types.doc.base import BoundingBox, CoordOrigin, Size
from docling_core.types.doc.common.content_layer import ContentLayer
from docling_core.types.doc.common.reference import ImageRef, ProvenanceItem
from docling_core.types.doc.document import DoclingDocument
from docling_core.types.doc.items.group import GroupItem
from docling_core.types.doc.items.node import DocItem
from docling_core.types.doc.items.picture.picture import PictureItem
from docling_core.types.doc.items.table.table import TableItem
from docling_core.types.doc.items.table.table_data import TableCell, TableData
from docling_core.types.doc.labels import DocItemLabel

from ocrd.domain import Figure, PageResult, PageSource
from ocrd.text.elements import Element, ElementKind, elements, formula_text, plain, table_element
from ocrd.text.grounding import Block, Box
from ocrd.text.markdown import decode_entities_outside_tables, scrub_tags
from ocrd.text.plain import FORMULA_LABELS

DOCLING_SUFFIX = ".docling.json"
TITLE_LABELS = frozenset({"title", "doc_title", "document_title"})
HEADING_LABELS = frozenset({"sub_title", "subtitle", "section_header", "heading", "header_text"})
PICTURE_LABELS = frozenset({"image", "figure", "picture", "chart"})
CAPTION_LABELS = {  # a caption label, and the kind of item it belongs to (None: either)
    "image_caption": PictureItem,
    "figure_caption": PictureItem,
    "figure_title": PictureItem,
    "table_caption": TableItem,
    "table_title": TableItem,
    "caption": None,
}
FOOTNOTE_LABELS = frozenset({"table_footnote", "footnote", "image_footnote"})
FURNITURE_LABELS = {
    "header": DocItemLabel.PAGE_HEADER,
    "page_header": DocItemLabel.PAGE_HEADER,
    "footer": DocItemLabel.PAGE_FOOTER,
    "page_footer": DocItemLabel.PAGE_FOOTER,
    "page_number": DocItemLabel.PAGE_FOOTER,
}
CODE_LABELS = frozenset({"code", "code_block"})
MATCH_SHARE = 0.6  # a piece of placed text belongs to an item holding this share of its words
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Placed:
    """Words placed on a page: a block's content and its boxes (in 0..999 of the page)."""

    words: frozenset[str]
    boxes: tuple[Box, ...]


def _words(text: str) -> frozenset[str]:
    return frozenset(word.lower() for word in _WORD.findall(text))


@dataclass
class _PageBuilder:
    """The items of one page, added to the document in reading order."""

    doc: DoclingDocument
    page: PageResult
    figure_links: dict[int, str]  # image block index: the figure's link beside the Markdown
    last: DocItem | None = None
    pending_captions: list[tuple[DocItem, type[DocItem] | None]] = field(default_factory=list)
    list_group: GroupItem | None = None
    list_ordered: bool = False

    # --- provenance ------------------------------------------------------------------

    def provenance(self, boxes: Sequence[Box], text: str) -> list[ProvenanceItem]:
        width, height = self.page.page_size_pt
        found = []
        for box in boxes:
            left, top, right, bottom = box.scaled(width, height)
            bbox = BoundingBox(l=left, t=top, r=right, b=bottom, coord_origin=CoordOrigin.TOPLEFT)
            found.append(
                ProvenanceItem(
                    page_no=self.page.number,
                    bbox=bbox.to_bottom_left_origin(height),
                    charspan=(0, len(text)),
                )
            )
        return found

    def placed_boxes(self, text: str, pieces: Sequence[Placed]) -> tuple[Box, ...]:
        """One box around the placed pieces of text whose words the item holds; or the box
        of a piece that holds the item (a heading inside a block)."""
        words = _words(text)
        if not words:
            return ()
        inside = [
            p for p in pieces if p.words and len(p.words & words) >= MATCH_SHARE * len(p.words)
        ]
        if not inside:
            inside = [p for p in pieces if len(p.words & words) >= MATCH_SHARE * len(words)][:1]
        boxes = [box for piece in inside for box in piece.boxes]
        if not boxes:
            return ()
        return (
            Box(
                min(b.x1 for b in boxes),
                min(b.y1 for b in boxes),
                max(b.x2 for b in boxes),
                max(b.y2 for b in boxes),
            ),
        )

    # --- items -----------------------------------------------------------------------

    def _placed(self, item: DocItem, boxes: Sequence[Box], text: str) -> DocItem:
        item.prov.extend(self.provenance(boxes, text))
        if item.label is not DocItemLabel.LIST_ITEM:
            self.list_group = None
        self.last = item
        return item

    def element(self, element: Element, boxes: Sequence[Box]) -> DocItem:
        """The item for one element of the page's Markdown."""
        doc, text = self.doc, element.text
        if element.kind is ElementKind.heading:
            return self._placed(doc.add_heading(text, level=min(element.level, 6)), boxes, text)
        if element.kind is ElementKind.list_item:
            if self.list_group is None or self.list_ordered != element.ordered:
                self.list_group, self.list_ordered = doc.add_list_group(), element.ordered
            item = doc.add_list_item(text, enumerated=element.ordered, parent=self.list_group)
            return self._placed(item, boxes, text)
        if element.kind is ElementKind.table and element.grid is not None:
            return self._placed(doc.add_table(table_data(element)), boxes, text)
        if element.kind is ElementKind.formula:
            return self._placed(doc.add_formula(text), boxes, text)
        if element.kind is ElementKind.code:
            return self._placed(doc.add_code(text), boxes, text)
        return self._placed(doc.add_text(DocItemLabel.TEXT, text), boxes, text)

    def block(self, index: int, block: Block) -> None:
        """The items of one grounding block, by its label."""
        label, boxes = block.label, block.boxes
        content = decode_entities_outside_tables(scrub_tags(block.content)).strip()
        if label in PICTURE_LABELS:
            self.picture(index, boxes)
        elif label in CAPTION_LABELS:
            self.caption(plain(content), boxes, CAPTION_LABELS[label])
        elif label in FURNITURE_LABELS:
            self._furniture(FURNITURE_LABELS[label], plain(content), boxes)
        elif not content:
            return
        elif label in TITLE_LABELS:
            text = plain(content.lstrip("#").strip())
            self._placed(self.doc.add_title(text), boxes, text)
        elif label in HEADING_LABELS:
            hashes = len(content) - len(content.lstrip("#"))
            text = plain(content.lstrip("#").strip())
            level = max(hashes - 1, 1)  # `#` is the title's; `##` a first-level header
            self._placed(self.doc.add_heading(text, level=min(level, 6)), boxes, text)
        elif label in FORMULA_LABELS:
            text = formula_text(content)
            self._placed(self.doc.add_formula(text), boxes, text)
        elif label == "table":
            table = table_element(content)
            self.element(table or Element(ElementKind.paragraph, plain(content)), boxes)
            self._attach_pending()
        elif label in FOOTNOTE_LABELS:
            text = plain(content)
            self._placed(self.doc.add_text(DocItemLabel.FOOTNOTE, text), boxes, text)
        elif label in CODE_LABELS:
            self._placed(self.doc.add_code(content.strip("`").strip()), boxes, content)
        else:
            found = elements(content)
            for element in found:  # one block's box covers all its elements
                self.element(element, boxes)

    def _furniture(self, label: DocItemLabel, text: str, boxes: Sequence[Box]) -> None:
        if text:
            item = self.doc.add_text(label, text, content_layer=ContentLayer.FURNITURE)
            item.prov.extend(self.provenance(boxes, text))

    def picture(self, index: int, boxes: Sequence[Box]) -> None:
        figure = self.page.figures.get(index)
        link = self.figure_links.get(index)
        image = figure_image(figure, link) if figure is not None and link else None
        self._placed(self.doc.add_picture(image=image), boxes, "")
        self._attach_pending()

    def caption(self, text: str, boxes: Sequence[Box], kind: type[DocItem] | None) -> None:
        """A caption goes to the picture or table just before it, else to the next one on
        the page; one that finds neither stays a caption of its own."""
        if not text:
            return
        target = self.last
        if (
            isinstance(target, PictureItem | TableItem)
            and not target.captions
            and (kind is None or isinstance(target, kind))
        ):
            self._attach(target, text, boxes)
            return
        item = self.doc.add_text(DocItemLabel.CAPTION, text)
        item.prov.extend(self.provenance(boxes, text))
        self.pending_captions.append((item, kind))

    def _attach(self, target: PictureItem | TableItem, text: str, boxes: Sequence[Box]) -> None:
        item = self.doc.add_text(DocItemLabel.CAPTION, text, parent=target)
        item.prov.extend(self.provenance(boxes, text))
        target.captions.append(item.get_ref())

    def _attach_pending(self) -> None:
        """Captions written before their picture or table (a table's usually is)."""
        target = self.last
        if not isinstance(target, PictureItem | TableItem) or target.captions:
            return
        for pending in list(self.pending_captions):
            item, kind = pending
            if kind is None or isinstance(target, kind):
                target.captions.append(item.get_ref())
                self.pending_captions.remove(pending)
                return


def figure_image(figure: Figure, link: str) -> ImageRef:
    """The picture's image: its crop beside the Markdown, by its relative link."""
    size = Size(width=figure.width, height=figure.height)
    uri = Path(unquote(link))
    return ImageRef(mimetype="image/png", dpi=round(figure.source_dpi), size=size, uri=uri)


def table_data(element: Element) -> TableData:
    grid = element.grid
    assert grid is not None
    cells = [
        TableCell(
            text=cell.text,
            row_span=cell.row_span,
            col_span=cell.column_span,
            start_row_offset_idx=cell.row,
            end_row_offset_idx=cell.row + cell.row_span,
            start_col_offset_idx=cell.column,
            end_col_offset_idx=cell.column + cell.column_span,
            column_header=cell.header,
        )
        for cell in grid.cells
    ]
    return TableData(table_cells=cells, num_rows=grid.rows, num_cols=grid.columns)


def _has_grounding(page: PageResult) -> bool:
    """Whether the page's blocks come from the model's grounding (labels and boxes)."""
    return page.text.blocks is None and any(block.boxes for block in page.blocks)


def add_page(doc: DoclingDocument, page: PageResult, figure_links: dict[int, str]) -> None:
    """One page of `doc`: its page item and its content in reading order."""
    width, height = page.page_size_pt
    doc.add_page(page_no=page.number, size=Size(width=width, height=height))
    if page.source is PageSource.blank:
        return
    builder = _PageBuilder(doc, page, figure_links)
    if _has_grounding(page):
        for index, block in enumerate(page.blocks):
            builder.block(index, block)
        return
    pieces = [Placed(_words(b.content), b.boxes) for b in page.layout_blocks if b.boxes]
    markdown = "\n\n".join(block.content for block in page.blocks)
    for element in elements(markdown):
        builder.element(element, builder.placed_boxes(element.text, pieces))


def build_document(
    pages: Sequence[PageResult], name: str, figure_links: Sequence[dict[int, str]] = ()
) -> DoclingDocument:
    """The DoclingDocument of converted pages; `figure_links` gives each page's figures'
    links (relative to where the document is written), by image block index."""
    doc = DoclingDocument(name=name)
    for index, page in enumerate(pages):
        add_page(doc, page, figure_links[index] if index < len(figure_links) else {})
    return doc
