"""Office documents and web pages (Word, PowerPoint, Excel, HTML, Markdown, CSV) as people
drop them: written by python-docx, python-pptx and openpyxl, dropped into an inbox, uploaded
over HTTP and sent to the docling API of one `ocrd run` (simulated engine); they come out as
a PDF does (Markdown, a DoclingDocument docling-core loads, chunks), a picture's text read
by the engine in its place. Hostile ones (macros, XML entities, linked files, a zip bomb, a
million cells) go to failed/ with the reason, and nothing outside the file is ever read:
a secret file beside the inbox shows up in no output, no log line and no answer."""

from __future__ import annotations

import io
import json
import secrets
import shutil
import zipfile
from pathlib import Path
from typing import Any

import httpx
import openpyxl
import pytest
from conftest import files_under
from docling.service_client import DoclingServiceClient
from docling_core.types.doc.document import DoclingDocument
from docling_core.types.doc.items.picture.picture import PictureItem
from docling_core.types.doc.items.text import TextItem
from office_files import (
    EMBEDDED_JPEG_SIZE,
    EMBEDDED_PNG_SIZE,
    PICTURE_SIZE,
    SECRET_IMAGE_SIZE,
    csv_file,
    data_uri,
    drawn_picture,
    huge_csv,
    markdown_file,
    picture_png,
    receipt_notes,
    receipt_page,
    slides_file,
    spreadsheet_file,
    web_page,
    with_entity,
    with_linked_picture,
    with_macros,
    with_template_link,
    word_file,
    zip_bomb,
)
from PIL import Image
from test_uploads import AUTH, TOKEN, follow, upload, uploading_daemon

from ocrd.documents.sources import Sources, page_files
from ocrd.domain import InputFormat
from ocrd.office.inspect import check_document
from ocrd.office.limits import OfficeLimits, OfficeRefused
from ocrd.office.read import OfficeRead, read_office
from ocrd.render import RenderError, detect_format

PICTURE_TEXT = f"Image {PICTURE_SIZE[0]}x{PICTURE_SIZE[1]} px"  # the simulated engine's
SECRET_SEEN = f"Image {SECRET_IMAGE_SIZE[0]}x{SECRET_IMAGE_SIZE[1]} px"
PNG_TEXT = f"Image {EMBEDDED_PNG_SIZE[0]}x{EMBEDDED_PNG_SIZE[1]} px"
JPEG_TEXT = f"Image {EMBEDDED_JPEG_SIZE[0]}x{EMBEDDED_JPEG_SIZE[1]} px"
WORKER_PIXELS = 50_000_000  # a render worker's Pillow limit (max_page_pixels)
OUTPUTS = ["markdown", "docling", "chunks", "pdf"]


def picture_texts(doc: DoclingDocument) -> list[str]:
    """The text items under each picture: what the engine read in it."""
    found = []
    for picture in doc.pictures:
        assert isinstance(picture, PictureItem)
        for child in picture.children:
            item = child.resolve(doc)
            if isinstance(item, TextItem):
                found.append(item.text)
    return found


def test_formats_are_told_by_content_and_only_markdown_and_csv_by_name(tmp_path: Path) -> None:
    word = word_file(tmp_path / "report.docx", picture=False)
    named_pdf = tmp_path / "report.pdf"
    shutil.copy(word, named_pdf)
    assert detect_format(named_pdf) is InputFormat.docx  # its content, not its name
    assert detect_format(slides_file(tmp_path / "s.pptx")) is InputFormat.pptx
    assert detect_format(spreadsheet_file(tmp_path / "x.xlsx")) is InputFormat.xlsx
    page = tmp_path / "page.txt"
    page.write_text("<!-- saved -->\n<html><body><p>hi</p></body></html>")
    assert detect_format(page) is InputFormat.html
    notes = tmp_path / "notes.md"
    notes.write_text("# Notes\n")
    assert detect_format(notes) is InputFormat.md
    assert detect_format(csv_file(tmp_path / "c.csv")) is InputFormat.csv

    same_text = tmp_path / "notes.txt"
    same_text.write_text("# Notes\n")
    with pytest.raises(RenderError, match="only Markdown and CSV by their name"):
        detect_format(same_text)
    latin = tmp_path / "latin.csv"
    latin.write_bytes("name\nJos\xe9\n".encode("latin-1"))
    with pytest.raises(RenderError, match=r"must be UTF-8 text, and byte 8 is not UTF-8"):
        detect_format(latin)
    plain_zip = tmp_path / "photos.zip"
    with zipfile.ZipFile(plain_zip, "w") as archive:
        archive.writestr("a.txt", "hello")
    with pytest.raises(RenderError, match="not a PDF, TIFF, PNG or JPEG file"):
        detect_format(plain_zip)


