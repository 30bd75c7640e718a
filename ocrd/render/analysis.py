"""What a page holds, judged in the render workers: nothing (a blank page), or a text layer
good enough to stand in for recognising its pixels."""

from __future__ import annotations

import re
from typing import Any

from PIL import Image

BLANK_MARGIN = 0.03  # scanner edges and punch holes are not content
BLANK_CONTRAST = 80  # ink is this much darker than the paper (bleed-through is not)
BLANK_TILE = 16  # pixels a side
BLANK_TILE_INK = 0.05  # a tile with this share of ink holds content
BLANK_MAX_TILES = 0  # one tile of ink is content (a page number); specks of dust are not

MIN_TEXT_LAYER_WORDS = 2  # a few real words (one short line) stand in for recognising
SHORT_TEXT_LAYER_CHARACTERS = 50  # ...but a layer shorter than this only where the page
MAX_DRAWINGS_BESIDE_SHORT_TEXT = 100  # draws little else: text drawn as outlines (a path a
MAX_DRAWN_SHARE_BESIDE_SHORT_TEXT = 0.1  # glyph or a line), a chart or a form is not in it
NO_TEXT_LAYER = "no text layer"  # why a page's layer was not used: it has none
WORD = re.compile(r"[^\W\d_]{2,}")  # two letters or more, in any script
MAX_BAD_GLYPHS = 0.02  # share of unmapped or private-use characters in a usable layer
MIN_LETTER_SHARE = 0.7  # real text is 83 to 100 % letters and digits; unmapped fonts ~50 %
MAX_INVISIBLE_TEXT = 0.5  # more is an OCR layer laid under a scan by an older tool
MAX_IMAGE_COVER = 0.5  # more of the page under images: a scan, or a page made of pictures


def looks_blank(image: Image.Image) -> bool:
    """Whether a page (RGB or grey) is blank at this resolution: no tile of it holds ink
    that stands out from the paper. Bleed-through, paper tone, specks and scanner edges do
    not count; a few words or a page number do. Pillow's C code only: a few ms a page."""
    width, height = image.size
    gray = image.convert("L")
    dx, dy = int(width * BLANK_MARGIN), int(height * BLANK_MARGIN)
    inner = gray.crop((dx, dy, width - dx, height - dy)).reduce(2)
    if inner.width < BLANK_TILE or inner.height < BLANK_TILE:
        return True
    paper = _percentile(inner.histogram(), 0.9)
    ink = inner.point(lambda value: 255 if value < paper - BLANK_CONTRAST else 0)
    share = ink.reduce(BLANK_TILE // 2).histogram()  # each tile's share of ink, 0..255
    return sum(share[int(BLANK_TILE_INK * 255) + 1 :]) <= BLANK_MAX_TILES


def _percentile(histogram: list[int], share: float) -> int:
    """The value below which `share` of a histogram's pixels lie."""
    wanted, seen = share * sum(histogram), 0
    for value, count in enumerate(histogram):
        seen += count
        if seen >= wanted:
            return value
    return 255


def judge_text_layer(page: Any) -> tuple[bool, str]:
    """Whether a PDF page's text layer can stand in for recognising its pixels."""
    text = page.get_text("text")
    characters = [c for c in text if not c.isspace()]
    if not characters:
        return False, NO_TEXT_LAYER
    if len(WORD.findall(text)) < MIN_TEXT_LAYER_WORDS:
        return False, f"too little text ({len(characters)} characters, no two words)"
    bad = sum(1 for c in characters if c == "\ufffd" or "\ue000" <= c <= "\uf8ff" or c < " ")
    letters = sum(1 for c in characters if c.isalnum())
    if bad / len(characters) > MAX_BAD_GLYPHS or letters / len(characters) < MIN_LETTER_SHARE:
        return False, "garbled text: its glyphs do not map to the letters shown"
    spans = page.get_texttrace()
    total = sum(len(span["chars"]) for span in spans) or 1
    invisible = sum(len(span["chars"]) for span in spans if span["type"] == 3)
    if invisible / total > MAX_INVISIBLE_TEXT:
        return False, "invisible text: an OCR layer from another tool"
    area = page.rect.get_area() or 1.0
    covered = sum(
        (page.rect & info["bbox"]).get_area() for info in page.get_image_info()
    )  # overlapping images may count twice: erring towards recognising the pixels
    if covered / area > MAX_IMAGE_COVER:
        return False, "images cover most of the page (a scan, or a page made of pictures)"
    if len(characters) < SHORT_TEXT_LAYER_CHARACTERS and draws_much(page):
        return False, "a few words beside drawings (text drawn as outlines, a chart, a form)"
    return True, "born-digital text layer"


def draws_much(page: Any) -> bool:
    """Whether a page draws more than a rule or a small logo in vector graphics."""
    drawings = page.get_drawings()
    if len(drawings) > MAX_DRAWINGS_BESIDE_SHORT_TEXT:
        return True
    area = page.rect.get_area() or 1.0
    drawn = sum((page.rect & drawing["rect"]).get_area() for drawing in drawings)
    return bool(drawn / area > MAX_DRAWN_SHARE_BESIDE_SHORT_TEXT)
