"""Separator sheets as people print them, and stacks of pages with sheets between documents.

Sheets are drawn as vector PDF pages with real PyMuPDF (barcodes written by zxing-cpp, their
modules drawn as rectangles), so they can be put into a PDF as they are, or "scanned": rendered
at a scanner's resolution, turned a degree or two, toned like paper and given sensor noise.

The PATCH-T sheet follows Kodak's geometry (Kodak publication A-61599, and the printable sheet
that paperless-ngx's documentation links): four bars parallel to each edge, read from that
edge inward narrow, wide, narrow, wide (narrow bars and spaces 0.08 in, wide bars 0.20 in,
0.80 in in all), starting 0.625 in from the edge; a Code 39 barcode "PATCHT" in the middle,
and the words PATCH T in large type. A Patch 3 sheet (wide, narrow, wide, narrow) is the same
with another pattern: it is no PATCH-T sheet.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pymupdf
import zxingcpp
from PIL import Image, ImageFilter

INCH = 72.0  # PDF points
A4 = (595.0, 842.0)
NARROW, WIDE = 0.08 * INCH, 0.20 * INCH
PATCH_MARGIN = 0.625 * INCH  # from the sheet's edge to its first bar
PATCH_T = "NWNW"  # from the edge inward
PATCH_3 = "WNWN"
BLACK = (0, 0, 0)

CORPUS = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"
SCANS = ("phototest.tif", "eurotext.tif", "8087_054.3B.tif")


# --- drawing on PDF pages ---------------------------------------------------------------


def _fill(page: pymupdf.Page, rect: pymupdf.Rect) -> None:
    page.draw_rect(rect, color=None, fill=BLACK, width=0)


def barcode_modules(text: str, symbology: str) -> np.ndarray:
    """The barcode's modules (True: dark), one per array cell, without quiet zones."""
    barcode = zxingcpp.create_barcode(text, zxingcpp.barcode_format_from_str(symbology))
    pixels = np.asarray(barcode.to_image(scale=1, add_quiet_zones=False))
    return pixels < 128


def draw_barcode(
    page: pymupdf.Page,
    text: str,
    symbology: str,
    centre: tuple[float, float],
    module: float,
    height: float | None = None,
) -> pymupdf.Rect:
    """A barcode drawn as vector rectangles, `module` points per module, centred at `centre`;
    a linear code's bars are `height` points tall (default: a quarter of its width)."""
    modules = barcode_modules(text, symbology)
    rows, columns = modules.shape
    linear = bool((modules == modules[0]).all())
    width = columns * module
    tall = (height or width / 4) if linear else rows * module
    left, top = centre[0] - width / 2, centre[1] - tall / 2
    pattern = modules[:1] if linear else modules
    row_height = tall if linear else module
    for y, row in enumerate(pattern):
        x = 0
        while x < columns:
            if not row[x]:
                x += 1
                continue
            end = x
            while end < columns and row[end]:
                end += 1
            y0 = top + y * row_height
            _fill(page, pymupdf.Rect(left + x * module, y0, left + end * module, y0 + row_height))
            x = end
    return pymupdf.Rect(left, top, left + width, top + tall)


def draw_patch_bars(page: pymupdf.Page, pattern: str, edges: str = "tblr") -> None:
    """A PATCH code's four bars along each named edge (t, b, l, r), read from that edge
    inward as `pattern` (N narrow, W wide), with narrow spaces between them."""
    width, height = page.rect.width, page.rect.height
    band = PATCH_MARGIN + len(pattern) * NARROW + pattern.count("W") * (WIDE - NARROW)
    band += (len(pattern) - 1) * NARROW
    offset = PATCH_MARGIN
    for element in pattern:
        size = WIDE if element == "W" else NARROW
        inner = offset + size
        if "t" in edges:  # the top and bottom bars run between the side bars
            _fill(page, pymupdf.Rect(band + 9, offset, width - band - 9, inner))
        if "b" in edges:
            _fill(page, pymupdf.Rect(band + 9, height - inner, width - band - 9, height - offset))
        if "l" in edges:
            _fill(page, pymupdf.Rect(offset, PATCH_MARGIN, inner, height - PATCH_MARGIN))
        if "r" in edges:
            _fill(
                page,
                pymupdf.Rect(width - inner, PATCH_MARGIN, width - offset, height - PATCH_MARGIN),
            )
        offset = inner + NARROW


def _write_lines(page: pymupdf.Page, top: float, lines: Iterable[str], size: float = 9) -> None:
    for number, line in enumerate(lines):
        page.insert_text((2 * INCH, top + number * size * 1.5), line, fontsize=size)


