"""The searchable PDF's invisible font: every character one empty glyph of one width (the
space a narrower one), so any script can be written, and a ToUnicode map that gives back the
very characters, so a selection copies the text as it was recognised."""

from __future__ import annotations

import contextlib
import functools
import io
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ocrd.output.textlayer import PlacedLine

FONT_NAME = "OcrdInvisibleText"  # the font's name in the PDF (BaseFont)
GLYPH_ADVANCE = 500  # every glyph's width, in thousandths of the font size...
SPACE_ADVANCE = 350  # ...but a space's, narrower as in type (a gutter is wider than a word
# gap) yet wide enough that readers see a word break even at the narrowest scaling
# (poppler's raw order wants 0.15 of the size)
SPACE = 0x20
ASCENT, DESCENT = 800, -200  # so a line's font size is its box's height, baseline 1/5 up
FIRST_EXTRA_CODE = 0xD800  # characters beyond the BMP get codes from the surrogate range
EXTRA_CODES = 0x800


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


def new_stream(doc: Any, data: bytes, dictionary: str = "<<>>") -> int:
    xref = doc.get_new_xref()
    doc.update_object(xref, dictionary)
    doc.update_stream(xref, data, compress=True)
    return int(xref)


def new_object(doc: Any, source: str) -> int:
    xref = doc.get_new_xref()
    doc.update_object(xref, source)
    return int(xref)


def add_font(doc: Any, encoding: TextEncoding) -> int:
    """The invisible font's objects in `doc`; the xref of its Type0 font dictionary.

    A CIDFontType2 with Identity-H encoding: two-byte codes, each mapped by the CIDToGIDMap
    to glyph 1 (never to .notdef, which PDF/A forbids to show), 500 units wide, but the
    space to glyph 2, 350 wide; the widths agree with the font program's."""
    program = font_program()
    file_xref = new_stream(doc, program, f"<< /Length1 {len(program)} >>")
    glyphs = bytearray(b"\x00\x01" * 0x10000)
    glyphs[2 * SPACE : 2 * SPACE + 2] = b"\x00\x02"
    cid_to_gid = new_stream(doc, bytes(glyphs))
    to_unicode = new_stream(doc, encoding.to_unicode_cmap())
    descriptor = new_object(
        doc,
        f"<< /Type /FontDescriptor /FontName /{FONT_NAME} /Flags 4 "
        f"/FontBBox [0 {DESCENT} {GLYPH_ADVANCE} {ASCENT}] /ItalicAngle 0 /Ascent {ASCENT} "
        f"/Descent {DESCENT} /CapHeight {ASCENT} /StemV 80 /FontFile2 {file_xref} 0 R >>",
    )
    descendant = new_object(
        doc,
        f"<< /Type /Font /Subtype /CIDFontType2 /BaseFont /{FONT_NAME} "
        "/CIDSystemInfo << /Registry (Adobe) /Ordering (Identity) /Supplement 0 >> "
        f"/FontDescriptor {descriptor} 0 R /DW {GLYPH_ADVANCE} /W [{SPACE} [{SPACE_ADVANCE}]] "
        f"/CIDToGIDMap {cid_to_gid} 0 R >>",
    )
    return new_object(
        doc,
        f"<< /Type /Font /Subtype /Type0 /BaseFont /{FONT_NAME} /Encoding /Identity-H "
        f"/DescendantFonts [{descendant} 0 R] /ToUnicode {to_unicode} 0 R >>",
    )
