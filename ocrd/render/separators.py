"""Separator sheets: pages between documents that say "a new document starts here".

An inbox may split a file or a scan job at three kinds of separator page (`split_on`):

- `patch_t`: a PATCH-T sheet. Kodak's PATCH codes are four bars parallel to the sheet's
  leading edge, wide (0.20 in) and narrow (0.08 in), with narrow spaces, 0.80 in in all;
  PATCH T reads narrow, wide, narrow, wide from the edge inward (Patch 2 is WNNW, Patch 3
  WNWN). The printable sheets people use (Kodak's own, which paperless-ngx's documentation
  links) carry the bars along all four edges, and also a Code 39 barcode "PATCHT". Either
  is enough: the barcode is read like any other, the bars are measured on scanlines across
  each edge band (what a scanner's patch reader does along its leading edge).
- `barcode`: a barcode whose whole text matches the inbox's `split_barcode` expression.
- `blank`: a blank page, as `ocrd.render.analysis.looks_blank` judges it at the engine's
  resolution.

Detection is pure and blocking, for a render worker: it never runs in the daemon's process.
Barcodes need about 200 pixels per inch (Code 39 and Code 128 with 0.25 mm modules are not
read at 144 DPI, and are at 200), so a PDF page is rendered again in grey for them
(`pdf_page_for_barcodes`) and a scan is read from its own pixels, at most 200 DPI
(`scan_for_barcodes`); the bars and blankness need no more than the engine's resolution.
benchmarks/separators.py measures what it costs.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zxingcpp
from PIL import Image

from ocrd.domain import SeparatorKind, SeparatorMark, Split
from ocrd.render.analysis import looks_blank

# Pixels per inch a page is read for barcodes at (see the docstring). A finer scan is
# reduced to it first: at 300 DPI zxing-cpp took 2 to 18 times as long (a scan's noise makes
# edges) and found only modules under 0.25 mm more, which separator sheets do not have.
BARCODE_DPI = 200
MAX_BARCODE_PIXELS = 8_000_000  # and never more pixels than this (A3 at 200 DPI is 7.8 M)
PATCH_T_TEXT = re.compile(r"PATCH[\s-]?T", re.IGNORECASE)  # what PATCH-T sheets' barcodes say
# A PATCH-T sheet's own barcode is Code 39; Code 128 and QR codes saying PATCHT are common
# home-made ones. Reading only these took 17 ms on a 200 DPI page of text, every symbology 59.
PATCH_T_SYMBOLOGIES = (
    zxingcpp.BarcodeFormat.Code39,
    zxingcpp.BarcodeFormat.Code128,
    zxingcpp.BarcodeFormat.QRCode,
)

# PATCH bars, in units of the narrow element (0.08 in): bar, space, bar, ... from the edge.
PATCH_T_ELEMENTS = (1.0, 1.0, 2.5, 1.0, 1.0, 1.0, 2.5)
PATCH_TOLERANCE = (0.45, 0.45, 0.6, 0.45, 0.45, 0.45, 0.6)  # print, scan and threshold spread
PATCH_QUIET = 1.0  # units of paper before the first bar and after the last
PATCH_UNIT_SHARE = (0.0055, 0.017)  # unit / the page's short side: A3 (scaled) to A5 paper
PATCH_BAND = 0.45  # the bars lie within this share of the page from an edge
PATCH_MIN_LENGTH = 20  # units (1.6 in) of bars along the edge; Kodak's minimum is 2 in
PATCH_MIN_COVER = 0.7  # share of the scanlines along that length that must read the pattern
PATCH_WORK_SIDE = 640  # the short side bars are measured at (the unit is then 6 px on A4)
PATCH_SCANLINES = 120  # scanlines across each edge band
PATCH_MIN_CONTRAST = 60  # grey levels between paper and bars


@dataclass(frozen=True)
class SeparatorRules:
    """What an inbox splits on: its `split_on` list and `split_barcode` expression."""

    patch_t: bool = False
    barcode: str | None = None  # the whole barcode text must match this regular expression
    blank: bool = False

    @classmethod
    def of(cls, split_on: Collection[str], split_barcode: str | None = None) -> SeparatorRules:
        """The rules for an inbox's `split_on` and `split_barcode` (checked by the
        configuration: a barcode expression is given exactly when `barcode` is asked for)."""
        return cls(
            patch_t="patch_t" in split_on,
            barcode=split_barcode if "barcode" in split_on else None,
            blank="blank" in split_on,
        )

    @property
    def active(self) -> bool:
        return self.patch_t or self.barcode is not None or self.blank

    @property
    def reads_barcodes(self) -> bool:
        return self.patch_t or self.barcode is not None

    @property
    def symbologies(self) -> tuple[Any, ...]:
        """The barcode symbologies worth reading: all for `barcode`, few for PATCH-T alone."""
        return () if self.barcode is not None else PATCH_T_SYMBOLOGIES


# --- detection --------------------------------------------------------------------------


def detect_separator(
    image: Image.Image, rules: SeparatorRules, blank: bool | None = None
) -> SeparatorMark:
    """Whether a rendered page is a separator sheet under `rules`, and why.

    `image` is the page to look at (grey or RGB): best `pdf_page_for_barcodes` or
    `scan_for_barcodes`, which keep small barcodes readable; the engine's image at 144 DPI
    finds PATCH bars and blankness as well but misses barcodes with modules under about
    0.33 mm. `blank` is what rendering judged of the engine's image (None: judged here, on
    `image`). PATCH-T comes first, then a matching barcode, then blankness. Blocking, CPU
    only: call it in a render worker.
    """
    if blank is None:
        blank = looks_blank(image) if rules.active else False
    if blank or not rules.reads_barcodes:  # a blank page has no bars and no barcode
        return judged_by_blankness(rules, blank)
    if rules.patch_t and has_patch_t_bars(image):
        return SeparatorMark(SeparatorKind.patch_t, symbology="PATCH bars")
    for text, symbology in read_barcodes(image, rules.symbologies):
        if rules.patch_t and PATCH_T_TEXT.fullmatch(text.strip()):
            return SeparatorMark(SeparatorKind.patch_t, text, symbology)
        if rules.barcode is not None and re.fullmatch(rules.barcode, text):
            return SeparatorMark(SeparatorKind.barcode, text, symbology)
    return SeparatorMark()


def detect_on_pdf_page(page: Any, rules: SeparatorRules, blank: bool | None) -> SeparatorMark:
    """`detect_separator` for a PyMuPDF page, rendered for it at BARCODE_DPI in grey."""
    if not needs_looking(rules, blank):
        return judged_by_blankness(rules, bool(blank))  # no need to render anything
    return detect_separator(pdf_page_for_barcodes(page), rules, blank)


def detect_on_scan(
    frame: Image.Image, dpi: float, rules: SeparatorRules, blank: bool | None
) -> SeparatorMark:
    """`detect_separator` for a scanned page's own pixels (`dpi` as its file says)."""
    if not needs_looking(rules, blank):
        return judged_by_blankness(rules, bool(blank))  # no need to render anything
    return detect_separator(scan_for_barcodes(frame, dpi), rules, blank)


