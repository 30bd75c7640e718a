"""Searchable PDFs: the original pages, untouched, with the recognised text laid invisibly
over them.

A document made of one PDF gets its text layer as an incremental update: the output is the
original file byte for byte, followed by the new objects (a font, and per page a content
stream and the page's new /Contents and /Resources). Nothing of the original is decoded,
re-rendered or recompressed, and a signature over the original bytes stays intact. Any other
document (images, a scan job's files, a duplex pair) is assembled in its page order: a PDF's
pages are copied with their streams as they are; an image becomes a page of its own size
(its DPI, or a sensible default) through img2pdf, which keeps JPEG bytes as they are and
stores other images losslessly (G4 and bilevel scans as CCITT, PNG data as it is).

The text is drawn in render mode 3 (invisible) with a font whose every character is one
empty glyph of one width (the space a narrower one), so any script can be written, and its
ToUnicode map gives back the very characters: a search hit highlights the right line, and
a selection copies the text in reading order. Each line is scaled to its box (font size to
the box's height, horizontal scaling to its width), in a coordinate system set once per page
from its /Rotate and its visible box (CropBox within MediaBox), so rotated and cropped pages
come out right. Which text goes where is `ocrd/textlayer.py`'s business.

Pages read from their own text layer, blank pages, pages the engine failed on, and PDF
pages that already carry text of their own get no layer: never two layers on one page.

PDF parsing is dangerous: this runs in a render worker process, never in the daemon's.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import io
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from ocrd import __version__
from ocrd.domain import InputFormat, PageResult
from ocrd.files import temporary_path
from ocrd.files.dropped import open_input
from ocrd.output.textlayer import PlacedLine, page_lines

FONT_NAME = "OcrdInvisibleText"  # the font's name in the PDF (BaseFont)
FONT_RESOURCE = "OcrdText"  # its name in a page's resources (another if taken)
GLYPH_ADVANCE = 500  # every glyph's width, in thousandths of the font size...
SPACE_ADVANCE = 350  # ...but a space's, narrower as in type (a gutter is wider than a word
# gap) yet wide enough that readers see a word break even at MIN_SCALE (poppler's raw order
# wants 0.15 of the size)
SPACE = 0x20
# Horizontal scaling (percent) below which readers take a word's letters for overprinted
# duplicates and drop them (poppler does below 10 % of the size between two letters).
MIN_SCALE = 50.0
ASCENT, DESCENT = 800, -200  # so a line's font size is its box's height, baseline 1/5 up
# A PDF page with this much text of its own is searchable already: a second layer would
# double every search hit (a stamp or a page number is less).
MIN_OWN_TEXT_CHARACTERS = 20
DEFAULT_PAGE_LONG_SIDE_INCHES = 11.69  # an image without a usable DPI: as long as A4
MIN_IMAGE_DPI, MAX_IMAGE_DPI = 10.0, 10000.0  # a declared DPI outside is no DPI
FIRST_EXTRA_CODE = 0xD800  # characters beyond the BMP get codes from the surrogate range
EXTRA_CODES = 0x800


class SearchablePdfError(Exception):
    """The searchable PDF cannot be written; the message says which file and why (and for
    an archival PDF, `findings` lists what keeps it from being PDF/A-2b)."""

    def __init__(self, message: str, findings: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.findings = list(findings)


@dataclass(frozen=True)
class SearchablePdfResult:
    """What was written: which pages got a text layer, and how."""

    pages: int
    layered_pages: list[int] = field(default_factory=list)  # 1-based, in the output
    own_text_pages: list[int] = field(default_factory=list)  # had text already: no layer
    incremental: bool = False  # the original's bytes come first, unchanged
    archive: str | None = None  # PDF/A-2b made by "pikepdf" or "ghostscript"; None: not asked


# --- the font -------------------------------------------------------------------------------


@functools.cache
def font_program() -> bytes:
    """A TrueType font of empty glyphs on a 1000-unit em, one 500 units wide for every
    character and a narrower one for the space: what makes the text invisible to every
    renderer and any character writable."""
    from fontTools.fontBuilder import FontBuilder
    from fontTools.pens.ttGlyphPen import TTGlyphPen

    builder = FontBuilder(1000, isTTF=True)
    widths = {".notdef": GLYPH_ADVANCE, "blank": GLYPH_ADVANCE, "space": SPACE_ADVANCE}
    builder.setupGlyphOrder(list(widths))
    builder.setupCharacterMap({SPACE: "space", 0xA0: "blank"})
    builder.setupGlyf({name: TTGlyphPen(None).glyph() for name in widths})
    builder.setupHorizontalMetrics({name: (width, 0) for name, width in widths.items()})
    builder.setupHorizontalHeader(ascent=ASCENT, descent=DESCENT)
    builder.setupNameTable({"familyName": FONT_NAME, "styleName": "Regular"})
    builder.setupOS2(
        sTypoAscender=ASCENT,
        sTypoDescender=DESCENT,
        usWinAscent=ASCENT,
        usWinDescent=-DESCENT,
        fsType=0,  # installable: embedding is unrestricted
    )
    builder.setupPost()
    buffer = io.BytesIO()
    builder.save(buffer)
    return buffer.getvalue()


@dataclass(frozen=True)
class TextEncoding:
    """Characters to the font's two-byte codes: a BMP character is its own code point; the
    few beyond the BMP a document uses get codes from the surrogate range, which no
    character of its own has."""

    extra: tuple[str, ...] = ()  # characters beyond the BMP, in code order

    @classmethod
    def for_lines(cls, lines: Iterable[PlacedLine]) -> TextEncoding:
        found = sorted({c for line in lines for c in line.text if ord(c) > 0xFFFF})
        return cls(tuple(found[:EXTRA_CODES]))

    def code(self, character: str) -> int:
        value = ord(character)
        if value < 0x20 or value == 0x7F:
            return 0x20  # control characters copy as spaces
        if value <= 0xFFFF:
            return 0xFFFD if 0xD800 <= value <= 0xDFFF else value
        with contextlib.suppress(ValueError):
            return FIRST_EXTRA_CODE + self.extra.index(character)
        return 0xFFFD

    def hex(self, text: str) -> str:
        return "".join(f"{self.code(c):04X}" for c in text)

    def to_unicode_cmap(self) -> bytes:
        """The ToUnicode CMap: each code to its character (ranges of 256 with one high byte,
        as the CMap format requires), and the extra codes one by one."""
        ranges = [
            f"<{h:02X}00> <{h:02X}FF> <{h:02X}00>" for h in range(256) if not 0xD8 <= h <= 0xDF
        ]
        singles = [
            f"<{FIRST_EXTRA_CODE + i:04X}> <{c.encode('utf-16-be').hex().upper()}>"
            for i, c in enumerate(self.extra)
        ]
        parts = [
            "/CIDInit /ProcSet findresource begin",
            "12 dict begin",
            "begincmap",
            "/CIDSystemInfo << /Registry (Adobe) /Ordering (UCS) /Supplement 0 >> def",
            "/CMapName /Adobe-Identity-UCS def",
            "/CMapType 2 def",
            "1 begincodespacerange",
            "<0000> <FFFF>",
            "endcodespacerange",
        ]
        for start in range(0, len(ranges), 100):  # at most 100 entries a section
            chunk = ranges[start : start + 100]
            parts += [f"{len(chunk)} beginbfrange", *chunk, "endbfrange"]
        for start in range(0, len(singles), 100):
            chunk = singles[start : start + 100]
            parts += [f"{len(chunk)} beginbfchar", *chunk, "endbfchar"]
        parts += ["endcmap", "CMapName currentdict /CMap defineresource pop", "end", "end"]
        return ("\n".join(parts) + "\n").encode("ascii")


def _new_stream(doc: Any, data: bytes, dictionary: str = "<<>>") -> int:
    xref = doc.get_new_xref()
    doc.update_object(xref, dictionary)
    doc.update_stream(xref, data, compress=True)
    return int(xref)


def _new_object(doc: Any, source: str) -> int:
    xref = doc.get_new_xref()
    doc.update_object(xref, source)
    return int(xref)


def add_font(doc: Any, encoding: TextEncoding) -> int:
    """The invisible font's objects in `doc`; the xref of its Type0 font dictionary.

    A CIDFontType2 with Identity-H encoding: two-byte codes, each mapped by the CIDToGIDMap
    to glyph 1 (never to .notdef, which PDF/A forbids to show), 500 units wide, but the
    space to glyph 2, 350 wide; the widths agree with the font program's."""
    program = font_program()
    file_xref = _new_stream(doc, program, f"<< /Length1 {len(program)} >>")
    glyphs = bytearray(b"\x00\x01" * 0x10000)
    glyphs[2 * SPACE : 2 * SPACE + 2] = b"\x00\x02"
    cid_to_gid = _new_stream(doc, bytes(glyphs))
    to_unicode = _new_stream(doc, encoding.to_unicode_cmap())
    descriptor = _new_object(
        doc,
        f"<< /Type /FontDescriptor /FontName /{FONT_NAME} /Flags 4 "
        f"/FontBBox [0 {DESCENT} {GLYPH_ADVANCE} {ASCENT}] /ItalicAngle 0 /Ascent {ASCENT} "
        f"/Descent {DESCENT} /CapHeight {ASCENT} /StemV 80 /FontFile2 {file_xref} 0 R >>",
    )
    descendant = _new_object(
        doc,
        f"<< /Type /Font /Subtype /CIDFontType2 /BaseFont /{FONT_NAME} "
        "/CIDSystemInfo << /Registry (Adobe) /Ordering (Identity) /Supplement 0 >> "
        f"/FontDescriptor {descriptor} 0 R /DW {GLYPH_ADVANCE} /W [{SPACE} [{SPACE_ADVANCE}]] "
        f"/CIDToGIDMap {cid_to_gid} 0 R >>",
    )
    return _new_object(
        doc,
        f"<< /Type /Font /Subtype /Type0 /BaseFont /{FONT_NAME} /Encoding /Identity-H "
        f"/DescendantFonts [{descendant} 0 R] /ToUnicode {to_unicode} 0 R >>",
    )


