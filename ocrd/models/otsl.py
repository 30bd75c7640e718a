"""OTSL tables (the cell grammar PaddleOCR-VL answers `Table Recognition:` with) as HTML.

OTSL writes a table row by row in six tags: `<fcel>` a cell with text (the text follows
it), `<ecel>` an empty cell, `<lcel>` a cell merged with the one on its left, `<ucel>`
merged with the one above, `<xcel>` merged both ways, `<nl>` the end of a row. PaddleOCR's
pipeline turns it into an HTML table (PaddleX's `convert_otsl_to_html`, as projects that
use PaddleOCR-VL describe it); ocrd does the same here, so that a table read region by
region is the HTML every output expects. A cell starts at `<fcel>` or `<ecel>`; its
colspan counts the `<lcel>`s after it in its row, its rowspan the `<ucel>`s below it in
its column. An answer that holds no OTSL tag (HTML already, or text) is left as it is.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

_TAG = re.compile(r"<(fcel|ecel|lcel|ucel|xcel|nl)>")
STARTS = ("fcel", "ecel")


def is_otsl(answer: str) -> bool:
    return _TAG.search(answer) is not None


def otsl_html(answer: str) -> str:
    """The table as HTML; the answer unchanged where it holds no OTSL."""
    rows = _rows(answer)
    if not any(rows):
        return answer
    width = max(len(row) for row in rows)
    grid = [[tag for tag, _ in row] + [""] * (width - len(row)) for row in rows]
    down = _runs(grid, lambda r, c: grid[r + 1][c] in ("ucel", "xcel"), vertical=True)
    right = _runs(grid, lambda r, c: grid[r][c + 1] in ("lcel", "xcel"), vertical=False)
    parts = ["<table>"]
    for r, row in enumerate(rows):
        parts.append("<tr>")
        for c, (tag, text) in enumerate(row):
            if tag not in STARTS:
                continue
            spans = ""
            if down[r][c] > 1:
                spans += f' rowspan="{down[r][c]}"'
            if right[r][c] > 1:
                spans += f' colspan="{right[r][c]}"'
            parts.append(f"<td{spans}>{html.escape(text.strip())}</td>")
        parts.append("</tr>")
    parts.append("</table>")
    return "".join(parts)


def _rows(answer: str) -> list[list[tuple[str, str]]]:
    """Each row's cells: their tag and the text after it, up to the next tag."""
    rows: list[list[tuple[str, str]]] = [[]]
    matches = list(_TAG.finditer(answer))
    for index, match in enumerate(matches):
        end = matches[index + 1].start() if index + 1 < len(matches) else len(answer)
        if match.group(1) == "nl":
            rows.append([])
        else:
            rows[-1].append((match.group(1), answer[match.end() : end]))
    return [row for row in rows if row]


def _runs(
    grid: list[list[str]], continues: Callable[[int, int], bool], vertical: bool
) -> list[list[int]]:
    """For each cell, how many cells its span covers downwards (or rightwards): one pass
    from the far end, so that a huge table costs its size, not its size squared."""
    height, width = len(grid), len(grid[0]) if grid else 0
    runs = [[1] * width for _ in range(height)]
    if vertical:
        for r in range(height - 2, -1, -1):
            for c in range(width):
                if continues(r, c):
                    runs[r][c] = runs[r + 1][c] + 1
    else:
        for r in range(height):
            for c in range(width - 2, -1, -1):
                if continues(r, c):
                    runs[r][c] = runs[r][c + 1] + 1
    return runs
