"""An inbox's settings: its folders, how its files are taken and read, and what is
written for each document."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path, PurePath
from typing import Annotated, Literal

from pydantic import Field, model_validator

from ocrd.config.base import Strict, absolute_path
from ocrd.config.engine import DEFAULT_MODEL, PromptMode

UPLOADS_FOLDER = "uploads"  # under an inbox with `uploads: true`: `uploads/<id>/<name>`

DEFAULT_TEMPORARY_SUFFIXES = (".part", ".filepart", ".tmp", ".crdownload", ".partial", ".download")


class WebhookConfig(Strict):
    """POST of the document's summary as JSON, retried with backoff."""

    url: Annotated[str, Field(pattern=r"^https?://")]
    secret_env: str | None = None  # environment variable holding a shared secret
    secret_header: str = "X-Ocrd-Secret"
    timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    retries: Annotated[int, Field(ge=0)] = 5


class HookConfig(Strict):
    """What to run when a document settles: a command, a webhook, or both."""

    command: Annotated[tuple[str, ...], Field(min_length=1)] | None = None  # never a shell
    webhook: WebhookConfig | None = None
    timeout_seconds: Annotated[float, Field(gt=0)] = 60.0  # for the command


class HooksConfig(Strict):
    on_done: HookConfig | None = None
    on_failed: HookConfig | None = None


class PdfText(StrEnum):
    """Whether a PDF page's own text layer stands in for recognising its pixels."""

    auto = "auto"  # prefer on the CPU engine, ocr on the GPU engines
    ocr = "ocr"  # never
    prefer = "prefer"  # where the layer is good


class PdfLines(StrEnum):
    """Where the searchable PDF lays the text of a model that gives no positions."""

    read = "read"  # over the lines RapidOCR finds on the page and reads (best, slowest)
    detect = "detect"  # over the lines it finds, the text cut by length (no reading)
    off = "off"  # stacked down the page in reading order; RapidOCR does not run


class BlankPages(StrEnum):
    keep = "keep"  # recognise them like any page
    drop = "drop"  # leave the page empty
    mark = "mark"  # write a visible marker


class UnfinishedPages(StrEnum):
    """Where a document with pages the engine stopped before their end goes."""

    done = "done"
    failed = "failed"


class TableFormat(StrEnum):
    markdown = "markdown"  # pipe tables where simple enough
    html = "html"  # as the model wrote them


class OutputKind(StrEnum):
    markdown = "markdown"  # always written: it marks a document complete
    pdf = "pdf"  # the original pages with the recognised text invisible over them
    docling = "docling"  # <name>.docling.json: the document as a DoclingDocument
    chunks = "chunks"  # <name>.chunks.jsonl: its chunks for retrieval, with page and box


class SeparatorSheet(StrEnum):
    """A kind of page that separates documents in a batch scan."""

    patch_t = "patch_t"  # a PATCH-T sheet
    barcode = "barcode"  # a barcode whose whole text matches `split_barcode`
    blank = "blank"  # a blank page


@dataclass(frozen=True)
class RenderSettings:
    """How one document's pages are rasterised: resolution is what the engine pays for."""

    dpi: int = 144
    max_image_side: int = 2048
    passwords: tuple[str, ...] = ()  # tried in turn on an encrypted PDF


