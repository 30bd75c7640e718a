"""A page's Markdown, as models that answer in plain Markdown write it, cut into blocks.

DeepSeek-OCR-2 labels its own blocks; LightOnOCR and olmOCR write Markdown only, so the
labels come from the Markdown: a `#` heading is the page's `title`, deeper headings are
`sub_title`s, an HTML or pipe table is a `table`, a display formula (`$$ … $$`,
`\\[ … \\]`) an `equation`, an image link on a line of its own an `image` (its box, where
the model gives one, read by the caller's `ImageBoxes`), everything else `text`, one block
per paragraph. The answer is untrusted: it is only ever matched, line by line, with
patterns that cannot backtrack; an unclosed table, formula or code fence runs to the end.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ocrd.text.grounding import SCALE, Block, Box

# An image link alone on its line: the alt text, the target, and what follows it.
IMAGE_LINE = re.compile(r"^\s*!\[([^\]\n]{0,2000})\]\(([^)\s]{0,2000})\)(.*)$")
_HEADING = re.compile(r"^(#{1,6})\s+\S")
_TABLE_START = re.compile(r"<table\b", re.IGNORECASE)
_TABLE_END = re.compile(r"</table\s*>", re.IGNORECASE)
_PIPE_RULE = re.compile(r"^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$")
_FORMULA_CLOSE = {"$$": "$$", "\\[": "\\]"}

# A model's way of placing an image: its link's target and the rest of its line give a
# box (None where they give none, or one that makes no sense).
ImageBoxes = Callable[[str, str], Box | None]


def no_boxes(target: str, rest: str) -> Box | None:
    return None


def thousandths_box(a: float, b: float, c: float, d: float) -> Box:
    """A box in coordinates normalised to 0..1000, in ocrd's 0..999 (clamped, ordered)."""
    return Box.normalised(a * SCALE / 1000, b * SCALE / 1000, c * SCALE / 1000, d * SCALE / 1000)


@dataclass
class _Lines:
    lines: list[str]
    at: int = 0

    def more(self) -> bool:
        return self.at < len(self.lines)

    def peek(self, offset: int = 0) -> str:
        index = self.at + offset
        return self.lines[index] if index < len(self.lines) else ""

    def take(self) -> str:
        self.at += 1
        return self.lines[self.at - 1]

    def take_through(self, ends: Callable[[str], bool]) -> list[str]:
        """Lines up to and including the first one (after the current) that `ends`
        accepts; to the end if none does."""
        taken = [self.take()]
        while self.more():
            taken.append(self.take())
            if ends(taken[-1]):
                break
        return taken


def markdown_blocks(markdown: str, image_boxes: ImageBoxes = no_boxes) -> list[Block]:
    """The Markdown's blocks in reading order."""
    return list(_blocks(_Lines(markdown.splitlines()), image_boxes))


def _blocks(lines: _Lines, image_boxes: ImageBoxes) -> Iterator[Block]:
    paragraph: list[str] = []

    def flush() -> Iterator[Block]:
        text = "\n".join(paragraph).strip("\n")
        paragraph.clear()
        if text.strip():
            yield Block("text", (), text)

    while lines.more():
        line = lines.peek()
        block = _special(lines, image_boxes)
        if block is None:
            if line.strip():
                paragraph.append(lines.take())
            else:
                lines.take()
                yield from flush()
            continue
        yield from flush()
        yield block
    yield from flush()


def _special(lines: _Lines, image_boxes: ImageBoxes) -> Block | None:
    """The block that starts at the current line, if it is not part of a paragraph;
    its lines are consumed."""
    line = lines.peek()
    stripped = line.strip()
    if stripped.startswith("```"):
        body = lines.take_through(lambda last: last.strip().startswith("```"))
        return Block("text", (), "\n".join(body))
    if start := _TABLE_START.search(line):
        if _TABLE_END.search(line, start.end()):
            return Block("table", (), lines.take().strip())
        body = lines.take_through(lambda last: bool(_TABLE_END.search(last)))
        return Block("table", (), "\n".join(body).strip())
    if stripped.startswith(("$$", "\\[")):
        return _formula(lines, stripped)
    if stripped.startswith("|") and _PIPE_RULE.match(lines.peek(1)):
        body = [lines.take()]
        while lines.more() and lines.peek().lstrip().startswith("|"):
            body.append(lines.take())
        return Block("table", (), "\n".join(body))
    if heading := _HEADING.match(stripped):
        label = "title" if len(heading.group(1)) == 1 else "sub_title"
        return Block(label, (), lines.take().strip())
    if image := IMAGE_LINE.match(line):
        lines.take()
        box = image_boxes(image.group(2), image.group(3).strip())
        return Block("image", (box,) if box else (), image.group(1).strip())
    return None


def _formula(lines: _Lines, stripped: str) -> Block:
    opening = "$$" if stripped.startswith("$$") else "\\["
    closing = _FORMULA_CLOSE[opening]
    if stripped != opening and stripped[len(opening) :].rstrip().endswith(closing):
        return Block("equation", (), lines.take().strip())
    body = lines.take_through(lambda last: last.rstrip().endswith(closing))
    return Block("equation", (), "\n".join(body).strip())
