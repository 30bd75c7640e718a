"""A page's text layer in PDF: a content stream drawing the recognised lines invisibly
(render mode 3), each scaled to its box (font size to the box's height, horizontal scaling to
its width), in a coordinate system set once per page from its /Rotate and its visible box
(CropBox within MediaBox), so rotated and cropped pages come out right; and the page's
/Contents and /Resources changed to draw it over the page's own content, which is kept as it
is. Which text goes where is `ocrd/output/textlayer.py`'s business.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ocrd.output.pdffont import (
    DESCENT,
    GLYPH_ADVANCE,
    SPACE,
    SPACE_ADVANCE,
    TextEncoding,
    add_font,
    new_stream,
)
from ocrd.output.textlayer import PlacedLine

FONT_RESOURCE = "OcrdText"  # the font's name in a page's resources (another if taken)
# Horizontal scaling (percent) below which readers take a word's letters for overprinted
# duplicates and drop them (poppler does below 10 % of the size between two letters).
MIN_SCALE = 50.0
# A PDF page with this much text of its own is searchable already: a second layer would
# double every search hit (a stamp or a page number is less).
MIN_OWN_TEXT_CHARACTERS = 20

Rect = tuple[float, float, float, float]  # x0, y0, x1, y1 in PDF user space
Matrix = tuple[float, float, float, float, float, float]


def shown_to_user_space(visible: Rect, rotation: int) -> Matrix:
    """The matrix from the page as shown (origin bottom left, y up, in the visible box's
    units) to PDF user space, for a page turned `rotation` degrees clockwise (/Rotate)."""
    x0, y0, x1, y1 = visible
    return {
        0: (1.0, 0.0, 0.0, 1.0, x0, y0),
        90: (0.0, 1.0, -1.0, 0.0, x1, y0),
        180: (-1.0, 0.0, 0.0, -1.0, x1, y1),
        270: (0.0, -1.0, 1.0, 0.0, x0, y1),
    }[rotation % 360]


def shown_size(visible: Rect, rotation: int) -> tuple[float, float]:
    width, height = visible[2] - visible[0], visible[3] - visible[1]
    return (height, width) if rotation % 180 else (width, height)


def _number(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def text_advance(text: str, encoding: TextEncoding) -> float:
    """The width of `text` set at size 1 and no scaling."""
    spaces = sum(1 for c in text if encoding.code(c) == SPACE)
    return (spaces * SPACE_ADVANCE + (len(text) - spaces) * GLYPH_ADVANCE) / 1000


def layer_content(
    lines: Sequence[PlacedLine],
    visible: Rect,
    rotation: int,
    encoding: TextEncoding,
    resource: str = FONT_RESOURCE,
) -> bytes:
    """The content stream that draws `lines` invisibly, each line's glyphs spread evenly
    over its box: font size the box's height, horizontal scaling its width."""
    width, height = shown_size(visible, rotation)
    matrix = " ".join(_number(v) for v in shown_to_user_space(visible, rotation))
    out = [f"q {matrix} cm", "BT", "3 Tr"]
    for line in lines:
        text = line.text
        row = (line.bottom - line.top) * height
        span = (line.right - line.left) * width
        if not text or row <= 0 or span <= 0:
            continue
        advance = text_advance(text, encoding)
        # The type is as tall as the row, unless that squeezes it below MIN_SCALE (a box
        # taller than its text is wide: sideways text): then smaller, centred in the row.
        size = min(row, 100 * span / (advance * MIN_SCALE))
        scale = 100 * span / (advance * size)
        baseline = (1 - line.bottom) * height + (row - size) / 2 - DESCENT / 1000 * size
        out += [
            f"/{resource} {_number(size)} Tf {_number(scale)} Tz",
            f"1 0 0 1 {_number(line.left * width)} {_number(baseline)} Tm",
            f"<{encoding.hex(text)}> Tj",
        ]
    out += ["ET", "Q", ""]
    return "\n".join(out).encode("ascii")


# --- pages of a PDF -------------------------------------------------------------------------


