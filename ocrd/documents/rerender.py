"""`ocrd rerender`: a document's output written again from the engine's raw text.

The pages are rendered again exactly as the daemon renders them (same settings, so the same
pixels and the same figures, cut from the source by the same render worker code), and the
raw lines of `<name>.raw.jsonl` stand in for the engine. Users who upgrade ocrd or change
output options get new Markdown without a GPU.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from ocrd.config import DocumentOptions, OutputKind
from ocrd.documents import failures
from ocrd.documents.figures import cut_figures
from ocrd.documents.pipeline import searchable_pdfs, split_document
from ocrd.documents.sources import PageRef, SourceKind
from ocrd.domain import OFFICE_FORMATS, DocumentFailed, DocumentResult, Stage
from ocrd.output.page import RawPage, text_from_record
from ocrd.output.write import markdown_target, write_parts
from ocrd.render import RenderError, RenderLimits, RenderPool, SourceFile, detect_format


class RawFileError(Exception):
    """The raw file cannot be used; the message says which line and why."""


def read_raw(path: Path) -> dict[int, RawPage]:
    pages: dict[int, RawPage] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            pages[int(record["page"])] = text_from_record(record)
        except (ValueError, KeyError, TypeError) as error:
            raise RawFileError(f"{path}, line {number}: not a raw page line ({error})") from None
    return pages


async def rerender(
    document: Path, raw: Path, out: Path, settings: DocumentOptions, limits: RenderLimits
) -> list[Path]:
    """Write `<out>/<name>.md` (and its companions; for a document split at separator
    sheets, each part's) for `document` from `raw`; the Markdown files written."""
    texts = read_raw(raw)
    pool = RenderPool(1, limits, largest_side=settings.render.max_image_side)
    try:
        with tempfile.TemporaryDirectory(prefix="ocrd-rerender-") as scratch:
            source = SourceFile(document, detect_format(document), settings.render)
            if source.format in OFFICE_FORMATS:
                raise DocumentFailed(
                    Stage.detect,
                    f"{document.name} is a {source.format.value} document, not pages: ocrd "
                    "rerender has nothing to render it from; convert it again instead",
                    error_type="NotPages",
                    code="unsupported",
                )
            count = await pool.open(source)
            missing = sorted(set(range(1, count + 1)) - texts.keys())
            if missing:
                raise RawFileError(f"{raw} has no line for page {missing[0]} of {document}")
            pages = []
            for number in range(1, count + 1):
                page = texts[number].result((await pool.render(source, number)).info)
                if settings.figures:
                    await cut_figures(
                        pool,
                        PageRef(source, number),
                        page,
                        settings,
                        Path(scratch),
                    )
                pages.append(page)
            split = split_document(pages, settings, SourceKind.file)
            result = DocumentResult(source.format, pages, 0.0, split)
            if OutputKind.pdf in settings.outputs:
                refs = [PageRef(source, number) for number in range(1, count + 1)]
                result.pdfs = await searchable_pdfs(
                    pool, result, [source], refs, settings, Path(scratch)
                )
            target = markdown_target(out, Path(document.name))
            return write_parts(result, settings, target, document.name)
    except (RenderError, BaseExceptionGroup) as error:
        failure = failures.of(error)
        assert isinstance(failure, DocumentFailed)
        raise failure from None
    finally:
        pool.shutdown()
