"""The bounds an office document or web page must keep, and the refusal that names the one
it broke."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class OfficeRefusal(StrEnum):
    """Why a file is refused (the render failure code it becomes)."""

    unsupported = "unsupported"
    damaged = "damaged"
    too_large = "too_large"
    hostile = "hostile"  # macros, XML entities, external references


class OfficeRefused(Exception):
    """A file ocrd will not convert, with a reason for people."""

    def __init__(self, message: str, code: OfficeRefusal = OfficeRefusal.unsupported) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class OfficeLimits:
    """What a document may hold before it is refused. Zip sizes are the central
    directory's, and Python's zip reader never inflates an entry past its declared size."""

    max_file_bytes: int = 100 * 1024 * 1024
    max_text_bytes: int = 20 * 1024 * 1024  # an HTML, Markdown or CSV file
    max_zip_entries: int = 5_000
    max_unzipped_bytes: int = 500 * 1024 * 1024
    max_zip_ratio: int = 200  # uncompressed / compressed: the whole archive's, and each part's
    ratio_from_bytes: int = 10 * 1024 * 1024  # a small archive may compress as well as it likes
    max_part_bytes: int = 100 * 1024 * 1024  # one XML part
    # the XML parts' paragraphs, runs and cells together: millions of empty paragraphs
    # fit in a small file, and docling walks each (100,000 paragraphs took it 80 s on a
    # busy 2-core machine; 16 million held a worker until the render time limit)
    max_elements: int = 100_000
    # how deep a web page's elements, or a Markdown file's quotes and lists, may nest:
    # 100,000 nested <div>s in a 1 MB page held a worker past 90 s
    max_nesting: int = 250
    # a workbook's, CSV file's or web page's cells: its DoclingDocument (about 500 bytes of
    # JSON a cell) is held by the daemon while its outputs are written
    max_cells: int = 50_000
    # rows x columns a sheet's cells and merged ranges reach: a few cells far apart make a
    # grid a spreadsheet reader would walk whole
    max_sheet_grid: int = 5_000_000
    max_pictures: int = 50  # pictures read by the engine; the rest are kept unread
    # pictures a document may hold at all, unread placeholders included: each is an item of
    # its DoclingDocument the daemon holds (40,000 in a 3 MB Markdown file took it to 1.3 GB)
    max_picture_items: int = 5_000
    max_picture_side: int = 2048  # a larger picture is scaled down before the engine
    # the pictures' pixels all together (RGB, 3 bytes a pixel), written by the worker into
    # the claim's scratch folder until the engine has read them: those past it stay unread
    max_picture_pixels: int = 40_000_000
    # the pixels of a web page's or Markdown file's embedded (data: URI) pictures as decoded,
    # before they are scaled down, all together: decoding them is the worker's time (four
    # pictures at the worker's Pillow limit of 50 million); those past it stay unread
    max_decoded_pixels: int = 200_000_000

    @property
    def max_unzipped_mb(self) -> int:
        return self.max_unzipped_bytes // (1024 * 1024)


DEFAULT_LIMITS = OfficeLimits()
