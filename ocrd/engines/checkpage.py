"""A model's self-check page (ocrd/models/selfcheck.py says what it holds) drawn as a PDF
page with PyMuPDF's built-in Helvetica and rendered like a page of an inbox, at the size
the model's recipe reads it at."""

from __future__ import annotations

from PIL import Image

from ocrd.models.selfcheck import CheckText

TITLE_SIZE = 17.0
LINE_SIZE = 12.0
CELL_SIZE = 11.0
ROW_HEIGHT = 21.0
COLUMN_WIDTHS = (110.0, 70.0, 70.0)
MARGIN = 28.0


def draw_check_page(page: CheckText, long_side: int) -> Image.Image:
    """The page, rendered with `long_side` pixels on its longer side."""
    import pymupdf

    document = pymupdf.open()
    try:
        drawn = document.new_page(width=page.width_pt, height=page.height_pt)
        drawn.insert_text((MARGIN, 44), page.title, fontsize=TITLE_SIZE, fontname="helv")
        y = 78.0
        for line in page.lines:
            drawn.insert_text((MARGIN, y), line, fontsize=LINE_SIZE, fontname="helv")
            y += 20
        _draw_table(drawn, page.table, MARGIN, y + 8)
        zoom = long_side / max(page.width_pt, page.height_pt)
        pixmap = drawn.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), alpha=False)
        return Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples)
    finally:
        document.close()


def _draw_table(page: object, table: tuple[tuple[str, ...], ...], left: float, top: float) -> None:
    import pymupdf

    assert isinstance(page, pymupdf.Page)
    widths = COLUMN_WIDTHS[: len(table[0])]
    right = left + sum(widths)
    bottom = top + ROW_HEIGHT * len(table)
    for index in range(len(table) + 1):
        y = top + index * ROW_HEIGHT
        page.draw_line((left, y), (right, y), width=0.8)
    x = left
    for width in (0.0, *widths):
        x += width
        page.draw_line((x, top), (x, bottom), width=0.8)
    for r, cells in enumerate(table):
        x = left
        for width, cell in zip(widths, cells, strict=False):
            font = "hebo" if r == 0 else "helv"
            page.insert_text(
                (x + 6, top + r * ROW_HEIGHT + 15), cell, fontsize=CELL_SIZE, fontname=font
            )
            x += width
