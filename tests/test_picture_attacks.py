"""Pictures a document's author embeds as `data:` URIs to make the render worker decode
without end, in a worker of its own here (as a render worker reads a file): named again
and again, or shaped so that their decoder works through part after part. And what must
still be read as its bytes say, in every format and place a web page or Markdown file
holds one. tests/test_office_attacks.py sends the largest of them through the daemon.
"""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path

import pytest
from hostile_shapes import jpeg_of_scans, png_of_profiles
from office_files import data_uri
from PIL import Image
from test_office import read, sizes

from ocrd.domain import InputFormat
from ocrd.office.limits import OfficeLimits, OfficeRefused


def saved(image: Image.Image, kind: str, **saving: object) -> bytes:
    out = io.BytesIO()
    image.save(out, kind, **saving)
    return out.getvalue()


def blank(size: tuple[int, int], kind: str, mode: str = "RGB", **saving: object) -> bytes:
    return saved(Image.new(mode, size, "white" if mode == "RGB" else 0), kind, **saving)


def animation(size: tuple[int, int], frames: int, kind: str) -> bytes:
    """An animated WebP or PNG of `frames` frames, each its own colour."""
    images = [Image.new("RGB", size, (n % 256, 0, 0)) for n in range(frames)]
    out = io.BytesIO()
    images[0].save(out, kind, save_all=True, append_images=images[1:])
    return out.getvalue()


def test_a_picture_named_again_and_again_is_decoded_no_more_than_a_page_holds(
    tmp_path: Path,
) -> None:
    """A Markdown file names one picture by reference hundreds of times, and one data: URI
    that is no picture as often: each naming is decoded again (none is an icon the page
    repeats), so pictures stop being decoded once their base64 makes as much as a page may
    hold, and what is no picture is never read past its first characters."""
    noise = Image.frombytes("RGB", (100, 100), os.urandom(100 * 100 * 3))
    picture = data_uri(saved(noise, "PNG"), "image/png")  # 40 KB of base64
    nothing = "data:image/png;base64," + "A" * 100_000
    namings = "".join(f"![again {n}][picture] ![nothing][nothing]\n" for n in range(300))
    notes = tmp_path / "again.md"
    notes.write_text(
        f"# Again\n\n{namings}\nThe end.\n\n[picture]: {picture}\n[nothing]: {nothing}\n"
    )
    limits = OfficeLimits(max_text_bytes=notes.stat().st_size)
    payload = len(picture) - len("data:image/png;base64,")

    result = read(notes, InputFormat.md, limits)
    decoded = limits.max_text_bytes // payload  # 4: fewer than max_pictures
    assert sizes(result) == [(100, 100)] * decoded
    assert result.unread_pictures == 600 - decoded


def test_pictures_their_decoder_would_work_through_part_by_part_stay_unread(
    tmp_path: Path,
) -> None:
    """A progressive JPEG of 101 scans more than Pillow writes (each a pass over the whole
    picture: 150,000 of them fit in a page), a PNG of five colour profiles (each inflated
    to a MB): unread, counted. The same pictures as a real one is made are read."""
    sources = [
        data_uri(jpeg_of_scans(64, 101), "image/jpeg"),
        data_uri(png_of_profiles(5), "image/png"),
        data_uri(jpeg_of_scans(65, 0), "image/jpeg"),
        data_uri(png_of_profiles(1, (66, 33)), "image/png"),
    ]
    page = tmp_path / "parts.html"
    page.write_text("<p>Parts</p>" + "".join(f'<img src="{src}">' for src in sources))

    result = read(page, InputFormat.html)
    assert sizes(result) == [(65, 65), (66, 33)]
    assert result.unread_pictures == 2


