"""What an office document or web page is: by its content where its content tells (an
OOXML zip's `[Content_Types].xml`, HTML's leading markup), by its name's extension where
nothing in the content can (Markdown, CSV: and then only for UTF-8 text).

This runs in the daemon (the claim reads the file's format before any worker), so it reads
only what it needs, within bounds: a zip's central directory is sized before Python's zip
reader lists it, and only its content types part is read.
"""

from __future__ import annotations

import re
import struct
import zipfile
from typing import BinaryIO
from xml.etree import ElementTree

from ocrd.domain import InputFormat
from ocrd.office.limits import DEFAULT_LIMITS, OfficeLimits, OfficeRefusal, OfficeRefused
from ocrd.office.shape import check_part_ratio

ZIP_SIGNATURE = b"PK\x03\x04"
CONTENT_TYPES = "[Content_Types].xml"
MAX_CONTENT_TYPES_BYTES = 1024 * 1024
CENTRAL_DIRECTORY_BYTES_PER_ENTRY = 1024  # a generous average; real ones are about 80
_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_EOCD_SEARCH = 22 + 65535  # the record and the longest comment it may carry

_OOXML = "application/vnd.openxmlformats-officedocument."
MAIN_TYPES = {
    _OOXML + "wordprocessingml.document.main+xml": InputFormat.docx,
    _OOXML + "presentationml.presentation.main+xml": InputFormat.pptx,
    _OOXML + "spreadsheetml.sheet.main+xml": InputFormat.xlsx,
}
MACRO_TYPES = {
    "application/vnd.ms-word.document.macroenabled.main+xml": "Word (.docm)",
    "application/vnd.ms-word.template.macroenabledtemplate.main+xml": "Word (.dotm)",
    "application/vnd.ms-powerpoint.presentation.macroenabled.main+xml": "PowerPoint (.pptm)",
    "application/vnd.ms-powerpoint.slideshow.macroenabled.main+xml": "PowerPoint (.ppsm)",
    "application/vnd.ms-excel.sheet.macroenabled.main+xml": "Excel (.xlsm)",
    "application/vnd.ms-excel.template.macroenabled.main+xml": "Excel (.xltm)",
    "application/vnd.ms-office.vbaproject": "a VBA project",
}
TEXT_SUFFIXES = {".md": InputFormat.md, ".markdown": InputFormat.md, ".csv": InputFormat.csv}
_HTML = re.compile(
    rb"(?:\xef\xbb\xbf)?\s*(?:<!--.*?-->\s*|<\?xml[^>]*>\s*)*"
    rb"<(?:!doctype\s+html|html|head|body)[\s>]",
    re.IGNORECASE | re.DOTALL,
)
_XML_DECLARATIONS = re.compile(rb"<!(?:DOCTYPE|ENTITY)", re.IGNORECASE)


def macros_refused(what: str) -> OfficeRefused:
    return OfficeRefused(
        f"it contains macros ({what}); ocrd converts no document that carries code: save "
        "it without macros (.docx, .pptx, .xlsx) and drop that",
        OfficeRefusal.hostile,
    )


def office_format(
    handle: BinaryIO, head: bytes, name: str, limits: OfficeLimits = DEFAULT_LIMITS
) -> InputFormat | None:
    """The office format of an open file that is no PDF or image (None: not one either);
    OfficeRefused for one that is, but must not be converted."""
    if head.startswith(ZIP_SIGNATURE):
        return zip_format(handle, limits)
    if _HTML.match(head):
        if _size(handle) > limits.max_text_bytes:
            raise too_large_text("web page", limits)
        return InputFormat.html
    suffix = name[name.rfind(".") :].lower() if "." in name else ""
    if suffix in TEXT_SUFFIXES:
        fmt = TEXT_SUFFIXES[suffix]
        check_utf8_text(handle, fmt, limits)
        return fmt
    return None


def too_large_text(what: str, limits: OfficeLimits) -> OfficeRefused:
    return OfficeRefused(
        f"the {what} is larger than the {limits.max_text_bytes // (1024 * 1024)} MB "
        "ocrd converts; split it into smaller files",
        OfficeRefusal.too_large,
    )


def check_utf8_text(handle: BinaryIO, fmt: InputFormat, limits: OfficeLimits) -> None:
    """A Markdown or CSV file (told by its name only) must be UTF-8 text, with no NUL."""
    handle.seek(0)
    data = handle.read(limits.max_text_bytes + 1)
    if len(data) > limits.max_text_bytes:
        raise too_large_text(f"{fmt.value} file", limits)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise OfficeRefused(
            f"a .{fmt.value} file must be UTF-8 text, and byte {error.start} is not "
            "UTF-8; save it as UTF-8 and drop it again",
            OfficeRefusal.unsupported,
        ) from None
    if b"\x00" in data:
        raise OfficeRefused(
            f"a .{fmt.value} file must be text, and this one holds NUL bytes",
            OfficeRefusal.unsupported,
        )


def _size(handle: BinaryIO) -> int:
    return handle.seek(0, 2)


