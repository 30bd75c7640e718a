"""Writing: a converted document's files in the outbox, the Markdown last.

Beside `<name>.md` go `<name>.assets/` (figures cropped from the pages), and where the inbox
asks for them `<name>.layout.json` (every block with its boxes), `<name>.raw.jsonl` (the
engine's raw text, for `ocrd rerender`) and `<name>.pdf` (the searchable PDF, made by a
render worker). The companions are in place before the Markdown, so a reader who sees the
Markdown finds everything it links to. A document split at separator sheets is written
part by part, each as a document of its own.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any
from urllib.parse import quote

from ocrd import __version__
from ocrd.config import BlankPages, DocumentOptions, OutputKind
from ocrd.domain import DocumentResult, Figure, PageResult, PageSource
from ocrd.files import (
    fsync_dir,
    json_bytes,
    link_or_copy,
    numbered,
    rename_checked,
    replace_file,
    temporary_path,
    write_new_file,
)
from ocrd.files.beneath import held_folder
from ocrd.files.dropped import printable
from ocrd.output.page import figure_box_px, page_record
from ocrd.text.grounding import Block
from ocrd.text.markdown import join_pages, page_markdown, scrub_tags, strip_running_lines

BLANK_MARKER = "*(blank page)*"
NO_TEXT_MARKER = "<!-- ocrd: page {page} has content, but no text came from it: {reason} -->"
UNFINISHED_MARKER = (
    "> **ocrd:** page {page} is incomplete: the engine stopped it before its end "
    "(finish reason: {reason})."
)

FIGURES_LEFT_OUT_MARKER = (
    "> **ocrd:** page {page} has {count} more figures than max_figures_per_page ({limit}) "
    "allows; they were not cut."
)


@dataclass(frozen=True)
class OutputFiles:
    markdown: Path

    def _beside(self, suffix: str) -> Path:
        return self.markdown.with_name(self.markdown.stem + suffix)

    @property
    def assets(self) -> Path:
        return self._beside(".assets")

    @property
    def layout(self) -> Path:
        return self._beside(".layout.json")

    @property
    def raw(self) -> Path:
        return self._beside(".raw.jsonl")

    @property
    def pdf(self) -> Path:
        return self._beside(".pdf")

    @property
    def docling(self) -> Path:
        return self._beside(".docling.json")

    @property
    def chunks(self) -> Path:
        return self._beside(".chunks.jsonl")

    @property
    def beside(self) -> tuple[str, ...]:
        """The names of the companion files the documents API serves beside the Markdown."""
        return (self.layout.name, self.raw.name, self.docling.name, self.chunks.name)

    @property
    def companions(self) -> tuple[Path, ...]:
        return (self.assets, self.layout, self.raw, self.pdf, self.docling, self.chunks)


def markdown_path(outbox: Path, relative: PurePath, number: int = 1) -> Path:
    """`<outbox>/<folder>/<stem>.md` for number 1, `<stem>-2.md` for 2, ..."""
    return numbered(outbox / relative.parent / f"{relative.stem}.md", number)


def outputs_free(markdown: Path) -> bool:
    files = OutputFiles(markdown)
    return not any(p.exists() for p in (markdown, *files.companions))


def part_markdown(markdown: Path, part: int) -> Path:
    """The Markdown of part `part` (1-based) of a document split at separator sheets:
    `<stem>-1.md`, `<stem>-2.md`, ... beside the name the whole would have had."""
    return markdown.with_name(f"{markdown.stem}-{part}{markdown.suffix}")


def markdown_target(outbox: Path, relative: PurePath) -> Path:
    """The first of `<stem>.md`, `<stem>-2.md`, ... free together with its companions."""
    number = 1
    while not outputs_free(markdown_path(outbox, relative, number)):
        number += 1
    return markdown_path(outbox, relative, number)


def discard_outputs(markdown: Path, *, with_markdown: bool = False) -> None:
    """Remove what an abandoned plan wrote: its companions, and its Markdown if asked."""
    files = OutputFiles(markdown)
    shutil.rmtree(files.assets, ignore_errors=True)
    for companion in files.companions:
        if companion != files.assets:
            companion.unlink(missing_ok=True)
    if with_markdown:
        markdown.unlink(missing_ok=True)


def figure_links(page: PageResult, assets: str) -> dict[int, str]:
    folder = quote(assets, errors="surrogateescape")  # a name's own bytes, UTF-8 or not
    return {index: f"{folder}/{quote(figure.path.name)}" for index, figure in page.figures.items()}


def render_markdown(result: DocumentResult, settings: DocumentOptions, assets: str) -> str:
    """Pages in order; an unfinished page keeps its text, followed by a visible marker."""
    pages = [
        page_markdown(page.blocks, settings.tables, figure_links(page, assets))
        for page in result.pages
    ]
    for index, page in enumerate(result.pages):
        if page.source is PageSource.blank and settings.blank_pages is BlankPages.mark:
            pages[index] = BLANK_MARKER
    if settings.strip_headers_footers:
        pages = strip_running_lines(pages)
    for index, page in enumerate(result.pages):
        if page.no_text is not None:  # said where the text would be (never "--" inside)
            reason = page.no_text.replace("--", "- -")
            pages[index] = NO_TEXT_MARKER.format(page=page.number, reason=reason)
        if page.unfinished:
            marker = UNFINISHED_MARKER.format(page=page.number, reason=page.finish_reason)
            pages[index] = f"{pages[index]}\n\n{marker}".strip()
        if page.figures_left_out:
            marker = FIGURES_LEFT_OUT_MARKER.format(
                page=page.number, count=page.figures_left_out, limit=settings.max_figures_per_page
            )
            pages[index] = f"{pages[index]}\n\n{marker}".strip()
    return join_pages(pages, settings.page_separator)


def _block_layout(
    block: Block, page: PageResult, figure: Figure | None, link: str | None
) -> dict[str, Any]:
    width_pt, height_pt = page.page_size_pt
    entry: dict[str, Any] = {
        "label": block.label,
        "text": scrub_tags(block.content).strip(),
        "boxes_px": [list(figure_box_px(box, page.image_size)) for box in block.boxes],
        "boxes_pt": [[round(v, 2) for v in box.scaled(width_pt, height_pt)] for box in block.boxes],
    }
    if figure is not None:
        entry["figure"] = link
        entry["figure_size"] = [figure.width, figure.height]
        entry["figure_source_box"] = list(figure.source_box)
        entry["figure_source_dpi"] = figure.source_dpi
    return entry


def _page_layout(page: PageResult, assets: str) -> dict[str, Any]:
    links = figure_links(page, assets)
    return {
        "page": page.number,
        "width_pt": round(page.page_size_pt[0], 2),
        "height_pt": round(page.page_size_pt[1], 2),
        "image_width": page.image_size[0],
        "image_height": page.image_size[1],
        "prompt": page.prompt.value,
        "source": page.source.value,
        "blank": page.source is PageSource.blank,
        "finish_reason": page.finish_reason,
        "unfinished": page.unfinished,
        "no_text": page.no_text,
        "retried": page.retried,
        "figures_left_out": page.figures_left_out,
        "prompt_tokens": page.text.prompt_tokens,
        "completion_tokens": page.text.completion_tokens,
        "blocks": [
            _block_layout(block, page, page.figures.get(index), links.get(index))
            for index, block in enumerate(page.layout_blocks)
        ],
    }


def layout_document(result: DocumentResult, source: str, assets: str) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "source": printable(source),
        "ocrd_version": __version__,
        "unfinished_pages": result.unfinished_pages,
        "text_layer_pages": result.text_layer_pages,
        "blank_pages": result.blank_pages,
        "pages_without_text": result.pages_without_text,
    }
    if result.split is not None:  # where the document was cut, and which part this is
        layout["split"] = {
            "part": (result.part or 0) + 1,
            "of": len(result.split.parts),
            **result.split.fields(),
        }
    layout["pages"] = [_page_layout(page, assets) for page in result.pages]
    return layout


def raw_lines(result: DocumentResult) -> bytes:
    """One JSON object a page, every page of the document (also in a part's file, with the
    separator sheets): what `ocrd rerender` needs to write the same output again."""
    pages = result.whole or tuple(result.pages)
    return b"".join(json_bytes(page_record(page)) + b"\n" for page in pages)


def _place_figures(result: DocumentResult, assets: Path) -> None:
    """Copy the figure crops into `assets`, which appears whole (renamed into place)."""
    # A figure the page has twice (the same box) is one file, linked twice.
    figures = list(
        dict.fromkeys(figure.path for page in result.pages for figure in page.figures.values())
    )
    if assets.is_symlink():
        assets.unlink()  # put there since its name was planned; never followed
    elif assets.exists():
        shutil.rmtree(assets)  # left by an attempt that died before its Markdown
    if not figures:
        return
    staging = temporary_path(assets.parent)
    staging.mkdir(parents=True)
    try:
        with held_folder(staging) as inside:  # never a link swapped in at its name
            for path in figures:
                link_or_copy(path, inside / path.name)
            fsync_dir(inside)
        rename_checked(staging, assets)  # a network share's retried rename is no failure
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # a full disk must not fill up further
        raise
    fsync_dir(assets.parent)


def _write_docling(
    result: DocumentResult, settings: DocumentOptions, files: OutputFiles, source: str
) -> None:
    """`<name>.docling.json` and `<name>.chunks.jsonl`, as the inbox asks."""
    # docling-core takes over a second to import (its chunker more): only documents that
    # ask for these outputs pay for it, not every start of the daemon.
    from ocrd.output.chunks import chunk_lines
    from ocrd.output.docling import build_document

    links = [figure_links(page, files.assets.name) for page in result.pages]
    doc = build_document(result.pages, PurePath(source).stem, links)
    if OutputKind.docling in settings.outputs:
        replace_file(files.docling, json_bytes(doc.export_to_dict()) + b"\n")
    if OutputKind.chunks in settings.outputs:
        replace_file(files.chunks, chunk_lines(doc, printable(source)))


def _office_outputs(
    result: DocumentResult, settings: DocumentOptions, files: OutputFiles, source: str
) -> str:
    """An office document's or web page's `<name>.docling.json` and `<name>.chunks.jsonl`
    as the inbox asks, from docling's own DoclingDocument; and its Markdown, as docling
    exports it (each picture's text below its place)."""
    from docling_core.types.doc.document import DoclingDocument

    from ocrd.output.chunks import chunk_lines

    doc = DoclingDocument.model_validate(result.docling)
    doc.name = PurePath(source).stem
    doc.origin = None  # docling saw the bytes under a made-up name, not the file's
    if OutputKind.docling in settings.outputs:
        replace_file(files.docling, json_bytes(doc.export_to_dict()) + b"\n")
    if OutputKind.chunks in settings.outputs:
        replace_file(files.chunks, chunk_lines(doc, printable(source)))
    return doc.export_to_markdown(traverse_pictures=True).strip() + "\n"


def write_parts(
    result: DocumentResult, settings: DocumentOptions, markdown: Path, source: str
) -> list[Path]:
    """The document's outputs at `markdown`, or for a document split at separator sheets
    each part's at `<stem>-1.md`, `<stem>-2.md`, ... (`ocrd convert` and `ocrd rerender`;
    the daemon plans its names in `ocrd/output/settle.py`)."""
    parts = result.parts()
    targets = (
        [markdown]
        if len(parts) == 1
        else [part_markdown(markdown, k) for k in range(1, len(parts) + 1)]
    )
    for part, target in zip(parts, targets, strict=True):
        write_document(part, settings, target, source)
    return targets


def write_document(
    result: DocumentResult, settings: DocumentOptions, markdown: Path, source: str
) -> OutputFiles:
    """Write the companions, then the Markdown (which must not exist yet)."""
    files = OutputFiles(markdown)
    markdown.parent.mkdir(parents=True, exist_ok=True)
    _place_figures(result, files.assets)
    if settings.layout_file:
        layout = layout_document(result, source, files.assets.name)
        replace_file(files.layout, json_bytes(layout, indent=1) + b"\n")
    if settings.keep_raw:
        replace_file(files.raw, raw_lines(result))
    if result.docling is not None:
        text = _office_outputs(result, settings, files, source)
        write_new_file(markdown, text.encode("utf-8"))
        return files
    if {OutputKind.docling, OutputKind.chunks} & set(settings.outputs):
        _write_docling(result, settings, files, source)
    if result.pdfs:  # made durable by the render worker: given its name in the outbox
        files.pdf.unlink(missing_ok=True)  # left by an attempt that died before its Markdown
        link_or_copy(result.pdfs[0], files.pdf)
        fsync_dir(files.pdf.parent)
    text = render_markdown(result, settings, files.assets.name)
    write_new_file(markdown, text.encode("utf-8"))
    return files
