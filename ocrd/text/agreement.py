"""How far two readings of the same document agree (`ocrd compare`).

Each reading is ocrd's Markdown of the document. What is compared is its words: Markdown
and HTML markup, comments (ocrd's page markers and notes) and figure links are taken out,
and the rest is split into runs of letters and digits, case folded, so that two models that
read the same words agree fully however each lays them out (a table as Markdown or HTML,
a heading or bold text). Pages are matched page by page: difflib's matching is quadratic in
the worst case, so a whole book is never one sequence, and a page's words are never matched
with another page's.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import zip_longest

_COMMENTS = re.compile(r"<!--.*?-->", re.DOTALL)
_IMAGES = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_TAGS = re.compile(r"<[^>]{0,200}>")
_WORDS = re.compile(r"\w+")
# ocrd's page separator (DocumentOptions.page_separator's default), which `ocrd compare`
# writes between pages: the page after it is numbered in it.
PAGE_MARKER = re.compile(r"\n*<!-- page \d+ -->\n*")


def words(markdown: str) -> list[str]:
    """The words of a Markdown text, without markup, case folded."""
    text = _TAGS.sub(" ", _IMAGES.sub(" ", _COMMENTS.sub(" ", markdown)))
    return _WORDS.findall(text.casefold())


@dataclass(frozen=True)
class Agreement:
    """Words matched between readings A and B, and what only one of them has. Agreements
    add up: the sum over pages is the document's, over documents the sample's."""

    matched: int = 0  # words found in both, in the same order
    words_a: int = 0
    words_b: int = 0
    only_a: int = 0  # characters of A's words that B does not have there
    only_b: int = 0

    @property
    def ratio(self) -> float:
        """difflib's ratio over the words: 2 x matched / (A's words + B's words); 1.0 for
        two readings without any words."""
        total = self.words_a + self.words_b
        return 2 * self.matched / total if total else 1.0

    def __add__(self, other: Agreement) -> Agreement:
        return Agreement(
            self.matched + other.matched,
            self.words_a + other.words_a,
            self.words_b + other.words_b,
            self.only_a + other.only_a,
            self.only_b + other.only_b,
        )


def page_agreement(a: Sequence[str], b: Sequence[str]) -> Agreement:
    """The agreement of two pages' words."""
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)  # "the" is a word too
    matched, only_a, only_b = 0, 0, 0
    for tag, a_start, a_end, b_start, b_end in matcher.get_opcodes():
        if tag == "equal":
            matched += a_end - a_start
            continue
        only_a += sum(len(word) for word in a[a_start:a_end])
        only_b += sum(len(word) for word in b[b_start:b_end])
    return Agreement(matched, len(a), len(b), only_a, only_b)


def pages_of(markdown: str) -> list[str]:
    """A document's Markdown cut at ocrd's page markers."""
    return PAGE_MARKER.split(markdown)


def agreement(markdown_a: str, markdown_b: str) -> Agreement:
    """The agreement of two readings of one document, page by page."""
    total = Agreement()
    for page_a, page_b in zip_longest(pages_of(markdown_a), pages_of(markdown_b), fillvalue=""):
        total += page_agreement(words(page_a), words(page_b))
    return total


def unified_diff(markdown_a: str, markdown_b: str, name_a: str, name_b: str) -> str:
    """A unified diff of two readings, line by line, for a person to read."""
    lines = difflib.unified_diff(
        markdown_a.splitlines(keepends=True),
        markdown_b.splitlines(keepends=True),
        fromfile=name_a,
        tofile=name_b,
    )
    return "".join(line if line.endswith("\n") else f"{line}\n" for line in lines)
