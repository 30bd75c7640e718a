"""Parsing DeepSeek-OCR-2's grounding output into blocks: label, boxes, content.

In layout mode the model writes `<|ref|>LABEL<|/ref|><|det|>[[x1, y1, x2, y2], ...]<|/det|>`
before each block's Markdown. Coordinates are normalised to 0..999 over the image the model
saw. The text is untrusted: a page can make the model write anything, so it is only ever
matched, never evaluated, and every malformation is tolerated: unknown labels, several
boxes in one tag, coordinates out of range or inverted, missing or unclosed tags, text
before the first tag, and output cut off in the middle of a block.

A page has at most `MAX_BLOCKS` blocks: a real answer cannot have more (a block costs at
least a dozen tokens of tags, and a page at most `max_tokens`, 8192 by default, about 600
blocks). What a page writes after that many is kept as the text of one last block (its
tags removed when it is written), not split further.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCALE = 999  # the model's coordinates run from 0 to 999 on each axis
MAX_BLOCKS = 2000

_TAG = re.compile(r"(<\|/?ref\|>|<\|/?det\|>)")
_NUMBER = r"\s*(-?\d+(?:\.\d+)?)\s*"
_BOX = re.compile(r"\[" + ",".join([_NUMBER] * 4) + r"\]")
_LABEL_CHARACTERS = re.compile(r"[^a-z0-9_\- ]")


@dataclass(frozen=True)
class Box:
    """A box in the model's 0..999 coordinates, clamped and ordered (x1 <= x2, y1 <= y2)."""

    x1: float
    y1: float
    x2: float
    y2: float

    @classmethod
    def normalised(cls, a: float, b: float, c: float, d: float) -> Box:
        def clamp(value: float) -> float:
            return min(max(value, 0.0), float(SCALE))

        x1, x2 = sorted((clamp(a), clamp(c)))
        y1, y2 = sorted((clamp(b), clamp(d)))
        return cls(x1, y1, x2, y2)

    @classmethod
    def from_pixels(
        cls, x0: float, y0: float, x1: float, y1: float, width: float, height: float
    ) -> Box:
        """A box measured in pixels of an image of the given size (RapidOCR's lines)."""
        return cls.normalised(
            x0 / width * SCALE, y0 / height * SCALE, x1 / width * SCALE, y1 / height * SCALE
        )

    def scaled(self, width: float, height: float) -> tuple[float, float, float, float]:
        """The box in units of an image or page of the given size."""
        return (
            self.x1 / SCALE * width,
            self.y1 / SCALE * height,
            self.x2 / SCALE * width,
            self.y2 / SCALE * height,
        )


@dataclass(frozen=True)
class Block:
    label: str
    boxes: tuple[Box, ...]
    content: str


def parse_boxes(text: str) -> tuple[Box, ...]:
    return tuple(
        Box.normalised(*(float(group) for group in match.groups())) for match in _BOX.finditer(text)
    )


def clean_label(text: str) -> str:
    label = _LABEL_CHARACTERS.sub("", text.strip().lower())[:40].strip()
    return label or "text"


def parse_page(raw: str, max_blocks: int = MAX_BLOCKS) -> list[Block]:
    """Blocks in the order the model wrote them; text outside any tag is a `text` block;
    from block `max_blocks` on, the rest of the text is one last `text` block."""
    blocks: list[Block] = []
    boxes: tuple[Box, ...] = ()
    label, content = "text", ""
    state = "content"  # or "label" (inside ref) or "det" (inside det)
    pending = ""  # text of the tag being read

    def finish_block() -> None:
        nonlocal label, boxes, content
        if content.strip() or boxes or label != "text":
            blocks.append(Block(label, boxes, content.strip("\n")))
        label, boxes, content = "text", (), ""

    parts = _TAG.split(raw)
    for index, part in enumerate(parts):
        if part == "<|ref|>":
            if state == "det":  # an unclosed det tag
                found, rest = _split_unclosed_det(pending)
                boxes, content = boxes + found, content + rest
            finish_block()
            if len(blocks) >= max_blocks - 1:  # the rest as it is, in one last block
                blocks.append(Block("text", (), "".join(parts[index:])))
                return blocks
            state, pending = "label", ""
        elif part == "<|/ref|>":
            if state == "label":
                label = clean_label(pending)
            state, pending = "content", ""
        elif part == "<|det|>":
            if state == "label":  # <|/ref|> missing: the label ends here
                label = clean_label(pending)
            state, pending = "det", ""
        elif part == "<|/det|>":
            if state == "det":
                boxes = boxes + parse_boxes(pending)
            state, pending = "content", ""
        elif state == "content":
            content += part
        else:
            pending += part

    if state == "label":  # cut off inside a label: what follows the first line is content
        first, _, rest = pending.partition("\n")
        label, content = clean_label(first), rest
    elif state == "det":
        found, rest = _split_unclosed_det(pending)
        boxes, content = boxes + found, content + rest
    finish_block()
    return blocks


def _split_unclosed_det(text: str) -> tuple[tuple[Box, ...], str]:
    """Boxes up to the last "]" of a det tag that never closed; what follows is content."""
    end = text.rfind("]")
    if end < 0:
        return (), ""  # cut off inside the coordinates
    return parse_boxes(text[: end + 1]), text[end + 1 :]
