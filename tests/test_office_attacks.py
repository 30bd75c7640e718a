"""Hostile office documents and web pages against `ocrd run`, from outside: a member of the
shared inbox's group (alice) drops them, an HTTP client with the token uploads them, and
their author wrote them to make a reader fetch, expand or unpack what it should not
(tests/hostile_office.py makes them). ocrd runs with the simulated engine.

For every file: it ends exactly once, in done/ with its Markdown or in failed/ with a
reason a person can read; no file outside it is opened (inotify on planted secrets, by
any process); the web server it points at gets no request; the daemon's processes keep
their memory bounded; and the daemon still converts a plain PDF, in this inbox and in
another, afterwards.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hostile_office as hostile
import hostile_shapes as shapes
import httpx
import pytest
import yaml
from conftest import DaemonProcess, files_under, write_config
from helpers import make_pdf
from office_watch import (
    CountingServer,
    Ending,
    MemoryWatch,
    OpenWatch,
    holds_secret,
    plant_secrets,
    readable,
    rss_bytes,
    the_watches_see,
)
from PIL import Image
from test_http import base_url
from test_shared_folder import make_text_pdf
from test_uploads import AUTH, TOKEN, WITH_TOKEN
from users import ensure_users, give, shared_data, uid

pytestmark = [pytest.mark.slow, pytest.mark.users]

SETTLE = 0.5
RESCAN = 2.0
RENDER_TIMEOUT = 45.0  # pipeline.page_render_timeout_seconds: an office file gets twice it
RENDER_WORKERS = 2
# A worker's resident memory may reach what a renderer may use (the default of
# pipeline.render_memory_limit_mb, which this config leaves as it is); docling's import
# alone takes about 0.8 GiB of it.
MAX_WORKER_RSS = 4096 << 20
SECRET = f"OCRD-SECRET-{uuid.uuid4().hex}"
KEY = {"X-Api-Key": TOKEN}


def one_file_seconds() -> float:
    """The longest one file may take by the settings: settling, a rescan, a worker's
    opening and converting (each within the render timeout), with room for a loaded CI."""
    return 3 * (SETTLE + RESCAN + 2 * RENDER_TIMEOUT) + 30


def seconds_for(count: int) -> float:
    return one_file_seconds() * (1 + count // RENDER_WORKERS)


@dataclass
class Office:
    """The module's daemon and what the attacks watch."""

    daemon: DaemonProcess
    url: str
    data: Path  # inbox/, outbox/, done/, failed/, work/
    other: Path  # a second inbox's data folder
    staging: Path  # where files are made before alice drops them
    bait: hostile.Bait
    opened: OpenWatch
    server: CountingServer
    memory: MemoryWatch


def config_for(root: Path, data: Path, other: Path) -> Path:
    second = {name: str(other / name) for name in ("outbox", "done", "failed", "work")}
    settings = {
        "inboxes": [
            {"path": str(data / "inbox"), "settle_seconds": SETTLE, "uploads": True},
            {"path": str(other / "inbox"), "settle_seconds": SETTLE, **second},
        ],
        "engine": {"kind": "simulated", "simulated": {"seconds_per_page": 0.02}},
        "pipeline": {
            "rescan_interval_seconds": RESCAN,
            "status_interval_seconds": 0.5,
            "page_render_timeout_seconds": RENDER_TIMEOUT,
            "render_workers": RENDER_WORKERS,
        },
        "http": {"listen": "127.0.0.1:0"},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(settings))
    return path


