"""Pictures a web page or Markdown file carries inside itself as `data:` URIs (a browser's
"save as single file", a note app's Markdown export), read as a Word file's pictures are.

docling places them, ocrd decodes them. With `fetch_images` on, docling's HTML and
Markdown backends put a picture where each `<img src>` or `![](...)` stands and ask their
image loader (docling's `ImageResourceLoader`, built by name in each backend's module) for
its pixels. With its fetches off that loader reads no file and no URL, but it decodes a
`data:` URI itself, and not as ocrd must: any format Pillow opens (EPS among them, which
Pillow hands to Ghostscript, installed beside ocrd for PDF/A), every such picture in the
document (a page of thousands of icons, each decoded and encoded again as PNG), with no
budget for the pixels of all together. So while a web page or Markdown file is converted,
the loader those modules build is `EmbeddedPictureLoader` (`embedded_pictures`): it loads
nothing outside the document, and reads a `data:` URI only if its bytes (never its declared
type) are PNG, JPEG, GIF (the first frame) or WebP, within the limits that bound a Word
file's pictures. Every other picture stays the placeholder it was before.
"""

from __future__ import annotations

import base64
import importlib
import io
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from PIL import Image

from ocrd.domain import InputFormat
from ocrd.office.limits import OfficeLimits

if TYPE_CHECKING:  # docling is imported in the worker only, where a document needs it
    from docling_core.types.doc.common.reference import ImageRef

# The modules whose backends build an image loader, by format: a Markdown file's HTML
# blocks are read by an HTML backend docling makes for them.
LOADER_MODULES = {
    InputFormat.html: ("docling.backend.html_backend",),
    InputFormat.md: ("docling.backend.md_backend", "docling.backend.html_backend"),
}
SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"\xff\xd8\xff", "JPEG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
)
_HEAD_CHARACTERS = 16  # base64 for the first 12 bytes: every signature, WebP's included
# How far into a source its comma and its first base64 characters are looked for: only so
# much of a source is read before it counts as decoded, as a Markdown file may name one
# picture of megabytes (or one that is no picture) a hundred thousand times.
_HEADER_CHARACTERS = 256
_WHITESPACE = re.compile(r"[\t\n\f\r ]+")  # browsers drop it from a data: URI's base64
DPI = 72  # what docling records for a picture that names none
# Parts a decoder works through whole, however few bytes each takes, by format: a
# progressive JPEG's scans (each a pass over every block of the picture: 3,000 scans of a
# 7000 x 7000 JPEG, in 0.5 MB, took 8 s to decode) and a PNG's colour profiles (each
# inflated up to 1 MB: 1,000 of them in 1 MB took 3 s). A real JPEG has about ten scans,
# a PNG one profile (the most its standard allows; a few more stand for chance matches in
# its compressed data). The markers are counted in the bytes, an upper bound.
MOST_PARTS = {"JPEG": (b"\xff\xda", 100), "PNG": (b"iCCP", 4)}


def raster_format(head: bytes) -> str | None:
    """Pillow's name of the format the bytes start as, among those read; None otherwise."""
    for signature, name in SIGNATURES:
        if head.startswith(signature):
            return name
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return None


def payload_start(source: str) -> int | None:
    """Where the base64 text of a `data:...;base64,` source starts; None for any other
    source (a URL, a path, a data: URI of text). Only its first characters are read."""
    comma = source.find(",", 0, _HEADER_CHARACTERS)
    header = source[: max(comma, 0)].lstrip().lower()
    if comma < 0 or not header.startswith("data:") or not header.endswith(";base64"):
        return None
    return comma + 1


def head_format(source: str, start: int) -> str | None:
    """The format of the payload starting at `start`, told by its first bytes, before the
    rest is decoded (or even read)."""
    head = _WHITESPACE.sub("", source[start : start + _HEADER_CHARACTERS])
    try:
        first = base64.b64decode(head[:_HEAD_CHARACTERS], validate=True)
    except ValueError:  # binascii.Error: not base64
        return None
    return raster_format(first)


def too_many_parts(data: bytes, kind: str) -> bool:
    """Whether the picture holds more of the parts its decoder works through whole than
    a real one does (`MOST_PARTS`)."""
    marker, most = MOST_PARTS.get(kind, (b"", 0))
    return bool(marker) and data.count(marker) > most


