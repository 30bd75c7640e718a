"""The types every step shares: pages, their text, a document's settings, results and failures.

They sit below the modules that use them (render, engines, pipeline, write, settle,
rerender), so data flows one way and no step imports another only for its types.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from pathlib import Path
from typing import Any, cast

from PIL import Image

from ocrd.config import PromptMode
from ocrd.text.grounding import Block
from ocrd.text.markdown import looks_repetitive


class Stage(StrEnum):
    """Where a document's processing failed; `error.json`'s `stage`."""

    detect = "detect"  # the file is not an input ocrd reads
    render = "render"  # the PDF or image could not be opened or rasterised
    recognise = "recognise"  # the engine failed on a page, or left pages unfinished
    write = "write"  # the outputs could not be written
    settle = "settle"  # a storage error that retrying cannot fix, for this one file
    crash = "crash"  # the daemon or its engine died while this file was in flight
    internal = "internal"  # a bug in ocrd


class Outcome(StrEnum):
    done = "done"
    failed = "failed"


class InputFormat(StrEnum):
    pdf = "pdf"
    tiff = "tiff"
    png = "png"
    jpeg = "jpeg"
    # Documents made by people, read by docling's rule-based backends (ocrd/office/).
    docx = "docx"
    pptx = "pptx"
    xlsx = "xlsx"
    html = "html"
    md = "md"
    csv = "csv"


OFFICE_FORMATS = frozenset(
    {
        InputFormat.docx,
        InputFormat.pptx,
        InputFormat.xlsx,
        InputFormat.html,
        InputFormat.md,
        InputFormat.csv,
    }
)


class SeparatorKind(StrEnum):
    """Why a page separates documents (none: it does not)."""

    none = "none"
    patch_t = "patch_t"
    barcode = "barcode"
    blank = "blank"


@dataclass(frozen=True)
class SeparatorMark:
    """What detection found on one page: whether it separates, and why."""

    kind: SeparatorKind = SeparatorKind.none
    text: str = ""  # the barcode's text where a barcode decided it
    symbology: str = ""  # the barcode's symbology ("Code 39", "QR Code"), or "PATCH bars"
    blank: bool = False  # the page looked blank at the engine's resolution

    @property
    def separates(self) -> bool:
        return self.kind is not SeparatorKind.none

    def describe(self) -> str:
        """For logs and reports: 'PATCH-T sheet (Code 39 "PATCHT")', 'blank page', ..."""
        if self.kind is SeparatorKind.patch_t:
            how = "its bars" if not self.text else f'{self.symbology} "{self.text}"'
            return f"PATCH-T sheet ({how})"
        if self.kind is SeparatorKind.barcode:
            return f'separator barcode "{self.text}" ({self.symbology})'
        if self.kind is SeparatorKind.blank:
            return "blank page"
        return "no separator"

    def record(self) -> dict[str, object]:
        """The mark as the page journal and the raw file keep it."""
        return {
            "kind": self.kind.value,
            "text": self.text,
            "symbology": self.symbology,
            "blank": self.blank,
        }

    @classmethod
    def of_record(cls, record: dict[str, object]) -> SeparatorMark:
        """A mark kept by `record`; KeyError, TypeError or ValueError if it is not one."""
        return cls(
            SeparatorKind(str(record["kind"])),
            str(record.get("text", "")),
            str(record.get("symbology", "")),
            bool(record.get("blank", False)),
        )

    def fields(self) -> dict[str, object]:
        """The mark for the summary event and the layout file."""
        found: dict[str, object] = {"kind": self.kind.value}
        if self.text:
            found["text"] = self.text
        if self.symbology:
            found["symbology"] = self.symbology
        return found


@dataclass(frozen=True)
class Split:
    """A document's pages cut at its separator pages."""

    parts: tuple[tuple[int, ...], ...]  # page numbers of each part, in reading order
    separators: tuple[tuple[int, SeparatorMark], ...]  # the separator pages, and why
    backs: tuple[int, ...] = ()  # blank backs of separator sheets, dropped with them

    @property
    def numbered(self) -> bool:
        """Whether the parts are written as `<name>-1.md`, `<name>-2.md`, ...: only where
        there is more than one; a single part keeps the document's own name."""
        return len(self.parts) > 1

    @property
    def dropped(self) -> list[int]:
        """Every page that is in no part: the separators and their backs."""
        return sorted([number for number, _ in self.separators] + list(self.backs))

    def separator_fields(self) -> list[dict[str, object]]:
        return [{"page": number, **mark.fields()} for number, mark in self.separators]

    def fields(self) -> dict[str, object]:
        """Where the document was split, for its summary event and layout file."""
        found: dict[str, object] = {
            "parts": [list(part) for part in self.parts],
            "separators": self.separator_fields(),
        }
        if self.backs:
            found["separator_backs"] = list(self.backs)
        return found


@dataclass(frozen=True)
class PageInfo:
    """What is known of a rendered page besides its pixels."""

    number: int  # 1-based
    image_size: tuple[int, int]  # the pixels' width and height
    width_pt: float  # the page's size in PDF points (72 per inch), for mapping boxes back
    height_pt: float


