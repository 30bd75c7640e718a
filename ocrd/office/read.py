"""The conversion, in a render worker: the file's bytes checked (`inspect.py`), then
docling's rule-based backend for its format makes a DoclingDocument. Its pictures' pixels
are taken out (scaled to at most `max_picture_side`) for the engine, which the daemon
asks; the document goes back as JSON without them.

docling reads the bytes from memory, never the file's path (so nothing beside it can be
resolved), with every fetch switched off: HTML and Markdown image sources, remote or
local, are never loaded (their pictures stay placeholders), only a picture the file holds
itself as a `data:` URI is read, and by ocrd (`embedded.py`); charts are not rendered
(that would start LibreOffice).
"""

from __future__ import annotations

import importlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image

from ocrd.domain import InputFormat
from ocrd.files.dropped import opened
from ocrd.files.writes import write_scratch_file
from ocrd.office.embedded import embedded_pictures, on_white, transparent
from ocrd.office.inspect import check_document
from ocrd.office.limits import OfficeLimits, OfficeRefusal, OfficeRefused

if TYPE_CHECKING:  # docling is imported in the worker only, where a document needs it
    from docling.backend.abstract_backend import DeclarativeDocumentBackend
    from docling.datamodel.base_models import InputFormat as Docling
    from docling_core.types.doc.document import DoclingDocument


@dataclass(frozen=True)
class OfficePicture:
    """A picture of the document, for the engine: its place, and its pixels (RGB)."""

    ref: str  # the picture's `self_ref` in the DoclingDocument
    width: int
    height: int
    # a PPM file in the folder the daemon named, loaded when the engine takes the picture;
    # where it could not be written (a full disk), the pixels travel instead
    file: Path | None = None
    pixels: bytes = b""


@dataclass(frozen=True)
class OfficeRead:
    """What the worker made of the file."""

    docling: dict[str, Any]  # the DoclingDocument, pictures without their images
    pictures: tuple[OfficePicture, ...]
    unread_pictures: int  # beyond `max_pictures`, or with no pixels docling could decode


def read_bytes(path: Path, root: Path | None, limits: OfficeLimits) -> bytes:
    """The file, opened as a regular file only (no link followed), within the size limit."""
    with opened(path, root) as handle:
        data = handle.read(limits.max_file_bytes + 1)
    if len(data) > limits.max_file_bytes:
        raise OfficeRefused(
            f"the file is larger than the {limits.max_file_bytes // (1024 * 1024)} MB ocrd "
            "converts",
            OfficeRefusal.too_large,
        )
    return data


def without_model_libraries() -> None:
    """Mark torch and transformers absent in this worker (where nothing imported them):
    docling's model code imports them where installed (next to vLLM; docling-core's
    chunking extra brings transformers) though a rule-based backend never uses them, and
    torch is more than the worker's address-space limit can map. Absent, docling takes the
    paths of its slim install, and its import costs seconds less."""
    for name in ("torch", "transformers"):
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


BACKENDS = {  # docling's format name, and the module and class of its rule-based backend
    InputFormat.docx: ("DOCX", "docling.backend.msword_backend", "MsWordDocumentBackend"),
    InputFormat.pptx: (
        "PPTX",
        "docling.backend.mspowerpoint_backend",
        "MsPowerpointDocumentBackend",
    ),
    InputFormat.xlsx: ("XLSX", "docling.backend.msexcel_backend", "MsExcelDocumentBackend"),
    InputFormat.html: ("HTML", "docling.backend.html_backend", "HTMLDocumentBackend"),
    InputFormat.md: ("MD", "docling.backend.md_backend", "MarkdownDocumentBackend"),
    InputFormat.csv: ("CSV", "docling.backend.csv_backend", "CsvDocumentBackend"),
}


def backend_options(fmt: InputFormat, embedded: bool = False) -> Any:
    """The backend's options with every fetch off (None: the backend fetches nothing).
    `embedded`: a web page's or Markdown file's pictures are asked of the image loader,
    which then is `embedded.py`'s, loading nothing but `data:` URIs."""
    from docling.datamodel import backend_options as options

    off: dict[str, Any] = {"enable_local_fetch": False, "enable_remote_fetch": False}
    if fmt is InputFormat.docx:
        return options.MsWordBackendOptions(render_chart_images=False, **off)
    if fmt is InputFormat.html:
        return options.HTMLBackendOptions(fetch_images=embedded, **off)
    if fmt is InputFormat.md:
        return options.MarkdownBackendOptions(fetch_images=embedded, **off)
    return None


