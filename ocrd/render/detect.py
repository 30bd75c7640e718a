"""What an input is: by its first bytes, never by its name; for an office document or web
page by its content too (`ocrd/office/detect.py`), and only Markdown and CSV, which no
content tells apart from other text, by their name's extension."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

from ocrd.domain import InputFormat
from ocrd.files.dropped import NotRegularFile, opened
from ocrd.office.detect import office_format
from ocrd.office.limits import OfficeRefused
from ocrd.render.errors import RenderError, RenderFailure

_SIGNATURES: tuple[tuple[bytes, InputFormat], ...] = (
    (b"\x89PNG\r\n\x1a\n", InputFormat.png),
    (b"\xff\xd8\xff", InputFormat.jpeg),
    (b"II*\x00", InputFormat.tiff),
    (b"MM\x00*", InputFormat.tiff),
    (b"II+\x00", InputFormat.tiff),  # BigTIFF
    (b"MM\x00+", InputFormat.tiff),
)


def not_a_file(error: NotRegularFile) -> RenderError:
    return RenderError(
        f"not a regular file ({error.strerror}); ocrd reads only files dropped as they are",
        code=RenderFailure.unsupported,
    )


def detect_format(path: Path, root: Path | None = None) -> InputFormat:
    """Recognise an input by its first bytes. Only a regular file is opened (never through
    a link, also none on the way below `root`, never blocking on a FIFO)."""
    try:
        with opened(path, root) as handle:
            head = handle.read(1024)
            found = _by_head(head) or _office(handle, head, path.name)
    except NotRegularFile as error:
        raise not_a_file(error) from None
    if found is not None:
        return found
    raise RenderError(
        f"not a PDF, TIFF, PNG or JPEG file, nor a Word (.docx), PowerPoint (.pptx) or "
        f"Excel (.xlsx) document, a web page or UTF-8 Markdown (.md) or CSV (.csv) text (it "
        f"starts with {head[:8]!r}); ocrd recognises inputs by their content, and only "
        "Markdown and CSV by their name",
        code=RenderFailure.unsupported,
    )


def _by_head(head: bytes) -> InputFormat | None:
    if not head:
        raise RenderError("the file is empty (0 bytes)", code=RenderFailure.empty)
    for signature, fmt in _SIGNATURES:
        if head.startswith(signature):
            return fmt
    if b"%PDF-" in head:  # the PDF header may follow a few bytes of junk
        return InputFormat.pdf
    return None


def _office(handle: BinaryIO, head: bytes, name: str) -> InputFormat | None:
    try:
        return office_format(handle, head, name)
    except OfficeRefused as error:
        raise RenderError(str(error), code=RenderFailure(error.code.value)) from None