def needs_looking(rules: SeparatorRules, blank: bool | None) -> bool:
    """Whether a page must be looked at again (a render worker's request) to know whether
    it separates; if not, `judged_by_blankness` says, in any process."""
    return bool(rules.active and (blank is None or (not blank and rules.reads_barcodes)))


def judged_by_blankness(rules: SeparatorRules, blank: bool) -> SeparatorMark:
    """The mark of a page whose blankness decides it (blank, or no barcodes wanted)."""
    return SeparatorMark(
        SeparatorKind.blank if blank and rules.blank else SeparatorKind.none, blank=blank
    )


def read_barcodes(image: Image.Image, symbologies: Sequence[Any] = ()) -> list[tuple[str, str]]:
    """The text and symbology name of every barcode zxing-cpp finds on the page, in any
    orientation; `symbologies` (zxingcpp.BarcodeFormat values) limits what it looks for."""
    grey = image if image.mode == "L" else image.convert("L")
    options: dict[str, Any] = {"try_invert": False}  # white-on-black separators are rare
    if symbologies:
        options["formats"] = list(symbologies)
    return [(found.text, str(found.format)) for found in zxingcpp.read_barcodes(grey, **options)]


def pdf_page_for_barcodes(page: Any, dpi: int = BARCODE_DPI) -> Image.Image:
    """A PyMuPDF page rendered in grey at `dpi`, capped at MAX_BARCODE_PIXELS."""
    import pymupdf

    rect = page.rect
    zoom = dpi / 72
    area = rect.width * rect.height * zoom * zoom
    if area > MAX_BARCODE_PIXELS:
        zoom *= (MAX_BARCODE_PIXELS / area) ** 0.5
    pixmap = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), colorspace="gray", alpha=False)
    return Image.frombytes("L", (pixmap.width, pixmap.height), pixmap.samples)