@dataclass(frozen=True)
class PageImage:
    number: int  # 1-based
    image: Image.Image
    width_pt: float  # the page's size in PDF points (72 per inch), for mapping boxes back
    height_pt: float
    blank: bool = False  # nothing on it at this resolution (a scanned back, a separator)
    separator: SeparatorMark | None = None  # with split_on: whether it separates documents
    model: str | None = None  # the OCR model its inbox chose (None: the engine's only one)
    # One region of a page (ocrd/engines/layout.py): the model's task it is read with
    # (its prompt); None: a whole page, read with the prompt of the page's mode.
    task: str | None = None

    @property
    def info(self) -> PageInfo:
        return PageInfo(self.number, self.image.size, self.width_pt, self.height_pt)


@dataclass(frozen=True)
class TextLayer:
    """A PDF page's own text, and whether it can stand in for recognising the pixels."""

    usable: bool
    reason: str  # why it can, or why not ("an invisible OCR layer", "unmapped glyphs", ...)
    markdown: str = ""
    blocks: tuple[Block, ...] = ()  # the layer's text blocks with their boxes
    image_size: tuple[int, int] = (0, 0)  # the size the page would be rendered at
    page_size_pt: tuple[float, float] = (0.0, 0.0)


class PageSource(StrEnum):
    """Where a page's text came from."""

    engine = "engine"
    text_layer = "text_layer"  # the PDF's own text (inbox setting pdf_text)
    blank = "blank"  # nothing on the page; not sent to the engine
    separator = "separator"  # a separator sheet (split_on): dropped, not sent to the engine


@dataclass(frozen=True)
class PageText:
    """An engine's answer for one page."""

    text: str
    finish_reason: str  # stop, length, repetition, abort, error (vLLM's words)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    token_ids: tuple[int, ...] = ()
    # When the engine itself first scheduled the page and produced its last token
    # (monotonic clock, comparable across processes on one machine); None if unknown.
    engine_interval: tuple[float, float] | None = None
    # Blocks the engine found itself (RapidOCR's lines); None: parse them from `text`.
    blocks: tuple[Block, ...] | None = None
    # The OCR model that wrote `text` (its parser reads it); None: no model's (RapidOCR)
    # or an older journal's, read as grounded Markdown.
    model: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason == "stop"