def patch_sheet(
    doc: pymupdf.Document, pattern: str = PATCH_T, code39: bool = True, edges: str = "tblr"
) -> pymupdf.Page:
    """A printable PATCH sheet (A4): bars on the named edges, its name in large type, how to
    print it, and for PATCH-T the Code 39 barcode "PATCHT" (with `code39`)."""
    page = doc.new_page(width=A4[0], height=A4[1])
    name = "PATCH T" if pattern == PATCH_T else "PATCH 3" if pattern == PATCH_3 else "PATCH"
    draw_patch_bars(page, pattern, edges)
    page.insert_text((2.1 * INCH, 2.6 * INCH), name, fontsize=54)
    page.insert_text(
        (2.4 * INCH, 3.0 * INCH), "Sized for printing unscaled on A4 paper", fontsize=11
    )
    _write_lines(
        page,
        3.4 * INCH,
        (
            "Patch code separator sheet; the geometry is that of Kodak publication A-61599.",
            "Wide black bars must be 0.20 in, narrow bars and white spaces 0.08 in.",
            "Print at 100 % scale on white paper, in black, with no toner saving.",
            "Put one sheet between documents; it is not part of either document.",
        ),
    )
    if code39 and pattern == PATCH_T:
        draw_barcode(
            page, "PATCHT", "Code39", (A4[0] / 2, 5.9 * INCH), 0.016 * INCH, height=0.9 * INCH
        )
        page.insert_text((2.2 * INCH, 6.6 * INCH), 'The barcode is CODE 39 = "PATCHT"', fontsize=9)
    return page


def barcode_sheet(
    doc: pymupdf.Document,
    text: str,
    symbology: str,
    module_mm: float = 0.5,
    heading: str = "Document separator",
) -> pymupdf.Page:
    """A separator sheet as made with a barcode generator: a heading, the barcode, its text."""
    page = doc.new_page(width=A4[0], height=A4[1])
    page.insert_text((1.5 * INCH, 2 * INCH), heading, fontsize=28)
    module = module_mm / 25.4 * INCH
    box = draw_barcode(page, text, symbology, (A4[0] / 2, A4[1] / 2), module, 1.0 * INCH)
    page.insert_text((box.x0, box.y1 + 20), text, fontsize=12)
    return page


def invoice_with_barcode(doc: pymupdf.Document, text: str, symbology: str) -> pymupdf.Page:
    """A content page carrying an unrelated barcode (a parcel or invoice number)."""
    page = doc.new_page(width=A4[0], height=A4[1])
    page.insert_text((INCH, 1.2 * INCH), "INVOICE 2024-0815", fontsize=20)
    _write_lines(
        page,
        1.8 * INCH,
        (
            "Acme Office Supplies, 12 Harbour Street, Portsmouth",
            "Customer number 44 1029, order of 3 March",
            "1 x toner cartridge, black .................... 89.00",
            "2 x copy paper A4, 5 reams ................... 41.80",
            "Total due within 30 days ...................... 130.80",
        ),
        size=11,
    )
    draw_barcode(
        page,
        text,
        symbology,
        (A4[0] - 2.2 * INCH, 1.4 * INCH),
        0.35 / 25.4 * INCH,
        height=0.6 * INCH,
    )
    return page


def blank_sheet(doc: pymupdf.Document) -> pymupdf.Page:
    return doc.new_page(width=A4[0], height=A4[1])


def nearly_blank_sheet(doc: pymupdf.Document, words: str = "Notes: see overleaf") -> pymupdf.Page:
    """A page with nothing on it but a few words: content, not a separator."""
    page = doc.new_page(width=A4[0], height=A4[1])
    page.insert_text((1.2 * INCH, 2.5 * INCH), words, fontsize=11)
    return page


def scan_page(doc: pymupdf.Document, name: str) -> pymupdf.Page:
    """A page of the corpus scan `name` (in scans/), at the size it was scanned."""
    image = Image.open(CORPUS / "scans" / name)
    dpi = float(image.info.get("dpi", (300, 300))[0])
    size = (image.width * INCH / dpi, image.height * INCH / dpi)
    page = doc.new_page(width=size[0], height=size[1])
    page.insert_image(page.rect, filename=str(CORPUS / "scans" / name))
    return page


def pdf_page(doc: pymupdf.Document, name: str, number: int = 1) -> pymupdf.Page:
    """Page `number` of the corpus PDF `name` (in real/)."""
    with pymupdf.open(CORPUS / "real" / name) as source:
        doc.insert_pdf(source, from_page=number - 1, to_page=number - 1)
    return doc[-1]


# --- stacks: documents with separator sheets between them ------------------------------


@dataclass(frozen=True)
class Sheet:
    """One page of a stack: what it is (a maker above) and with what."""

    kind: str  # patch_t, patch_t_bars, patch_t_code39, patch_3, qr, code128, datamatrix,
    # invoice, blank, nearly_blank, scan, pdf
    value: str = ""  # the barcode's text, the corpus file's name
    number: int = 1  # the page of a corpus PDF

    def draw(self, doc: pymupdf.Document) -> pymupdf.Page:
        makers = {
            "patch_t": lambda: patch_sheet(doc),
            "patch_t_bars": lambda: patch_sheet(doc, code39=False),
            "patch_t_top_bars": lambda: patch_sheet(doc, code39=False, edges="t"),
            "patch_t_code39": lambda: barcode_sheet(doc, "PATCHT", "Code39", 0.4, "PATCH T"),
            "patch_3": lambda: patch_sheet(doc, PATCH_3),
            "qr": lambda: barcode_sheet(doc, self.value, "QRCode", 1.0),
            "code128": lambda: barcode_sheet(doc, self.value, "Code128", 0.4),
            "datamatrix": lambda: barcode_sheet(doc, self.value, "DataMatrix", 1.0),
            "invoice": lambda: invoice_with_barcode(doc, self.value, "Code128"),
            "blank": lambda: blank_sheet(doc),
            "nearly_blank": lambda: nearly_blank_sheet(doc, self.value or "Notes: see overleaf"),
            "scan": lambda: scan_page(doc, self.value),
            "pdf": lambda: pdf_page(doc, self.value, self.number),
        }
        return makers[self.kind]()

    @property
    def is_corpus_scan(self) -> bool:
        return self.kind == "scan"