def test_archive_and_cell_limits_refuse_before_anything_is_parsed(tmp_path: Path) -> None:
    """Entries are counted from the zip's end record, before Python's reader lists them;
    a workbook's cells against the limit before docling opens it."""
    many = tmp_path / "many.docx"
    with zipfile.ZipFile(many, "w") as archive:
        for number in range(5_001):
            archive.writestr(f"e{number}", b"")
    with pytest.raises(RenderError, match="more than the 5000 entries ocrd opens") as refused:
        detect_format(many)
    assert refused.value.code.value == "too_large"

    word = word_file(tmp_path / "w.docx", picture=False)
    template = with_template_link(word, tmp_path / "template.docx")
    check_document(template.read_bytes(), InputFormat.docx, OfficeLimits())  # never loaded
    linked = with_linked_picture(word, tmp_path / "linked.docx", tmp_path / "secret.png")
    with pytest.raises(OfficeRefused, match="links content from outside the file"):
        check_document(linked.read_bytes(), InputFormat.docx, OfficeLimits())

    sheet = spreadsheet_file(tmp_path / "x.xlsx").read_bytes()
    check_document(sheet, InputFormat.xlsx, OfficeLimits(max_cells=6))  # it has six
    with pytest.raises(OfficeRefused, match="too many cells: about 6 in the workbook"):
        check_document(sheet, InputFormat.xlsx, OfficeLimits(max_cells=5))
    book = openpyxl.load_workbook(io.BytesIO(sheet))
    book.active["XFD1048576"] = "far away"  # two cells, a grid of 17 billion
    far = tmp_path / "far.xlsx"
    book.save(far)
    with pytest.raises(OfficeRefused, match="reaches row 1048576 and column 16384"):
        check_document(far.read_bytes(), InputFormat.xlsx, OfficeLimits())


def test_elements_and_nesting_are_measured_before_docling(tmp_path: Path) -> None:
    """A document's paragraphs, runs and cells are counted against their limit; a page's
    nesting is measured as a browser nests it (unclosed paragraphs and list items do not
    deepen it), a Markdown file's by its quotes, list items and indentation."""
    word = word_file(tmp_path / "w.docx", picture=False).read_bytes()
    check_document(word, InputFormat.docx, OfficeLimits())
    with pytest.raises(OfficeRefused, match="more than 1 paragraphs, runs and cells"):
        check_document(word, InputFormat.docx, OfficeLimits(max_elements=1))

    def page(depth: int) -> bytes:
        sloppy = "<p>unclosed<li>item" * 500  # HTML closes these itself
        nested = "<div>" * depth + "deep" + "</div>" * depth
        return (
            f"<html><body>{sloppy}<script>'{'<div>' * 9}'</script>{nested}</body></html>".encode()
        )

    check_document(page(20), InputFormat.html, OfficeLimits(max_nesting=20))
    with pytest.raises(OfficeRefused, match="nest deeper than the 20 levels ocrd converts"):
        check_document(page(21), InputFormat.html, OfficeLimits(max_nesting=20))

    quoted, listed, indented = b"> " * 21 + b"q\n", b"- " * 21 + b"l\n", b" " * 42 + b"- i\n"
    check_document(b"> " * 20 + b"fine\n", InputFormat.md, OfficeLimits(max_nesting=20))
    for deep in (quoted, listed, indented):
        with pytest.raises(OfficeRefused, match="quotes and lists nest deeper than the 20"):
            check_document(b"# Notes\n\n" + deep, InputFormat.md, OfficeLimits(max_nesting=20))


def secret_files(folder: Path) -> tuple[str, Path, Path]:
    """A secret text and an image only a link could reach: (the text, its file, the image)."""
    token = f"SECRET-{secrets.token_hex(8)}"
    text = folder / "secret.txt"
    text.write_text(token + "\n")
    image = folder / "secret.png"
    image.write_bytes(picture_png(SECRET_IMAGE_SIZE, token))
    return token, text, image


