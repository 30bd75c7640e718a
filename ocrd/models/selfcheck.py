"""A self-check page's content, and how a model's answer to it is judged.

The page is a few lines of ordinary words and a small table (drawn by the engines with
PyMuPDF). A model that reads returns nearly all of its words; a model that is served
wrong (vLLM #39919: fluent garbage) returns almost none. The answer is judged after the
model's own parser has made blocks of it, so its markup (grounding tags, front matter,
JSON) never counts, in any model's format.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from ocrd.text.grounding import Block

WORD = re.compile(r"[a-z]+|[0-9]+(?:\.[0-9]+)?")
_HTML_TAG = re.compile(r"<[^>]*>")


@dataclass(frozen=True)
class CheckText:
    """What the test page says; `width_pt` x `height_pt` is its size as a PDF page."""

    title: str
    lines: tuple[str, ...]
    table: tuple[tuple[str, ...], ...]
    width_pt: float = 420.0
    height_pt: float = 315.0

    def expected_text(self) -> str:
        """The page as Markdown: what a model that reads it writes, give or take."""
        rows = ["| " + " | ".join(row) + " |" for row in self.table]
        rows.insert(1, "|" + "---|" * len(self.table[0]))
        return "\n\n".join([f"# {self.title}", *self.lines, "\n".join(rows)])

    def pixel_size(self, long_side: int) -> tuple[int, int]:
        """The page's size in pixels when rendered with `long_side` pixels on its longer
        side (PyMuPDF rounds a zoomed page's size down)."""
        zoom = long_side / max(self.width_pt, self.height_pt)
        return int(self.width_pt * zoom), int(self.height_pt * zoom)


# ocrd's test page (the same words as ocrd/engines/selfcheck.py draws).
HARBOUR_PAGE = CheckText(
    title="Harbour Museum Quarterly Report",
    lines=(
        "Visitors arrived early on Tuesday morning.",
        "The yellow lantern in the north gallery cost 48 dollars.",
        "Please return borrowed maps to the front desk.",
    ),
    table=(
        ("Item", "Count", "Price"),
        ("Apples", "12", "3.50"),
        ("Pencils", "7", "1.25"),
        ("Blankets", "30", "19.90"),
    ),
)


def markdown_text(blocks: Sequence[Block], figure: str = "![image](image_{n}.png)") -> str:
    """Blocks as plain Markdown (a block's content is Markdown already, a heading's `#`
    included), figures as links (`figure` with their number); one paragraph each."""
    parts, figures = [], 0
    for block in blocks:
        if block.label == "image":
            figures += 1
            parts.append(figure.format(n=figures))
        else:
            parts.append(block.content)
    return "\n\n".join(parts) + "\n"


def page_blocks(page: CheckText) -> list[Block]:
    """The test page as the blocks a model that reads it makes: its title, its lines, its
    table (as Markdown), each with the box it has on the page (roughly)."""
    from ocrd.text.grounding import Box

    rows = ["| " + " | ".join(row) + " |" for row in page.table]
    rows.insert(1, "|" + "---|" * len(page.table[0]))
    blocks = [Block("title", (Box.normalised(60, 60, 700, 140),), f"# {page.title}")]
    for index, line in enumerate(page.lines):
        top = 200 + index * 60
        blocks.append(Block("text", (Box.normalised(60, top, 940, top + 50),), line))
    blocks.append(Block("table", (Box.normalised(60, 420, 700, 900),), "\n".join(rows)))
    return blocks


@dataclass(frozen=True)
class CheckScore:
    found: int
    expected: int
    pass_share: float

    @property
    def share(self) -> float:
        return self.found / self.expected if self.expected else 0.0

    @property
    def passed(self) -> bool:
        return self.share >= self.pass_share


def words(text: str) -> Counter[str]:
    return Counter(WORD.findall(text.lower()))


def score_blocks(page: CheckText, blocks: Sequence[Block], pass_share: float = 0.8) -> CheckScore:
    """How many of the page's words the blocks hold, each counted as often as it is on the
    page; HTML markup (a table's `<td>`) is ignored."""
    want = words(page.expected_text())
    got = words(" ".join(_HTML_TAG.sub(" ", block.content) for block in blocks))
    found = sum(min(count, got[word]) for word, count in want.items())
    return CheckScore(found, sum(want.values()), pass_share)