@pytest.fixture(scope="module")
def office() -> Iterator[Office]:
    """The daemon, as root with this venv's interpreter: root may read every file, so a
    read ocrd's own user would be refused is seen too. (As ocrd's user it would run
    Debian's python3, which may be older than this venv's packages allow: soupsieve 4.1.3,
    under docling's HTML reader, needs Python 3.11.5.)"""
    ensure_users()
    root = Path(tempfile.mkdtemp(prefix="ocrd-office-"))
    outside = Path(tempfile.mkdtemp(prefix="ocrd-secret-"))
    os.chmod(outside, 0o755)
    server = CountingServer()
    data = shared_data(root)
    (root / "second").mkdir()
    other = shared_data(root / "second")
    staging = data / "inbox" / ".staging"  # hidden: never taken
    staging.mkdir()
    secrets = plant_secrets([outside, root, data], SECRET)
    opened = OpenWatch(secrets)
    the_watches_see(opened, server, secrets)
    daemon = DaemonProcess(config_for(root, data, other), env=WITH_TOKEN)
    try:
        url = base_url(daemon)
        daemon.wait_for("daemon.ready", timeout=120)
        memory = MemoryWatch(daemon.process.pid, kill_above=MAX_WORKER_RSS + (2 << 30))
        bait = hostile.bait_for(SECRET, outside, secrets, server.url)
        yield Office(daemon, url, data, other, staging, bait, opened, server, memory)
        assert daemon.stop() == 0, daemon.output()
    finally:
        daemon.kill()
        opened.close()
        server.close()
        subprocess.run(["rm", "-rf", str(root), str(outside)], check=False)


# ---- dropping files and reading what became of them -----------------------------------------


def drop(office: Office, made: Path, folder: Path | None = None) -> str:
    """`made` dropped by alice as a careful writer does: written under a hidden name, then
    renamed into the inbox. Its name there is returned."""
    inbox = folder or office.data / "inbox"
    hidden = inbox / f".{made.name}.part"
    shutil.move(made, hidden)
    give(hidden, "alice", 0o664)
    os.rename(hidden, inbox / made.name)
    return made.name


def made(office: Office, name: str) -> Path:
    return office.staging / name


def ending(office: Office, name: str, data: Path | None = None) -> Ending:
    """Where `name` ended, checked to be exactly one place, whole, with a readable reason."""
    data = data or office.data
    stem = Path(name).stem
    done, failed = data / "done" / name, data / "failed" / name
    assert done.exists() != failed.exists(), (name, files_under(data))
    assert not (data / "inbox" / name).exists(), f"{name} is still in the inbox"
    left = [p for p in files_under(data / "work") if Path(p).name == name]
    assert left == [], f"{name} is still in the work area: {left}"
    if failed.exists():
        report = json.loads((data / "failed" / f"{stem}.error.json").read_text())
        assert readable(report["message"]), report
        assert not (data / "outbox" / f"{stem}.md").exists()
        return Ending(name, "failed", report["message"], "")
    markdown = (data / "outbox" / f"{stem}.md").read_text()
    return Ending(name, "done", "", markdown)


def settle_all(office: Office, names: list[str], data: Path | None = None) -> dict[str, Ending]:
    """Wait until each of `names` finished, then read where each ended."""
    for name in names:
        office.daemon.wait_for("document.finished", timeout=seconds_for(len(names)), path=name)
    return {name: ending(office, name, data) for name in names}


def nothing_outside_was_touched(office: Office) -> None:
    """No secret file opened by anyone, no request to the server, the secret in no output,
    report or log line."""
    assert office.opened.read() == [], "a file outside the document was opened"
    assert office.server.requests == [], office.server.requests
    for folder in (office.data / "outbox", office.data / "done", office.data / "failed"):
        for name in files_under(folder):
            content = (folder / name).read_bytes()
            assert not holds_secret(content, SECRET), f"{folder / name} holds the secret"
    assert not holds_secret("".join(office.daemon.raw).encode(), SECRET), "the log holds it"


def still_serving(office: Office) -> None:
    """A plain PDF converts afterwards, here and in the other inbox."""
    here = drop(office, make_pdf(made(office, f"after-{uuid.uuid4().hex[:8]}.pdf"), 1))
    there = drop(
        office,
        make_pdf(made(office, f"other-{uuid.uuid4().hex[:8]}.pdf"), 1),
        office.other / "inbox",
    )
    assert settle_all(office, [here])[here].outcome == "done"
    assert settle_all(office, [there], office.other)[there].outcome == "done"
    assert office.daemon.process.poll() is None