def made_files(folder: Path, secret: Path, secret_image: Path) -> tuple[list[Path], list[Path]]:
    """(documents to convert, hostile documents), written into `folder`."""
    folder.mkdir()
    word = word_file(folder / "report.docx")
    good = [
        word,
        slides_file(folder / "slides.pptx"),
        spreadsheet_file(folder / "sheet.xlsx"),
        web_page(folder / "team.html", secret_image),
        markdown_file(folder / "notes.md", secret_image),
        csv_file(folder / "cities.csv"),
        receipt_page(folder / "expenses.html"),
        receipt_notes(folder / "travel.md"),
    ]
    hostile = [
        with_macros(word, folder / "macros.docm"),
        with_entity(word, folder / "entities.docx", secret),
        with_linked_picture(word, folder / "linked.docx", secret_image),
        zip_bomb(word, folder / "bomb.docx"),
        huge_csv(folder / "huge.csv", 1_000_000),
    ]
    return good, hostile


def test_office_files_dropped_uploaded_and_sent_come_out_as_a_pdf_does(
    tmp_path: Path, start_daemon: Any
) -> None:
    token, secret, secret_image = secret_files(tmp_path)
    good, hostile = made_files(tmp_path / "made", secret, secret_image)
    daemon, url = uploading_daemon(tmp_path, start_daemon, {"outputs": OUTPUTS})
    data = tmp_path / "data"
    for path in good + hostile:
        shutil.copy(path, data / "inbox" / path.name)
    sent = upload(url, good[2], name="uploaded.xlsx")
    assert sent.status_code == 202, sent.text
    with DoclingServiceClient(url=url, api_key=TOKEN, job_timeout=300) as client:
        converted = client.convert(good[0])
    uploaded = follow(sent.json()["status_url"], 300)[-1]
    daemon.wait_for("document.finished", timeout=300, count=len(good + hostile) + 2)

    # The Word file: its text, and its picture's text read by the engine in its place.
    outbox = data / "outbox"
    report = (outbox / "report.md").read_text()
    places = [
        report.index(text)
        for text in ("Quarterly report", "Revenue grew", "<!-- image -->", PICTURE_TEXT)
    ]
    assert places == sorted(places) and report.index("Closing words") > places[-1]
    doc = DoclingDocument.load_from_json(outbox / "report.docling.json")
    assert [PICTURE_TEXT in text for text in picture_texts(doc)].count(True) == 1
    assert doc.name == "report"
    chunks = [
        json.loads(line)
        for line in (outbox / "report.chunks.jsonl").read_text().split("\n")
        if line
    ]
    assert any("Revenue grew" in chunk["text"] for chunk in chunks)
    assert any(PICTURE_TEXT in chunk["text"] for chunk in chunks)  # a search finds it
    assert (data / "done" / "report.docx").exists()
    [finished] = daemon.find("document.finished", path="report.docx")
    assert finished["outcome"] == "done" and finished["pages"] == 1
    assert finished["pdf_not_made"].startswith("no searchable PDF for a docx document")
    assert not (outbox / "report.pdf").exists()

    # The others: their text, tables as tables; each a DoclingDocument docling-core loads.
    expected = {
        "slides": ["Roadmap slide", "Ship the office inputs"],
        "sheet": ["| quince", "17"],
        "team": ["# Team page", "Welcome to the team.", "| Ada"],
        "notes": ["# Notes", "milk"],
        "cities": ["| Lisbon", "545000"],
    }
    for name, texts in expected.items():
        markdown = (outbox / f"{name}.md").read_text()
        assert all(text in markdown for text in texts), (name, markdown)
        DoclingDocument.load_from_json(outbox / f"{name}.docling.json")
        assert (outbox / f"{name}.chunks.jsonl").read_text().strip()

    # A web page and a Markdown file with their pictures inside them (data: URIs): each
    # picture's text where it stands, as a Word file's; the SVG icon stays a placeholder.
    for name, texts in {
        "expenses": ["The receipt", PNG_TEXT, "Paid on the spot.", JPEG_TEXT, "Claimed in March"],
        "travel": ["The receipt", PNG_TEXT, JPEG_TEXT, "Claimed in March"],
    }.items():
        markdown = (outbox / f"{name}.md").read_text()
        places = [markdown.find(text) for text in texts]
        assert -1 not in places and places == sorted(places), (name, markdown)
        assert markdown.count("<!-- image -->") == (3 if name == "expenses" else 2), markdown
        doc = DoclingDocument.load_from_json(outbox / f"{name}.docling.json")
        read_in = " ".join(picture_texts(doc))
        assert 0 <= read_in.find(PNG_TEXT) < read_in.find(JPEG_TEXT), read_in
        chunks = (outbox / f"{name}.chunks.jsonl").read_text()
        assert all(text in chunks for text in ("Claimed in March.", PNG_TEXT, JPEG_TEXT)), chunks
        [opened] = daemon.find(
            "document.opened", path=f"{name}.{'html' if name == 'expenses' else 'md'}"
        )
        assert opened["pictures"] == 2, opened
        assert opened["pictures_unread"] == (1 if name == "expenses" else 0), opened
    # The web page's SVG icon, unread, is told where the user looks: a warning and the summary.
    [finished] = daemon.find("document.finished", path="expenses.html")
    assert finished["pictures_unread"] == 1, finished
    [unread] = daemon.find("document.pictures_unread", path="expenses.html")
    assert unread["count"] == 1 and "SVG" in unread["reason"], unread
    assert not daemon.find("document.pictures_unread", path="travel.md")
    [finished] = daemon.find("document.finished", path="travel.md")
    assert "pictures_unread" not in finished, finished

    # The same files by HTTP upload and through docling's own client.
    assert uploaded["state"] == "done", uploaded
    markdown = httpx.get(uploaded["links"]["markdown"], headers=AUTH, timeout=30).text
    assert "| quince" in markdown
    assert converted.status.value == "success"
    assert isinstance(converted.document, DoclingDocument)
    assert any(PICTURE_TEXT in text for text in picture_texts(converted.document))
    assert "Revenue grew" in converted.document.export_to_markdown()

    # Hostile files: refused with the reason, the file kept in failed/.
    failed = data / "failed"
    reasons = {
        path.name.removesuffix(".error.json"): json.loads(path.read_text())["message"]
        for path in failed.glob("*.error.json")
    }
    assert "contains macros" in reasons["macros"]
    assert "declares a document type or entities" in reasons["entities"]
    assert "links content from outside the file (image" in reasons["linked"]
    assert "a zip bomb" in reasons["bomb"]
    assert "too many cells" in reasons["huge"]
    assert sorted(path.name for path in hostile) == sorted(
        name for name in files_under(failed) if not name.endswith(".error.json")
    )

    # Nothing outside the documents was read: the secret is in no file ocrd wrote, no
    # log line, no answer; no picture the engine saw was the secret image.
    assert daemon.stop() == 0
    written = [path for path in data.rglob("*") if path.is_file()]
    for path in written:
        content = path.read_bytes()
        assert token.encode() not in content, path
        assert SECRET_SEEN.encode() not in content, path
    assert token not in "".join(daemon.raw)
    assert SECRET_SEEN not in "".join(daemon.raw)
    assert token not in converted.document.export_to_markdown()


