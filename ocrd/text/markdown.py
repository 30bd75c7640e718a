"""From parsed blocks to clean Markdown that people can read, diff and index.

Grounding tags and model control tokens never reach the output. Headings, lists and LaTeX
are kept as the model wrote them; HTML tables stay HTML, or become pipe tables where they
are simple enough; HTML entities the model escaped outside tables are decoded.
"""

from __future__ import annotations

import html
import math
import re
from collections import Counter
from collections.abc import Sequence
from html.parser import HTMLParser

from ocrd.text.grounding import Block

_ANY_TAG = re.compile(r"<\|/?[a-z_]{1,20}\|>|<｜[^｜\n]{1,40}｜>")
_BLANK_LINES = re.compile(r"\n[ \t]*\n(?:[ \t]*\n)+")
_TABLE = re.compile(r"<table\b.*?(?:</table>|\Z)", re.DOTALL | re.IGNORECASE)
_WHITESPACE = re.compile(r"\s+")
LOOP_WINDOW = 4000  # characters at the end of a page that are looked at for a loop
LOOP_MAX_UNIT = 200  # longest repeating passage recognised, in non-space characters
LOOP_MIN_REPEATS = 8
LOOP_MIN_SPAN = 24  # a short unit must cover at least this many characters ("----" is no loop)


def scrub_tags(text: str) -> str:
    """Remove grounding tags and special tokens, also ones that nest to form new tags."""
    while True:
        cleaned = _ANY_TAG.sub("", text)
        if cleaned == text:
            return cleaned
        text = cleaned


def looks_repetitive(text: str) -> bool:
    """True when the text ends in the same passage over and over: a repetition loop.

    Whitespace is ignored (the model varies it between repeats), and each possible passage
    length is one string comparison: microseconds, where a backtracking regex took tens of
    milliseconds on a long page.
    """
    tail = _WHITESPACE.sub("", text[-LOOP_WINDOW:])
    for unit in range(1, LOOP_MAX_UNIT + 1):
        repeats = max(LOOP_MIN_REPEATS, -(-LOOP_MIN_SPAN // unit))
        span = unit * repeats
        if span > len(tail):
            return False
        if tail[-span:] == tail[-unit:] * repeats:
            return True
    return False


class _TableReader(HTMLParser):
    """Rows of cell texts; `simple` turns false on spans, nesting or markup inside cells."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self.simple = True
        self._cell: list[str] | None = None
        self._depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._depth += 1
            self.simple = self.simple and self._depth == 1
        elif tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            if any(
                name in ("rowspan", "colspan") and value not in (None, "1") for name, value in attrs
            ):
                self.simple = False
            if not self.rows:
                self.rows.append([])
            self._cell = []
        elif tag == "br" and self._cell is not None:
            self._cell.append(" ")
        elif tag not in ("thead", "tbody", "tfoot"):
            self.simple = False

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "table":
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def html_table_to_pipes(table: str) -> str | None:
    """A pipe table for a simple, complete HTML table; None where pipes would lose something."""
    if not re.search(r"</table>\s*\Z", table, re.IGNORECASE):
        return None  # cut off: keep what there is as HTML
    reader = _TableReader()
    reader.feed(table)
    reader.close()
    rows = [row for row in reader.rows if row]
    if not reader.simple or not rows or len({len(row) for row in rows}) != 1:
        return None

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    header, *body = rows
    return "\n".join([line(header), line(["---"] * len(header)), *(line(row) for row in body)])


def render_tables(text: str, table_format: str) -> str:
    """HTML tables as written, or as pipe tables where `table_format` is `markdown`."""
    if table_format != "markdown":
        return text
    return _TABLE.sub(lambda match: html_table_to_pipes(match.group(0)) or match.group(0), text)


def decode_entities_outside_tables(text: str) -> str:
    parts: list[str] = []
    position = 0
    for match in _TABLE.finditer(text):
        parts.append(html.unescape(text[position : match.start()]))
        parts.append(match.group(0))
        position = match.end()
    parts.append(html.unescape(text[position:]))
    return "".join(parts)


def block_markdown(block: Block, table_format: str, figure_link: str | None = None) -> str:
    if block.label == "image":
        return f"![]({figure_link})" if figure_link else ""
    text = scrub_tags(block.content).strip()
    if block.label == "table" or "<table" in text.lower():
        return render_tables(text, table_format)
    return decode_entities_outside_tables(text)


def page_markdown(
    blocks: Sequence[Block], table_format: str, figure_links: dict[int, str] | None = None
) -> str:
    links = figure_links or {}
    parts = [block_markdown(block, table_format, links.get(i)) for i, block in enumerate(blocks)]
    text = "\n\n".join(part for part in parts if part)
    return _BLANK_LINES.sub("\n\n", scrub_tags(text)).strip()


def _normalised_line(line: str) -> str:
    return re.sub(r"\d+", "#", " ".join(line.lower().split()))


def strip_running_lines(pages: list[str], edge_lines: int = 2, share: float = 0.6) -> list[str]:
    """Remove running headers and footers (titles, page numbers) from a multi-page document.

    A line among the first or last `edge_lines` of a page is running when, with digits
    ignored, it appears in that zone on at least `share` of the pages (and on three or more).
    """
    if len(pages) < 3:
        return pages
    split = [page.split("\n") for page in pages]

    def zones(lines: list[str]) -> tuple[list[int], list[int]]:
        content = [index for index, line in enumerate(lines) if line.strip()]
        return content[:edge_lines], content[-edge_lines:]

    top_counts: Counter[str] = Counter()
    bottom_counts: Counter[str] = Counter()
    for lines in split:
        top, bottom = zones(lines)
        top_counts.update({_normalised_line(lines[i]) for i in top})
        bottom_counts.update({_normalised_line(lines[i]) for i in bottom})
    needed = max(3, math.ceil(share * len(pages)))
    running_top = {line for line, seen in top_counts.items() if seen >= needed}
    running_bottom = {line for line, seen in bottom_counts.items() if seen >= needed}

    result = []
    for lines in split:
        top, bottom = zones(lines)
        drop = {i for i in top if _normalised_line(lines[i]) in running_top}
        drop |= {i for i in bottom if _normalised_line(lines[i]) in running_bottom}
        kept = "\n".join(line for index, line in enumerate(lines) if index not in drop)
        result.append(_BLANK_LINES.sub("\n\n", kept).strip())
    return result


def join_pages(pages: Sequence[str], separator: str) -> str:
    """One document: page texts joined by `separator`, where `{page}` is the next page's number."""
    parts: list[str] = []
    for number, text in enumerate(pages, start=1):
        if number > 1:
            parts.append(separator.replace("{page}", str(number)))
        parts.append(text)
    return "".join(parts).strip() + "\n"