class DocumentOptions(Strict):
    """How an inbox's documents are recognised and written: the options each document
    takes with it when it starts (a reload changes them for documents not yet started)."""

    prompt: PromptMode = PromptMode.layout
    # The OCR model that reads the pages (ocrd.models' names); an engine must serve it
    # (`engine.model`, or an entry of `engine.models`).
    model: str = DEFAULT_MODEL
    dpi: Annotated[int, Field(ge=36, le=600)] = 144
    figure_dpi: Annotated[int, Field(ge=36, le=1200)] | None = None  # None: twice `dpi`
    max_image_side: Annotated[int, Field(ge=256, le=10000)] = 2048
    passwords: tuple[str, ...] = ()
    page_separator: str = "\n\n<!-- page {page} -->\n\n"
    unfinished_pages: UnfinishedPages = UnfinishedPages.done
    retry_unfinished: bool = True
    tables: TableFormat = TableFormat.markdown
    figures: bool = True
    # At most this many figures cut from one page; more is a page that went wrong (or a
    # worker that lies): the rest are not cut, and the page says so.
    max_figures_per_page: Annotated[int, Field(ge=0, le=10000)] = 50
    layout_file: bool = False
    keep_raw: bool = False
    strip_headers_footers: bool = False
    pdf_text: PdfText = PdfText.auto
    blank_pages: BlankPages = BlankPages.mark  # pages blank at engine resolution
    outputs: Annotated[tuple[OutputKind, ...], Field(min_length=1)] = (OutputKind.markdown,)
    pdf_archive: bool = False  # the searchable PDF as PDF/A-2b
    pdf_lines: PdfLines = PdfLines.read  # only for pages whose model gives no positions
    split_on: tuple[SeparatorSheet, ...] = ()
    split_barcode: str | None = None  # a regular expression a whole barcode text matches

    @model_validator(mode="after")
    def _consistent(self) -> DocumentOptions:
        if OutputKind.markdown not in self.outputs:
            raise ValueError(
                "outputs: 'markdown' is always written (it is what marks a document "
                "complete); list it, with 'pdf' beside it for a searchable PDF"
            )
        if self.pdf_archive and OutputKind.pdf not in self.outputs:
            raise ValueError("pdf_archive is true but outputs has no 'pdf': add it")
        barcode = SeparatorSheet.barcode in self.split_on
        if barcode and not self.split_barcode:
            raise ValueError(
                "split_on has 'barcode' but split_barcode is not set: give the regular "
                "expression that a separator barcode's whole text matches, e.g. 'SEPARATOR'"
            )
        if self.split_barcode and not barcode:
            raise ValueError(
                "split_barcode is set but split_on has no 'barcode': add it to split_on, or "
                "remove split_barcode"
            )
        if self.split_barcode:
            try:
                re.compile(self.split_barcode)
            except re.error as error:
                raise ValueError(
                    f"split_barcode {self.split_barcode!r} is no regular expression: {error}"
                ) from None
        return self

    @property
    def render(self) -> RenderSettings:
        return RenderSettings(self.dpi, self.max_image_side, self.passwords)

    @property
    def figure_resolution(self) -> int:
        """The DPI figures are cut at from a PDF page."""
        return self.figure_dpi or 2 * self.dpi

    def for_engine(self, engine: str | None) -> DocumentOptions:
        """These options with `auto` decided for the engine in use: DeepSeek-OCR-2 gives
        better structure than a text layer, RapidOCR does not."""
        if self.pdf_text is not PdfText.auto:
            return self
        chosen = PdfText.prefer if engine == "rapidocr" else PdfText.ocr
        return self.model_copy(update={"pdf_text": chosen})