def stack_pdf(sheets: Sequence[Sheet], path: Path) -> Path:
    """All sheets as one PDF, as a PDF-writing scanner or a merged file would have them."""
    doc = pymupdf.open()
    for sheet in sheets:
        sheet.draw(doc)
    doc.save(path, garbage=3, deflate=True)
    doc.close()
    return path


def sheet_pdf(sheet: Sheet) -> bytes:
    """One sheet as the bytes of a one-page PDF."""
    doc = pymupdf.open()
    sheet.draw(doc)
    data = doc.tobytes()
    doc.close()
    return data


def scanned(
    page: pymupdf.Page, dpi: int, seed: int, angle: float | None = None, bilevel: bool = False
) -> Image.Image:
    """The page as a scanner sees it at `dpi`: turned by `angle` degrees (default: a random
    one between 0.5 and 2 either way), paper tone, a little blur and sensor noise; `bilevel`
    thresholds it to black and white as a document scanner's fax-like mode does."""
    rng = random.Random(seed)
    if angle is None:
        angle = rng.uniform(0.5, 2.0) * rng.choice((-1, 1))
    pixmap = page.get_pixmap(dpi=dpi, colorspace="gray", alpha=False)
    image = Image.frombytes("L", (pixmap.width, pixmap.height), pixmap.samples)
    image = image.rotate(angle, resample=Image.Resampling.BICUBIC, fillcolor=255)
    image = image.filter(ImageFilter.GaussianBlur(0.5 * dpi / 200))
    pixels = np.asarray(image, dtype=np.float32)
    paper, ink = rng.uniform(228, 242), rng.uniform(25, 45)
    pixels = ink + pixels / 255.0 * (paper - ink)
    noise = np.random.default_rng(seed).normal(0, 6.0, pixels.shape)
    pixels = np.clip(pixels + noise, 0, 255).astype(np.uint8)
    result = Image.fromarray(pixels, "L")
    if bilevel:
        return result.point(lambda value: 255 if value > 140 else 0).convert("1")
    return result.convert("RGB")


def save_scan(image: Image.Image, path: Path, dpi: int) -> Path:
    """Write a scanned page as its name's format says (TIFF, PNG or JPEG), with its DPI."""
    suffix = path.suffix.lower()
    if suffix in (".jpg", ".jpeg"):
        image.convert("RGB").save(path, quality=85, dpi=(dpi, dpi))
    elif suffix in (".tif", ".tiff"):
        compression = "group4" if image.mode == "1" else "tiff_lzw"
        image.save(path, compression=compression, dpi=(dpi, dpi))
    else:  # a noisy page compresses badly: the fastest level saves seconds a page
        image.save(path, dpi=(dpi, dpi), compress_level=1)
    return path


def scan_sheet(sheet: Sheet, dpi: int, seed: int, bilevel: bool = False) -> Image.Image:
    """One sheet scanned at `dpi` (a corpus scan is its own real scan: returned as it is)."""
    if sheet.is_corpus_scan:
        return Image.open(CORPUS / "scans" / sheet.value)
    with pymupdf.open("pdf", sheet_pdf(sheet)) as doc:
        return scanned(doc[0], dpi, seed, bilevel=bilevel)


def stack_folder(
    sheets: Sequence[Sheet], folder: Path, dpi: int = 300, suffix: str = ".tif", seed: int = 0
) -> list[Path]:
    """A scan job: one image file per sheet (p1, p2, ... so natural order is reading order);
    corpus PDF pages are written as one-page PDFs, as a scanner that mixes them would."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for number, sheet in enumerate(sheets, start=1):
        if sheet.kind == "pdf":
            path = folder / f"p{number}.pdf"
            path.write_bytes(sheet_pdf(sheet))
        else:
            path = save_scan(
                scan_sheet(sheet, dpi, seed + number), folder / f"p{number}{suffix}", dpi
            )
        written.append(path)
    return written


# Three letters with PATCH-T sheets between them, vector pages (quick to render): a batch
# that splits into three documents, pages 1, 3-4 and 6.
LETTERS = [
    Sheet("nearly_blank", "Letter one"),
    Sheet("patch_t"),
    Sheet("nearly_blank", "Letter two"),
    Sheet("nearly_blank", "Letter two, its second page"),
    Sheet("patch_t"),
    Sheet("nearly_blank", "Letter three"),
]
LETTERS_PARTS = [[1], [3, 4], [6]]