# --- the layer's content stream -------------------------------------------------------------

Rect = tuple[float, float, float, float]  # x0, y0, x1, y1 in PDF user space
Matrix = tuple[float, float, float, float, float, float]


def shown_to_user_space(visible: Rect, rotation: int) -> Matrix:
    """The matrix from the page as shown (origin bottom left, y up, in the visible box's
    units) to PDF user space, for a page turned `rotation` degrees clockwise (/Rotate)."""
    x0, y0, x1, y1 = visible
    return {
        0: (1.0, 0.0, 0.0, 1.0, x0, y0),
        90: (0.0, 1.0, -1.0, 0.0, x1, y0),
        180: (-1.0, 0.0, 0.0, -1.0, x1, y1),
        270: (0.0, -1.0, 1.0, 0.0, x0, y1),
    }[rotation % 360]


def shown_size(visible: Rect, rotation: int) -> tuple[float, float]:
    width, height = visible[2] - visible[0], visible[3] - visible[1]
    return (height, width) if rotation % 180 else (width, height)


def _number(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def text_advance(text: str, encoding: TextEncoding) -> float:
    """The width of `text` set at size 1 and no scaling."""
    spaces = sum(1 for c in text if encoding.code(c) == SPACE)
    return (spaces * SPACE_ADVANCE + (len(text) - spaces) * GLYPH_ADVANCE) / 1000


def layer_content(
    lines: Sequence[PlacedLine],
    visible: Rect,
    rotation: int,
    encoding: TextEncoding,
    resource: str = FONT_RESOURCE,
) -> bytes:
    """The content stream that draws `lines` invisibly, each line's glyphs spread evenly
    over its box: font size the box's height, horizontal scaling its width."""
    width, height = shown_size(visible, rotation)
    matrix = " ".join(_number(v) for v in shown_to_user_space(visible, rotation))
    out = [f"q {matrix} cm", "BT", "3 Tr"]
    for line in lines:
        text = line.text
        row = (line.bottom - line.top) * height
        span = (line.right - line.left) * width
        if not text or row <= 0 or span <= 0:
            continue
        advance = text_advance(text, encoding)
        # The type is as tall as the row, unless that squeezes it below MIN_SCALE (a box
        # taller than its text is wide: sideways text): then smaller, centred in the row.
        size = min(row, 100 * span / (advance * MIN_SCALE))
        scale = 100 * span / (advance * size)
        baseline = (1 - line.bottom) * height + (row - size) / 2 - DESCENT / 1000 * size
        out += [
            f"/{resource} {_number(size)} Tf {_number(scale)} Tz",
            f"1 0 0 1 {_number(line.left * width)} {_number(baseline)} Tm",
            f"<{encoding.hex(text)}> Tj",
        ]
    out += ["ET", "Q", ""]
    return "\n".join(out).encode("ascii")


# --- pages of a PDF -------------------------------------------------------------------------


def visible_box(page: Any) -> Rect:
    """The part of the page that is shown, in PDF user space: CropBox within MediaBox.

    PyMuPDF gives the MediaBox in PDF coordinates and the CropBox with its y axis turned
    over inside the MediaBox; turned back, the two are intersected as viewers do."""
    media = page.mediabox
    crop = page.cropbox
    x0, x1 = crop.x0, crop.x1
    y0, y1 = media.y1 - crop.y1, media.y1 - crop.y0
    return (max(x0, media.x0), max(y0, media.y0), min(x1, media.x1), min(y1, media.y1))


def has_own_text(page: Any) -> bool:
    text = page.get_text("text")
    return sum(1 for c in text if not c.isspace()) >= MIN_OWN_TEXT_CHARACTERS


def _reference(value: str) -> int | None:
    parts = value.split()
    return int(parts[0]) if len(parts) == 3 and parts[2] == "R" else None


def _inherited(doc: Any, xref: int, key: str) -> tuple[str, str] | None:
    """A page's value of an inheritable key, from itself or the nearest ancestor."""
    seen: set[int] = set()
    while xref and xref not in seen:
        seen.add(xref)
        kind, value = doc.xref_get_key(xref, key)
        if kind != "null":
            return kind, value
        parent_kind, parent = doc.xref_get_key(xref, "Parent")
        xref = (_reference(parent) or 0) if parent_kind == "xref" else 0
    return None


def _resources_dictionary(doc: Any, page_xref: int) -> tuple[int, str]:
    """Where the page's resources can be changed: (object, key path to the dictionary).
    Inherited resources are given to the page itself first, so its new entry cannot change
    what the page's ancestors give to other pages."""
    kind, value = doc.xref_get_key(page_xref, "Resources")
    if kind == "null":
        kind, value = _inherited(doc, page_xref, "Resources") or ("dict", "<<>>")
        doc.xref_set_key(page_xref, "Resources", value)
    if kind == "xref" and (number := _reference(value)):
        return number, ""
    return page_xref, "Resources/"


def add_font_resource(doc: Any, page_xref: int, font_xref: int) -> str:
    """Name the font in the page's /Resources /Font; the name it got (one not taken)."""
    xref, path = _resources_dictionary(doc, page_xref)
    kind, value = doc.xref_get_key(xref, path + "Font")
    if kind == "xref" and (number := _reference(value)):
        xref, path = number, ""
    elif kind == "dict":
        path += "Font/"
    else:
        doc.xref_set_key(xref, path + "Font", "<<>>")
        path += "Font/"
    reference = f"{font_xref} 0 R"
    name, suffix = FONT_RESOURCE, 1
    while True:
        kind, value = doc.xref_get_key(xref, path + name)
        if kind == "null" or value == reference:
            break
        suffix += 1
        name = f"{FONT_RESOURCE}{suffix}"
    doc.xref_set_key(xref, path + name, reference)
    return name


def add_layer(doc: Any, page: Any, lines: Sequence[PlacedLine], font_xref: int,
              encoding: TextEncoding) -> None:  # fmt: skip
    """Draw `lines` over the page: its own content is wrapped in q/Q (so whatever state it
    leaves cannot move the text) and kept as it is; the layer comes last, on top."""
    name = add_font_resource(doc, page.xref, font_xref)
    content = layer_content(lines, visible_box(page), page.rotation, encoding, name)
    before = _new_stream(doc, b"q\n")
    after = _new_stream(doc, b"\nQ\n" + content)
    streams = [before, *page.get_contents(), after]
    doc.xref_set_key(page.xref, "Contents", "[" + " ".join(f"{x} 0 R" for x in streams) + "]")


# --- opening the inputs ---------------------------------------------------------------------


# The inputs are read through descriptors opened once (`_held`): what is read is what was
# checked, never a link swapped in later. Messages name the files, not the descriptors.
_NAMES: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "names", default=None
)