def memory_was_bounded(office: Office) -> None:
    assert office.memory.killed == [], "a worker grew 2 GiB past its bound and was killed"
    assert office.memory.child_peak < MAX_WORKER_RSS, office.memory.peaks
    assert office.memory.daemon_peak < 1 << 30, office.memory.peaks


# ---- the attacks ----------------------------------------------------------------------------


def test_zip_bombs_fail_with_a_reason_and_memory_stays_bounded(office: Office) -> None:
    """Archives that unpack to gigabytes (sizes told honestly, or lied about), 100,000
    entries, zips nested in zips: each fails naming why, or (the nested package docling
    never opens) converts; no process of the daemon's grows past the render limit."""
    names = [
        hostile.docx_bomb(made(office, "bomb-honest.docx")).name,
        hostile.docx_bomb_lying(made(office, "bomb-lying.docx")).name,
        hostile.xlsx_bomb(made(office, "bomb-strings.xlsx")).name,
        hostile.docx_many_entries(made(office, "many-entries.docx")).name,
        hostile.docx_nested_zips(made(office, "nested.docx")).name,
    ]
    with office.memory.sampling():
        for name in names:
            drop(office, office.staging / name)
        endings = settle_all(office, names)
    for name in ("bomb-honest.docx", "bomb-lying.docx", "bomb-strings.xlsx", "many-entries.docx"):
        assert endings[name].outcome == "failed", endings[name]
    nested = endings["nested.docx"]
    assert nested.outcome == "failed" or "nested zips" in nested.markdown, nested
    memory_was_bounded(office)
    nothing_outside_was_touched(office)
    still_serving(office)


def test_pictures_of_81_million_pixels_end_within_a_workers_memory(office: Office) -> None:
    """Three pictures of 81 million pixels each (under twice Pillow's bomb limit, so
    decoded, 240 MB apiece) in a 38 KB document: converted with them scaled down, or
    failed with a reason, without a worker's memory past its bound."""
    with office.memory.sampling():
        name = drop(office, shapes.docx_picture_bomb(made(office, "pictures.docx")))
        pictures = settle_all(office, [name])[name]
    assert pictures.outcome == "failed" or "Pictures behind" in pictures.markdown, pictures
    memory_was_bounded(office)
    still_serving(office)


def test_xml_entities_and_doctypes_expand_and_fetch_nothing(office: Office) -> None:
    """External entities (a secret file, the web server), an external DTD, parameter
    entities and the billion laughs, in a Word document (also encoded as UTF-16), a
    workbook's shared strings and a slide: nothing outside is read or fetched, nothing
    expands."""
    bait = office.bait
    names = [
        hostile.docx_entities(made(office, "entities-word.docx"), bait).name,
        hostile.xlsx_entities(made(office, "entities-sheet.xlsx"), bait).name,
        hostile.pptx_entities(made(office, "entities-slide.pptx"), bait).name,
        hostile.docx_entities_utf16(made(office, "entities-utf16.docx"), bait).name,
    ]
    for name in names:
        drop(office, office.staging / name)
    endings = settle_all(office, names)
    for result in endings.values():
        assert result.outcome == "failed" or "lollollol" not in result.markdown, result
    nothing_outside_was_touched(office)


def test_macros_and_external_relationships_load_nothing(office: Office) -> None:
    """A macro-enabled document named .docx; linked pictures, a remote template, frames,
    OLE objects and sub-documents pointing at secret files and the web server. Each is
    refused by name or converted without what it points at; hyperlinks stay text."""
    bait = office.bait
    names = [
        hostile.docm_named_docx(made(office, "macros.docx")).name,
        hostile.docx_external(made(office, "external-word.docx"), bait).name,
        hostile.pptx_external(made(office, "external-slide.pptx"), bait).name,
    ]
    for name in names:
        drop(office, office.staging / name)
    endings = settle_all(office, names)
    macros = endings["macros.docx"]
    assert macros.outcome == "failed" or "macros" in macros.markdown.lower(), macros
    nothing_outside_was_touched(office)
    still_serving(office)