def test_an_office_file_in_a_scan_job_is_left_out_with_the_reason(tmp_path: Path) -> None:
    job = tmp_path / "scan-0001"
    job.mkdir()
    (job / "p1.png").write_bytes(picture_png())
    word_file(job / "p2.docx", picture=False)
    files, skipped = page_files(Sources.of(job))
    assert [(path.name, fmt) for path, fmt in files] == [("p1.png", InputFormat.png)]
    assert skipped == [
        "p2.docx: a docx document is converted on its own, never as pages of a scan job or "
        "duplex pair; drop it into the inbox by itself"
    ]


def read(path: Path, fmt: InputFormat, limits: OfficeLimits | None = None) -> OfficeRead:
    """The file as a render worker reads it, its pictures written beside it."""
    folder = path.parent / f"pictures-{secrets.token_hex(4)}"
    folder.mkdir()
    return read_office(path, fmt, None, limits or OfficeLimits(), WORKER_PIXELS, folder)


def sizes(read: OfficeRead) -> list[tuple[int, int]]:
    return [(picture.width, picture.height) for picture in read.pictures]


EMBEDDED_READ = [(200, 60), (150, 50), (210, 70), (260, 80), (230, 75)]


def embedded_sources(secret_image: Path) -> list[str]:
    """Pictures a document holds as data: URIs, the raster ones of EMBEDDED_READ's sizes,
    then what must stay a placeholder: an SVG, PostScript named a PNG (Pillow would start
    Ghostscript for it), a TIFF and a BMP (formats Pillow reads but web pages do not
    embed), broken base64, a text data: URI, and the secret image named every local way."""
    postscript = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 97 31\nshowpage\n"
    return [
        data_uri(drawn_picture((200, 60), "WEBP", "WEBP"), "image/webp"),
        data_uri(drawn_picture((150, 50), "GIF", "GIF"), "image/gif"),
        data_uri(drawn_picture((210, 70), "PNG named a GIF", "PNG"), "image/gif"),
        data_uri(drawn_picture((260, 80), "TRANSPARENT", "PNG", mode="RGBA"), "image/png"),
        data_uri(drawn_picture((230, 75), "JPEG named a PNG", "JPEG"), "image/png"),
        data_uri(
            b'<svg xmlns="http://www.w3.org/2000/svg" width="99" height="33"/>', "image/svg+xml"
        ),
        data_uri(postscript, "image/png"),
        data_uri(drawn_picture((98, 32), "TIFF", "TIFF"), "image/tiff"),
        data_uri(drawn_picture((96, 30), "BMP", "BMP"), "image/bmp"),
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAA!!!broken",
        "data:text/plain,Hello",
        str(secret_image),
        f"file://{secret_image}",
        f"../{secret_image.name}",
    ]


