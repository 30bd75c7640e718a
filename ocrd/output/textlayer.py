"""Where a page's recognised text goes in its searchable PDF: plain lines, each in a box.

Pure functions, no PDF. A page's blocks become lines of plain text (Markdown, HTML tables and
LaTeX reduced to the words a reader searches for and copies) in reading order, each with the
box it covers on the page as shown (fractions of its width and height, origin top left):

- an engine that finds lines (RapidOCR) gives one box per line: each line fills its box;
- a model that gives no positions at all (LightOnOCR-2, olmOCR-2; GLM-OCR and PaddleOCR-VL
  without their layout stage): its words are shared out over the text lines found on the
  page's image (`linefit.py`), each run filling its line; where none were found, its lines
  are stacked over the page in reading order, spread as one block;
- DeepSeek-OCR-2 gives one box per block (a paragraph, a table, a formula): the block's
  lines are wrapped into as many rows as the box holds at its estimated type size, spread
  over the box top to bottom, filled as type is set (each row as wide as the box, the last
  row of a paragraph as long as its words); a table is a row a line.

Pages taken from their own text layer, blank pages and pages without text get no lines.
"""

from __future__ import annotations

import itertools
import math
import statistics
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from ocrd.domain import PageResult, PageSource
from ocrd.output.linefit import by_reading, runs
from ocrd.text.grounding import SCALE, Block, Box
from ocrd.text.lines import TextLine, reading_order
from ocrd.text.plain import block_lines

Region = tuple[float, float, float, float]  # left, top, right, bottom as fractions (0..1)

# A character's advance over the distance between two lines of body text (about 0.5 em over
# 1.2 em); it estimates how many rows a block's text fills in its box.
ADVANCE_PER_PITCH = 0.42
MIN_PITCH_PT = 3.0  # no row is estimated smaller than this
# Where text without a box goes (plain-text prompt, text before the model's first tag):
# the page inside a margin, so that it can be found, if not pointed at.
PAGE_REGION: Region = (0.05, 0.05, 0.95, 0.95)
MAX_SKEW_SLOPE = 0.2  # about 11 degrees; boxes taller than that are not skew
MIN_WIDTH_DIFFERENCE = 0.1  # lines compared for the skew differ by a tenth of the longest
MIN_TEXT_SHARE = 0.3  # a line's text is never estimated below this share of its box
# Advances in em, about those of a common proportional face; others: 0.52, capitals 0.7,
# wide (CJK) characters 1.
EM_WIDTHS = (("ijl.,;:'!|", 0.25), ('ftrI()[]-/"', 0.35), ("mwMW", 0.85), ("0123456789", 0.55))
SPACE_EM = 0.28
SAME_TYPE = 1.3  # lines whose heights differ less are taken for one size of type
FAILED_FINISH_REASONS = frozenset({"error"})


@dataclass(frozen=True)
class PlacedLine:
    """One line of the text layer: its plain text and the box it covers on the page as shown."""

    text: str
    left: float
    top: float
    right: float
    bottom: float

    @property
    def region(self) -> Region:
        return (self.left, self.top, self.right, self.bottom)


# --- rows of a block ------------------------------------------------------------------------


def _is_wide(character: str) -> bool:
    return unicodedata.east_asian_width(character) in "WF"


def _width_units(text: str) -> int:
    """A text's width in narrow characters: wide (CJK) characters count twice, marks not."""
    return sum(0 if unicodedata.combining(c) else 2 if _is_wide(c) else 1 for c in text)


def _tokens(text: str) -> list[tuple[str, bool]]:
    """Words, each wide (CJK) character a word of its own since such text breaks between
    any two, with whether a space comes before each."""
    tokens: list[tuple[str, bool]] = []
    for word in text.split():
        pieces, run = [], ""
        for character in word:
            if _is_wide(character):
                pieces.extend([run, character] if run else [character])
                run = ""
            else:
                run += character
        pieces.extend([run] if run else [])
        tokens.extend((piece, index == 0 and bool(tokens)) for index, piece in enumerate(pieces))
    return tokens