def test_web_pages_and_markdown_fetch_nothing(office: Office) -> None:
    """Pictures, style sheets, frames, objects, `<base href>` and refresh in HTML, and
    picture and reference links in Markdown, at local files (absolute, file:, ../) and at
    the web server: the text converts, nothing is fetched or read."""
    bait = office.bait
    page = made(office, "references-page.html")
    page.write_text(shapes.html_references(bait))
    notes = made(office, "references-notes.md")
    notes.write_text(shapes.markdown_references(bait))
    names = [drop(office, page), drop(office, notes)]
    endings = settle_all(office, names)
    for result in endings.values():
        assert result.outcome == "done", result
        assert "Text before." in result.markdown and "Text after." in result.markdown, result
    nothing_outside_was_touched(office)


def test_huge_data_pictures_in_web_pages_end_without_blowing_memory(office: Office) -> None:
    """A 64 MB data: picture in HTML, and one just under the text limit: each ends with
    its text or a reason."""
    names = [
        shapes.html_huge_data_uri(made(office, "huge-data.html")).name,
        shapes.html_huge_data_uri(made(office, "data-15mb.html"), 15 * hostile.MIB).name,
    ]
    with office.memory.sampling():
        for name in names:
            drop(office, office.staging / name)
        endings = settle_all(office, names)
    assert endings["huge-data.html"].outcome == "failed", endings["huge-data.html"]
    data = endings["data-15mb.html"]
    assert data.outcome == "failed" or "Text after the picture." in data.markdown, data
    memory_was_bounded(office)
    still_serving(office)


NOT_A_PICTURE = (233, 71)  # a PNG in places no picture is read from: its text never shows
# name: the pictures read, and those left unread (`document.opened`)
EMBEDDED_ENDINGS = {
    "tiny-pictures.html": (50, 4950),  # max_pictures read; the rest never decoded
    "huge-picture.md": (0, 1),
    "broken-pictures.html": (0, 7),
    "picture-bombs.html": (4, 4),  # four of 49 million pixels spend the decoding budget
    "gif-frames.html": (1, 0),  # its first frame
    "no-picture-places.html": (0, 4),  # the SVG, two EPS, an <img> with only a srcset
}


def test_pictures_embedded_as_data_uris_end_bounded_and_load_nothing(office: Office) -> None:
    """Pictures held inside a page or Markdown file as data: URIs: 5,000 of four pixels, more
    than a document's elements may be, one of 15 MB, broken base64, PNGs claiming 10 billion
    and 81 million pixels, a GIF of 10,000 frames; a PNG in CSS url(), an object, an embed,
    an iframe's data: page, a poster and a srcset; an SVG and an EPS naming the secret files
    and the server. Each ends converted with its text (the pictures within the limits read,
    the rest counted unread) or refused naming its shape; nothing outside is opened or
    fetched, no EPS reaches Ghostscript, and memory stays bounded."""
    names = [
        shapes.html_tiny_data_uris(made(office, "tiny-pictures.html")).name,
        shapes.markdown_tiny_data_uris(made(office, "tiny-notes.md")).name,
        shapes.markdown_huge_data_uri(made(office, "huge-picture.md")).name,
        shapes.html_broken_data_uris(made(office, "broken-pictures.html")).name,
        shapes.html_picture_bombs(made(office, "picture-bombs.html")).name,
        shapes.html_gif_frames(made(office, "gif-frames.html"), size=(211, 61)).name,
        shapes.html_data_uris_no_picture_loads(
            made(office, "no-picture-places.html"), office.bait, NOT_A_PICTURE
        ).name,
    ]
    with office.memory.sampling():
        for name in names:
            drop(office, office.staging / name)
        endings = settle_all(office, names)
    refused = endings["tiny-notes.md"]
    assert refused.outcome == "failed" and "pictures" in refused.reason, refused
    for name, (read, unread) in EMBEDDED_ENDINGS.items():
        ended = endings[name]
        assert ended.outcome == "done" and "Text after." in ended.markdown, ended
        [opened] = office.daemon.find("document.opened", path=name)
        assert (opened["pictures"], opened["pictures_unread"]) == (read, unread), opened
    assert endings["tiny-pictures.html"].markdown.count("Image 2x2 px") == 50
    assert endings["picture-bombs.html"].markdown.count("Image 2048x2048 px") == 4
    assert endings["gif-frames.html"].markdown.count("Image 211x61 px") == 1
    places = endings["no-picture-places.html"].markdown
    assert "Image 233x71 px" not in places and "Image 79x35 px" not in places, places
    memory_was_bounded(office)
    nothing_outside_was_touched(office)
    still_serving(office)