def _shown(path: Path) -> str:
    return (_NAMES.get() or {}).get(str(path), path.name)


@contextlib.contextmanager
def _held(
    files: Sequence[tuple[Path, InputFormat]], root: Path | None
) -> Iterator[list[tuple[Path, InputFormat]]]:
    """The input files opened once, never through a link and only if regular
    (`ocrd/dropped.py`), and named by their descriptors from then on."""
    descriptors: list[int] = []
    names: dict[str, str] = {}
    try:
        held = []
        for path, fmt in files:
            try:
                fd = open_input(path, root)
            except OSError as error:
                raise SearchablePdfError(
                    f"{path.name}: cannot be read ({error.strerror})"
                ) from None
            descriptors.append(fd)
            os.set_inheritable(fd, True)  # for Ghostscript, which reads it by this name too
            names[f"/proc/self/fd/{fd}"] = path.name
            held.append((Path(f"/proc/self/fd/{fd}"), fmt))
        token = _NAMES.set(names)
        try:
            yield held
        finally:
            _NAMES.reset(token)
    finally:
        for fd in descriptors:
            os.close(fd)


def open_pdf(path: Path, passwords: Sequence[str] = ()) -> Any:
    import pymupdf

    try:
        doc = pymupdf.open(path, filetype="pdf")
    except Exception as error:  # MuPDF raises its own types for broken files
        detail = str(error).replace(str(path), _shown(path))
        raise SearchablePdfError(f"{_shown(path)}: cannot open the PDF ({detail})") from None
    if doc.needs_pass and not any(doc.authenticate(p) for p in ("", *passwords)):
        doc.close()
        raise SearchablePdfError(
            f"{_shown(path)}: encrypted, and no password of the inbox opens it"
        )
    return doc


