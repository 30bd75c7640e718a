"""Why a document goes to failed/: the one place where errors become a document's failure,
each with a reason a person can act on.

Rendering and the engine fail in their own terms (RenderError, EngineError); `of` turns
whatever ended a document's conversion into its DocumentFailed, except a dead engine
(which ends the daemon instead) and bugs (which surface with their traceback).
"""

from __future__ import annotations

from pathlib import Path

from ocrd.domain import DocumentFailed, DocumentResult, Split, Stage
from ocrd.engines import EngineDeadError, EngineError
from ocrd.files.storage import describe
from ocrd.render import RenderError
from ocrd.render.errors import RenderFailure


def _leaves(error: BaseException) -> list[BaseException]:
    if not isinstance(error, BaseExceptionGroup):
        return [error]
    return [leaf for inner in error.exceptions for leaf in _leaves(inner)]


def of(error: BaseException) -> BaseException:
    """The one error that decides a document's fate, from a page's error or a group of
    them: a dead engine outranks everything; a render or engine error becomes the
    document's failure; anything else is a bug in ocrd and is returned as it is."""
    errors = _leaves(error)
    dead = next((e for e in errors if isinstance(e, EngineDeadError)), None)
    if dead is not None:
        return dead
    first = errors[0]
    if isinstance(first, RenderError):
        return DocumentFailed(Stage.render, str(first), first.page, "RenderError", first.code)
    if isinstance(first, EngineError):
        return DocumentFailed(Stage.recognise, str(first), first.page, "EngineError")
    return first


def undetected(error: RenderError | OSError) -> DocumentFailed:
    """The input could not even be recognised as a PDF or an image."""
    if isinstance(error, RenderError):
        return DocumentFailed(
            Stage.detect, str(error), error_type="UnsupportedInput", code=error.code
        )
    return DocumentFailed(
        Stage.detect, f"cannot read the file: {error.strerror}", code=RenderFailure.unreadable
    )


def task_unreadable(why: str) -> DocumentFailed:
    """A task of the docling-serve API whose options cannot be read back."""
    return DocumentFailed(
        Stage.detect, f"not converted: {why}; send the file again", error_type="TaskRecordError"
    )


def no_pages_in_range(first: int, last: int, count: int) -> DocumentFailed:
    """A task's page range that holds none of the document's pages."""
    return DocumentFailed(
        Stage.detect,
        f"page_range {first}-{last} holds none of the document's {count} pages",
        error_type="PageRange",
    )


def no_pages_in_folder() -> DocumentFailed:
    return DocumentFailed(
        Stage.detect,
        "the folder holds no PDF, TIFF, PNG or JPEG file",
        code=RenderFailure.no_pages,
    )


def only_separators(split: Split) -> DocumentFailed:
    kinds = sorted({mark.describe() for _, mark in split.separators})
    return DocumentFailed(
        Stage.detect,
        f"every page is a separator sheet ({', '.join(kinds)}), so there is nothing to "
        "convert; check the inbox's split_on, or drop the file into an inbox that does not "
        "split",
        code="only_separators",
    )


def unfinished(result: DocumentResult) -> DocumentFailed:
    """Pages the engine stopped before their end, where the inbox wants such documents
    in failed/."""
    reasons = sorted({result.pages[n - 1].finish_reason for n in result.unfinished_pages})
    numbers = ", ".join(str(n) for n in result.unfinished_pages)
    return DocumentFailed(
        Stage.recognise,
        f"page {numbers} did not finish (finish reason: {', '.join(reasons)}); the inbox's "
        "unfinished_pages setting is 'failed' (set it to 'done' to keep such text with a "
        "marker)",
        result.unfinished_pages[0],
        "UnfinishedPages",
    )


def no_text(result: DocumentResult) -> DocumentFailed:
    """Pages with content, and not one of them gave any text: a document written as
    nothing but empty pages would be an empty 'done'."""
    pages = result.pages_without_text
    why = {page.no_text for page in result.pages if page.no_text is not None}
    return DocumentFailed(
        Stage.recognise,
        f"no text came from any page with content (page {', '.join(map(str, pages))}: "
        f"{'; '.join(sorted(why))}); for a scan, check that it is legible at the inbox's dpi "
        "and that the engine reads its language; a picture without text is no document to "
        "convert",
        pages[0],
        "NoText",
        code="no_text",
    )


def job_kept_changing(times: int) -> DocumentFailed:
    return DocumentFailed(
        Stage.detect,
        f"the scan job changed {times} times while it was converted (a scanner still writing "
        "into its folder after it was quiet for settle_seconds); drop it in again once the "
        "scanner is done, or raise the inbox's settle_seconds",
        error_type="JobChanged",
    )


def still_growing(max_wait_seconds: float) -> DocumentFailed:
    return DocumentFailed(
        Stage.detect,
        f"the file was still being written {max_wait_seconds:g} s after it appeared, so it "
        "was never complete; drop it in again once it is written (or raise the inbox's "
        "max_settle_wait_seconds)",
        error_type="StillGrowing",
    )


def refused_everywhere(error: OSError) -> DocumentFailed:
    folder = Path(error.filename).parent if error.filename else "the output folder"
    name = Path(error.filename).name if error.filename else "?"
    return DocumentFailed(
        Stage.settle,
        f"{folder} refuses the file {name!r} under its own name, a safe name and a short one "
        f"({describe(error)}); the document was converted but cannot be stored there",
        error_type="StorageRefused",
    )


def file_refused(error: OSError) -> DocumentFailed:
    return DocumentFailed(
        Stage.settle,
        f"the outbox or done folder refuses this file: {describe(error)}",
        error_type="StorageRefused",
    )


def unwritable(error: Exception) -> DocumentFailed:
    """A bug met while writing the outputs: this document fails, nothing else."""
    return DocumentFailed(Stage.write, repr(error), None, type(error).__name__)


def internal(error: Exception) -> DocumentFailed:
    """A bug met while converting: this document fails, nothing else."""
    return DocumentFailed(Stage.internal, repr(error), None, type(error).__name__)


def unsettled(error: BaseException) -> DocumentFailed:
    return DocumentFailed(
        Stage.internal,
        f"ocrd failed while settling this file ({type(error).__name__}: {error}); it was set "
        "aside under a safe name so that other files keep moving; please report this",
        error_type=type(error).__name__,
    )