def visible_box(page: Any) -> Rect:
    """The part of the page that is shown, in PDF user space: CropBox within MediaBox.

    PyMuPDF gives the MediaBox in PDF coordinates and the CropBox with its y axis turned
    over inside the MediaBox; turned back, the two are intersected as viewers do."""
    media = page.mediabox
    crop = page.cropbox
    x0, x1 = crop.x0, crop.x1
    y0, y1 = media.y1 - crop.y1, media.y1 - crop.y0
    return (max(x0, media.x0), max(y0, media.y0), min(x1, media.x1), min(y1, media.y1))


def has_own_text(page: Any) -> bool:
    text = page.get_text("text")
    return sum(1 for c in text if not c.isspace()) >= MIN_OWN_TEXT_CHARACTERS


def _reference(value: str) -> int | None:
    parts = value.split()
    return int(parts[0]) if len(parts) == 3 and parts[2] == "R" else None


def _inherited(doc: Any, xref: int, key: str) -> tuple[str, str] | None:
    """A page's value of an inheritable key, from itself or the nearest ancestor."""
    seen: set[int] = set()
    while xref and xref not in seen:
        seen.add(xref)
        kind, value = doc.xref_get_key(xref, key)
        if kind != "null":
            return kind, value
        parent_kind, parent = doc.xref_get_key(xref, "Parent")
        xref = (_reference(parent) or 0) if parent_kind == "xref" else 0
    return None


def _resources_dictionary(doc: Any, page_xref: int) -> tuple[int, str]:
    """Where the page's resources can be changed: (object, key path to the dictionary).
    Inherited resources are given to the page itself first, so its new entry cannot change
    what the page's ancestors give to other pages."""
    kind, value = doc.xref_get_key(page_xref, "Resources")
    if kind == "null":
        kind, value = _inherited(doc, page_xref, "Resources") or ("dict", "<<>>")
        doc.xref_set_key(page_xref, "Resources", value)
    if kind == "xref" and (number := _reference(value)):
        return number, ""
    return page_xref, "Resources/"


def add_font_resource(doc: Any, page_xref: int, font_xref: int) -> str:
    """Name the font in the page's /Resources /Font; the name it got (one not taken)."""
    xref, path = _resources_dictionary(doc, page_xref)
    kind, value = doc.xref_get_key(xref, path + "Font")
    if kind == "xref" and (number := _reference(value)):
        xref, path = number, ""
    elif kind == "dict":
        path += "Font/"
    else:
        doc.xref_set_key(xref, path + "Font", "<<>>")
        path += "Font/"
    reference = f"{font_xref} 0 R"
    name, suffix = FONT_RESOURCE, 1
    while True:
        kind, value = doc.xref_get_key(xref, path + name)
        if kind == "null" or value == reference:
            break
        suffix += 1
        name = f"{FONT_RESOURCE}{suffix}"
    doc.xref_set_key(xref, path + name, reference)
    return name


def add_layer(
    doc: Any, page: Any, lines: Sequence[PlacedLine], font_xref: int, encoding: TextEncoding
) -> None:
    """Draw `lines` over the page: its own content is wrapped in q/Q (so whatever state it
    leaves cannot move the text) and kept as it is; the layer comes last, on top."""
    name = add_font_resource(doc, page.xref, font_xref)
    content = layer_content(lines, visible_box(page), page.rotation, encoding, name)
    before = new_stream(doc, b"q\n")
    after = new_stream(doc, b"\nQ\n" + content)
    streams = [before, *page.get_contents(), after]
    doc.xref_set_key(page.xref, "Contents", "[" + " ".join(f"{x} 0 R" for x in streams) + "]")


def lay_text(
    doc: Any, layers: Sequence[list[PlacedLine]], only: Sequence[int] | None = None
) -> tuple[list[int], list[int]]:
    """Add each page's layer to `doc` (whose pages are the document's, in order): pages
    (1-based) that got one, and pages left alone for their own text. With `only`, exactly
    those pages get theirs."""
    encoding = TextEncoding.for_lines(line for lines in layers for line in lines)
    layered, own_text = [], []
    font_xref = 0
    for index, lines in enumerate(layers):
        if not lines or (only is not None and index + 1 not in only):
            continue
        page = doc[index]
        if only is None and has_own_text(page):
            own_text.append(index + 1)
            continue
        font_xref = font_xref or add_font(doc, encoding)
        add_layer(doc, page, lines, font_xref, encoding)
        layered.append(index + 1)
    return layered, own_text
