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
from PIL import Image

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


def data_uri(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def page_of(path: Path, body: str) -> Path:
    path.write_text(f"<html><body><p>Text before.</p>{body}<p>Text after.</p></body></html>")
    return path


def tiny_png() -> bytes:
    """Two by two pixels (a 1x1 RGB PNG starts as the planted secret picture does)."""
    return png_bomb(2, 2)


def html_tiny_data_uris(path: Path, count: int = 5000) -> Path:
    """`count` pictures of four pixels, each its own data: URI (icons and spacers of a saved
    page, thousands of them)."""
    return page_of(path, f'<img src="{data_uri(tiny_png())}">' * count)


def markdown_tiny_data_uris(path: Path, count: int = 120_000) -> Path:
    """More four-pixel pictures than a document's elements may be, on one line."""
    path.write_text("# Tiny\n\nText before.\n\n" + f"![]({data_uri(tiny_png())})" * count + "\n")
    return path


def markdown_huge_data_uri(path: Path, size: int = 15 * MIB) -> Path:
    """One picture of `size` bytes of base64: a PNG header, then filler."""
    png = b"\x89PNG\r\n\x1a\n" + b"\0" * (size * 3 // 4)
    path.write_text(f"# Huge\n\nText before.\n\n![huge]({data_uri(png)})\n\nText after.\n")
    return path


def html_broken_data_uris(path: Path) -> Path:
    """Base64 that is no base64, cut short, padded wrongly; a PNG header over garbage."""
    broken = [
        "data:image/png;base64,iVBORw0KGgo!!!!not base64",
        "data:image/png;base64," + base64.b64encode(tiny_png()).decode()[:-7],
        "data:image/png;base64,iVBORw0KGgo=AAAA",
        data_uri(b"\x89PNG\r\n\x1a\n" + os.urandom(4096)),
        data_uri(b"GIF89a" + os.urandom(64), "image/gif"),
        "data:image/png;base64,",
        "data:;base64,iVBORw0KGgo",
    ]
    return page_of(path, "".join(f'<img src="{uri}">' for uri in broken))


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose header claims `width` x `height` pixels over a few bytes of data."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    stream = zlib.compress(b"\0" * 64)
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", header)
        + png_chunk(b"IDAT", stream)
        + png_chunk(b"IEND", b"")
    )


def png_of_profiles(profiles: int, size: tuple[int, int] = (64, 32)) -> bytes:
    """A PNG of `size` holding `profiles` colour profiles (iCCP chunks) of a byte under a
    MB each as inflated, in about a KB each: a decoder inflates every one."""
    image = io.BytesIO()
    Image.new("RGB", size, "white").save(image, "PNG")
    data = image.getvalue()
    profile = png_chunk(b"iCCP", b"x\0\0" + zlib.compress(b"\0" * (MIB - 1), 9))
    end_of_header = 8 + 25  # the signature and IHDR
    return data[:end_of_header] + profile * profiles + data[end_of_header:]


def jpeg_of_scans(side: int, scans: int) -> bytes:
    """A grey progressive JPEG of `side` x `side` with `scans` more scans than Pillow
    writes: its first AC scan, with its table, repeated (about 100 bytes each, and each a
    pass over every block of the picture for a decoder)."""
    image = io.BytesIO()
    Image.new("L", (side, side), 200).save(image, "JPEG", progressive=True)
    data = image.getvalue()
    table = data.index(b"\xff\xc4", data.index(b"\xff\xda"))  # after the DC scan
    end = data.index(b"\xff\xc4", data.index(b"\xff\xda", table))
    return data[:end] + data[table:end] * scans + data[end:]


def html_picture_bombs(path: Path, within: int = 6) -> Path:
    """A PNG claiming 10 billion pixels; one of 81 million (over the worker's Pillow limit
    of 50 million, under twice it, which Pillow would decode); `within` of 49 million
    (each decoded, until the document's budget of decoded pixels is spent)."""
    over = data_uri(png_bomb(9_000, 9_000))
    under = data_uri(png_bomb(7_000, 7_000))
    claiming = data_uri(png_claiming(100_000, 100_000))
    return page_of(
        path, f'<img src="{claiming}"><img src="{over}">' + f'<img src="{under}">' * within
    )


def gif_of_frames(frames: int, size: tuple[int, int]) -> bytes:
    """An animated GIF of `frames` one-pixel frames on a screen of `size`: a reader that
    walks every frame works `frames` times."""
    width, height = size
    screen = b"GIF89a" + struct.pack("<HHBBB", width, height, 0x80, 0, 0) + b"\0\0\0\xff\xff\xff"
    loop = b"\x21\xff\x0bNETSCAPE2.0\x03\x01\0\0\0"
    frame = (
        b"\x21\xf9\x04\x00\x01\x00\x00\x00"  # a delay of 1/100 s
        + b"\x2c"
        + struct.pack("<HHHHB", 0, 0, 1, 1, 0)
        + b"\x02\x02\x44\x01\x00"  # LZW: one pixel of colour 0
    )
    return screen + loop + frame * frames + b"\x3b"


def html_gif_frames(path: Path, frames: int = 10_000, size: tuple[int, int] = (211, 61)) -> Path:
    return page_of(path, f'<img src="{data_uri(gif_of_frames(frames, size), "image/gif")}">')


def html_data_uris_no_picture_loads(path: Path, bait: Bait, size: tuple[int, int]) -> Path:
    """A PNG of `size` in every place that is no picture docling reads (CSS url(), an
    object, an embed, an iframe's data: page, a video's poster, srcset); an SVG and an EPS
    pointing at the secret files and the server (Pillow would hand the EPS to Ghostscript);
    a picture of the secret image named by path."""
    png = data_uri(png_bomb(*size))
    inner = base64.b64encode(f'<img src="{png}"><img src="file://{bait.secret_paths[0]}">'.encode())
    references = "".join(
        f'<image href="{ref}" width="10" height="10"/>' for ref in [*bait.local_refs, bait.url]
    )
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" width="77" height="33">{references}</svg>'
    postscript = (
        "%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 79 35\n"
        f"({bait.secret_paths[0]}) (r) file pop\nshowpage\n"
    ).encode()
    return page_of(
        path,
        f"<div style=\"background-image: url('{png}')\">styled</div>"
        f"<style>p {{ background: url({png}) }}</style>"
        f'<object data="{png}" type="image/png"></object><embed src="{png}">'
        f'<iframe src="data:text/html;base64,{inner.decode()}"></iframe>'
        f'<video poster="{png}"></video><img srcset="{png} 2x">'
        f'<img src="{data_uri(svg.encode(), "image/svg+xml")}">'
        f'<img src="{data_uri(postscript)}"><img src="{data_uri(postscript, "image/x-eps")}">',
    )


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