def central_directory(handle: BinaryIO) -> tuple[int, int] | None:
    """(entries, bytes) of a zip's central directory as its end record says (zip64's where
    it points there); None where no end record is found (Python's reader then refuses)."""
    size = _size(handle)
    start = max(0, size - _EOCD_SEARCH)
    handle.seek(start)
    tail = handle.read()
    at = tail.rfind(_EOCD)
    if at < 0 or len(tail) - at < 22:
        return None
    entries, directory_bytes = struct.unpack_from("<HI", tail, at + 10)
    if entries != 0xFFFF and directory_bytes != 0xFFFFFFFF:
        return entries, directory_bytes
    locator = at - 20
    if locator < 0 or tail[locator : locator + 4] != _ZIP64_LOCATOR:
        return None
    (record_at,) = struct.unpack_from("<Q", tail, locator + 8)
    handle.seek(record_at)
    record = handle.read(56)
    if len(record) < 56:
        return None
    entries64, directory64 = struct.unpack_from("<QQ", record, 32)
    return entries64, directory64


def check_archive(infos: list[zipfile.ZipInfo], packed: int, limits: OfficeLimits) -> None:
    """Refuse a zip bomb by its listed sizes, before anything is inflated."""
    unzipped = sum(info.file_size for info in infos)
    if unzipped > limits.max_unzipped_bytes:
        raise OfficeRefused(
            f"it unpacks to {unzipped // (1024 * 1024)} MB, more than the "
            f"{limits.max_unzipped_mb} MB ocrd unpacks (a zip bomb, or a document too large)",
            OfficeRefusal.too_large,
        )
    if unzipped > limits.ratio_from_bytes and unzipped > limits.max_zip_ratio * max(packed, 1):
        raise OfficeRefused(
            f"it unpacks to {unzipped // max(packed, 1)} times its size (at most "
            f"{limits.max_zip_ratio} allowed): a zip bomb",
            OfficeRefusal.hostile,
        )
    for info in infos:
        check_part_ratio(info.filename, info.file_size, info.compress_size, limits)


def list_zip(handle: BinaryIO, limits: OfficeLimits) -> zipfile.ZipFile:
    """The zip, its directory sized before it is listed; its sizes checked."""
    directory = central_directory(handle)
    if directory is not None:
        entries, directory_bytes = directory
        if (
            entries > limits.max_zip_entries
            or directory_bytes > limits.max_zip_entries * CENTRAL_DIRECTORY_BYTES_PER_ENTRY
        ):
            raise OfficeRefused(
                f"the zip lists {entries} entries in {directory_bytes} bytes, more than the "
                f"{limits.max_zip_entries} entries ocrd opens (a zip bomb)",
                OfficeRefusal.too_large,
            )
    handle.seek(0)
    try:
        archive = zipfile.ZipFile(handle)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
        raise OfficeRefused(f"a damaged zip file: {error}", OfficeRefusal.damaged) from None
    infos = archive.infolist()
    if len(infos) > limits.max_zip_entries:
        raise OfficeRefused(
            f"the zip holds {len(infos)} entries, more than the {limits.max_zip_entries} "
            "ocrd opens (a zip bomb)",
            OfficeRefusal.too_large,
        )
    check_archive(infos, _size(handle), limits)
    return archive


def read_part(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes:
    """One part, refused beyond `limit` bytes (never inflated past its listed size)."""
    if info.file_size > limit:
        raise OfficeRefused(
            f"its part {info.filename} unpacks to {info.file_size} bytes, more than the "
            f"{limit} ocrd reads",
            OfficeRefusal.too_large,
        )
    try:
        with archive.open(info) as part:
            return part.read(limit + 1)[:limit]
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError, RuntimeError) as error:
        raise OfficeRefused(
            f"its part {info.filename} is damaged: {error}", OfficeRefusal.damaged
        ) from None


def refuse_declarations(data: bytes, part: str) -> None:
    """No XML part may declare a document type or entities: nothing is ever resolved."""
    if _XML_DECLARATIONS.search(data):
        raise OfficeRefused(
            f"its XML part {part} declares a document type or entities (<!DOCTYPE/<!ENTITY), "
            "which no Office document needs: refused, nothing in it resolved",
            OfficeRefusal.hostile,
        )


def content_types(archive: zipfile.ZipFile) -> dict[str, str]:
    """Part name (without its leading slash) or `*.ext`: its content type, lowercased."""
    data = read_part(archive, archive.getinfo(CONTENT_TYPES), MAX_CONTENT_TYPES_BYTES)
    refuse_declarations(data, CONTENT_TYPES)
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as error:
        raise OfficeRefused(
            f"its {CONTENT_TYPES} is damaged: {error}", OfficeRefusal.damaged
        ) from None
    types = {}
    for element in root:
        kind = element.get("ContentType", "").lower()
        if element.tag.endswith("Override"):
            types[element.get("PartName", "").lstrip("/")] = kind
        elif element.tag.endswith("Default"):
            types["*." + element.get("Extension", "").lower()] = kind
    return types


def zip_format(handle: BinaryIO, limits: OfficeLimits = DEFAULT_LIMITS) -> InputFormat | None:
    """A Word, PowerPoint or Excel file by its main part's content type; None for another
    zip; OfficeRefused for one with macros, or a zip bomb."""
    with list_zip(handle, limits) as archive:
        names = archive.namelist()
        if CONTENT_TYPES not in names:
            return None
        if any(name.lower().rsplit("/", 1)[-1] == "vbaproject.bin" for name in names):
            raise macros_refused("a VBA project")
        types = content_types(archive)
    for kind in types.values():
        if kind in MACRO_TYPES:
            raise macros_refused(MACRO_TYPES[kind])
    for kind in types.values():
        if kind in MAIN_TYPES:
            return MAIN_TYPES[kind]
    return None