@dataclass(frozen=True)
class Row:
    """One row of a wrapped line, and how much of the measure it fills (the last row of a
    paragraph stops short, as in type)."""

    text: str
    share: float = 1.0


def _fill(widths: Sequence[float], measure: float) -> list[int]:
    """Where rows start when tokens of `widths` fill rows of `measure` one after another."""
    starts, used = [0], 0.0
    for index, width in enumerate(widths):
        if index and used + width > measure:
            starts.append(index)
            used = 0.0
        used += width
    return starts


def wrap_filled(text: str, rows: int) -> list[Row]:
    """`text` in at most `rows` rows filled one after the other, at the narrowest measure
    that needs no more rows: full rows and a shorter last one, as a paragraph is set.
    Breaks fall between words, or between wide (CJK) characters."""
    tokens = _tokens(text)
    if not tokens:
        return []
    if rows <= 1 or len(tokens) == 1:
        return [Row(" ".join(text.split()))]
    widths = [_width_units(token) + (1 if space else 0) for token, space in tokens]
    low, high = max(max(widths), sum(widths) / rows), float(sum(widths))
    for _ in range(32):  # bisect the measure: at most `rows` rows, as narrow as can be
        middle = (low + high) / 2
        low, high = (low, middle) if len(_fill(widths, middle)) <= rows else (middle, high)
    starts = _fill(widths, high)
    filled = []
    for begin, end in zip(starts, [*starts[1:], len(tokens)], strict=True):
        row = tokens[begin:end]
        text_of_row = row[0][0] + "".join((" " if space else "") + word for word, space in row[1:])
        filled.append(Row(text_of_row, min(1.0, sum(widths[begin:end]) / high)))
    return [Row(row.text) for row in filled[:-1]] + [filled[-1]]


def row_counts(units: Sequence[int], width: float, height: float) -> list[int]:
    """How many rows each of a block's lines fills in a box `width` x `height` (points): the
    fewest rows at which every line, set at the row pitch, fits the width."""
    if not units:
        return []
    most = max(len(units), int(height / MIN_PITCH_PT))
    counts = [1] * len(units)
    for total in range(len(units), most + 1):
        pitch = height / total
        counts = [max(1, math.ceil(u * ADVANCE_PER_PITCH * pitch / width - 1e-9)) for u in units]
        if sum(counts) <= total:
            break
    return counts


def lay_out_block(
    lines: Sequence[str], region: Region, page_size: tuple[float, float], wrap: bool = True
) -> list[PlacedLine]:
    """A block's lines spread over its box, top to bottom, each row as wide as the box (the
    last row of a wrapped line as wide as its text); with `wrap`, long lines are broken into
    as many rows as the box's size suggests."""
    left, top, right, bottom = region
    width, height = (right - left) * page_size[0], (bottom - top) * page_size[1]
    lines = [line for line in lines if line.strip()]
    if not lines or width <= 0 or height <= 0:
        return []
    if wrap:
        counts = row_counts([_width_units(line) for line in lines], width, height)
        rows = [
            row
            for line, count in zip(lines, counts, strict=True)
            for row in wrap_filled(line, count)
        ]
    else:
        rows = [Row(" ".join(line.split())) for line in lines]
    pitch = (bottom - top) / len(rows)
    return [
        PlacedLine(
            row.text,
            left,
            top + index * pitch,
            left + row.share * (right - left),
            top + (index + 1) * pitch,
        )
        for index, row in enumerate(rows)
    ]


def _fractions(box: Box) -> Region:
    return (box.x1 / SCALE, box.y1 / SCALE, box.x2 / SCALE, box.y2 / SCALE)


def _share_between_boxes(lines: list[str], boxes: Sequence[Box]) -> list[list[str]]:
    """A block's lines given to its boxes in order, in proportion to the boxes' areas."""
    areas = [max((b.x2 - b.x1) * (b.y2 - b.y1), 1.0) for b in boxes]
    units = [max(_width_units(line), 1) for line in lines]
    shares: list[list[str]] = [[] for _ in boxes]
    total, seen, box = sum(units), 0, 0
    bounds = [sum(areas[: i + 1]) / sum(areas) * total for i in range(len(boxes))]
    for line, width in zip(lines, units, strict=True):
        while box < len(boxes) - 1 and seen + width / 2 > bounds[box]:
            box += 1
        shares[box].append(line)
        seen += width
    return shares