class InboxEntry(DocumentOptions):
    """An inbox as the configuration file gives it: output folders may be left out."""

    path: Path
    outbox: Path | None = None
    done: Path | None = None
    failed: Path | None = None
    work: Path | None = Field(
        default=None, description="claimed files wait here; must be on the inbox's filesystem"
    )
    recursive: bool = True
    include: tuple[str, ...] = ("*",)
    ignore: tuple[str, ...] = ()
    # Folders whose name matches one of these are scan jobs: one document of their files.
    job_folders: tuple[str, ...] = ()
    # Duplex from a single-sided feeder: a file, then the next within the window, are the
    # fronts and the backs (in reverse) of one document.
    collate: bool = False
    collate_window_seconds: Annotated[float, Field(gt=0)] = 300.0
    settle_seconds: Annotated[float, Field(ge=0)] = 5.0  # quiet this long: ready to take
    max_settle_wait_seconds: Annotated[float, Field(gt=0)] = 3600.0
    # `auto`: polling where the inbox is on a network filesystem (NFS, SMB, FUSE), whose
    # files written by other machines inotify never reports; inotify elsewhere.
    polling: bool | Literal["auto"] = "auto"
    poll_interval_seconds: Annotated[float, Field(gt=0)] = 5.0
    hooks: HooksConfig = HooksConfig()
    # Files may be handed over by HTTP (`POST /api/documents`): each lands in
    # `uploads/<id>/` under the inbox and goes the way of a dropped file.
    uploads: bool = False

    @model_validator(mode="after")
    def _uploads_can_arrive(self) -> InboxEntry:
        if not self.uploads:
            return self
        if not self.recursive:
            raise ValueError(
                "uploads: true needs recursive: true (an upload lands in the subfolder "
                f"{UPLOADS_FOLDER}/<id>/ of the inbox)"
            )
        if self.collate:
            raise ValueError(
                "uploads: true cannot be combined with collate: true (an upload would be "
                "paired with the next file as its backs); use another inbox for uploads"
            )
        if any(fnmatch.fnmatch(UPLOADS_FOLDER, pattern) for pattern in self.job_folders):
            raise ValueError(
                f"uploads: true, but job_folders matches the folder {UPLOADS_FOLDER!r} that "
                "uploads land in: every upload would become part of one scan job"
            )
        return self

    @model_validator(mode="after")
    def _blank_separators_without_collating(self) -> InboxEntry:
        if self.collate and SeparatorSheet.blank in self.split_on:
            raise ValueError(
                "split_on: 'blank' cannot be used with collate: true, where the blank backs of "
                "one-sided sheets are normal and would split the document at every sheet; put "
                "PATCH-T or barcode sheets between documents and split on those instead"
            )
        return self

    def located(self, base: Path) -> InboxConfig:
        """Absolute paths, with output folders defaulting to siblings of the inbox."""
        inbox = absolute_path(self.path, base)
        parent = inbox.parent

        def folder(value: Path | None, default: str) -> Path:
            return absolute_path(value, base) if value is not None else parent / default

        return InboxConfig(
            **{
                **dict(self),
                "path": inbox,
                "outbox": folder(self.outbox, "outbox"),
                "done": folder(self.done, "done"),
                "failed": folder(self.failed, "failed"),
                "work": folder(self.work, "work"),
            }
        )


class InboxConfig(InboxEntry):
    """An inbox as the daemon serves it: every folder known, every path absolute."""

    outbox: Path
    done: Path
    failed: Path
    work: Path


def job_folder_of(relative: PurePath, inbox: InboxConfig, is_directory: bool) -> PurePath | None:
    """The scan job folder `relative` is (or lies in), by the inbox's `job_folders`."""
    if not inbox.job_folders:
        return None
    folders = relative.parts if is_directory else relative.parts[:-1]
    if not inbox.recursive:
        folders = folders[:1]
    for depth, name in enumerate(folders):
        if name.startswith("."):
            return None
        if any(fnmatch.fnmatch(name, pattern) for pattern in inbox.job_folders):
            return PurePath(*relative.parts[: depth + 1])
    return None


def is_candidate_name(relative: PurePath, inbox: InboxConfig) -> bool:
    """Whether a path (relative to the inbox) names a file ocrd should consider at all."""
    if any(part.startswith(".") for part in relative.parts):
        return False  # hidden files and folders, including ocrd's own temporary files
    name = relative.name
    if name.startswith("~$") or name.lower().endswith(DEFAULT_TEMPORARY_SUFFIXES):
        return False  # Office lock files and uploads still in progress
    if not inbox.recursive and len(relative.parts) > 1:
        return False
    text = relative.as_posix()

    def matches(pattern: str) -> bool:
        return fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(text, pattern)

    return any(matches(p) for p in inbox.include) and not any(matches(p) for p in inbox.ignore)
