"""What the daemon asks its render workers, and what they answer: typed messages through
a pipe, matched by their type on both sides.

A worker keeps a few sources open: every request names its source by `SourceKey` (the
file, its format, how it is rendered), so any worker can serve any page, opening the file
itself if it has not yet.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ocrd.config import PdfLines, PipelineConfig, RenderSettings
from ocrd.domain import Figure, InputFormat, PageResult, SeparatorMark, TextLayer
from ocrd.office.read import OfficeRead
from ocrd.output.searchable import SearchablePdfResult
from ocrd.render.errors import RenderFailure
from ocrd.render.separators import SeparatorRules

Region = tuple[float, float, float, float]  # a part of a page as fractions (0..1) of it


@dataclass(frozen=True)
class RenderLimits:
    """Limits of a render worker process, the same for every document."""

    max_page_pixels: int = 50_000_000
    memory_limit_mb: int = 4096
    page_timeout_seconds: float = 120.0

    @classmethod
    def of(cls, config: PipelineConfig) -> RenderLimits:
        return cls(
            config.max_page_pixels,
            config.render_memory_limit_mb,
            config.page_render_timeout_seconds,
        )


@dataclass(frozen=True)
class SourceKey:
    """Everything it takes to open one input file."""

    path: str
    format: InputFormat
    settings: RenderSettings
    root: str | None = None  # no link is followed below this folder (a claim's)


# --- requests -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Ping:
    """Answered once the worker has started (imported and mapped the shared buffer)."""


@dataclass(frozen=True)
class Open:
    source: SourceKey


@dataclass(frozen=True)
class RenderPage:
    source: SourceKey
    page: int  # 1-based, within the file
    separators: SeparatorRules | None = None  # also tell whether it is a separator sheet
    # Also write the pixels there as a PPM file, for an engine that reads pages from files
    # (local replicas): the daemon then never copies them.
    page_file: Path | None = None


@dataclass(frozen=True)
class ReadTextLayer:
    source: SourceKey
    page: int
    running_lines: bool  # keep running headers and footers


@dataclass(frozen=True)
class CutFigures:
    source: SourceKey
    page: int
    boxes: Sequence[Region]
    dpi: float
    folder: Path
    names: Sequence[str]


@dataclass(frozen=True)
class WriteSearchablePdf:
    """The document's pages (or one part's) with their text laid invisibly over them."""

    files: tuple[tuple[Path, InputFormat], ...]
    order: tuple[tuple[int, int], ...]  # (file index, page in file) for each page, in order
    pages: tuple[PageResult, ...]
    target: Path
    archive: bool
    passwords: tuple[str, ...]
    root: Path | None = None  # no link is followed below this folder (a claim's)
    lines: PdfLines = PdfLines.read  # how the lines of pages without positions are found


@dataclass(frozen=True)
class ReadOffice:
    """An office document or web page, checked and converted by docling (`ocrd/office/`)."""

    source: SourceKey
    pictures_folder: Path | None = None  # its pictures are written here, as PPM files


Request = Ping | Open | RenderPage | ReadTextLayer | CutFigures | WriteSearchablePdf | ReadOffice


def page_of(request: Request) -> int | None:
    """The page a request is about, for its error message."""
    return getattr(request, "page", None)


# --- replies ------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerReady:
    """The answer to Ping."""


@dataclass(frozen=True)
class Opened:
    pages: int


@dataclass(frozen=True)
class RenderedPage:
    """A page's pixels are in `file`, or in the shared buffer (`payload` None) or, if they
    did not fit, in `payload`; with the page's size in points and whether it is blank."""

    width: int
    height: int
    size: int  # bytes of pixels, as `layout` says
    payload: bytes | None
    width_pt: float
    height_pt: float
    blank: bool
    separator: SeparatorMark | None = None  # where RenderPage asked
    file: Path | None = None  # the pixels as a PPM file, where RenderPage asked and it worked
    layout: str = "RGB"  # of the pixels in the buffer or payload: "RGB" or "RGBX"


@dataclass(frozen=True)
class TextLayerRead:
    layer: TextLayer


@dataclass(frozen=True)
class FiguresCut:
    figures: list[Figure]


@dataclass(frozen=True)
class RenderFailed:
    message: str
    page: int | None
    code: RenderFailure


@dataclass(frozen=True)
class PdfWritten:
    result: SearchablePdfResult


@dataclass(frozen=True)
class OfficeConverted:
    read: OfficeRead


Reply = (
    WorkerReady
    | Opened
    | RenderedPage
    | TextLayerRead
    | FiguresCut
    | PdfWritten
    | OfficeConverted
    | RenderFailed
)