NAMINGS = 2400  # two pictures a naming: 4,800, within the 5,000 a document may hold


def test_pictures_named_again_and_again_or_of_endless_scans_hold_no_worker(
    office: Office,
) -> None:
    """A Markdown file naming an 8 MB data: URI that is no picture 2,400 times, and a 1 MB
    picture as often (its work, unbounded, was each naming's size: minutes); a page of one
    progressive JPEG of 40,000 scans in 4 MB, each a pass over 49 million pixels. Each
    ends converted with its text (the picture read as often as its base64 fits in a page,
    the rest counted unread), never held until the render time limit."""
    noise = io.BytesIO()
    Image.frombytes("RGB", (600, 600), os.urandom(600 * 600 * 3)).save(noise, "PNG")
    picture = shapes.data_uri(noise.getvalue())
    payload = len(picture) - len("data:image/png;base64,")
    nothing = "data:image/png;base64," + "A" * 8 * hostile.MIB
    namings = "![again][picture] ![nothing][nothing]\n" * NAMINGS
    notes = made(office, "named-again.md")
    references = f"[picture]: {picture}\n[nothing]: {nothing}\n"
    notes.write_text(f"# Again\n\n{namings}\nThe end.\n\n{references}")
    scans = shapes.data_uri(shapes.jpeg_of_scans(7000, 40_000), "image/jpeg")
    page = shapes.page_of(made(office, "endless-scans.html"), f'<img src="{scans}">')
    names = [drop(office, notes), drop(office, page)]
    with office.memory.sampling():
        endings = settle_all(office, names)
    held = [e for e in endings.values() if e.outcome != "done" or "took longer than" in e.reason]
    assert held == [], held
    assert "The end." in endings["named-again.md"].markdown
    assert "Text after." in endings["endless-scans.html"].markdown
    read = 20 * hostile.MIB // payload  # the base64 a page may hold (max_text_bytes)
    pictures = {"named-again.md": (read, 2 * NAMINGS - read), "endless-scans.html": (0, 1)}
    for name, counts in pictures.items():
        [opened] = office.daemon.find("document.opened", path=name)
        assert (opened["pictures"], opened["pictures_unread"]) == counts, opened
    memory_was_bounded(office)
    still_serving(office)


def test_tables_at_scale_end_within_the_limits(office: Office) -> None:
    """A CSV of a million columns and one of a 1 GB line; a workbook of a million formula
    cells; 3,000 slides and 2,000 slides: each within the limits or refused naming one."""
    names = [
        shapes.csv_wide(made(office, "wide.csv")).name,
        shapes.csv_long_line(made(office, "long-line.csv")).name,
        shapes.xlsx_million_cells(made(office, "million-cells.xlsx")).name,
        shapes.pptx_many_slides(made(office, "slides-3000.pptx")).name,
        shapes.pptx_many_slides(made(office, "slides-2000.pptx"), 2000).name,
    ]
    with office.memory.sampling():
        for name in names:
            drop(office, office.staging / name)
        endings = settle_all(office, names)
    for name in ("wide.csv", "long-line.csv", "million-cells.xlsx", "slides-3000.pptx"):
        assert endings[name].outcome == "failed", endings[name]
    slides = endings["slides-2000.pptx"]
    assert slides.outcome == "failed" or slides.markdown.count("one of many") == 2000, slides
    memory_was_bounded(office)
    still_serving(office)


