"""The shape of a document, measured before docling reads it: a small file may still hold
millions of elements, or nest them thousands deep, and keep a reader busy until the render
time limit stops it, holding a worker (and every document behind it) that long.

Each measure is a scan of bytes already within the size limits, stopped as soon as it
passes its limit: no parser builds a tree of what it measures.
"""

from __future__ import annotations

import re

from ocrd.office.limits import OfficeLimits, OfficeRefusal, OfficeRefused

# What docling's Office readers walk one by one: paragraphs and runs (Word's `w:p`, `w:r`;
# a slide's `a:p`, `a:r`), table cells (`w:tc`, `a:tc`) and a sheet's cells (`c`).
_ELEMENT = re.compile(rb"<(?:\w+:)?(?:p|r|tc|c)[\s>/]")
# A tag, or the start of what holds no tags (a comment, CDATA); the page is lowercased.
_TOKEN = re.compile(rb"<!--|<!\[cdata\[|<(/?)([a-z][\w:.-]*)[^<>]*?(/?)>")
_UNTIL = {b"<!--": b"-->", b"<![cdata[": b"]]>"}
_RAW_TEXT = frozenset((b"script", b"style", b"textarea", b"title", b"xmp"))
# Elements that hold nothing, or whose end tag a page may leave out (HTML closes them for
# it): counting them would make a sound page with unclosed paragraphs look deep.
_FLAT = frozenset(
    b"area base br col embed hr img input link meta source track wbr p li dt dd tr td th "
    b"option optgroup thead tbody tfoot colgroup caption rb rt rp html head body".split()
)
_HTML_BLOCK = re.compile(
    rb"<(?:p|li|h[1-6]|tr|dt|dd|pre|blockquote|div|figure|img)[\s>/]", re.IGNORECASE
)
_MARKDOWN_ITEM = re.compile(rb"[|#>]|(?:[-*+]|[0-9]{1,9}[.)])(?=[ \t]|$)")
_MARKDOWN_PREFIX = re.compile(rb"[ \t]*(?:>|(?:[-*+]|[0-9]{1,9}[.)])(?=[ \t]|$))")


def too_deep(what: str, limits: OfficeLimits) -> OfficeRefused:
    return OfficeRefused(
        f"its {what} nest deeper than the {limits.max_nesting} levels ocrd converts (no "
        "real document nests that far: a file shaped to hold its reader); flatten it",
        OfficeRefusal.too_large,
    )


def check_elements(part: bytes, name: str, counted: int, limits: OfficeLimits) -> int:
    """The paragraphs, runs and cells counted so far with `part`'s; OfficeRefused past
    `max_elements` (the scan stops there)."""
    for _ in _ELEMENT.finditer(part):
        counted += 1
        if counted > limits.max_elements:
            raise OfficeRefused(
                f"it holds more than {limits.max_elements} paragraphs, runs and cells (the "
                f"limit was passed in its part {name}); ocrd converts no document that large "
                "in elements: split it",
                OfficeRefusal.too_large,
            )
    return counted


def check_markdown_elements(data: bytes, limits: OfficeLimits) -> None:
    """OfficeRefused where a Markdown file starts more than `max_elements` paragraphs, list
    items, quotes, headings, table rows and pictures (as a Word file's paragraphs are
    counted): its lines of wrapped text count once, each line after a blank one or starting
    an item once, and each `![` on it (a picture docling makes an item of, as of an HTML
    `<img>`: a million `![](x)` in 6 MB held a worker 100 s and 6 GB)."""
    counted, blank = 0, True
    for line in data.splitlines():
        stripped = line.lstrip(b" \t")
        if stripped and (blank or _MARKDOWN_ITEM.match(stripped)):
            counted += 1
        counted += stripped.count(b"![")
        if counted > limits.max_elements:
            raise OfficeRefused(
                f"it holds more than {limits.max_elements} paragraphs, list items, pictures "
                "and table rows; ocrd converts no document that large in elements: split it",
                OfficeRefusal.too_large,
            )
        blank = not stripped


def check_html_elements(data: bytes, limits: OfficeLimits) -> None:
    """OfficeRefused where a page opens more than `max_elements` of the blocks docling makes
    an item of each (paragraphs, list items, headings, rows, ...); cells are counted apart."""
    for counted, _ in enumerate(_HTML_BLOCK.finditer(data), start=1):
        if counted > limits.max_elements:
            raise OfficeRefused(
                f"it holds more than {limits.max_elements} paragraphs, list items, headings "
                "and table rows; ocrd converts no document that large in elements: split it",
                OfficeRefusal.too_large,
            )


def check_part_ratio(name: str, unpacked: int, packed: int, limits: OfficeLimits) -> None:
    """One part must not unpack further than the whole archive may (a random part beside
    it would otherwise dilute the archive's ratio)."""
    if unpacked > limits.ratio_from_bytes and unpacked > limits.max_zip_ratio * max(packed, 1):
        raise OfficeRefused(
            f"its part {name} unpacks to {unpacked // max(packed, 1)} times its size (at "
            f"most {limits.max_zip_ratio} allowed): a zip bomb",
            OfficeRefusal.hostile,
        )


def check_html_depth(data: bytes, limits: OfficeLimits) -> None:
    """OfficeRefused where the page's elements nest deeper than `max_nesting`. One pass:
    what a comment, CDATA or script holds is skipped to its end (an end never found ends
    the scan, so that unclosed ones cannot make it search the rest again and again)."""
    page, depth, at = data.lower(), 0, 0
    while match := _TOKEN.search(page, at):
        closing, name, empty = match.groups()
        at = _past_raw_text(page, match)
        if at < 0:
            return
        if name is None or empty or name in _FLAT or name in _RAW_TEXT:
            continue
        depth = max(0, depth - 1) if closing else depth + 1
        if depth > limits.max_nesting:
            raise too_deep("web page's elements", limits)


def _past_raw_text(page: bytes, match: re.Match[bytes]) -> int:
    """Where to scan on after `match`: past the end of a comment, CDATA or script it
    starts (-1 where that end never comes)."""
    closing, name, empty = match.groups()
    if name is None:
        return page.find(_UNTIL[match.group()], match.end())
    if name in _RAW_TEXT and not closing and not empty:
        return page.find(b"</" + name, match.end())
    return match.end()


def check_markdown_depth(data: bytes, limits: OfficeLimits) -> None:
    """OfficeRefused where a line's quotes and list items (and its indentation, two spaces
    a level) nest deeper than `max_nesting`; HTML in it is measured as a page's."""
    for line in data.splitlines():
        levels, at = 0, 0
        while levels <= limits.max_nesting and (match := _MARKDOWN_PREFIX.match(line, at)):
            levels, at = levels + 1, match.end()
        indent = len(line) - len(line.lstrip(b" \t"))
        depth = levels + indent // 2
        if depth > limits.max_nesting:
            raise too_deep("quotes and lists", limits)
    check_html_depth(data, limits)
