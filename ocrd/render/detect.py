"""What an input is, by its first bytes, never by its name."""

from __future__ import annotations

from pathlib import Path

from ocrd.domain import InputFormat
from ocrd.files.dropped import NotRegularFile, opened
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
    except NotRegularFile as error:
        raise not_a_file(error) from None
    if not head:
        raise RenderError("the file is empty (0 bytes)", code=RenderFailure.empty)
    for signature, fmt in _SIGNATURES:
        if head.startswith(signature):
            return fmt
    if b"%PDF-" in head:  # the PDF header may follow a few bytes of junk
        return InputFormat.pdf
    raise RenderError(
        f"not a PDF, TIFF, PNG or JPEG file (it starts with {head[:8]!r}); "
        "ocrd recognises inputs by their content, not by their name",
        code=RenderFailure.unsupported,
    )
