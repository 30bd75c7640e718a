"""Writing: the Markdown of a converted document, placed atomically under a free name."""

from __future__ import annotations

from pathlib import Path, PurePath

from ocrd.files import free_name, write_new_file
from ocrd.markdown import join_pages
from ocrd.pipeline import DocumentResult, DocumentSettings

UNFINISHED_MARKER = (
    "\n\n> **ocrd:** page {page} is incomplete: the engine stopped it before its end "
    "(finish reason: {reason})."
)


def render_markdown(result: DocumentResult, settings: DocumentSettings) -> str:
    """Pages in order; an unfinished page keeps its text, followed by a visible marker."""
    texts = [
        page.text
        if page.finished
        else page.text + UNFINISHED_MARKER.format(page=number, reason=page.finish_reason)
        for number, page in enumerate(result.pages, start=1)
    ]
    return join_pages(texts, settings.page_separator)


def markdown_target(outbox: Path, relative: PurePath) -> Path:
    """`<outbox>/<relative folder>/<stem>.md`, or `<stem>-2.md`, ... when that name is taken."""
    return free_name(outbox / relative.parent / f"{relative.stem}.md")


def write_markdown(target: Path, markdown: str) -> None:
    write_new_file(target, markdown.encode("utf-8"))
