"""Searchable PDFs: the original pages, untouched, with the recognised text laid invisibly
over them.

A document that is one whole PDF gets its text layer as an incremental update: the output
is the original file byte for byte, followed by the new objects (a font, and per page a
content stream and the page's new /Contents and /Resources). Nothing of the original is
decoded, re-rendered or recompressed, and a signature over the original bytes stays intact.
A damaged PDF (one MuPDF had to repair to read, or whose pages' content does not decode) is
rewritten whole instead, as MuPDF reads it, so that what comes out opens cleanly in every
reader. Any other document (a part of a batch split at separator sheets, images, a scan
job's files, a duplex pair) is assembled in its page order: a PDF's pages are copied with
their streams as they are; an image becomes a page of its own size (its DPI, or a sensible
default) through img2pdf, which keeps JPEG bytes as they are and stores other images
losslessly (G4 and bilevel scans as CCITT, PNG data as it is).

The text is drawn invisibly with a font of empty glyphs (`pdffont.py`), each line scaled to
its box over the page's own content (`pdflayer.py`); which text goes where is
`textlayer.py`'s business.

Pages read from their own text layer, blank pages, pages the engine failed on, and PDF
pages that already carry text of their own get no layer: never two layers on one page.

PDF parsing is dangerous: this runs in a render worker process, never in the daemon's.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from ocrd import __version__
from ocrd.domain import InputFormat, PageResult
from ocrd.files import temporary_path
from ocrd.files.dropped import open_input
from ocrd.output.linefind import LineFinder
from ocrd.output.pdflayer import lay_text
from ocrd.output.textlayer import FoundLine, PlacedLine, page_lines, wants_found_lines

DEFAULT_PAGE_LONG_SIDE_INCHES = 11.69  # an image without a usable DPI: as long as A4
MIN_IMAGE_DPI, MAX_IMAGE_DPI = 10.0, 10000.0  # a declared DPI outside is no DPI


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
    (`ocrd/files/dropped.py`), and named by their descriptors from then on."""
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


def damage(doc: Any) -> str | None:
    """What is wrong with a PDF's structure, or None: MuPDF had to repair it to read it (no
    trailer, a broken cross-reference table), a stream's length or encryption is wrong, or a
    page's content stream does not decode. Such a file is rewritten whole rather than
    updated. Damage inside an image's data is the page as it is, kept as it is. Reading the
    raw streams and the pages' content streams costs milliseconds (images stay encoded)."""
    import pymupdf

    if doc.is_repaired:
        return "its structure is damaged (MuPDF repaired it to read it)"
    pymupdf.TOOLS.reset_mupdf_warnings()
    for xref in range(1, doc.xref_length()):
        # Cross-reference streams are never encrypted; MuPDF decrypting them warns.
        if doc.xref_is_stream(xref) and doc.xref_get_key(xref, "Type")[1] != "/XRef":
            doc.xref_stream_raw(xref)
    for page in doc:
        page.read_contents()
    if warnings := pymupdf.TOOLS.mupdf_warnings():
        return f"it is damaged ({warnings.splitlines()[0]})"
    return None


def restore_contents(doc: Any) -> None:
    """Each page content stream that does not decode written again as MuPDF reads it (up
    to the damage), so that the rewritten file holds a stream every reader decodes."""
    import pymupdf

    for page in doc:
        for xref in page.get_contents():
            pymupdf.TOOLS.reset_mupdf_warnings()
            data = doc.xref_stream(xref)
            if pymupdf.TOOLS.mupdf_warnings():
                doc.update_stream(xref, data, compress=True)


# A damaged file's rewrite: every object as MuPDF read it, unused ones dropped.
REPAIRED = {"garbage": 3, "clean": False, "deflate": False, "expand": 0}
# A file that cannot be updated incrementally otherwise: its streams as they are.
WHOLE = {"garbage": 0, "clean": False, "deflate": False, "expand": 0}


def _layered_copy(
    base: Path,
    target: Path,
    passwords: Sequence[str],
    layers: Sequence[list[PlacedLine]],
    only: Sequence[int] | None = None,
) -> tuple[list[int], list[int], bool]:
    """`base` copied to `target` with the layer appended as an incremental update: the
    base's bytes come first, unchanged (the third value True). A damaged file (`damage`)
    is rewritten whole instead, so the output opens cleanly in every reader, and so is one
    MuPDF cannot update incrementally (the third value False)."""
    shutil.copyfile(base, target)
    doc = open_pdf(target, passwords)
    try:
        if doc.page_count != len(layers):
            raise SearchablePdfError(
                f"{_shown(base)} has {doc.page_count} pages, the recognised text {len(layers)}"
            )
        damaged = damage(doc)
        layered, own_text = lay_text(doc, layers, only)
        if damaged is None and not layered:
            return layered, own_text, True  # the copy is the output
        if damaged is None and doc.can_save_incrementally():
            doc.saveIncr()
            return layered, own_text, True
        if damaged is not None:
            restore_contents(doc)
        options = REPAIRED if damaged else WHOLE
        data = doc.tobytes(**options, **_encrypted_as(doc, target, passwords))
    finally:
        doc.close()
    target.write_bytes(data)
    return layered, own_text, False


