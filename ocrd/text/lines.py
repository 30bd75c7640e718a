"""Text lines put back into reading order: regions by XY-cut (columns at the gutters, also
where a caption crosses one), rows within a region, lines left to right; then paragraphs
and headings. The CPU engine writes its Markdown this way, and a searchable PDF's text
layer follows the same order.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class TextLine:
    x0: float
    y0: float
    x1: float
    y1: float
    text: str

    @property
    def height(self) -> float:
        return self.y1 - self.y0

    @property
    def centre_y(self) -> float:
        return (self.y0 + self.y1) / 2


def _rows(lines: Sequence[TextLine]) -> list[list[TextLine]]:
    """Lines whose vertical centres fall inside each other's span share a row."""
    rows: list[list[TextLine]] = []
    for line in sorted(lines, key=lambda item: item.centre_y):
        if rows:
            row = rows[-1]
            top = min(item.y0 for item in row)
            bottom = max(item.y1 for item in row)
            if top <= line.centre_y <= bottom:
                row.append(line)
                continue
        rows.append([line])
    return [sorted(row, key=lambda item: item.x0) for row in rows]


def _join_text(previous: str, following: str) -> str:
    if previous.endswith("-") and following[:1].islower():
        return previous[:-1] + following  # a word hyphenated across lines
    return f"{previous} {following}"


def _gaps(spans: list[tuple[float, float]], min_gap: float) -> list[float]:
    """Cut positions where no span covers an interval at least `min_gap` wide."""
    cuts = []
    spans = sorted(spans)
    reach = spans[0][1]
    for start, end in spans[1:]:
        if start - reach >= min_gap:
            cuts.append((start + reach) / 2)
        reach = max(reach, end)
    return cuts


def _split(
    lines: list[TextLine], cuts: list[float], key: Callable[[TextLine], float]
) -> list[list[TextLine]]:
    parts: list[list[TextLine]] = [[] for _ in range(len(cuts) + 1)]
    for line in lines:
        parts[bisect.bisect(cuts, key(line))].append(line)
    return [part for part in parts if part]


def _crossed_gutter(lines: list[TextLine], min_gap: float) -> tuple[float, float] | None:
    """The vertical gutter that the fewest lines cross (a few at most), with a column of at
    least three lines on each side.

    Magazine pages run a caption or a pull quote across the gutter between two columns;
    a strict cut finds no gutter there and would read the page row by row across both.
    """
    edges = sorted({x for line in lines for x in (line.x0, line.x1)})
    index = {x: position for position, x in enumerate(edges)}
    starts_ends = [0] * len(edges)
    for line in lines:
        starts_ends[index[line.x0]] += 1
        starts_ends[index[line.x1]] -= 1
    covering = itertools.accumulate(starts_ends)  # lines over the strip right of each edge
    # the last edge has no strip to its right
    strips = [(*pair, n) for pair, n in zip(itertools.pairwise(edges), covering, strict=False)]
    for allowed in sorted({crossing for *_, crossing in strips if crossing <= len(lines) // 10}):
        runs = [
            (group[0][0], group[-1][1])
            for fits, run in itertools.groupby(strips, key=lambda strip: strip[2] <= allowed)
            if fits and (group := list(run))
        ]
        gutters = [
            (left, right)
            for left, right in runs
            if right - left >= min_gap
            and sum(1 for line in lines if line.x1 <= left) >= 3
            and sum(1 for line in lines if line.x0 >= right) >= 3
        ]
        if gutters:
            return max(gutters, key=lambda gutter: gutter[1] - gutter[0])
    return None


def _columns_across(lines: list[TextLine], gutter: tuple[float, float]) -> list[list[TextLine]]:
    """Left column, right column, and the lines across the gutter: before the columns when
    they are above both (a title), after them otherwise (a caption)."""
    left = [line for line in lines if line.x1 <= gutter[0]]
    right = [line for line in lines if line.x0 >= gutter[1]]
    across = [line for line in lines if line.x1 > gutter[0] and line.x0 < gutter[1]]
    top = min(line.y0 for line in left + right)
    above = [line for line in across if line.y1 <= top]
    below = [line for line in across if line.y1 > top]
    return [part for part in (above, left, right, below) if part]


def _regions(lines: list[TextLine], body_height: float) -> list[list[TextLine]]:
    """Recursive XY-cut: columns at wide vertical gutters, bands at large horizontal gaps,
    then columns at gutters that a few lines cross."""
    columns = _gaps([(line.x0, line.x1) for line in lines], 0.5 * body_height)
    if columns:
        parts = _split(lines, columns, lambda line: line.x0)
    elif bands := _gaps([(line.y0, line.y1) for line in lines], 0.6 * body_height):
        parts = _split(lines, bands, lambda line: line.y0)
    elif gutter := _crossed_gutter(lines, 0.5 * body_height):
        parts = _columns_across(lines, gutter)
    else:
        return [lines]
    return [region for part in parts for region in _regions(part, body_height)]


def _paragraphs(lines: list[TextLine], body_height: float) -> list[str]:
    """Rows of one region joined into paragraphs; rows in much larger type become headings.

    A paragraph ends at a larger gap than usual, or after a sentence that stops well short
    of the region's right edge (scans often have no extra space between paragraphs).
    """
    rows = _rows(lines)
    gaps = [
        min(item.y0 for item in below) - max(item.y1 for item in above)
        for above, below in itertools.pairwise(rows)
    ]
    paragraph_gap = max(statistics.median(gaps) if gaps else 0.0, 0.0) + 0.5 * body_height
    left = min(line.x0 for line in lines)
    right = max(line.x1 for line in lines)
    blocks: list[str] = []
    current = ""
    ended_short = False  # the previous row ended a sentence well before the right margin
    for index, row in enumerate(rows):
        text = " ".join(item.text.strip() for item in row)
        if statistics.median(item.height for item in row) >= 1.6 * body_height and len(text) <= 120:
            blocks.extend([current] if current else [])
            blocks.append(f"## {text}")
            current = ""
        elif not current or (index > 0 and gaps[index - 1] > paragraph_gap) or ended_short:
            blocks.extend([current] if current else [])
            current = text
        else:
            current = _join_text(current, text)
        ended_short = text.endswith((".", "!", "?", ":")) and row[-1].x1 < right - 0.25 * (
            right - left
        )
    return [*blocks, current] if current else blocks


def lines_to_markdown(lines: Sequence[TextLine]) -> str:
    """OCR lines as Markdown paragraphs in reading order: regions found by XY-cut, each read
    top to bottom, columns left to right."""
    lines = [line for line in lines if line.text.strip()]
    if not lines:
        return ""
    body_height = statistics.median(line.height for line in lines)
    return "\n\n".join(
        block
        for region in _regions(lines, body_height)
        for block in _paragraphs(region, body_height)
    )


def reading_order(lines: Sequence[TextLine]) -> list[TextLine]:
    """The lines in the order `lines_to_markdown` reads them: regions by XY-cut, each row by
    row, a row left to right (what a searchable PDF's text layer follows)."""
    lines = [line for line in lines if line.text.strip()]
    if not lines:
        return []
    body_height = statistics.median(line.height for line in lines)
    return [
        line for region in _regions(lines, body_height) for row in _rows(region) for line in row
    ]
