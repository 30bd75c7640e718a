"""Writing: the Markdown of a converted document, placed atomically under a free name."""

from __future__ import annotations

from pathlib import Path, PurePath

from ocrd.files import free_name, write_new_file
from ocrd.markdown import join_pages
from ocrd.pipeline import DocumentResult, DocumentSettings


def render_markdown(result: DocumentResult, settings: DocumentSettings) -> str:
    return join_pages([page.text for page in result.pages], settings.page_separator)


def markdown_target(outbox: Path, relative: PurePath) -> Path:
    """`<outbox>/<relative folder>/<stem>.md`, or `<stem>-2.md`, ... when that name is taken."""
    return free_name(outbox / relative.parent / f"{relative.stem}.md")


def write_markdown(target: Path, markdown: str) -> None:
    write_new_file(target, markdown.encode("utf-8"))
