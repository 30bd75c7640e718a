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
from ocrd.office.limits import OfficeLimits, OfficeRefused, Refusal

XML_SUFFIXES = (".xml", ".rels", ".vml")
HYPERLINK = "/hyperlink"  # an external relationship only a reader's click follows
_CELL = re.compile(rb"<(?:\w+:)?c[\s>/]")
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


def check_cells(cells: int, what: str, limits: OfficeLimits) -> None:
    if cells > limits.max_cells:
        raise OfficeRefused(
            f"too many cells: about {cells} in the {what}, more than the {limits.max_cells} "
            "ocrd converts; split it, or export the part you need",
            Refusal.too_large,
        )


def csv_cells(text: str) -> int:
    """An upper bound of a CSV text's cells, whichever delimiter it uses."""
    lines = text.count("\n") + 1
    return max(text.count(separator) + lines for separator in ",;\t|")


def check_ooxml(data: bytes, fmt: InputFormat, limits: OfficeLimits) -> None:
    """The archive's sizes, its type, and each XML part: no declarations, no external
    relationship that loads content, no more cells than the limit."""
    if zip_format(io.BytesIO(data), limits) is not fmt:
        raise OfficeRefused("it is no longer the document it was detected as", Refusal.damaged)
    cells = 0
    with list_zip(io.BytesIO(data), limits) as archive:
        for info in archive.infolist():
            if not info.filename.lower().endswith(XML_SUFFIXES):
                continue
            part = read_part(archive, info, limits.max_part_bytes)
            refuse_declarations(part, info.filename)
            if info.filename.lower().endswith(".rels"):
                refuse_external(part, info.filename)
            if fmt is InputFormat.xlsx and info.filename.startswith("xl/worksheets/"):
                cells += len(_CELL.findall(part))
                check_cells(cells, "workbook's sheets", limits)


def refuse_external(data: bytes, part: str) -> None:
    """A relationship whose target is outside the file (a linked picture, template, frame,
    OLE object or sub-document) is refused: ocrd reads nothing but the file. Hyperlinks
    are kept: they are addresses a reader may click, never loaded."""
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as error:
        raise OfficeRefused(f"its part {part} is damaged: {error}", Refusal.damaged) from None
    for relationship in root:
        if relationship.get("TargetMode", "").lower() != "external":
            continue
        kind = relationship.get("Type", "")
        if kind.endswith(HYPERLINK):
            continue
        target = relationship.get("Target", "")[:_SHOWN]
        raise OfficeRefused(
            f"its part {part} links content from outside the file ({kind.rsplit('/', 1)[-1]}: "
            f"{target!r}); ocrd reads nothing outside the document: embed it instead",
            Refusal.hostile,
        )
