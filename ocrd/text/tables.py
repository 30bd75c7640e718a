"""Tables as grids of cells: an HTML table as DeepSeek-OCR-2 writes it (spans included), or a
Markdown pipe table as a text layer's Markdown holds it. Each cell knows the rows and columns
it covers, so a reader that lays cells on a grid (DoclingDocument's table items) gets the
table's shape, not only its text."""

from __future__ import annotations

import re
from dataclasses import dataclass
from html.parser import HTMLParser

MAX_SPAN = 1000  # a span larger than this is the model's noise, not a table
EMPHASIS = re.compile(r"(\*\*|__)(.+?)\1")  # bold or strong: its markers dropped
_PIPE_RULE = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?\s*$")


@dataclass(frozen=True)
class Cell:
    """One cell: its text and the rows and columns it covers (end exclusive)."""

    text: str
    row: int
    column: int
    row_span: int = 1
    column_span: int = 1
    header: bool = False


@dataclass(frozen=True)
class Grid:
    cells: tuple[Cell, ...]
    rows: int
    columns: int


@dataclass
class _RawCell:
    text: list[str]
    row_span: int
    column_span: int
    header: bool


def _span(value: str | None) -> int:
    try:
        return min(max(int(value or "1"), 1), MAX_SPAN)
    except ValueError:
        return 1


class _HtmlTable(HTMLParser):
    """Rows of raw cells from the first table; nested tables' text goes into their cell."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[_RawCell]] = []
        self._cell: _RawCell | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._depth += 1
        if self._depth > 1:  # a table inside a cell: its text belongs to that cell
            if tag in ("td", "th", "br") and self._cell is not None:
                self._cell.text.append(" ")
            return
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            if not self.rows:
                self.rows.append([])
            named = dict(attrs)
            self._cell = _RawCell(
                [], _span(named.get("rowspan")), _span(named.get("colspan")), tag == "th"
            )
            self.rows[-1].append(self._cell)
        elif tag == "br" and self._cell is not None:
            self._cell.text.append(" ")

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self._depth -= 1
        elif tag in ("td", "th") and self._depth == 1:
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.text.append(data)


def _laid_out(rows: list[list[_RawCell]]) -> Grid:
    """Cells placed on a grid: each row's cells take the next columns not covered by a cell
    spanning down from a row above."""
    taken: set[tuple[int, int]] = set()
    cells: list[Cell] = []
    for row_index, row in enumerate(rows):
        column = 0
        for raw in row:
            while (row_index, column) in taken:
                column += 1
            row_span = min(raw.row_span, len(rows) - row_index)
            for r in range(row_index, row_index + row_span):
                for c in range(column, column + raw.column_span):
                    taken.add((r, c))
            text = " ".join("".join(raw.text).split())
            cells.append(Cell(text, row_index, column, row_span, raw.column_span, raw.header))
            column += raw.column_span
    columns = max((c + 1 for _, c in taken), default=0)
    return Grid(tuple(cells), len(rows), columns)


def html_grid(table: str) -> Grid:
    """The grid of an HTML table (also one cut off: what there is of it)."""
    reader = _HtmlTable()
    reader.feed(table)
    reader.close()
    rows = [row for row in reader.rows if row]
    grid = _laid_out(rows)
    if rows and not any(cell.header for cell in grid.cells):  # the model's first row heads it
        grid = Grid(
            tuple(
                Cell(c.text, c.row, c.column, c.row_span, c.column_span, c.row == 0)
                for c in grid.cells
            ),
            grid.rows,
            grid.columns,
        )
    return grid


def is_pipe_table(lines: list[str]) -> bool:
    """Whether the lines are a Markdown pipe table: a header row, a rule, rows."""
    return (
        len(lines) >= 2 and lines[0].lstrip().startswith("|") and bool(_PIPE_RULE.match(lines[1]))
    )


def _pipe_cells(line: str) -> list[str]:
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    cells = re.split(r"(?<!\\)\|", body)
    return [" ".join(EMPHASIS.sub(r"\2", cell.replace("\\|", "|")).split()) for cell in cells]


def pipe_grid(lines: list[str]) -> Grid:
    """The grid of a pipe table (its rule line left out; the first row is its header)."""
    rows = [_pipe_cells(line) for index, line in enumerate(lines) if index != 1]
    columns = max((len(row) for row in rows), default=0)
    cells = tuple(
        Cell(text, r, c, header=r == 0) for r, row in enumerate(rows) for c, text in enumerate(row)
    )
    return Grid(cells, len(rows), columns)
