"""Hostile web pages, text tables, and documents whose size or shape is the attack (a
million cells, thousands of slides, pictures of tens of millions of pixels), made with
tests/hostile_office.py's tools: none of them is large on disk.
"""

from __future__ import annotations

import base64
import io
import os
import struct
import zlib
from pathlib import Path

import docx
from hostile_office import (
    GIB,
    MIB,
    R_NS,
    Bait,
    Entry,
    Inflating,
    document_xml,
    docx_bytes,
    entries_of,
    pptx_bytes,
    replaced,
    write_zip,
    xlsx_bytes,
)

# ---- HTML, Markdown, CSV --------------------------------------------------------------------


def html_references(bait: Bait) -> str:
    """Every HTML way to make a reader fetch something, at the secrets and the server."""
    refs = [*bait.local_refs, f"{bait.url}/html"]
    tags = []
    for i, ref in enumerate(refs):
        tags += [
            f'<img src="{ref}" srcset="{ref} 2x" alt="img {i}">',
            f'<link rel="stylesheet" href="{ref}">',
            f'<iframe src="{ref}"></iframe>',
            f'<object data="{ref}"></object>',
            f'<embed src="{ref}">',
            f'<video poster="{ref}"><source src="{ref}"></video>',
            f"<div style=\"background-image: url('{ref}')\">styled {i}</div>",
            f'<svg><image href="{ref}"/></svg>',
            f'<script src="{ref}"></script>',
        ]
    secret_dir = bait.secret_paths[0].parent
    return (
        f'<!DOCTYPE html><html><head><base href="file://{secret_dir}/">'
        f'<meta http-equiv="refresh" content="0; url={bait.url}/refresh">'
        f'<link rel="import" href="{bait.url}/import"><title>References</title></head><body>'
        f'<h1>References</h1><p>Text before.</p><img src="{bait.secret_paths[0].name}">'
        + "".join(tags)
        + "<p>Text after.</p></body></html>"
    )


