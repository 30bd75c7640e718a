"""olmOCR-Bench's unit tests applied to a Markdown text: present, absent, order, table, math,
baseline. Written for ocrd from the test definitions in its `dataset.jsonl` (field names and
meanings), not from its code.

Texts are compared after normalising both sides: Unicode NFKC, typographic quotes and
dashes made plain, Markdown emphasis and heading marks removed, whitespace collapsed, and
lowercase unless a test is case-sensitive. `max_diffs` allows that many edits (Levenshtein)
between the test's text and some stretch of the page. Math tests are checked on the LaTeX
itself, normalised (spacing, `\\left`/`\\right`, braces around single symbols, `\\mathrm`):
olmOCR-Bench renders both sides with KaTeX and compares the pictures, which this does not
do, so a math pass here means the same LaTeX, a stricter test.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

_PLAIN = str.maketrans(
    {"‘": "'", "’": "'", "“": '"', "”": '"', "–": "-", "—": "-", "−": "-", "\u00a0": " "}
)


def normalise(text: str, case_sensitive: bool = False) -> str:
    text = unicodedata.normalize("NFKC", text).translate(_PLAIN)
    text = re.sub(r"<br\s*/?>", " ", text)
    text = re.sub(r"[*_#`]+", "", text)
    text = re.sub(r"\s+", " ", text).strip()
    return text if case_sensitive else text.lower()


def find(pattern: str, text: str, max_diffs: int = 0) -> int | None:
    """Where `pattern` ends in `text` with at most `max_diffs` edits (the end of the
    best match), or None. Sellers' algorithm: edit distance to any substring."""
    if not pattern:
        return 0
    exact = text.find(pattern)
    if exact >= 0:
        return exact + len(pattern)
    if max_diffs <= 0:
        return None
    previous = list(range(len(pattern) + 1))
    best: tuple[int, int] | None = None
    for end, character in enumerate(text, start=1):
        current = [0]
        for index, wanted in enumerate(pattern, start=1):
            cost = 0 if wanted == character else 1
            current.append(min(previous[index - 1] + cost, previous[index] + 1, current[-1] + 1))
        if current[-1] <= max_diffs and (best is None or current[-1] < best[0]):
            best = (current[-1], end)
            if best[0] == 0:
                break
        previous = current
    return best[1] if best else None


class _Tables(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self.tables:
            if not self.tables[-1]:
                self.tables[-1].append([])
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def tables(markdown: str) -> list[list[list[str]]]:
    """Every table in the text, pipe tables and HTML tables, as rows of cell texts."""
    found: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*markdown.splitlines(), ""]:
        stripped = line.strip()
        if stripped.startswith("|"):
            cells = [cell.strip() for cell in stripped.strip("|").split("|")]
            if not all(re.fullmatch(r":?-{2,}:?", cell) or not cell for cell in cells):
                rows.append(cells)
            continue
        if rows:
            found.append(rows)
            rows = []
    parser = _Tables()
    parser.feed(markdown)
    return found + [table for table in parser.tables if table]


def _latex(text: str) -> str:
    text = re.sub(r"\\(left|right|mathrm|displaystyle|,|;|!|quad)", "", text)
    text = re.sub(r"\{(\\?[A-Za-z0-9])\}", r"\1", text)
    return re.sub(r"\s+", "", text)


@dataclass
class Outcome:
    passed: bool
    why: str = ""


def check(test: dict[str, Any], markdown: str) -> Outcome:
    kind = test["type"]
    case = bool(test.get("case_sensitive", False))
    text = normalise(markdown, case)
    diffs = int(test.get("max_diffs", 0))
    if kind in ("present", "absent"):
        region = text
        if test.get("first_n"):
            region = text[: int(test["first_n"])]
        if test.get("last_n"):
            region = text[-int(test["last_n"]) :]
        found = find(normalise(test["text"], case), region, diffs) is not None
        passed = found if kind == "present" else not found
        return Outcome(passed, "" if passed else f"{kind}: {test['text'][:60]!r}")
    if kind == "order":
        before = find(normalise(test["before"], case), text, diffs)
        after = find(normalise(test["after"], case), text, diffs)
        passed = before is not None and after is not None and before < after
        return Outcome(passed, "" if passed else "order")
    if kind == "table":
        return _check_table(test, markdown)
    if kind == "math":
        passed = _latex(test["math"]) in _latex(markdown)
        return Outcome(passed, "" if passed else f"math: {test['math'][:60]!r}")
    if kind == "baseline":
        length = len(re.sub(r"\s+", "", markdown))
        limit = test.get("max_length")
        passed = length <= limit if limit is not None else length > 0
        return Outcome(passed, "" if passed else f"baseline: {length} characters")
    return Outcome(False, f"unknown test type {kind!r}")


def _check_table(test: dict[str, Any], markdown: str) -> Outcome:
    wanted = normalise(test["cell"])
    for table in tables(markdown):
        for row_index, row in enumerate(table):
            for column, cell in enumerate(row):
                if normalise(cell) != wanted:
                    continue
                if _neighbours_match(test, table, row_index, column):
                    return Outcome(True)
    return Outcome(False, f"table cell {test['cell'][:40]!r}")


def _neighbours_match(test: dict[str, Any], table: list[list[str]], row: int, column: int) -> bool:
    def at(r: int, c: int) -> str | None:
        if 0 <= r < len(table) and 0 <= c < len(table[r]):
            return normalise(table[r][c])
        return None

    checks = {
        "up": at(row - 1, column),
        "down": at(row + 1, column),
        "left": at(row, column - 1),
        "right": at(row, column + 1),
        "top_heading": at(0, column),
        "left_heading": at(row, 0),
    }
    return all(
        checks[key] == normalise(test[key]) for key in checks if test.get(key) not in (None, "")
    )