class DocumentFailed(Exception):
    """The document cannot be converted; it goes to failed/ with this reason."""

    def __init__(
        self,
        stage: Stage,
        message: str,
        page: int | None = None,
        error_type: str = "",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.stage = Stage(stage)
        self.page = page
        self.error_type = error_type or type(self).__name__
        self.code = code  # a short reason for metrics: "encrypted", "timeout", ...

    @property
    def message(self) -> str:
        return str(self)


@dataclass(frozen=True)
class Figure:
    """A figure cut from the source: its PNG file, and where it lies in the source."""

    path: Path
    width: int
    height: int
    source_box: tuple[int, int, int, int]  # in pixels of the source at `source_dpi`
    source_dpi: float


@dataclass
class PageResult:
    number: int
    text: PageText
    prompt: PromptMode
    image_size: tuple[int, int]
    page_size_pt: tuple[float, float]
    blocks: list[Block]  # parsed from the text: what the Markdown and the figures come from
    figures: dict[int, Figure] = field(default_factory=dict)  # image block index: its crop
    figures_left_out: int = 0  # figures not cut: more than the inbox's max_figures_per_page
    retried: bool = False
    source: PageSource = PageSource.engine
    separator: SeparatorMark | None = None  # with split_on: what detection found
    # A page with content (ink, or a text layer) from which no text came: why, in words.
    no_text: str | None = None

    @property
    def layout_blocks(self) -> list[Block]:
        """Blocks for the layout file: the engine's own where it has them (RapidOCR's lines)."""
        return list(self.text.blocks) if self.text.blocks is not None else self.blocks

    @cached_property
    def _loops(self) -> bool:
        # Computed once, asked for by several writers.
        return looks_repetitive(self.text.text)

    @property
    def unfinished(self) -> bool:
        """Stopped before its end (token limit, repetition stop) or ending in a loop."""
        return not self.text.finished or self._loops

    @property
    def finish_reason(self) -> str:
        if self.text.finished and self._loops:
            return "repetition"
        return self.text.finish_reason


@dataclass
class DocumentResult:
    format: InputFormat
    pages: list[PageResult]
    seconds: float
    split: Split | None = None  # with split_on: where the document was cut
    pdfs: tuple[Path, ...] = ()  # each part's searchable PDF (made in the claim's scratch)
    part: int | None = None  # which part of `split` this is (0-based), for a part's result
    whole: tuple[PageResult, ...] = ()  # a part's: every page of the document it came from
    # An office document's or web page's DoclingDocument (as JSON), its pictures' text
    # put in their places: its outputs come from it; `pages` are then its pictures.
    docling: dict[str, Any] | None = None
    pdf_not_made: str | None = None  # why `outputs: [pdf]` gave no searchable PDF
    pictures_unread: int = 0  # an office document's pictures the engine did not read

    def parts(self) -> list[DocumentResult]:
        """The documents to write: each part of a split document without its separator
        pages, or the document itself."""
        if self.split is None:
            return [self]
        by_number = {page.number: page for page in self.pages}
        return [
            DocumentResult(
                self.format,
                [by_number[number] for number in numbers],
                self.seconds,
                self.split,
                self.pdfs[index : index + 1],
                index,
                tuple(self.pages),
            )
            for index, numbers in enumerate(self.split.parts)
        ]

    @property
    def prompt_tokens(self) -> int:
        return sum(page.text.prompt_tokens for page in self.pages)

    @property
    def completion_tokens(self) -> int:
        return sum(page.text.completion_tokens for page in self.pages)

    @property
    def unfinished_pages(self) -> list[int]:
        """Numbers of pages the engine stopped before their end (token limit, loop)."""
        return [page.number for page in self.pages if page.unfinished]

    @property
    def retried_pages(self) -> list[int]:
        return [page.number for page in self.pages if page.retried]

    @property
    def text_layer_pages(self) -> list[int]:
        return [page.number for page in self.pages if page.source is PageSource.text_layer]

    @property
    def blank_pages(self) -> list[int]:
        return [page.number for page in self.pages if page.source is PageSource.blank]

    @property
    def pages_without_text(self) -> list[int]:
        """Pages with content (ink, or a text layer) from which no text came."""
        return [page.number for page in self.pages if page.no_text is not None]

    def finish_reasons(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for page in self.pages:
            counts[page.finish_reason] = counts.get(page.finish_reason, 0) + 1
        return counts


@dataclass
class DocumentSummary:
    """How a document ended: the `document.finished` event, and what status reports show."""

    doc: str
    inbox: str
    path: str  # relative to the inbox
    outcome: Outcome
    seconds: float
    pages: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    unfinished_pages: list[int] = field(default_factory=list)
    retried_pages: list[int] = field(default_factory=list)
    text_layer_pages: list[int] = field(default_factory=list)
    blank_pages: list[int] = field(default_factory=list)
    pages_without_text: list[int] = field(default_factory=list)  # content, but no text
    original: str | None = None  # where the original went
    markdown: str | None = None  # the (first part's) Markdown
    pdf: str | None = None  # the (first part's) searchable PDF, where asked for
    pdf_not_made: str | None = None  # asked for, and why there is none
    pictures_unread: int = 0  # an office document's pictures left as placeholders
    # A document split at separator sheets: each part's files and pages, and the sheets.
    parts: list[dict[str, object]] = field(default_factory=list)
    separators: list[dict[str, object]] = field(default_factory=list)
    renamed: str | None = None  # "safe" or "flat" where the target refused the name
    # (k, n): what hooks are told of part k of n of a split document (`part_summaries`)
    part: tuple[int, int] | None = None
    stage: Stage | None = None  # for failures
    page: int | None = None
    reason: str | None = None
    code: str | None = None  # a short reason for metrics
    model: str | None = None  # the OCR model its inbox chose when it started
    error_report: str | None = None
    finished_at: float = 0.0  # wall-clock seconds

    def part_summaries(self) -> list[DocumentSummary]:
        """The document as hooks are told of it: itself, or each part of one split at
        separator sheets as a document of its own (its Markdown, searchable PDF and pages;
        the original and the rest shared)."""
        if not self.parts:
            return [self]
        count = len(self.parts)
        return [
            replace(
                self,
                markdown=str(part["markdown"]),
                pdf=str(part["pdf"]) if "pdf" in part else None,
                pages=len(cast(list[int], part["pages"])),
                part=(number, count),
            )
            for number, part in enumerate(self.parts, start=1)
        ]

    @property
    def pages_per_second(self) -> float | None:
        return round(self.pages / self.seconds, 3) if self.pages and self.seconds else None

    def event(self) -> dict[str, object]:
        """The fields of the `document.finished` log event."""
        common: dict[str, object] = {
            "outcome": self.outcome.value,
            "pages": self.pages,
            "seconds": round(self.seconds, 3),
            "original": self.original,
        }
        if self.model:
            common["model"] = self.model
        if self.renamed:
            common["renamed"] = self.renamed
        if self.outcome is Outcome.failed:
            return {
                **common,
                "stage": self.stage.value if self.stage else None,
                "page": self.page,
                "reason": self.reason,
                "error_report": self.error_report,
            }
        done: dict[str, object] = {
            **common,
            "pages_per_second": self.pages_per_second,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reasons": self.finish_reasons,
            "unfinished_pages": self.unfinished_pages,
            "retried_pages": self.retried_pages,
            "text_layer_pages": self.text_layer_pages,
            "blank_pages": self.blank_pages,
            "pages_without_text": self.pages_without_text,
            "markdown": self.markdown,
        }
        if self.pdf:
            done["pdf"] = self.pdf
        if self.pdf_not_made:
            done["pdf_not_made"] = self.pdf_not_made
        if self.pictures_unread:
            done["pictures_unread"] = self.pictures_unread
        if self.parts:
            done["parts"] = self.parts
        if self.separators:
            done["separators"] = self.separators
        return done