def html_huge_data_uri(path: Path, size: int = 64 * MIB) -> Path:
    """An `<img>` whose data: URI is `size` bytes of base64 (a PNG header, then filler)."""
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * (size * 3 // 4)
    with path.open("wb") as out:
        out.write(b'<html><body><h1>Huge picture</h1><img src="data:image/png;base64,')
        out.write(base64.b64encode(png))
        out.write(b'"><p>Text after the picture.</p></body></html>')
    return path


def html_deep(path: Path, depth: int = 100_000) -> Path:
    path.write_text(
        "<html><body><p>Deep start</p>"
        + "<div>" * depth
        + "deep"
        + "</div>" * depth
        + "</body></html>"
    )
    return path


def markdown_references(bait: Bait) -> str:
    refs = [*bait.local_refs, f"{bait.url}/md.png"]
    lines = ["# References", "", "Text before."]
    for i, ref in enumerate(refs):
        lines += [
            f"![picture {i}]({ref})",
            f"[link {i}]({ref})",
            f'<img src="{ref}">',
            f"![ref {i}][r{i}]",
            f"[r{i}]: {ref}",
            "",
        ]
    return "\n".join([*lines, "Text after.", ""])


def markdown_deep(path: Path, depth: int = 100_000) -> Path:
    path.write_text("# Deep\n\n" + ">" * depth + " quoted\n\n" + "- " * depth + "listed\n")
    return path


def csv_wide(path: Path, columns: int = 1_000_000) -> Path:
    path.write_text("h," * (columns - 1) + "h\n" + "1," * (columns - 1) + "1\n")
    return path


def csv_long_line(path: Path, size: int = GIB) -> Path:
    with path.open("wb") as out:
        out.write(b"name,value\nlong,")
        block = b"x" * (16 * MIB)
        for _ in range(size // len(block)):
            out.write(block)
        out.write(b"\n")
    return path


# ---- spreadsheets and slides at scale ------------------------------------------------------

SHEET_HEAD = (
    '<?xml version="1.0" encoding="UTF-8"?><worksheet xmlns="http://schemas.openxmlformats.org/'
    'spreadsheetml/2006/main">'
)


def xlsx_sheet(path: Path, sheet: bytes | Inflating) -> Path:
    return write_zip(path, replaced(xlsx_bytes("x"), {"xl/worksheets/sheet1.xml": sheet}))


def xlsx_million_cells(path: Path, rows: int = 1000, columns: int = 1000) -> Path:
    """`rows` x `columns` cells, every one a formula over the whole column."""
    row_xml = b"".join(b"<c><f>SUM(A:A)*2</f><v>1</v></c>" for _ in range(columns))
    chunk = b"<row>" + row_xml + b"</row>"
    head = (SHEET_HEAD + "<sheetData>").encode()
    return xlsx_sheet(path, Inflating(head, chunk, rows, b"</sheetData></worksheet>"))


def xlsx_corners(path: Path) -> Path:
    """Two cells, at A1 and at the last cell a sheet can have: a reader that walks the
    grid between them walks 17 billion cells."""
    sheet = (
        SHEET_HEAD + '<dimension ref="A1:XFD1048576"/><sheetData>'
        '<row r="1"><c r="A1" t="inlineStr"><is><t>first</t></is></c></row>'
        '<row r="1048576"><c r="XFD1048576" t="inlineStr"><is><t>last</t></is></c></row>'
        "</sheetData></worksheet>"
    )
    return xlsx_sheet(path, sheet.encode())


def pptx_many_slides(path: Path, slides: int = 3000) -> Path:
    """`slides` copies of one slide, each its own part, listed in the presentation."""
    document = pptx_bytes("one of many")
    entries = {e.name: e.content for e in entries_of(document)}
    slide, slide_rels = (
        entries["ppt/slides/slide1.xml"],
        entries["ppt/slides/_rels/slide1.xml.rels"],
    )
    types, presentation = entries["[Content_Types].xml"], entries["ppt/presentation.xml"]
    rels = entries["ppt/_rels/presentation.xml.rels"]
    assert all(isinstance(x, bytes) for x in (slide, slide_rels, types, presentation, rels))
    numbers = range(2, slides + 1)
    slide_type = b"application/vnd.openxmlformats-officedocument.presentationml.slide+xml"
    changes: dict[str, bytes | Inflating] = {
        "[Content_Types].xml": types.replace(  # type: ignore[union-attr]
            b"</Types>",
            b"".join(
                b'<Override PartName="/ppt/slides/slide%d.xml" ContentType="%s"/>' % (n, slide_type)
                for n in numbers
            )
            + b"</Types>",
        ),
        "ppt/_rels/presentation.xml.rels": rels.replace(  # type: ignore[union-attr]
            b"</Relationships>",
            b"".join(
                b'<Relationship Id="rS%d" Type="%s/slide" Target="slides/slide%d.xml"/>'
                % (n, R_NS.encode(), n)
                for n in numbers
            )
            + b"</Relationships>",
        ),
        "ppt/presentation.xml": presentation.replace(  # type: ignore[union-attr]
            b"</p:sldIdLst>",
            b"".join(b'<p:sldId id="%d" r:id="rS%d"/>' % (300 + n, n) for n in numbers)
            + b"</p:sldIdLst>",
        ),
    }
    for n in numbers:
        changes[f"ppt/slides/slide{n}.xml"] = slide  # type: ignore[assignment]
        changes[f"ppt/slides/_rels/slide{n}.xml.rels"] = slide_rels  # type: ignore[assignment]
    return write_zip(path, replaced(document, changes))


def png_bomb(width: int, height: int) -> bytes:
    """A black RGB PNG of `width` x `height` pixels, a few hundred KB for 100 million."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    row = b"\0" * (1 + 3 * width)  # filter byte, then the pixels
    rows = Inflating(b"", row, height, b"")
    adler = 1
    for piece in rows.pieces():
        adler = zlib.adler32(piece, adler)
    stream = b"\x78\xda" + rows.deflated() + struct.pack(">I", adler)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", stream) + chunk(b"IEND", b"")
    )


def docx_picture_bomb(path: Path, pictures: int = 3, side: int = 9_000) -> Path:
    """Pictures of `side` x `side` pixels (81 million each, under twice Pillow's default
    bomb limit), a few hundred KB each: decoding them takes 240 MB apiece."""
    document = docx.Document()
    document.add_paragraph("Pictures ahead")
    picture = png_bomb(side, side)
    for _ in range(pictures):
        document.add_picture(io.BytesIO(picture))
    document.add_paragraph("Pictures behind")
    buffer = io.BytesIO()
    document.save(buffer)
    path.write_bytes(buffer.getvalue())
    return path


def docx_many_pictures(path: Path, pictures: int = 9, side: int = 2048) -> Path:
    """`pictures` drawings of one `side` x `side` PNG (stored once, a few KB): each is a
    picture the engine reads, its pixels `side` * `side` * 3 bytes on the way there."""
    document = docx.Document()
    document.add_paragraph("Album")
    picture = png_bomb(side, side)
    for _ in range(pictures):
        document.add_picture(io.BytesIO(picture))
    buffer = io.BytesIO()
    document.save(buffer)
    path.write_bytes(buffer.getvalue())
    return path


def paragraph_flood(path: Path) -> Path:
    """A document.xml under every size limit made of millions of empty paragraphs, a
    random part beside it keeping the archive's ratio in bounds."""
    head, tail = document_xml("|").split(b"|")
    paragraphs = b"<w:p/>" * (1 << 16)
    flood = Inflating(head, paragraphs, (90 * MIB) // len(paragraphs), tail)
    entries = replaced(docx_bytes("flood"), {"word/document.xml": flood})
    padding = Entry("word/media/noise.bin", os.urandom(MIB))
    return write_zip(path, [*entries, padding])