def scan_for_barcodes(frame: Image.Image, dpi: float) -> Image.Image:
    """A scanned page's own pixels in grey for reading barcodes: reduced to BARCODE_DPI if
    it was scanned finer (its `dpi` as the file says), and to MAX_BARCODE_PIXELS."""
    scale = min(1.0, BARCODE_DPI / dpi if dpi > 0 else 1.0)
    scale = min(scale, (MAX_BARCODE_PIXELS / (frame.width * frame.height)) ** 0.5)
    grey = frame if frame.mode == "L" else frame.convert("L")
    if scale < 1.0:
        size = (max(1, round(frame.width * scale)), max(1, round(frame.height * scale)))
        grey = grey.resize(size, Image.Resampling.BILINEAR, reducing_gap=2.0)
    return grey


# --- PATCH bars ---------------------------------------------------------------------------


def has_patch_t_bars(image: Image.Image) -> bool:
    """Whether a PATCH-T bar pattern runs along any edge of the page (so a sheet fed upside
    down or sideways counts), measured across the edge from the edge inward."""
    grey = _work_image(image)
    pixels = np.asarray(grey)
    histogram = grey.histogram()
    paper, ink = _percentile(histogram, 0.95), _percentile(histogram, 0.01)
    if paper - ink < PATCH_MIN_CONTRAST:
        return False
    dark = pixels < (paper + ink) / 2
    short = min(dark.shape)
    units = (PATCH_UNIT_SHARE[0] * short, PATCH_UNIT_SHARE[1] * short)
    height, width = dark.shape
    top = dark[: int(height * PATCH_BAND)].T  # scanlines from the edge inward, one per row
    bottom = dark[height - int(height * PATCH_BAND) :][::-1].T
    left = dark[:, : int(width * PATCH_BAND)]
    right = dark[:, width - int(width * PATCH_BAND) :][:, ::-1]
    return any(_band_has_pattern(band, units) for band in (top, bottom, left, right))