def backend_for(
    fmt: InputFormat, embedded: bool = False
) -> tuple[Docling, type[DeclarativeDocumentBackend], Any]:
    """docling's format, rule-based backend and its options for `fmt` (only that backend's
    libraries imported)."""
    from docling.datamodel.base_models import InputFormat as Docling

    kind, module, name = BACKENDS[fmt]
    backend = getattr(importlib.import_module(module), name)
    return Docling[kind], backend, backend_options(fmt, embedded)


def convert(data: bytes, fmt: InputFormat, limits: OfficeLimits) -> DoclingDocument:
    """docling's DoclingDocument of the bytes, by its rule-based backend for the format (what
    docling's DocumentConverter runs for these formats, without its model pipelines), with
    the pictures a web page or Markdown file embeds as `data:` URIs; OfficeRefused where
    docling cannot read them."""
    without_model_libraries()
    with embedded_pictures(fmt, limits) as embedded:
        return converted(data, fmt, backend_for(fmt, embedded))


def converted(
    data: bytes, fmt: InputFormat, chosen: tuple[Docling, type[DeclarativeDocumentBackend], Any]
) -> DoclingDocument:
    """The bytes converted by the `chosen` backend (its format, class and options)."""
    from docling.backend.abstract_backend import DeclarativeDocumentBackend
    from docling.datamodel.document import InputDocument

    kind, backend, options = chosen
    try:
        source = InputDocument(
            io.BytesIO(data), kind, backend, options, filename=f"document.{fmt.value}"
        )
        made = source._backend
        if not source.valid or not made.is_valid():
            raise ValueError(source._rejection.message if source._rejection else "not valid")
        assert isinstance(made, DeclarativeDocumentBackend)
        return made.convert()
    except MemoryError:
        raise
    except Exception as error:  # docling's own errors, and its parsers'
        raise OfficeRefused(
            f"docling could not read it as a {fmt.value} file: {type(error).__name__}: {error}",
            OfficeRefusal.damaged,
        ) from None


def check_picture_items(doc: DoclingDocument, limits: OfficeLimits) -> None:
    """OfficeRefused where the document holds more pictures than `max_picture_items`."""
    if len(doc.pictures) > limits.max_picture_items:
        raise OfficeRefused(
            f"it holds {len(doc.pictures)} pictures, more than the {limits.max_picture_items} "
            "ocrd converts in one document: split it",
            OfficeRefusal.too_large,
        )


def picture_file(image: Image.Image, path: Path) -> Path | None:
    """The picture written to `path` as a PPM file (None where that failed)."""
    return path if write_scratch_file(path, lambda out: image.save(out, "PPM")) else None


def kept_picture(ref: str, image: Image.Image, path: Path | None) -> OfficePicture:
    """The picture for the engine: a file at `path`, else its pixels."""
    file = picture_file(image, path) if path is not None else None
    pixels = b"" if file is not None else image.tobytes()
    return OfficePicture(ref, image.width, image.height, file, pixels)


def take_pictures(
    doc: DoclingDocument, limits: OfficeLimits, folder: Path | None = None
) -> tuple[list[OfficePicture], int]:
    """Each picture (up to `max_pictures`, and `max_picture_pixels` in all), taken out of
    the document, written into `folder` where one is given."""
    taken: list[OfficePicture] = []
    unread, pixels = 0, 0
    for picture in doc.pictures:
        image = None
        if picture.image is not None and len(taken) < limits.max_pictures:
            try:
                image = picture.image.pil_image
            except Exception:  # an image docling kept but PIL cannot decode
                image = None
        picture.image = None  # the outputs name no file: the picture's text stands for it
        if image is not None:  # transparent parts white, as the page shows them
            image = on_white(image.convert("RGBA" if transparent(image) else "RGB"))
            image.thumbnail((limits.max_picture_side, limits.max_picture_side))
        if image is None or pixels + image.width * image.height > limits.max_picture_pixels:
            unread += 1
            continue
        pixels += image.width * image.height
        path = folder / f"picture-{len(taken) + 1}.ppm" if folder is not None else None
        taken.append(kept_picture(picture.self_ref, image, path))
    return taken, unread


def read_office(
    path: Path,
    fmt: InputFormat,
    root: Path | None,
    limits: OfficeLimits,
    max_pixels: int,
    pictures_folder: Path | None = None,
) -> OfficeRead:
    """The file checked and converted, its pictures written into `pictures_folder` (where
    given); OfficeRefused with the reason where it must not be."""
    data = read_bytes(path, root, limits)
    check_document(data, fmt, limits)
    Image.MAX_IMAGE_PIXELS = max_pixels  # this worker's own limit, as for image pages
    doc = convert(data, fmt, limits)
    check_picture_items(doc, limits)
    pictures, unread = take_pictures(doc, limits, pictures_folder)
    return OfficeRead(doc.export_to_dict(), tuple(pictures), unread)
