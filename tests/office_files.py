"""Office documents and web pages for the tests, written by the real libraries (python-docx,
python-pptx, openpyxl) or as small texts; and hostile ones made from a real Word file by
changing one part of its zip."""

from __future__ import annotations

import base64
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


EMBEDDED_PNG_SIZE = (280, 90)  # the pictures a web page or Markdown file embeds
EMBEDDED_JPEG_SIZE = (320, 110)


def picture_png(size: tuple[int, int] = PICTURE_SIZE, words: str = "INVOICE 4711") -> bytes:
    return drawn_picture(size, words, "PNG")


def drawn_picture(size: tuple[int, int], words: str, kind: str, mode: str = "RGB") -> bytes:
    """`words` drawn in black on a picture of `size`, white (or transparent: mode RGBA),
    saved as Pillow's format `kind`."""
    image = Image.new(mode, size, "white" if mode == "RGB" else (0, 0, 0, 0))
    ImageDraw.Draw(image).text((10, size[1] // 2 - 5), words, fill="black")
    out = io.BytesIO()
    image.save(out, kind)
    return out.getvalue()


def data_uri(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def receipt_page(path: Path) -> Path:
    """A web page saved with its pictures inside it, as a browser's "save as single file"
    does: a scanned receipt (PNG) in a figure with a caption, a photo (JPEG, its base64
    wrapped over lines) and an SVG icon."""
    png = data_uri(drawn_picture(EMBEDDED_PNG_SIZE, "TOTAL 42.00 EUR", "PNG"), "image/png")
    jpeg = data_uri(drawn_picture(EMBEDDED_JPEG_SIZE, "PAID BY CARD", "JPEG"), "image/jpeg")
    wrapped = "\n".join(jpeg[at : at + 76] for at in range(0, len(jpeg), 76))
    icon = data_uri(
        b'<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"/>', "image/svg+xml"
    )
    path.write_text(
        "<!DOCTYPE html>\n<html><head><title>Expenses</title></head><body>"
        "<h1>Expenses</h1><p>The receipt from the conference dinner:</p>"
        f'<figure><img src="{png}" alt="receipt"><figcaption>Dinner receipt</figcaption></figure>'
        f'<p>Paid on the spot.</p><img src="{wrapped}"><img src="{icon}">'
        "<p>Claimed in March.</p></body></html>\n"
    )
    return path


def receipt_notes(path: Path) -> Path:
    """Markdown as a note app exports it: a picture link and an HTML picture, both embedded
    (the HTML one makes docling read the file through its HTML reader as well)."""
    png = data_uri(drawn_picture(EMBEDDED_PNG_SIZE, "TOTAL 42.00 EUR", "PNG"), "image/png")
    jpeg = data_uri(drawn_picture(EMBEDDED_JPEG_SIZE, "PAID BY CARD", "JPEG"), "image/jpeg")
    path.write_text(
        "# Travel notes\n\nThe receipt from the conference dinner:\n\n"
        f"![receipt]({png})\n\n"
        f'<img src="{jpeg}" width="320">\n\n'
        "Claimed in March.\n"
    )
    return path


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