def transparent(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info


def on_white(image: Image.Image) -> Image.Image:
    """An RGB or RGBA picture in RGB, what is transparent in it white (as a page shows it:
    black text on a transparent picture would otherwise turn black on black)."""
    if image.mode != "RGBA":
        return image
    return Image.alpha_composite(Image.new("RGBA", image.size, "white"), image).convert("RGB")


@dataclass
class EmbeddedPictures:
    """One document's embedded pictures, decoded as docling asks for them while the limits
    allow: at most `max_pictures` decoded, `max_decoded_pixels` of them as stored and
    `max_picture_pixels` as kept for the engine, each within the worker's Pillow limit.
    What is not decoded stays a placeholder, counted with the document's unread pictures."""

    limits: OfficeLimits
    decoded: int = 0  # pictures whose pixels were decoded, or tried
    # their base64 characters: a picture named again is decoded again, so that naming one
    # many times cannot make the worker decode more than a page may hold (max_text_bytes)
    decoded_characters: int = 0
    decoded_pixels: int = 0  # their pixels as Pillow decoded them
    kept_pixels: int = 0  # their pixels once scaled down for the engine

    def image(self, source: str) -> Image.Image | None:
        """The picture a `data:` URI holds, in RGB, scaled to `max_picture_side` (None:
        not one read)."""
        start = payload_start(source)
        if start is None or not self._decoding_allowed(len(source) - start):
            return None
        kind = head_format(source, start)
        if kind is None:
            return None
        self.decoded += 1
        self.decoded_characters += len(source) - start
        try:
            image = self._decoded(_WHITESPACE.sub("", source[start:]), kind)
        except MemoryError:
            raise
        except Exception:  # broken base64, a damaged or hostile picture: Pillow's errors vary
            return None
        if image is None or self.kept_pixels + image.width * image.height > (
            self.limits.max_picture_pixels
        ):
            return None
        self.kept_pixels += image.width * image.height
        return image

    def _decoding_allowed(self, characters: int) -> bool:
        limits = self.limits
        return (
            self.decoded < limits.max_pictures
            and self.decoded_characters + characters <= limits.max_text_bytes
            and self.decoded_pixels < limits.max_decoded_pixels
            and self.kept_pixels < limits.max_picture_pixels
        )

    def _decoded(self, payload: str, kind: str) -> Image.Image | None:
        """The payload's first frame decoded (a JPEG at the smallest scale that keeps the
        engine's side) and scaled down; None where its size breaks a limit, told by its
        header before its pixels are decoded, or where it holds more scans or profiles than
        a picture does."""
        side = self.limits.max_picture_side
        data = base64.b64decode(payload, validate=True)
        if too_many_parts(data, kind):
            return None
        with warnings.catch_warnings():  # past the limit it is refused here, not warned of
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            opened = Image.open(io.BytesIO(data), formats=(kind,))
        with opened:
            most = Image.MAX_IMAGE_PIXELS  # the worker's own, as for an image page
            if most is not None and opened.width * opened.height > most:
                return None
            if kind == "JPEG":
                opened.draft("RGB", (side, side))
            pixels = opened.width * opened.height
            if self.decoded_pixels + pixels > self.limits.max_decoded_pixels:
                return None
            self.decoded_pixels += pixels
            image = opened.convert("RGBA" if transparent(opened) else "RGB")
        image.thumbnail((side, side))
        return on_white(image)


class EmbeddedPictureLoader:
    """What docling's HTML and Markdown backends ask of their image loader, answered from
    the document alone: a `data:` URI's picture, as `EmbeddedPictures` allows; for any
    other source (a URL, a path, `file:`) nothing, and nothing is ever fetched."""

    def __init__(self, pictures: EmbeddedPictures) -> None:
        self.pictures = pictures

    def resolve_relative_path(self, loc: str, base_path: str | None) -> str:
        return loc.strip()  # resolved against nothing: nothing is loaded from a place

    def create_image_ref(self, src_url: str, base_path: str | None) -> ImageRef | None:
        from docling_core.types.doc.common.reference import ImageRef

        image = self.pictures.image(src_url)
        return None if image is None else ImageRef.from_pil(image, dpi=DPI)

    def load_image_ref(self, src: str, base_path: str | None) -> ImageRef | None:
        return self.create_image_ref(src, base_path)

    def load_image_data(self, src_loc: str, base_path: str | None) -> bytes | None:
        return None

    def fetch_remote(self, url: str) -> NoReturn:
        raise ValueError(f"ocrd fetches nothing: {url[:80]!r} was not loaded")


@contextmanager
def embedded_pictures(fmt: InputFormat, limits: OfficeLimits) -> Iterator[bool]:
    """While docling converts a document of `fmt`: whether its `data:` pictures are read
    (then its backends build `EmbeddedPictureLoader`s for this document, and docling's own
    loader again afterwards). False for formats without them, and for a docling whose
    backends no longer build their loader by the name replaced here: its pictures stay
    placeholders, as no loader of docling's may decode them."""
    if fmt not in LOADER_MODULES:
        yield False
        return
    from docling.backend.utils.image_resource_loader import ImageResourceLoader

    modules = [importlib.import_module(name) for name in LOADER_MODULES[fmt]]
    if any(
        getattr(module, "ImageResourceLoader", None) is not ImageResourceLoader
        for module in modules
    ):
        yield False
        return
    pictures = EmbeddedPictures(limits)

    def build(**_: object) -> EmbeddedPictureLoader:  # docling's settings: nothing is fetched
        return EmbeddedPictureLoader(pictures)

    for module in modules:
        setattr(module, "ImageResourceLoader", build)  # noqa: B010 (a module's own name)
    try:
        yield True
    finally:
        for module in modules:
            setattr(module, "ImageResourceLoader", ImageResourceLoader)  # noqa: B010
