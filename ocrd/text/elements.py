"""A page's Markdown cut into the elements a structured document is made of: headings,
paragraphs, list items, tables, formulas and code, in reading order.

The Markdown comes from a text layer (pymupdf4llm), from RapidOCR's lines, or from one of
DeepSeek-OCR-2's blocks; all are untrusted text, only ever matched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from ocrd.text.markdown import decode_entities_outside_tables, scrub_tags
from ocrd.text.tables import EMPHASIS, Grid, html_grid, is_pipe_table, pipe_grid

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LIST_ITEM = re.compile(r"^(\s*)([-*+•]|\d{1,3}[.)])\s+(.*)$")
_QUOTE = re.compile(r"^\s*>\s?")  # a block quote's marker (pymupdf4llm's footnotes)
_IMAGE_LINK = re.compile(r"^!\[[^\]]*\]\([^)]*\)$")
_FORMULA_OPEN = ("$$", "\\[")
_FORMULA_CLOSE = {"$$": "$$", "\\[": "\\]"}
_TABLE_END = re.compile(r"</table>", re.IGNORECASE)


class ElementKind(StrEnum):
    heading = "heading"
    paragraph = "paragraph"
    list_item = "list_item"
    table = "table"
    formula = "formula"
    code = "code"


@dataclass(frozen=True)
class Element:
    kind: ElementKind
    text: str
    level: int = 1  # a heading's level (1 for `#`), a list item's nesting (0 at the margin)
    ordered: bool = False  # a numbered list item
    grid: Grid | None = None  # a table's cells


def plain(text: str) -> str:
    """Inline Markdown emphasis dropped, whitespace collapsed."""
    return " ".join(EMPHASIS.sub(r"\2", text).split())


def formula_text(text: str) -> str:
    """LaTeX without its display delimiters (`\\[ \\]`, `$$`, `\\( \\)`)."""
    body = text.strip()
    for opening, closing in (("\\[", "\\]"), ("$$", "$$"), ("\\(", "\\)"), ("$", "$")):
        if body.startswith(opening) and body.endswith(closing) and len(body) >= 2 * len(opening):
            return body[len(opening) : len(body) - len(closing)].strip()
    return body


def table_element(text: str) -> Element | None:
    """A table written as HTML or as pipes; None if the text holds neither."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    if "<table" in text.lower():
        grid = html_grid(text)
    elif is_pipe_table(lines):
        grid = pipe_grid(lines)
    else:
        return None
    if not grid.cells:
        return None
    caption = " ".join(cell.text for cell in grid.cells)
    return Element(ElementKind.table, caption, grid=grid)


class _Reader:
    """Lines consumed one element at a time."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self.at = 0
        self.found: list[Element] = []

    def take_until(self, done: re.Pattern[str] | str, include: bool = True) -> list[str]:
        """Lines from here up to the first one that `done` matches (a regex, or a line that
        ends with the string); to the end if none does."""
        taken: list[str] = []
        while self.at < len(self.lines):
            line = self.lines[self.at]
            self.at += 1
            taken.append(line)
            ended = (
                done.search(line) if isinstance(done, re.Pattern) else line.rstrip().endswith(done)
            )
            if ended and (len(taken) > 1 or include):
                break
        return taken

    def read(self) -> list[Element]:
        while self.at < len(self.lines):
            line = self.lines[self.at]
            stripped = line.strip()
            if not stripped or _IMAGE_LINK.match(stripped):
                self.at += 1
            elif stripped.startswith("```"):
                self._code()
            elif stripped.startswith(_FORMULA_OPEN):
                opening = "$$" if stripped.startswith("$$") else "\\["
                body = self.take_until(_FORMULA_CLOSE[opening], include=stripped != opening)
                self.found.append(Element(ElementKind.formula, formula_text("\n".join(body))))
            elif "<table" in stripped.lower():
                body = self.take_until(_TABLE_END)
                self._table("\n".join(body))
            elif is_pipe_table(self.lines[self.at : self.at + 2]):
                body = []
                while self.at < len(self.lines) and self.lines[self.at].lstrip().startswith("|"):
                    body.append(self.lines[self.at])
                    self.at += 1
                self._table("\n".join(body))
            elif heading := _HEADING.match(stripped):
                self.at += 1
                self.found.append(
                    Element(ElementKind.heading, plain(heading.group(2)), len(heading.group(1)))
                )
            elif item := _LIST_ITEM.match(line):
                self.at += 1
                depth = len(item.group(1).expandtabs(4)) // 2
                ordered = item.group(2)[0].isdigit()
                self.found.append(
                    Element(ElementKind.list_item, plain(item.group(3)), depth, ordered)
                )
            else:
                self._paragraph()
        return [element for element in self.found if element.text or element.grid]

    def _code(self) -> None:
        body = self.take_until("```", include=False)
        self.found.append(Element(ElementKind.code, "\n".join(body[1:-1] if len(body) > 1 else [])))

    def _table(self, text: str) -> None:
        element = table_element(text)
        self.found.append(element or Element(ElementKind.paragraph, plain(text)))

    def _paragraph(self) -> None:
        """Lines up to a blank line or the start of another kind of element."""
        taken: list[str] = []
        while self.at < len(self.lines):
            line = self.lines[self.at]
            stripped = line.strip()
            starts_other = (
                not stripped
                or stripped.startswith(("```", *_FORMULA_OPEN))
                or "<table" in stripped.lower()
                or bool(_HEADING.match(stripped) or _LIST_ITEM.match(line))
            )
            if taken and starts_other:
                break
            taken.append(_QUOTE.sub("", line))
            self.at += 1
        self.found.append(Element(ElementKind.paragraph, plain(" ".join(taken))))


def elements(markdown: str) -> list[Element]:
    """The elements of a page's (or a block's) Markdown, in order; grounding tags and
    HTML entities outside tables are dealt with first."""
    text = decode_entities_outside_tables(scrub_tags(markdown))
    return _Reader(text).read()