def test_pictures_of_every_kind_and_place_are_read_as_their_bytes_say(tmp_path: Path) -> None:
    """What a page may embed and must still be read, first frame or pixels as a viewer
    shows them: an animated WebP and PNG of 300 frames, CMYK, 16-bit, a palette with a
    transparent colour, grey with alpha; `DATA:` in capitals, a charset parameter, base64
    over indented lines; in a `<picture>`, a table, a list; in Markdown's tables, lists,
    quotes, HTML blocks and by reference. What must not: a RIFF file that is an AVI (or
    says WEBP over one), URL-safe or percent-encoded base64 (unread, counted); a data:
    URI in a srcset (its `<img>` a placeholder), an `<input type=image>`, an SVG
    `<image>`, a MathML glyph (no picture)."""
    png = base64.b64encode(blank((107, 17), "PNG")).decode()
    indented = "\n    ".join(png[at : at + 40] for at in range(0, len(png), 40))
    read_ones = [
        data_uri(animation((101, 11), 300, "WEBP"), "image/webp"),
        data_uri(animation((102, 12), 300, "PNG"), "image/apng"),
        data_uri(blank((103, 13), "JPEG", "CMYK"), "image/jpeg"),
        data_uri(blank((104, 14), "PNG", "I;16"), "image/png"),
        data_uri(blank((105, 15), "PNG", "P", transparency=0), "image/png"),
        data_uri(blank((106, 16), "PNG", "LA"), "image/png"),
        "DATA:IMAGE/PNG;BASE64," + png,
        "data:image/png;charset=utf-8;base64," + png,
        "data:image/png;base64,\n    " + indented,
    ]
    unread_ones = [
        data_uri(b"RIFF\x10\0\0\0AVI LIST" + b"\0" * 64, "image/webp"),
        data_uri(b"RIFF\x10\0\0\0WEBPAVI LIST" + b"\0" * 64, "image/webp"),
        "data:image/png;base64," + base64.urlsafe_b64encode(blank((110, 20), "PNG")).decode(),
        "data:image/png;base64," + png.replace("=", "%3D").replace("+", "%2B"),
    ]
    other = data_uri(blank((99, 9), "PNG"), "image/png")
    no_pictures = (
        f'<img srcset="{other} 1x"><input type="image" src="{other}">'
        f'<svg><image href="{other}"/></svg><math><mglyph src="{other}"/></math>'
    )
    placed = [data_uri(blank((120 + n, 30), "PNG"), "image/png") for n in range(3)]
    page = tmp_path / "kinds.html"
    page.write_text(
        "<p>Kinds</p>"
        + "".join(f'<img src="{src}">' for src in read_ones + unread_ones)
        + no_pictures
        + f'<picture><source srcset="{other}"><img src="{placed[0]}"></picture>'
        + f'<table><tr><td><img src="{placed[1]}"></td></tr></table>'
        + f'<ul><li><img src="{placed[2]}"></li></ul><p>The end.</p>'
    )
    kinds = read(page, InputFormat.html)
    assert sizes(kinds) == [
        *[(101 + n, 11 + n) for n in range(6)],
        *[(107, 17)] * 3,
        *[(120 + n, 30) for n in range(3)],
    ]
    assert kinds.unread_pictures == len(unread_ones) + 1  # and the srcset's <img>

    markdown = [data_uri(blank((130 + n, 40), "PNG"), "image/png") for n in range(5)]
    notes = tmp_path / "places.md"
    notes.write_text(
        f"# Places\n\n| a | b |\n|---|---|\n| ![cell]({markdown[0]}) | b |\n\n"
        f"- an item ![item]({markdown[1]})\n- ![by reference][ref]\n\n"
        f'> ![quoted]({markdown[2]})\n\n<div><img src="{markdown[3]}"></div>\n\n'
        f"[ref]: {markdown[4]}\n\nThe end.\n"
    )
    places = read(notes, InputFormat.md)
    assert sizes(places) == [(130, 40), (131, 40), (134, 40), (132, 40), (133, 40)]
    assert places.unread_pictures == 0


def test_a_document_of_more_pictures_than_it_may_hold_is_refused_in_the_worker(
    tmp_path: Path,
) -> None:
    """Pictures that stay placeholders still are items of the DoclingDocument the daemon
    holds: 40,000 of them in a 3 MB Markdown file took the daemon to 1.3 GB. More than
    `max_picture_items` refuse the document, in the worker, with the count."""
    notes = tmp_path / "icons.md"
    notes.write_text("# Icons\n\n" + "".join(f"![icon {n}](i{n}.png)\n\n" for n in range(5_001)))
    with pytest.raises(OfficeRefused, match="it holds 5001 pictures, more than the 5000"):
        read(notes, InputFormat.md)
    fewer = tmp_path / "few.md"
    fewer.write_text("# Icons\n\n" + "".join(f"![icon {n}](i{n}.png)\n\n" for n in range(300)))
    assert read(fewer, InputFormat.md).unread_pictures == 300