def _encrypted_as(doc: Any, path: Path, passwords: Sequence[str]) -> dict[str, Any]:
    """The options that encrypt a whole rewrite of `doc` (read from `path`) as it was: the
    same password opens it (none, where it had only an owner password), with the same
    permissions (MuPDF drops the encryption of a file it rewrites otherwise); for a file
    that was not encrypted, none."""
    import secrets

    import pymupdf

    if not (doc.metadata or {}).get("encryption"):
        return {}
    with pymupdf.open(path, filetype="pdf") as again:
        password = next((p for p in ("", *passwords) if again.authenticate(p)), "")
    return {
        "encryption": pymupdf.PDF_ENCRYPT_AES_256,  # type: ignore[attr-defined]
        "user_pw": password,
        "owner_pw": secrets.token_urlsafe(24),  # nobody's: the original's is not known
        "permissions": doc.permissions,
    }


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


@dataclass(frozen=True)
class PdfSettings:
    """How a searchable PDF is made: PDF/A-2b with `archive` (Ghostscript given
    `archive_timeout_seconds`), encrypted inputs opened with `passwords`, the files read
    beneath `root` (no link followed out of it), the lines of pages whose model gave no
    positions found by `line_finder` (None: such text is spread over the page)."""

    archive: bool = False
    passwords: Sequence[str] = ()
    archive_timeout_seconds: float = 600.0
    root: Path | None = None
    line_finder: LineFinder | None = None  # finds the lines of pages without positions


def write_searchable_pdf(
    files: Sequence[tuple[Path, InputFormat]],
    page_order: Sequence[tuple[int, int]],
    pages: Sequence[PageResult],
    target: Path,
    settings: PdfSettings = PdfSettings(),
) -> SearchablePdfResult:
    """Write the document's searchable PDF to `target` (a new temporary file the caller
    links into place; fsynced here, removed again on failure). Blocking; run it in a render
    worker process.

    `files` and `page_order` are what `ocrd/documents/sources.py` gives (each file with its format;
    (file index, page in file) for each document page in reading order); `pages` the
    document's recognised pages in the same order; the settings' `passwords` those of the
    inbox, for encrypted PDFs. With `archive`, the file is PDF/A-2b (see
    `ocrd/output/pdfa.py`); where that cannot be, SearchablePdfError with the validator's
    findings. With the settings' `line_finder`, the text of a model that gives no positions
    is laid over the lines found on its page."""
    if len(pages) != len(page_order):
        raise SearchablePdfError(
            f"{len(page_order)} pages in the document, but {len(pages)} recognised"
        )
    with _held(files, settings.root) as held:
        return _write(held, page_order, pages, target, settings)


def _layers(
    base: Path, pages: Sequence[PageResult], settings: PdfSettings
) -> list[list[PlacedLine]]:
    """Each page's layer (`base` holds the document's pages in order); a page whose model
    gave no positions over the lines the settings' `line_finder` finds on it."""
    wanted = [index for index, page in enumerate(pages) if wants_found_lines(page)]
    found: dict[int, list[FoundLine]] = {}
    if wanted and settings.line_finder is not None:
        doc = open_pdf(base, settings.passwords)
        try:
            found = settings.line_finder.find_on_pdf_pages(doc, wanted)
        except Exception:  # found lines only refine the layer: without them it is spread
            found = {}
        finally:
            doc.close()
    return [page_lines(page, found.get(index, ())) for index, page in enumerate(pages)]


def _write(
    files: Sequence[tuple[Path, InputFormat]],
    page_order: Sequence[tuple[int, int]],
    pages: Sequence[PageResult],
    target: Path,
    settings: PdfSettings,
) -> SearchablePdfResult:
    passwords, count = settings.passwords, len(pages)
    assembled = temporary_path(target.parent)  # a killed worker's are swept at start
    try:
        if _whole_pdf(files, page_order, passwords):
            base = files[0][0]  # one PDF, all its pages in their order: updated as it is
        else:  # a part of a PDF, images, several files: a new PDF of the pages in order
            assemble(files, page_order, assembled, passwords)
            base = assembled
        layers = _layers(base, pages, settings)
        layered, own_text, appended = _layered_copy(base, target, passwords, layers)
        incremental = appended and base is not assembled  # the input's own bytes come first
        route = None
        if settings.archive:
            timeout = settings.archive_timeout_seconds
            route = _archive(base, target, passwords, layers, layered, timeout)
            incremental = False
        _fsync(target)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    finally:
        assembled.unlink(missing_ok=True)
    return SearchablePdfResult(count, layered, own_text, incremental, route)


def _whole_pdf(
    files: Sequence[tuple[Path, InputFormat]],
    page_order: Sequence[tuple[int, int]],
    passwords: Sequence[str],
) -> bool:
    """Whether the pages are one PDF's, every one of them, in its own order."""
    if len(files) != 1 or files[0][1] is not InputFormat.pdf:
        return False
    if list(page_order) != [(0, n) for n in range(1, len(page_order) + 1)]:
        return False
    doc = open_pdf(files[0][0], passwords)
    try:
        return bool(doc.page_count == len(page_order))
    finally:
        doc.close()


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