def test_small_files_shaped_to_hold_a_worker_are_refused_for_their_shape(office: Office) -> None:
    """Files of a few KB to a MB, under every size and cell limit, whose shape makes a
    reader work without end: two cells at A1 and XFD1048576 (a grid of 17 billion cells
    between them), 16 million empty paragraphs (a random part keeping the archive's ratio
    in bounds), HTML and Markdown nested 100,000 deep. Each must be converted or refused
    for its shape, naming it, never stopped at the render time limit after holding a
    worker (and every document queued behind it) that long."""
    names = [
        shapes.xlsx_corners(made(office, "corners.xlsx")).name,
        shapes.paragraph_flood(made(office, "paragraphs.docx")).name,
        shapes.html_deep(made(office, "deep-page.html")).name,
        shapes.markdown_deep(made(office, "deep-notes.md")).name,
    ]
    for name in names:
        drop(office, office.staging / name)
    endings = settle_all(office, names)
    held = [e for e in endings.values() if "took longer than" in e.reason]
    assert held == [], held
    still_serving(office)


def test_files_are_known_by_their_content_not_their_name(office: Office) -> None:
    """A PDF named .docx converts as the PDF; a Word document named .pdf as the document;
    a zip that is no office document, and text named .docx, fail saying what they are."""
    pdf = make_text_pdf(made(office, "really-a-pdf.docx"), "Portable words")
    word = hostile.write_docx(made(office, "really-a-docx.pdf"), "Wordy words")
    plain_zip = hostile.zip_not_ooxml(made(office, "plain-zip.docx"))
    text = made(office, "text.docx")
    text.write_text("Dear reader, this is no document.\n")
    names = [drop(office, p) for p in (pdf, word, plain_zip, text)]
    endings = settle_all(office, names)
    word_ended, pdf_ended = endings["really-a-docx.pdf"], endings["really-a-pdf.docx"]
    assert word_ended.outcome == "done" and "Wordy words" in word_ended.markdown, word_ended
    assert pdf_ended.outcome == "done", pdf_ended
    for name in ("plain-zip.docx", "text.docx"):
        assert endings[name].outcome == "failed", endings[name]


def test_links_and_fifos_named_as_documents_are_left_alone(office: Office) -> None:
    """alice puts a link named .docx to a secret file and a FIFO named .md in the inbox:
    neither is followed, opened or blocks; a document dropped after them converts."""
    inbox = office.data / "inbox"
    link = inbox / "link.docx"
    link.symlink_to(office.bait.secret_paths[0])
    os.lchown(link, uid("alice"), -1)
    fifo = inbox / "fifo.md"
    os.mkfifo(fifo)
    give(fifo, "alice", 0o664)
    office.daemon.wait_for("file.skipped", timeout=seconds_for(1), path=str(link))
    office.daemon.wait_for("file.skipped", timeout=seconds_for(1), path=str(fifo))
    after = drop(office, hostile.write_docx(made(office, "after-links.docx"), "Still here"))
    assert "Still here" in settle_all(office, [after])[after].markdown
    assert link.is_symlink() and stat.S_ISFIFO(fifo.lstat().st_mode)
    nothing_outside_was_touched(office)
    link.unlink()
    fifo.unlink()


def test_a_document_still_being_written_is_taken_whole(office: Office) -> None:
    """alice's program writes a Word document slowly, a part every fraction of the settle
    time, for several settle times: it is taken once complete, never half."""
    content = hostile.docx_bytes("Written slowly, taken whole")
    target = office.data / "inbox" / "slow.docx"
    pieces = 12
    step = len(content) // pieces + 1
    with target.open("wb") as out:
        give(target, "alice", 0o664)
        for start in range(0, len(content), step):
            out.write(content[start : start + step])
            out.flush()
            time.sleep(SETTLE / 3)  # the writer's pace: always within the settle time
    result = settle_all(office, ["slow.docx"])["slow.docx"]
    assert result.outcome == "done", result
    assert "Written slowly, taken whole" in result.markdown


# ---- over HTTP ------------------------------------------------------------------------------


