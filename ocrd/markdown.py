"""From the engine's page texts to one Markdown document.

In layout mode DeepSeek-OCR-2 writes each block as `<|ref|>LABEL<|/ref|><|det|>[[boxes]]<|/det|>`
followed by its Markdown. The text is untrusted (a page can make the model write anything),
so it is only ever matched by patterns, never evaluated.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_GROUNDING = re.compile(r"<\|ref\|>.*?<\|/ref\|>\s*(?:<\|det\|>.*?<\|/det\|>)?", re.DOTALL)
_STRAY_TAG = re.compile(r"<\|/?(?:ref|det|grounding)\|>|<｜[^｜]{1,40}｜>")
_BLANK_LINES = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")


def clean_page(text: str) -> str:
    """Drop grounding tags and model control tokens; keep the Markdown between them."""
    text = _GROUNDING.sub("\n", text)
    text = _STRAY_TAG.sub("", text)
    text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()


def join_pages(pages: Sequence[str], separator: str) -> str:
    """One document: page texts joined by `separator`, where `{page}` is the next page's number."""
    parts: list[str] = []
    for number, text in enumerate(pages, start=1):
        if number > 1:
            parts.append(separator.replace("{page}", str(number)))
        parts.append(clean_page(text))
    return "".join(parts).strip() + "\n"