def image_dpi(info: Mapping[Any, Any], size: tuple[int, int]) -> tuple[float, float]:
    """An image's resolution: the one it declares, or where it declares none (or nonsense)
    one that makes it as long as an A4 page (never less than 72: a small image keeps a
    point a pixel)."""
    with contextlib.suppress(TypeError, ValueError, IndexError):
        x, y = (float(v) for v in info.get("dpi", ())[:2])
        if MIN_IMAGE_DPI <= x <= MAX_IMAGE_DPI and MIN_IMAGE_DPI <= y <= MAX_IMAGE_DPI:
            return x, y
    dpi = max(72.0, max(size) / DEFAULT_PAGE_LONG_SIDE_INCHES)
    return dpi, dpi


def _frame_sizes(path: Path) -> list[tuple[float, float]]:
    """Each frame's page size in points, from its own pixels and DPI."""
    sizes = []
    with Image.open(path) as image:
        for index in range(getattr(image, "n_frames", 1)):
            image.seek(index)
            dpi_x, dpi_y = image_dpi(image.info, image.size)
            sizes.append((image.width * 72.0 / dpi_x, image.height * 72.0 / dpi_y))
    return sizes


def image_pdf(path: Path) -> bytes:
    """An image file (every frame) as a PDF of one page a frame, each page the image at its
    own resolution and exactly its size; pixels stored without loss (JPEG as it is)."""
    import img2pdf

    sizes = iter(_frame_sizes(path))

    def layout(width_px: int, height_px: int, dpi: tuple[float, float]) -> tuple[float, ...]:
        # img2pdf asks frame by frame, in order; the image fills its page.
        width, height = next(sizes)
        return width, height, width, height

    try:
        # Rotation.none: the pixels as stored, as the engine saw them (EXIF not applied).
        made = img2pdf.convert(str(path), layout_fun=layout, rotation=img2pdf.Rotation.none)
        return bytes(made)
    except Exception as error:  # img2pdf's own errors for images it cannot store as they are
        raise SearchablePdfError(
            f"{_shown(path)}: cannot put the image in a PDF ({error})"
        ) from None


