"""What an office document or web page must not hold, checked in the render worker before
docling parses a byte of it: an archive that unpacks too far, XML that declares entities,
macros, parts that point outside the file, more cells than a limit.

docling is also told never to fetch anything (`read.py`); these checks refuse a file that
tries, with the reason, rather than convert it quietly without what it points at.
"""

from __future__ import annotations

import io
import re
from xml.etree import ElementTree

from ocrd.domain import InputFormat
from ocrd.office.detect import list_zip, read_part, refuse_declarations, zip_format
from ocrd.office.limits import OfficeLimits, OfficeRefusal, OfficeRefused
from ocrd.office.shape import (
    check_elements,
    check_html_depth,
    check_html_elements,
    check_markdown_depth,
    check_markdown_elements,
)

XML_SUFFIXES = (".xml", ".rels", ".vml")
# External relationships no reader loads: a hyperlink (followed by a reader's click) and
# the template Word was made from (Word's own `C:\\...\\Normal.dotm` in many a file).
NEVER_LOADED = ("/hyperlink", "/attachedTemplate")
_CELL = re.compile(rb"<(?:\w+:)?c[\s>/]")
_CELL_REFERENCE = re.compile(rb'<(?:\w+:)?c\s[^>]*?\br="([A-Z]{1,3})([0-9]{1,7})"')
_MERGED_END = re.compile(
    rb'<(?:\w+:)?mergeCell\s[^>]*?\bref="[A-Z$0-9]*:\$?([A-Z]{1,3})\$?([0-9]{1,7})"'
)
_HTML_CELL = re.compile(rb"<t[dh][\s>/]", re.IGNORECASE)
_SHOWN = 80


def check_document(data: bytes, fmt: InputFormat, limits: OfficeLimits) -> None:
    """OfficeRefused where the file must not be converted."""
    if fmt in (InputFormat.docx, InputFormat.pptx, InputFormat.xlsx):
        check_ooxml(data, fmt, limits)
    elif fmt is InputFormat.csv:
        check_cells(csv_cells(data.decode("utf-8", "replace")), "CSV file", limits)
    elif fmt is InputFormat.html:
        check_cells(len(_HTML_CELL.findall(data)), "web page's tables", limits)
        check_html_depth(data, limits)
        check_html_elements(data, limits)
    elif fmt is InputFormat.md:
        check_markdown_depth(data, limits)
        check_markdown_elements(data, limits)


def check_cells(cells: int, what: str, limits: OfficeLimits) -> None:
    if cells > limits.max_cells:
        raise OfficeRefused(
            f"too many cells: about {cells} in the {what}, more than the {limits.max_cells} "
            "ocrd converts; split it, or export the part you need",
            OfficeRefusal.too_large,
        )


def csv_cells(text: str) -> int:
    """An upper bound of a CSV text's cells, whichever delimiter it uses."""
    lines = text.count("\n") + 1
    return max(text.count(separator) + lines for separator in ",;\t|")


def check_ooxml(data: bytes, fmt: InputFormat, limits: OfficeLimits) -> None:
    """The archive's sizes, its type, and each XML part: no declarations, no external
    relationship that loads content, no more cells or elements than the limits."""
    if zip_format(io.BytesIO(data), limits) is not fmt:
        raise OfficeRefused(
            "it is no longer the document it was detected as", OfficeRefusal.damaged
        )
    cells = elements = 0
    with list_zip(io.BytesIO(data), limits) as archive:
        for info in archive.infolist():
            if not info.filename.lower().endswith(XML_SUFFIXES):
                continue
            part = read_part(archive, info, limits.max_part_bytes)
            refuse_declarations(part, info.filename)
            elements = check_elements(part, info.filename, elements, limits)
            if info.filename.lower().endswith(".rels"):
                refuse_external(part, info.filename)
            if fmt is InputFormat.xlsx and info.filename.startswith("xl/worksheets/"):
                cells += len(_CELL.findall(part))
                check_cells(cells, "workbook's sheets", limits)
                check_grid(part, info.filename, limits)


def column_number(letters: bytes) -> int:
    number = 0
    for letter in letters:
        number = number * 26 + letter - ord("A") + 1
    return number


def check_grid(sheet: bytes, part: str, limits: OfficeLimits) -> None:
    """A sheet's cells and merged ranges must not reach further than `max_sheet_grid`
    cells from its corner (one cell at XFD1048576 makes a reader walk 17 billion)."""
    rows, columns = 0, 0
    for pattern in (_CELL_REFERENCE, _MERGED_END):
        for letters, digits in pattern.findall(sheet):
            rows, columns = max(rows, int(digits)), max(columns, column_number(letters))
    if rows * columns > limits.max_sheet_grid:
        raise OfficeRefused(
            f"its sheet {part} reaches row {rows} and column {columns}, a grid of "
            f"{rows * columns} cells, more than the {limits.max_sheet_grid} ocrd converts: "
            "too many cells",
            OfficeRefusal.too_large,
        )


def refuse_external(data: bytes, part: str) -> None:
    """A relationship whose target is outside the file (a linked picture, template, frame,
    OLE object or sub-document) is refused: ocrd reads nothing but the file. Hyperlinks
    and the template's name are kept: no reader loads them (python-docx and python-pptx
    never open an external target)."""
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as error:
        raise OfficeRefused(f"its part {part} is damaged: {error}", OfficeRefusal.damaged) from None
    for relationship in root:
        if relationship.get("TargetMode", "").lower() != "external":
            continue
        kind = relationship.get("Type", "")
        if kind.endswith(NEVER_LOADED):
            continue
        target = relationship.get("Target", "")[:_SHOWN]
        raise OfficeRefused(
            f"its part {part} links content from outside the file ({kind.rsplit('/', 1)[-1]}: "
            f"{target!r}); ocrd reads nothing outside the document: embed it instead",
            OfficeRefusal.hostile,
        )