def test_pictures_embedded_as_data_uris_are_read_by_their_bytes_alone(tmp_path: Path) -> None:
    """A web page's and a Markdown file's pictures held as data: URIs reach the engine when
    their bytes are PNG, JPEG, GIF or WebP, whatever type they declare; every other source
    stays a placeholder, counted unread. A transparent picture reaches it on white."""
    secret_image = tmp_path / "secret.png"
    secret_image.write_bytes(picture_png(SECRET_IMAGE_SIZE))
    sources = embedded_sources(secret_image)
    unread = len(sources) - len(EMBEDDED_READ)
    page = tmp_path / "page.html"
    images = "".join(f'<p>picture {n}</p><img src="{src}">' for n, src in enumerate(sources))
    page.write_text(f"<html><body><h1>Pictures</h1>{images}<p>The end.</p></body></html>")
    notes = tmp_path / "notes.md"
    links = "\n\n".join(f"![picture {n}]({src})" for n, src in enumerate(sources[:-1]))
    notes.write_text(f'# Pictures\n\n{links}\n\n<img src="{sources[-1]}">\n\nThe end.\n')

    for path, fmt in ((page, InputFormat.html), (notes, InputFormat.md)):
        result = read(path, fmt)
        assert sizes(result) == EMBEDDED_READ, path
        assert result.unread_pictures == unread, path
        transparent = result.pictures[3]
        assert transparent.file is not None
        with Image.open(transparent.file) as seen:
            assert seen.getpixel((0, 0)) == (255, 255, 255)  # on white, not black
            assert seen.convert("L").getextrema()[0] < 100  # its text is still there


def test_a_transparent_picture_in_a_word_file_reaches_the_engine_on_white(tmp_path: Path) -> None:
    """Black text on a transparent picture, as Word shows it on its white page: the engine
    gets it on white, not turned black on black."""
    import docx

    word = docx.Document()
    word.add_paragraph("A logo follows.")
    word.add_picture(io.BytesIO(drawn_picture((260, 80), "TRANSPARENT", "PNG", mode="RGBA")))
    word.save(str(tmp_path / "logo.docx"))

    [picture] = read(tmp_path / "logo.docx", InputFormat.docx).pictures
    assert picture.file is not None
    with Image.open(picture.file) as seen:
        assert seen.getpixel((0, 0)) == (255, 255, 255)
        assert seen.convert("L").getextrema()[0] < 100  # its text is still there


def test_embedded_pictures_keep_the_limits_of_a_documents_pictures(tmp_path: Path) -> None:
    """max_pictures, max_picture_side and the pixel budgets bound the pictures a page
    embeds as they bound a Word file's; those beyond them stay placeholders, counted."""
    page = tmp_path / "album.html"
    big = data_uri(drawn_picture((3000, 1000), "WIDE", "PNG"), "image/png")
    small = data_uri(drawn_picture((300, 100), "SMALL", "JPEG"), "image/jpeg")
    page.write_text(
        f'<html><body><p>Album</p><img src="{big}">{f"<img src={small!r}>" * 4}</body></html>'
    )

    everything = read(page, InputFormat.html)
    assert sizes(everything) == [(2048, 683)] + [(300, 100)] * 4  # scaled to 2048 a side
    two = read(page, InputFormat.html, OfficeLimits(max_pictures=2))
    assert (sizes(two), two.unread_pictures) == ([(2048, 683), (300, 100)], 3)
    decoded = read(page, InputFormat.html, OfficeLimits(max_decoded_pixels=3_000_000 + 30_000))
    assert (sizes(decoded), decoded.unread_pictures) == ([(2048, 683), (300, 100)], 3)
    kept = read(page, InputFormat.html, OfficeLimits(max_picture_pixels=2048 * 683 + 30_000))
    assert (sizes(kept), kept.unread_pictures) == ([(2048, 683), (300, 100)], 3)