# --- writing --------------------------------------------------------------------------------


def _fsync(path: Path) -> None:
    with path.open("rb+") as handle:
        os.fsync(handle.fileno())


def _lay_text(
    doc: Any, layers: Sequence[list[PlacedLine]], only: Sequence[int] | None = None
) -> tuple[list[int], list[int]]:
    """Add each page's layer to `doc` (whose pages are the document's, in order): pages
    (1-based) that got one, and pages left alone for their own text. With `only`, exactly
    those pages get theirs."""
    encoding = TextEncoding.for_lines(line for lines in layers for line in lines)
    layered, own_text = [], []
    font_xref = 0
    for index, lines in enumerate(layers):
        if not lines or (only is not None and index + 1 not in only):
            continue
        page = doc[index]
        if only is None and has_own_text(page):
            own_text.append(index + 1)
            continue
        font_xref = font_xref or add_font(doc, encoding)
        add_layer(doc, page, lines, font_xref, encoding)
        layered.append(index + 1)
    return layered, own_text


def _layered_copy(
    base: Path,
    target: Path,
    passwords: Sequence[str],
    layers: Sequence[list[PlacedLine]],
    only: Sequence[int] | None = None,
) -> tuple[list[int], list[int], bool]:
    """`base` copied to `target` with the layer appended as an incremental update: the
    base's bytes come first, unchanged. Where MuPDF had to repair the file to read it,
    the file is saved whole instead, its streams as they are (the third value False)."""
    shutil.copyfile(base, target)
    doc = open_pdf(target, passwords)
    try:
        if doc.page_count != len(layers):
            raise SearchablePdfError(
                f"{_shown(base)} has {doc.page_count} pages, the recognised text {len(layers)}"
            )
        layered, own_text = _lay_text(doc, layers, only)
        if not layered:
            return layered, own_text, True  # the copy is the output
        if doc.can_save_incrementally():
            doc.saveIncr()
            return layered, own_text, True
        data = doc.tobytes(garbage=0, deflate=False, expand=0, clean=False)
    finally:
        doc.close()
    target.write_bytes(data)
    return layered, own_text, False