def test_hostile_uploads_and_docling_tasks_fail_by_name_and_read_nothing(office: Office) -> None:
    """The same attacks sent by a client with the token: uploaded (`/api/documents`),
    converted synchronously (`/v1/convert/file`) and as base64 (`/v1/convert/source`).
    A bomb is answered with a failure naming why; a page pointing at secrets converts
    without them; no answer holds the secret."""
    bait = office.bait
    bomb = hostile.docx_bomb(made(office, "upload-bomb.docx"))
    page = made(office, "upload-references.html")
    page.write_text(shapes.html_references(bait))
    entities = hostile.docx_entities(made(office, "upload-entities.docx"), bait)

    sent = httpx.post(
        f"{office.url}/api/documents",
        headers=AUTH,
        params={"filename": bomb.name},
        content=bomb.read_bytes(),
        timeout=120,
    )
    assert sent.status_code == 202, sent.text
    upload = sent.json()["id"]

    with page.open("rb") as handle:
        answer = httpx.post(
            f"{office.url}/v1/convert/file",
            headers=KEY,
            data={"to_formats": ["md", "json"]},
            files={"files": (page.name, handle)},
            timeout=seconds_for(1),
        )
    assert answer.status_code == 200, answer.text
    document = answer.json()["document"]
    assert "Text after." in document.get("md_content", ""), answer.json()
    assert not holds_secret(answer.content, SECRET)

    source = {
        "kind": "file",
        "filename": entities.name,
        "base64_string": base64.b64encode(entities.read_bytes()).decode(),
    }
    answer = httpx.post(
        f"{office.url}/v1/convert/source",
        headers=KEY,
        json={"sources": [source], "options": {"to_formats": ["md"]}},
        timeout=seconds_for(1),
    )
    assert answer.status_code in (200, 422), answer.text
    assert not holds_secret(answer.content, SECRET)
    if answer.json().get("status") == "failure" or answer.status_code == 422:
        message = json.dumps(answer.json())
        assert "entit" in message.lower() or "declar" in message.lower(), message

    status = httpx.get(
        f"{office.url}/api/documents/{upload}",
        headers=AUTH,
        params={"wait": min(300, seconds_for(1))},
        timeout=seconds_for(1) + 30,
    ).json()
    assert status["state"] == "failed", status
    assert readable(status["reason"]), status
    nothing_outside_was_touched(office)


# ---- the daemon's own memory ----------------------------------------------------------------

PICTURE_SIDE = 2048  # ocrd/office/limits.py's max_picture_side
WAITING_DOCUMENTS = 4


def test_pictures_waiting_for_the_engine_are_not_all_held_in_the_daemon(
    tmp_path: Path, start_daemon: Any
) -> None:
    """Documents of 37 KB, each nine drawings of one 2048 x 2048 picture (113 MB of pixels
    on their way to the engine), dropped while the engine is busy: the daemon may hold the
    pixels of the pages in flight (what a PDF's rendered pages are bounded by), not every
    waiting document's. Four documents must not grow it by four documents' pixels."""
    engine = {"kind": "simulated", "simulated": {"seconds_per_page": 600, "capacity": 1}}
    pipeline = {"shutdown_grace_seconds": 1, "render_workers": RENDER_WORKERS}
    config = write_config(tmp_path, engine=engine, pipeline=pipeline)
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready", timeout=120)
    baseline = rss_bytes(daemon.process.pid)
    staging = tmp_path / "staging"
    staging.mkdir()
    for number in range(WAITING_DOCUMENTS):
        album = shapes.docx_many_pictures(staging / f"album-{number}.docx")
        os.rename(album, tmp_path / "data" / "inbox" / album.name)
    daemon.wait_for(
        "document.opened", timeout=seconds_for(WAITING_DOCUMENTS), count=WAITING_DOCUMENTS
    )
    pages_in_flight = 1 + 4  # the engine's capacity, and a quarter more but at least 4
    allowed = pages_in_flight * PICTURE_SIDE**2 * 3 + (200 << 20)  # and room for the rest
    grown = rss_bytes(daemon.process.pid) - baseline
    assert grown < allowed, (
        f"the daemon grew by {grown >> 20} MB holding {WAITING_DOCUMENTS} documents' "
        f"pictures; the pages in flight allow {allowed >> 20} MB"
    )
    assert daemon.stop() == 0