def _work_image(image: Image.Image) -> Image.Image:
    """The page in grey, reduced to about PATCH_WORK_SIDE on its short side (whole factors:
    Pillow's reduce() is a fast box filter)."""
    grey = image if image.mode == "L" else image.convert("L")
    factor = max(1, min(grey.size) // PATCH_WORK_SIDE)
    return grey.reduce(factor) if factor > 1 else grey


def _percentile(histogram: list[int], share: float) -> int:
    counts = np.cumsum(histogram)
    return int(np.searchsorted(counts, share * counts[-1]))


def _band_has_pattern(band: np.ndarray[Any, Any], units: tuple[float, float]) -> bool:
    """Whether enough neighbouring scanlines of an edge band (rows: scanlines along the
    edge, columns: from the edge inward) read PATCH T at one place and size."""
    lines, depth = band.shape
    if lines < PATCH_SCANLINES or depth < 16:
        return False
    step = lines / PATCH_SCANLINES
    rows = (np.arange(PATCH_SCANLINES) * step + step / 2).astype(int)
    hits = _pattern_hits(band[rows], units)  # (scanline index, offset, unit) of each hit
    if len(hits) == 0:
        return False
    unit = float(np.median(hits[:, 2]))
    offset = float(np.median(hits[:, 1]))
    alike = (np.abs(hits[:, 2] - unit) <= 0.25 * unit) & (np.abs(hits[:, 1] - offset) <= 5 * unit)
    same = hits[alike]
    if len(same) < 3:
        return False
    along = np.unique(same[:, 0])
    length = (along[-1] - along[0] + 1) * step  # pixels along the edge
    cover = len(along) / (along[-1] - along[0] + 1)
    return bool(length >= PATCH_MIN_LENGTH * unit and cover >= PATCH_MIN_COVER)


def _pattern_hits(lines: np.ndarray[Any, Any], units: tuple[float, float]) -> np.ndarray[Any, Any]:
    """Where scanlines read the PATCH-T elements with paper before and after: rows of
    (scanline, offset from the edge in pixels, unit in pixels); all scanlines at once."""
    count, depth = lines.shape
    # Runs of equal pixels over all scanlines, broken at each scanline's start.
    flat = lines.reshape(-1).astype(np.int8)
    change = np.flatnonzero(np.diff(flat)) + 1
    starts = np.union1d(change, np.arange(count) * depth)
    lengths = np.diff(np.append(starts, flat.size))
    dark = flat[starts].astype(bool)
    line = starts // depth
    window = len(PATCH_T_ELEMENTS) + 2  # paper, the bars and spaces, paper
    if len(starts) < window:
        return np.empty((0, 3))
    first = np.arange(len(starts) - window + 1)
    candidate = dark[first + 1] & (line[first] == line[first + window - 1])
    first = first[candidate]
    runs = lengths[first[:, None] + np.arange(window)]  # (candidates, window)
    elements = runs[:, 1:-1].astype(np.float64)
    unit = elements.sum(axis=1) / sum(PATCH_T_ELEMENTS)
    measured = elements / unit[:, None]
    fits = (np.abs(measured - PATCH_T_ELEMENTS) <= PATCH_TOLERANCE).all(axis=1)
    quiet = (runs[:, 0] >= PATCH_QUIET * unit) & (runs[:, -1] >= PATCH_QUIET * unit)
    sized = (unit >= units[0]) & (unit <= units[1])
    found = first[fits & quiet & sized]
    offsets = starts[found + 1] - line[found] * depth
    return np.column_stack((line[found], offsets, unit[fits & quiet & sized]))


# --- splitting ----------------------------------------------------------------------------


def split_pages(
    marks: Sequence[SeparatorMark], split_on: Collection[str], duplex: bool = False
) -> Split:
    """Cut a document at its separator pages. `marks[i]` is page i + 1's, in reading order;
    a mark counts only if its kind is in `split_on`. Separator pages are dropped, and so
    are the parts they would leave empty (separators first, last or in a row): a document
    of nothing but separators has no parts.

    With `duplex` the pages are the two sides of sheets (1 and 2, 3 and 4, ...): the blank
    other side of a separator sheet is dropped with it, so it does not start the next part.
    """
    separating = [mark.separates and mark.kind.value in split_on for mark in marks]
    backs = set()
    if duplex:
        for front in range(0, len(marks) - 1, 2):
            back = front + 1
            if separating[front] and marks[back].blank and not separating[back]:
                backs.add(back)
            if separating[back] and marks[front].blank and not separating[front]:
                backs.add(front)
    parts: list[tuple[int, ...]] = []
    current: list[int] = []
    for index, separates in enumerate(separating):
        if separates:
            if current:
                parts.append(tuple(current))
            current = []
        elif index not in backs:
            current.append(index + 1)
    if current:
        parts.append(tuple(current))
    separators = tuple((index + 1, marks[index]) for index, cut in enumerate(separating) if cut)
    return Split(tuple(parts), separators, tuple(sorted(index + 1 for index in backs)))
