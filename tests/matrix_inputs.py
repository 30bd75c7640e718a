"""The inputs of the combination matrix (tests/test_matrix.py): each kind of input a user
drops or hands over, made of real corpus pages and the separator sheets people print, with
what each part of it must hold once it is split.

Every input is a few content pages in two groups; a splitting rule puts its separator sheet
between the groups (none: the groups run on). Each content page is known by a marker: a
scan's is the simulated engine's "Simulated page N" (N its page in the document), a
born-digital page's its own first words, read from its text layer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pymupdf
from helpers import without_trailer
from PIL import Image
from separator_sheets import CORPUS, Sheet, scan_sheet, stack_folder, stack_pdf

KINDS = [
    "born-digital PDF",
    "scanned PDF",
    "mixed PDF",
    "owner-password PDF",
    "damaged PDF",
    "multi-page TIFF",
    "PNG",
    "scan job folder",
    "collated duplex",
    "upload",
]
OUTPUTS = ["markdown", "markdown+pdf", "markdown+pdf_archive"]
SPLITS = ["none", "patch_t", "barcode", "blank"]
DELIVERIES = ["command", "webhook", "api"]
SPLIT_BARCODE = r"SPLIT-\d{4}"
SEPARATORS = {
    "patch_t": Sheet("patch_t"),
    "barcode": Sheet("qr", "SPLIT-0001"),
    "blank": Sheet("blank"),
}
OWNER_PASSWORD = "matrix-owner"
SCAN_DPI = 200
LATEX = "sample-files__pdflatex-4-pages.pdf"


def refusal(kind: str, split: str) -> str | None:
    """What `ocrd check-config` must say of a cell it refuses (None: it is allowed)."""
    if kind == "collated duplex" and split == "blank":
        return "blank"  # blank backs are normal in a duplex scan: not a separator there
    return None


@dataclass(frozen=True)
class Page:
    """A content page of an input: its number in the document, and what shows it is there."""

    number: int
    engine: bool  # recognised by the (simulated) engine; else read from its text layer
    words: tuple[str, ...] = ()  # a born-digital page's first words

    def found_in(self, text: str) -> bool:
        """Whether `text` (Markdown, or what pdftotext reads off a page) shows this page."""
        words = re.findall(r"\w+", text.lower())
        if self.engine:
            return f"simulated page {self.number} " in " ".join(words) + " "
        return all(word in words for word in self.words)


@dataclass
class Input:
    """One input as it goes into an inbox, and what must come of it."""

    kind: str
    path: str  # its document's path relative to the inbox (an upload's: its file name)
    stem: str  # the name its outputs take
    parts: list[list[Page]]
    write: Callable[[Path], None]  # puts it into a folder (for an upload: the file to send)
    separators: list[int] = field(default_factory=list)  # pages that are separator sheets
    # A duplex pair's backs: put into the inbox once the fronts wait for them.
    write_backs: Callable[[Path], None] | None = None


def _first_words(name: str, number: int) -> tuple[str, ...]:
    with pymupdf.open(CORPUS / "real" / name) as doc:
        found = re.findall(r"[a-z]{5,}", doc[number - 1].get_text().lower())
    return tuple(found[:3])


def _pages(
    groups: Sequence[Sequence[Sheet]], split: str
) -> tuple[list[Sheet], list[list[Page]], list[int]]:
    """The sheets in order (a separator between the groups where the rule has one), each
    group's content pages as they will be numbered, and the separators' numbers."""
    sheets: list[Sheet] = []
    parts: list[list[Page]] = []
    separators: list[int] = []
    for index, group in enumerate(groups):
        if index and split != "none":
            sheets.append(SEPARATORS[split])
            separators.append(len(sheets))
        pages = []
        for sheet in group:
            sheets.append(sheet)
            engine = sheet.kind != "pdf" or sheet.value != LATEX
            words = () if engine else _first_words(sheet.value, sheet.number)
            pages.append(Page(len(sheets), engine, words))
        parts.append(pages)
    if split == "none":
        parts = [[page for part in parts for page in part]]
    return sheets, parts, separators


SCANS = [[Sheet("scan", "phototest.tif")], [Sheet("scan", "eurotext.tif")]]
BORN = [[Sheet("pdf", LATEX, 1)], [Sheet("pdf", LATEX, 2), Sheet("pdf", LATEX, 3)]]
MIXED = [[Sheet("pdf", LATEX, 1), Sheet("scan", "phototest.tif")], [Sheet("pdf", LATEX, 2)]]


def _pdf(
    kind: str,
    stem: str,
    groups: Sequence[Sequence[Sheet]],
    split: str,
    finish: Callable[[Path, Path], None] | None = None,
) -> Input:
    sheets, parts, separators = _pages(groups, split)

    def write(folder: Path) -> None:
        made = stack_pdf(sheets, folder / f".{stem}.pdf")
        if finish is None:
            made.rename(folder / f"{stem}.pdf")
        else:
            finish(made, folder / f"{stem}.pdf")
            made.unlink()

    return Input(kind, f"{stem}.pdf", stem, parts, write, separators=separators)


def _owner_password(made: Path, target: Path) -> None:
    with pymupdf.open(made) as doc:
        doc.save(
            target,
            encryption=pymupdf.PDF_ENCRYPT_AES_256,
            owner_pw=OWNER_PASSWORD,
            user_pw="",
            permissions=pymupdf.PDF_PERM_PRINT,
        )


def _tiff(split: str) -> Input:
    sheets, parts, separators = _pages(SCANS, split)

    def write(folder: Path) -> None:
        frames = [
            scan_sheet(sheet, SCAN_DPI, seed).convert("L") for seed, sheet in enumerate(sheets)
        ]
        hidden = folder / ".multipage.tif"
        frames[0].save(
            hidden,
            save_all=True,
            append_images=frames[1:],
            compression="tiff_lzw",
            dpi=(SCAN_DPI, SCAN_DPI),
        )
        hidden.rename(folder / "multipage.tif")

    return Input(
        "multi-page TIFF", "multipage.tif", "multipage", parts, write, separators=separators
    )


def _png() -> Input:
    def write(folder: Path) -> None:
        with Image.open(CORPUS / "real" / "ocrmypdf__typewriter.png") as image:
            image.save(folder / ".typewriter.png")
        (folder / ".typewriter.png").rename(folder / "typewriter.png")

    return Input("PNG", "typewriter.png", "typewriter", [[Page(1, True)]], write)


def _job(split: str) -> Input:
    sheets, parts, separators = _pages(SCANS, split)

    def write(folder: Path) -> None:
        stack_folder(sheets, folder / ".scan-0001", dpi=SCAN_DPI, suffix=".jpg")
        (folder / ".scan-0001").rename(folder / "scan-0001")

    return Input("scan job folder", "scan-0001", "scan-0001", parts, write, separators=separators)


def _duplex(split: str) -> Input:
    """Fronts: a scan, the separator sheet, a scan; backs (fed last page first): a scan,
    the sheet's blank back, a PDF page. Interleaved: f1 b1 | f3 b3."""
    fronts = [Sheet("scan", "phototest.tif"), Sheet("scan", "eurotext.tif")]
    backs = [Sheet("pdf", "ocrmypdf__linn.pdf"), Sheet("scan", "8087_054.3B.tif")]  # b3, b1
    if split != "none":
        fronts.insert(1, SEPARATORS[split])
        backs.insert(1, Sheet("blank"))
    count = len(fronts) * 2
    pages = [Page(n, True) for n in range(1, count + 1)]
    parts = [pages] if split == "none" else [pages[:2], pages[4:]]

    def write(folder: Path) -> None:
        stack_pdf(fronts, folder / ".fronts.pdf").rename(folder / "fronts.pdf")

    def write_backs(folder: Path) -> None:
        stack_pdf(backs, folder / ".backs.pdf").rename(folder / "backs.pdf")

    return Input(
        "collated duplex",
        "fronts.pdf",
        "fronts",
        parts,
        write,
        [3] if split != "none" else [],
        write_backs,
    )


def make_input(kind: str, split: str) -> Input:
    if kind == "born-digital PDF":
        return _pdf(kind, "born", BORN, split)
    if kind == "scanned PDF":
        return _pdf(kind, "scanned", SCANS, split)
    if kind == "mixed PDF":
        return _pdf(kind, "mixed", MIXED, split)
    if kind == "owner-password PDF":
        return _pdf(kind, "owner", MIXED, split, _owner_password)
    if kind == "damaged PDF":
        return _pdf(kind, "damaged", MIXED, split, without_trailer)
    if kind == "multi-page TIFF":
        return _tiff(split)
    if kind == "PNG":
        return _png()
    if kind == "scan job folder":
        return _job(split)
    if kind == "collated duplex":
        return _duplex(split)
    if kind == "upload":
        return _pdf(kind, "upload", SCANS, split)
    raise ValueError(kind)
