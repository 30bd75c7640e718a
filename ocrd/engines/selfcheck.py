"""ocrd's built-in test page, and whether an engine read it.

A vLLM version can serve DeepSeek-OCR-2 and answer every request with fluent garbage
(vLLM #39919: garbled on 0.19, fine on 0.16 to 0.18). Nothing fails then: every document
would go to done/ as junk. So each replica reads this page before it gets any work, and
again after each restart or reconnection: a few lines of ordinary words and a small table,
drawn with PyMuPDF's built-in Helvetica and rendered like a page of the inbox. It passes
when at least `PASS_SHARE` of the page's words come back (in any order, any markup: the
table may come back as Markdown or HTML). A model that reads scores near 1; garbled output
shares almost no words with the page.

Servers ocrd did not start (a fleet) are sent `draw_check()`'s page instead: the same
page with its table's twelve cells drawn at random from word lists each time, judged by
those cells. A server that keeps the answer to a picture it was sent before (and garbles
the rest) fails the next check: no two checks show the same picture.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from PIL import Image

PASS_SHARE = 0.8
# Long side of the page in pixels: at most 768 px, DeepSeek-OCR-2 sees it in one 1024 px
# view (257 prompt tokens), the cheapest request; the type is still about 30 px high.
PAGE_SIDE = 768
MAX_TOKENS = 768  # about three times what the page needs

TITLE = "Harbour Museum Quarterly Report"
LINES = (
    "Visitors arrived early on Tuesday morning.",
    "The yellow lantern in the north gallery cost 48 dollars.",
    "Please return borrowed maps to the front desk.",
)
TABLE = (
    ("Item", "Count", "Price"),
    ("Apples", "12", "3.50"),
    ("Pencils", "7", "1.25"),
    ("Blankets", "30", "19.90"),
)
# The drawn check's cells: column by column, each body cell one of its column's list.
ITEMS = (
    "apples", "pencils", "blankets", "candles", "buckets", "ladders", "mirrors", "saddles",
    "kettles", "baskets", "lanterns", "hammers", "anchors", "barrels", "compasses", "ropes",
    "shovels", "teapots", "violins", "helmets", "pillows", "needles", "scissors", "wagons",
    "carpets", "bottles", "cushions", "drums", "funnels", "goblets", "harps", "jackets",
)  # fmt: skip
COUNTS = tuple(str(n) for n in range(11, 99, 3) if n % 10)[:32]
PRICES = tuple(f"{n // 100}.{n % 100:02d}" for n in range(125, 4000, 121))[:32]
COLUMNS = (ITEMS, COUNTS, PRICES)
DRAWN_ROWS = 4
WORD = re.compile(r"[a-z]+|[0-9]+(?:\.[0-9]+)?")


@dataclass(frozen=True)
class Score:
    found: int
    expected: int

    @property
    def share(self) -> float:
        return self.found / self.expected if self.expected else 0.0

    @property
    def passed(self) -> bool:
        return self.share >= PASS_SHARE


@dataclass(frozen=True)
class CheckPage:
    """A drawn check page: its picture, and the cells it shows (how it is judged)."""

    image: Image.Image
    table: tuple[tuple[str, ...], ...]

    def text(self) -> str:
        return expected_text(self.table)

    def score(self, answer: str) -> Score:
        """How many of the drawn cells the answer holds: the page's fixed words could come
        from an answer kept from an earlier check."""
        return _score(words(" ".join(" ".join(row) for row in self.table[1:])), answer)


def draw_check(draws: random.Random) -> CheckPage:
    """A check page with fresh cells: each column's words drawn without repeats."""
    picked = [draws.sample(column, DRAWN_ROWS) for column in COLUMNS]
    table = (TABLE[0], *zip(*picked, strict=True))
    return CheckPage(check_page(table), table)


def expected_text(table: tuple[tuple[str, ...], ...] = TABLE) -> str:
    """The page's text as Markdown (what a model that reads it writes, give or take)."""
    rows = ["| " + " | ".join(row) + " |" for row in table]
    rows.insert(1, "|" + "---|" * len(table[0]))
    return "\n\n".join([f"# {TITLE}", *LINES, "\n".join(rows)])


def words(text: str) -> Counter[str]:
    return Counter(WORD.findall(text.lower()))


def score(answer: str) -> Score:
    """How many of the page's words the answer holds (each counted as often as it is on the
    page); markup such as grounding tags, `|` or `<td>` is ignored."""
    return _score(words(expected_text()), answer)


def _score(want: Counter[str], answer: str) -> Score:
    got = words(_without_tags(answer))
    found = sum(min(count, got[word]) for word, count in want.items())
    return Score(found, sum(want.values()))


def _without_tags(text: str) -> str:
    text = re.sub(r"<\|det\|>.*?<\|/det\|>", " ", text, flags=re.DOTALL)  # box coordinates
    return re.sub(r"<[^>]*>", " ", text)


def check_page(table: tuple[tuple[str, ...], ...] = TABLE) -> Image.Image:
    """The page, drawn as a PDF page and rendered to at most PAGE_SIDE pixels (its text in
    one TextWriter, its rules in one Shape: each check draws a page anew, so it is cheap)."""
    import pymupdf

    width, height = 420.0, 315.0  # points, 4:3
    document = pymupdf.open()
    try:
        page = document.new_page(width=width, height=height)
        regular, bold = pymupdf.Font("helv"), pymupdf.Font("hebo")
        writer = pymupdf.TextWriter(page.rect)
        writer.append((28, 44), TITLE, font=regular, fontsize=17)
        y = 78.0
        for line in LINES:
            writer.append((28, y), line, font=regular, fontsize=12)
            y += 20
        rules = page.new_shape()
        _draw_table(writer, rules, table, (28, y + 8), (regular, bold))
        rules.finish(width=0.8, color=(0, 0, 0))
        rules.commit()
        writer.write_text(page)
        zoom = PAGE_SIDE / max(width, height)
        pixmap = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), alpha=False)
        return Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples)
    finally:
        document.close()


TABLE_WIDTHS = (110.0, 70.0, 70.0)  # points
TABLE_ROW = 21.0


def _draw_table(
    writer: Any,
    rules: Any,
    table: tuple[tuple[str, ...], ...],
    at: tuple[float, float],
    fonts: tuple[Any, Any],
) -> None:
    """The table's rules into the Shape `rules`, its cells into the TextWriter `writer`
    (the header in the second font of `fonts`)."""
    (left, top), widths, row = at, TABLE_WIDTHS, TABLE_ROW
    right = left + sum(widths)
    bottom = top + row * len(table)
    for index in range(len(table) + 1):
        rules.draw_line((left, top + index * row), (right, top + index * row))
    x = left
    for width in (0.0, *widths):
        x += width
        rules.draw_line((x, top), (x, bottom))
    for r, cells in enumerate(table):
        x = left
        for width, cell in zip(widths, cells, strict=True):
            if cell:
                font = fonts[1] if r == 0 else fonts[0]
                writer.append((x + 6, top + r * row + 15), cell, font=font, fontsize=11)
            x += width