def _set_document_information(doc: Any, first_pdf: Any | None) -> None:
    """A new document's catalog without the /Info MuPDF puts there (it belongs in the
    trailer, where PDF/A validators look), and its document information: the first PDF's,
    or for images only the producer."""
    catalog = doc.pdf_catalog()
    entries = [(key, doc.xref_get_key(catalog, key)[1]) for key in doc.xref_get_keys(catalog)]
    doc.update_object(
        catalog,
        "<<" + "".join(f" /{key} {value}" for key, value in entries if key != "Info") + " >>",
    )
    info = {} if first_pdf is None else dict(first_pdf.metadata or {})
    info = {key: value for key, value in info.items() if key not in ("format", "encryption")}
    info["producer"] = info.get("producer") or f"ocrd {__version__}"
    doc.set_metadata(info)


def assemble(
    files: Sequence[tuple[Path, InputFormat]],
    page_order: Sequence[tuple[int, int]],
    target: Path,
    passwords: Sequence[str] = (),
) -> None:
    """A new PDF of the document's pages in order: PDF pages copied with their streams as
    they are (and their annotations), each image a page of its own."""
    import pymupdf

    sources: dict[int, Any] = {}
    out = pymupdf.open()
    try:
        for file_index, number in page_order:
            if file_index not in sources:
                path, fmt = files[file_index]
                sources[file_index] = (
                    open_pdf(path, passwords)
                    if fmt is InputFormat.pdf
                    else pymupdf.open("pdf", image_pdf(path))
                )
            source = sources[file_index]
            if not 1 <= number <= source.page_count:
                raise SearchablePdfError(f"{_shown(files[file_index][0])} has no page {number}")
            # final=0 keeps the map of copied objects: resources shared by pages copy once.
            out.insert_pdf(source, from_page=number - 1, to_page=number - 1, final=0)
        pdfs = [sources[i] for i, (_, fmt) in enumerate(files) if fmt is InputFormat.pdf]
        _set_document_information(out, pdfs[0] if pdfs else None)
        out.save(target, garbage=1, deflate=False, expand=0, clean=False)
    finally:
        out.close()
        for source in sources.values():
            source.close()


