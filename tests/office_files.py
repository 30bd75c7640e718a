"""Office documents and web pages for the tests, written by the real libraries (python-docx,
python-pptx, openpyxl) or as small texts; and hostile ones made from a real Word file by
changing one part of its zip."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import docx
import openpyxl
import pptx
from PIL import Image, ImageDraw

PICTURE_SIZE = (300, 100)  # the simulated engine's answer names it: "Image 300x100 px"
SECRET_IMAGE_SIZE = (123, 77)  # were it ever read, "Image 123x77 px" would show


def picture_png(size: tuple[int, int] = PICTURE_SIZE, words: str = "INVOICE 4711") -> bytes:
    image = Image.new("RGB", size, "white")
    ImageDraw.Draw(image).text((10, size[1] // 2 - 5), words, fill="black")
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def word_file(path: Path, picture: bool = True) -> Path:
    document = docx.Document()
    document.add_heading("Quarterly report", 1)
    document.add_paragraph("Revenue grew in the third quarter.")
    if picture:
        document.add_picture(io.BytesIO(picture_png()))
    document.add_paragraph("Closing words after the picture.")
    document.save(str(path))
    return path


def slides_file(path: Path) -> Path:
    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])
    slide.shapes.title.text = "Roadmap slide"
    slide.placeholders[1].text = "Ship the office inputs"
    deck.save(str(path))
    return path


def spreadsheet_file(path: Path) -> Path:
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.append(["fruit", "count"])
    sheet.append(["quince", 17])
    sheet.append(["medlar", 23])
    book.save(str(path))
    return path


def web_page(path: Path, secret_image: Path) -> Path:
    """A page whose pictures point at a local file, absolutely and relatively."""
    relative = Path("..") / ".." / secret_image.name
    path.write_text(
        "<!DOCTYPE html>\n<html><head><title>Team page</title></head><body>"
        "<h1>Team page</h1><p>Welcome to the team.</p>"
        f'<img src="file://{secret_image}"><img src="{relative}">'
        f'<img src="{secret_image}">'
        "<table><tr><th>name</th><th>room</th></tr><tr><td>Ada</td><td>B12</td></tr></table>"
        "</body></html>\n"
    )
    return path


def markdown_file(path: Path, secret_image: Path) -> Path:
    path.write_text(
        f"# Notes\n\nRemember the *milk*.\n\n![plan]({secret_image})\n\n"
        f"![plan](file://{secret_image})\n\n![plan](../../{secret_image.name})\n"
    )
    return path


def csv_file(path: Path) -> Path:
    path.write_text("city,people\nLisbon,545000\nPorto,232000\n")
    return path


def rewritten(source: Path, target: Path, parts: dict[str, bytes]) -> Path:
    """`source`'s zip with `parts` replaced or added."""
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as out:
        for info in original.infolist():
            if info.filename not in parts:
                out.writestr(info, original.read(info))
        for name, data in parts.items():
            out.writestr(name, data, zipfile.ZIP_DEFLATED)
    return target


def part(path: Path, name: str) -> bytes:
    with zipfile.ZipFile(path) as archive:
        return archive.read(name)


def with_macros(word: Path, target: Path) -> Path:
    types = part(word, "[Content_Types].xml").replace(
        b"application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml",
        b"application/vnd.ms-word.document.macroEnabled.main+xml",
    )
    parts = {"[Content_Types].xml": types, "word/vbaProject.bin": b"\xd0\xcf\x11\xe0macro"}
    return rewritten(word, target, parts)


def with_entity(word: Path, target: Path, secret: Path) -> Path:
    """The body's first text replaced by an external entity naming the secret file."""
    body = part(word, "word/document.xml")
    declaration = f'<!DOCTYPE d [<!ENTITY secret SYSTEM "file://{secret}">]>'.encode()
    body = re.sub(rb"(<\?xml[^>]*\?>)", rb"\1" + declaration, body, count=1)
    body = body.replace(b"Revenue grew in the third quarter.", b"&secret;", 1)
    return rewritten(word, target, {"word/document.xml": body})


def with_template_link(word: Path, target: Path) -> Path:
    """The template Word made it from, named as Word names it: an external relationship
    no reader loads."""
    settings = (
        b'<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n<Relationships xmlns='
        b'"http://schemas.openxmlformats.org/package/2006/relationships"><Relationship Id="rId1" '
        b'Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/'
        b'attachedTemplate" Target="file:///C:\\Users\\ada\\Normal.dotm" TargetMode="External"/>'
        b"</Relationships>"
    )
    return rewritten(word, target, {"word/_rels/settings.xml.rels": settings})


def with_linked_picture(word: Path, target: Path, secret_image: Path) -> Path:
    """A relationship that links a picture from the disk instead of embedding it."""
    rels = part(word, "word/_rels/document.xml.rels")
    link = (
        '<Relationship Id="rIdSecret" Type="http://schemas.openxmlformats.org/'
        f'officeDocument/2006/relationships/image" Target="file://{secret_image}" '
        'TargetMode="External"/></Relationships>'
    ).encode()
    rels = rels.replace(b"</Relationships>", link)
    return rewritten(word, target, {"word/_rels/document.xml.rels": rels})


def zip_bomb(word: Path, target: Path, megabytes: int = 30) -> Path:
    """A Word file carrying a part of zeros that packs a thousandfold."""
    return rewritten(word, target, {"word/media/zeros.bin": bytes(megabytes * 1024 * 1024)})


def huge_csv(path: Path, cells: int) -> Path:
    row = ",".join(str(n) for n in range(10)) + "\n"
    path.write_text(row * (cells // 10 + 1))
    return path
