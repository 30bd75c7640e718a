"""Test documents made with real PyMuPDF."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pymupdf


def make_pdf(path: Path, pages: int, label: str = "Page") -> Path:
    """A PDF whose page N says '<label> N' in large type (A5, so it renders quickly)."""
    doc = pymupdf.open()
    for number in range(1, pages + 1):
        page = doc.new_page(width=420, height=595)
        page.insert_text((40, 100), f"{label} {number}", fontsize=36)
        page.insert_text((40, 160), "The quick brown fox jumps over the lazy dog.", fontsize=14)
    doc.save(path)
    doc.close()
    return path


def repeated_ngrams(tokens: tuple[int, ...] | list[int], n: int) -> int:
    """How many n-grams of `tokens` repeat an earlier one."""
    counts = Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return sum(count - 1 for count in counts.values() if count > 1)