def write_searchable_pdf(
    files: Sequence[tuple[Path, InputFormat]],
    page_order: Sequence[tuple[int, int]],
    pages: Sequence[PageResult],
    target: Path,
    *,
    archive: bool = False,
    passwords: Sequence[str] = (),
    archive_timeout_seconds: float = 600.0,
    root: Path | None = None,
) -> SearchablePdfResult:
    """Write the document's searchable PDF to `target` (a new temporary file the caller
    links into place; fsynced here, removed again on failure). Blocking; run it in a render
    worker process.

    `files` and `page_order` are what `ocrd/sources.py` gives (each file with its format;
    (file index, page in file) for each document page in reading order); `pages` the
    document's recognised pages in the same order; `passwords` those of the inbox, for
    encrypted PDFs. With `archive`, the file is PDF/A-2b (see `ocrd/pdfa.py`); where that
    cannot be, SearchablePdfError with the validator's findings."""
    if len(pages) != len(page_order):
        raise SearchablePdfError(
            f"{len(page_order)} pages in the document, but {len(pages)} recognised"
        )
    layers = [page_lines(page) for page in pages]
    with _held(files, root) as held:
        return _write(held, page_order, layers, len(pages), target, archive, passwords,
                      archive_timeout_seconds)  # fmt: skip


def _write(
    files: Sequence[tuple[Path, InputFormat]],
    page_order: Sequence[tuple[int, int]],
    layers: Sequence[list[PlacedLine]],
    count: int,
    target: Path,
    archive: bool,
    passwords: Sequence[str],
    archive_timeout_seconds: float,
) -> SearchablePdfResult:
    assembled = temporary_path(target.parent)  # a killed worker's are swept at start
    try:
        if (
            len(files) == 1
            and files[0][1] is InputFormat.pdf
            and list(page_order) == [(0, n) for n in range(1, count + 1)]
        ):
            base = files[0][0]  # one PDF, its pages in their order: updated as it is
        else:
            assemble(files, page_order, assembled, passwords)
            base = assembled
        layered, own_text, appended = _layered_copy(base, target, passwords, layers)
        incremental = appended and base is not assembled  # the input's own bytes come first
        route = None
        if archive:
            route = _archive(base, target, passwords, layers, layered, archive_timeout_seconds)
            incremental = False
        _fsync(target)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    finally:
        assembled.unlink(missing_ok=True)
    return SearchablePdfResult(count, layered, own_text, incremental, route)


def _archive(
    base: Path,
    target: Path,
    passwords: Sequence[str],
    layers: Sequence[list[PlacedLine]],
    layered: Sequence[int],
    timeout_seconds: float,
) -> str:
    """Make `target` (`base` with its layer) PDF/A-2b: as it is where pikepdf's preparation
    passes its validator; otherwise `base` through Ghostscript, the same layer laid over
    that (Ghostscript never rewrites the layer's font or positions), and validated. Which
    way it went; SearchablePdfError with the findings where neither passes."""
    from ocrd.output.pdfa import PdfaError, ghostscript_pdfa, save_validated

    staged, rewritten, relayered = (temporary_path(target.parent) for _ in range(3))
    try:
        try:
            save_validated(target, staged, passwords)
            route = "pikepdf"
        except PdfaError as first:
            try:
                ghostscript_pdfa(base, rewritten, passwords, timeout_seconds)
                _layered_copy(rewritten, relayered, (), layers, only=layered)
                save_validated(relayered, staged)
            except PdfaError as second:
                raise SearchablePdfError(
                    f"cannot be made PDF/A-2b: {second} (before Ghostscript: {first})",
                    second.findings or first.findings,
                ) from None
            route = "ghostscript"
        os.replace(staged, target)
        return route
    finally:
        for path in (staged, rewritten, relayered):
            path.unlink(missing_ok=True)