def block_placements(
    block: Block, page_size: tuple[float, float], region: Region = PAGE_REGION
) -> list[PlacedLine]:
    """A grounding block's plain lines in its boxes; a block without a box in `region`."""
    lines = block_lines(block)
    wrap = block.label != "table" and "<table" not in block.content.lower()
    if not block.boxes:
        return lay_out_block(lines, region, page_size, wrap)
    shares = _share_between_boxes(lines, block.boxes)
    return [
        placed
        for box, share in zip(block.boxes, shares, strict=True)
        for placed in lay_out_block(share, _fractions(box), page_size, wrap)
    ]


def skew_slope(lines: Sequence[TextLine]) -> float:
    """How much taller a line's box gets per unit of its width on this page: the box of a
    line on a skewed scan holds the text's height plus its width times the skew, the same
    for every line. The median of the slopes between lines of clearly different widths
    (Theil-Sen) is not thrown off by headings; never below 0, at most MAX_SKEW_SLOPE."""
    if len(lines) < 3:
        return 0.0
    longest = max(line.x1 - line.x0 for line in lines)
    slopes = sorted(
        (b.height - a.height) / ((b.x1 - b.x0) - (a.x1 - a.x0))
        for a, b in itertools.combinations(lines, 2)
        if abs((b.x1 - b.x0) - (a.x1 - a.x0)) > MIN_WIDTH_DIFFERENCE * longest
    )
    if not slopes:
        return 0.0
    return min(max(slopes[len(slopes) // 2], 0.0), MAX_SKEW_SLOPE)


def _line_placements(blocks: Sequence[Block]) -> list[PlacedLine]:
    """An engine's own text lines, in the reading order of its Markdown. Each fills its box's
    width; its height is the text's, centred in the box, so that the lines of a skewed scan
    (whose upright boxes overlap) do not run into each other."""
    lines = [
        TextLine(
            block.boxes[0].x1,
            block.boxes[0].y1,
            block.boxes[0].x2,
            block.boxes[0].y2,
            " ".join(block.content.split()),
        )
        for block in blocks
        if block.boxes and block.content.strip()
    ]
    lines = [line for line in lines if line.x1 > line.x0 and line.y1 > line.y0]
    slope = skew_slope(lines)
    placed = []
    for line in reading_order(lines):
        height = max(line.height - slope * (line.x1 - line.x0), MIN_TEXT_SHARE * line.height)
        top = line.centre_y - height / 2
        placed.append(
            PlacedLine(
                line.text, line.x0 / SCALE, top / SCALE, line.x1 / SCALE, (top + height) / SCALE
            )
        )
    return placed


@dataclass(frozen=True)
class FoundLine:
    """A text line found on a page's image: its box (fractions of the page as shown) and,
    where it was read too, its text as read."""

    region: Region
    text: str = ""


def _detected_lines(found: Sequence[FoundLine]) -> list[TextLine]:
    """Found lines as lines in 0..SCALE (their text as read, or a dash), in reading order."""
    lines = [
        TextLine(left * SCALE, top * SCALE, right * SCALE, bottom * SCALE, line.text or "-")
        for line in found
        for left, top, right, bottom in [line.region]
        if right > left and bottom > top
    ]
    return reading_order(lines)


def _em_width(text: str) -> float:
    """About how wide `text` is set, in em of a common proportional face: letters differ
    (an i is a third of an m), and a line is cut by where its words end."""
    width = 0.0
    for character in text:
        if unicodedata.combining(character):
            continue
        width += next((em for group, em in EM_WIDTHS if character in group), None) or (
            1.0 if _is_wide(character) else 0.7 if character.isupper() else 0.52
        )
    return width


def _type_heights(lines: Sequence[TextLine], slope: float) -> list[float]:
    """Each line's type height: its box's less the page's skew; the page's body height for
    every line about as tall as that (ascenders and descenders make the boxes of one size
    of type differ), its own for a heading or a footnote."""
    own = [max(ln.height - slope * (ln.x1 - ln.x0), MIN_TEXT_SHARE * ln.height) for ln in lines]
    body = statistics.median(own)
    return [body if body / SAME_TYPE <= height <= body * SAME_TYPE else height for height in own]


def _by_length(
    tokens: Sequence[Sequence[tuple[str, bool]]],
    detected: Sequence[TextLine],
    page_size: tuple[float, float],
) -> list[int]:
    """For each word (`tokens`: the model's lines' words), the found line it goes to when
    the words are cut into runs as long as the lines hold (`linefit.runs`)."""
    slope = skew_slope(detected)
    heights = _type_heights(detected, slope)
    room = [
        (line.x1 - line.x0) * page_size[0] / (height * page_size[1])
        for line, height in zip(detected, heights, strict=True)
    ]
    ends = [index == len(line) - 1 for line in tokens for index in range(len(line))]
    units = [
        _em_width(word) + (SPACE_EM if space else 0.0) for line in tokens for word, space in line
    ]
    cut = runs(units, ends, room)
    return [index for index, run in enumerate(cut) for _ in run]


def fitted_lines(
    lines: Sequence[str], found: Sequence[FoundLine], page_size: tuple[float, float]
) -> list[PlacedLine]:
    """`lines` (a page's text in reading order) shared out over the lines `found` on its
    image, each line's words filling it; none where no line was found. Where the found
    lines were read, the words both share place the model's (`linefit.by_reading`);
    otherwise runs as long as each line holds (`linefit.runs`): a line holds text in
    proportion to its width over its type's height (its box's, less the page's skew)."""
    detected = _detected_lines(found)
    tokens = [_tokens(line) for line in lines]
    # Each line's first word follows the line before it after a space.
    words = [
        (word, space or (index == 0)) for line in tokens for index, (word, space) in enumerate(line)
    ]
    if not detected or not words:
        return []
    read = any(line.text.strip() for line in found)
    ends = [index == len(line) - 1 for line in tokens for index in range(len(line))]
    line_of = (
        by_reading([word for word, _ in words], [ln.text.split() for ln in detected], ends)
        if read
        else None
    )
    if line_of is None:
        line_of = _by_length(tokens, detected, page_size)
    blocks = []
    for index, line in enumerate(detected):
        run = [word for word, at in zip(words, line_of, strict=True) if at == index]
        if run:
            text = run[0][0] + "".join((" " if space else "") + word for word, space in run[1:])
            box = Box.normalised(line.x0, line.y0, line.x1, line.y1)
            blocks.append(Block("text", (box,), text))
    return _line_placements(blocks)


def has_positions(page: PageResult) -> bool:
    """Whether any block of the page's text has a box of its own (images aside)."""
    return any(block.boxes for block in page.blocks if block_lines(block))


def wants_found_lines(page: PageResult) -> bool:
    """Whether the page's layer is placed by the lines found on its image: a page with a
    layer whose model gave no positions."""
    return wants_layer(page) and page.text.blocks is None and not has_positions(page)


def wants_layer(page: PageResult) -> bool:
    """Whether a page gets recognised text laid over it: not a page that has its own text
    layer, a blank page, or a page the engine failed on."""
    return (
        page.source is PageSource.engine
        and page.text.finish_reason not in FAILED_FINISH_REASONS
        and bool(page.text.text.strip() or page.text.blocks)
    )


def page_lines(page: PageResult, found: Sequence[FoundLine] = ()) -> list[PlacedLine]:
    """The lines of a page's text layer in reading order; none where it gets no layer.
    `found`: the text lines found on the page's image, for a model that gives no positions
    (`wants_found_lines`)."""
    if not wants_layer(page):
        return []
    if page.text.blocks is not None:  # the engine found the lines itself (RapidOCR)
        return _line_placements(page.text.blocks)
    if not has_positions(page):
        lines = [line for block in page.blocks for line in block_lines(block)]
        return fitted_lines(lines, found, page.page_size_pt) or lay_out_block(
            lines, PAGE_REGION, page.page_size_pt
        )
    return [
        placed for block in page.blocks for placed in block_placements(block, page.page_size_pt)
    ]
