"""Separator sheets: finding them on real rendered pages, and cutting documents at them.

Pages are rendered for the engine by the real render workers (which also judge them blank),
then looked at as a render worker will: a PDF page rendered in grey for barcodes, a scan's
own pixels. Sheets are made as people print them (tests/separator_sheets.py) and put between
real scans and real PDF pages of the corpus.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pymupdf
import pytest
from PIL import Image
from separator_sheets import (
    Sheet,
    save_scan,
    scan_sheet,
    stack_folder,
    stack_pdf,
)

from ocrd.config import ConfigError, RenderSettings, parse_config
from ocrd.documents.sources import Sources, page_files, page_order
from ocrd.domain import InputFormat, PageImage, SeparatorKind, SeparatorMark
from ocrd.render import RenderLimits, RenderPool, SourceFile, detect_format
from ocrd.render.separators import (
    SeparatorRules,
    detect_on_pdf_page,
    detect_on_scan,
    detect_separator,
    judged_by_blankness,
    needs_looking,
    split_pages,
)

SPLIT_BARCODE = r"SPLIT-\d{4}"
EVERYTHING = SeparatorRules.of(["patch_t", "barcode", "blank"], SPLIT_BARCODE)

# Each kind of page, and what it is with every separator on.
CATALOGUE: list[tuple[str, Sheet, SeparatorKind]] = [
    ("PATCH-T sheet", Sheet("patch_t"), SeparatorKind.patch_t),
    ("PATCH-T bars only", Sheet("patch_t_bars"), SeparatorKind.patch_t),
    ("PATCH-T bars along the top only", Sheet("patch_t_top_bars"), SeparatorKind.patch_t),
    ("PATCH-T Code 39 only", Sheet("patch_t_code39"), SeparatorKind.patch_t),
    ("Patch 3 sheet", Sheet("patch_3"), SeparatorKind.none),
    ("QR code SPLIT-0001", Sheet("qr", "SPLIT-0001"), SeparatorKind.barcode),
    ("Code 128 SPLIT-0002", Sheet("code128", "SPLIT-0002"), SeparatorKind.barcode),
    ("Data Matrix SPLIT-0003", Sheet("datamatrix", "SPLIT-0003"), SeparatorKind.barcode),
    ("QR code SPLIT-12 (not the pattern)", Sheet("qr", "SPLIT-12"), SeparatorKind.none),
    ("Code 128 ORDER-5531", Sheet("code128", "ORDER-5531"), SeparatorKind.none),
    ("invoice with a barcode", Sheet("invoice", "INV-2024-0815"), SeparatorKind.none),
    ("blank sheet", Sheet("blank"), SeparatorKind.blank),
    ("a few words", Sheet("nearly_blank"), SeparatorKind.none),
    ("a page number alone", Sheet("nearly_blank", "- 17 -"), SeparatorKind.none),
    ("corpus scan phototest", Sheet("scan", "phototest.tif"), SeparatorKind.none),
    ("corpus PDF page linn", Sheet("pdf", "ocrmypdf__linn.pdf"), SeparatorKind.none),
]
NAMES = [name for name, _, _ in CATALOGUE]
# Black and white scans (a document scanner's fax-like mode) of a few of them.
BILEVEL = [
    NAMES.index(name)
    for name in (
        "PATCH-T sheet",
        "PATCH-T Code 39 only",
        "Code 128 SPLIT-0002",
        "QR code SPLIT-12 (not the pattern)",
        "blank sheet",
        "a few words",
    )
]


@dataclass(frozen=True)
class Looked:
    """A page rendered for the engine, and its mark."""

    page: PageImage
    mark: SeparatorMark


def render_pages(paths: list[Path]) -> list[tuple[Path, InputFormat, PageImage]]:
    """Every page of the files, in order, rendered for the engine by a real render worker."""

    async def run() -> list[tuple[Path, InputFormat, PageImage]]:
        pool = RenderPool(1, RenderLimits())
        rendered = []
        try:
            for path in paths:
                fmt = detect_format(path)
                document = SourceFile(path, fmt, RenderSettings())
                count = await pool.open(document)
                for number in range(1, count + 1):
                    rendered.append((path, fmt, await pool.render(document, number)))
        finally:
            pool.shutdown()
        return rendered

    return asyncio.run(run())


def look(path: Path, fmt: InputFormat, page: PageImage, rules: SeparatorRules) -> SeparatorMark:
    """What a render worker finds on the page: at barcode resolution, blankness from render."""
    if fmt is InputFormat.pdf:
        with pymupdf.open(path) as doc:
            return detect_on_pdf_page(doc[page.number - 1], rules, page.blank)
    with Image.open(path) as image:
        image.seek(page.number - 1)
        dpi = float(image.info.get("dpi", (72, 72))[0] or 72)
        return detect_on_scan(image.convert("RGB"), dpi, rules, page.blank)


def looked_at(paths: list[Path], rules: SeparatorRules = EVERYTHING) -> list[Looked]:
    return [Looked(page, look(p, fmt, page, rules)) for p, fmt, page in render_pages(paths)]


def scanned_files(
    folder: Path, dpi: int, suffix: str, bilevel: bool = False, only: Sequence[int] = ()
) -> list[Path]:
    """The catalogue's sheets (or those at the indexes `only`) scanned into files."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, (_, sheet, _) in enumerate(CATALOGUE):
        if only and index not in only:
            continue
        path = folder / f"{index:02d}{suffix}"
        if sheet.kind == "pdf":
            path = path.with_suffix(".pdf")
            stack_pdf([sheet], path)
        else:
            save_scan(scan_sheet(sheet, dpi, seed=index, bilevel=bilevel), path, dpi)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def catalogue_pdf(tmp_path_factory: pytest.TempPathFactory) -> list[Looked]:
    pdf = stack_pdf([sheet for _, sheet, _ in CATALOGUE], tmp_path_factory.mktemp("pdf") / "a.pdf")
    return looked_at([pdf])


@pytest.fixture(scope="module")
def catalogue_200(tmp_path_factory: pytest.TempPathFactory) -> list[Looked]:
    return looked_at(scanned_files(tmp_path_factory.mktemp("s200"), 200, ".png"))


@pytest.fixture(scope="module")
def catalogue_300(tmp_path_factory: pytest.TempPathFactory) -> list[Looked]:
    return looked_at(scanned_files(tmp_path_factory.mktemp("s300"), 300, ".jpg"))


@pytest.fixture(scope="module")
def catalogue_300_bilevel(tmp_path_factory: pytest.TempPathFactory) -> list[Looked]:
    folder = tmp_path_factory.mktemp("s300bw")
    return looked_at(scanned_files(folder, 300, ".tif", bilevel=True, only=BILEVEL))


# --- detection ----------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(len(CATALOGUE)), ids=NAMES)
def test_each_kind_of_page_is_found_on_a_pdf_page_at_the_engines_resolution(
    catalogue_pdf: list[Looked], index: int
) -> None:
    _, _, expected = CATALOGUE[index]
    looked = catalogue_pdf[index]
    assert looked.page.image.width == pytest.approx(looked.page.width_pt * 2, abs=1)  # 144 DPI
    assert looked.mark.kind is expected


@pytest.mark.parametrize("index", range(len(CATALOGUE)), ids=NAMES)
def test_each_kind_of_page_is_found_on_a_200_dpi_scan(
    catalogue_200: list[Looked], index: int
) -> None:
    assert catalogue_200[index].mark.kind is CATALOGUE[index][2]


@pytest.mark.parametrize("index", range(len(CATALOGUE)), ids=NAMES)
def test_each_kind_of_page_is_found_on_a_300_dpi_scan(
    catalogue_300: list[Looked], index: int
) -> None:
    assert catalogue_300[index].mark.kind is CATALOGUE[index][2]


@pytest.mark.parametrize("index", BILEVEL, ids=[NAMES[index] for index in BILEVEL])
def test_each_kind_of_page_is_found_on_a_black_and_white_300_dpi_scan(
    catalogue_300_bilevel: list[Looked], index: int
) -> None:
    assert catalogue_300_bilevel[BILEVEL.index(index)].mark.kind is CATALOGUE[index][2]


def test_a_mark_says_what_was_found(catalogue_pdf: list[Looked]) -> None:
    marks = {name: looked.mark for name, looked in zip(NAMES, catalogue_pdf, strict=True)}
    assert marks["PATCH-T sheet"].describe() == "PATCH-T sheet (its bars)"
    assert marks["PATCH-T Code 39 only"].fields() == {
        "kind": "patch_t",
        "text": "PATCHT",
        "symbology": "Code 39",
    }
    assert marks["QR code SPLIT-0001"].fields() == {
        "kind": "barcode",
        "text": "SPLIT-0001",
        "symbology": "QR Code",
    }
    assert marks["blank sheet"].describe() == "blank page" and marks["blank sheet"].blank


def test_a_patch_t_sheet_fed_upside_down_or_sideways_is_found(tmp_path: Path) -> None:
    sheet = scan_sheet(Sheet("patch_t_top_bars"), 300, seed=7)
    paths = [
        save_scan(sheet.rotate(angle, expand=True), tmp_path / f"p{angle}.tif", 300)
        for angle in (90, 180, 270)
    ]
    marks = [looked.mark for looked in looked_at(paths)]
    assert [mark.kind for mark in marks] == [SeparatorKind.patch_t] * 3


def test_a_real_multi_page_scan_has_no_separators(corpus: Path) -> None:
    marks = [looked.mark for looked in looked_at([corpus / "scans" / "multipage-scan.tif"])]
    assert [mark.kind for mark in marks] == [SeparatorKind.none] * 3


def test_an_unrelated_barcode_does_not_split(catalogue_pdf: list[Looked], tmp_path: Path) -> None:
    barcode_only = SeparatorRules.of(["barcode"], SPLIT_BARCODE)
    pages = [
        NAMES.index(name)
        for name in (
            "Code 128 ORDER-5531",
            "invoice with a barcode",
            "QR code SPLIT-12 (not the pattern)",
        )
    ]
    for index in pages:
        looked = catalogue_pdf[index]
        assert detect_separator(looked.page.image, barcode_only, looked.page.blank).kind is (
            SeparatorKind.none
        ), NAMES[index]
    # Nor does a separator barcode when the inbox's expression wants another text.
    other = SeparatorRules.of(["barcode"], r"NEXT DOCUMENT")
    qr = catalogue_pdf[NAMES.index("QR code SPLIT-0001")]
    assert not detect_separator(qr.page.image, other, qr.page.blank).separates


def test_a_separator_kind_not_in_split_on_does_not_split(catalogue_pdf: list[Looked]) -> None:
    blank_only = SeparatorRules.of(["blank"])
    patch_t_only = SeparatorRules.of(["patch_t"])
    for name in ("PATCH-T sheet", "QR code SPLIT-0001"):
        looked = catalogue_pdf[NAMES.index(name)]
        assert not detect_separator(looked.page.image, blank_only, looked.page.blank).separates
    blank = catalogue_pdf[NAMES.index("blank sheet")]
    mark = detect_separator(blank.page.image, patch_t_only, blank.page.blank)
    assert mark.kind is SeparatorKind.none and mark.blank  # known blank, but no separator
    qr = catalogue_pdf[NAMES.index("QR code SPLIT-0001")]
    assert not detect_separator(qr.page.image, patch_t_only, qr.page.blank).separates


def test_a_nearly_blank_page_with_a_few_words_does_not_split_as_blank(tmp_path: Path) -> None:
    sheets = [Sheet("nearly_blank"), Sheet("nearly_blank", "- 17 -"), Sheet("blank")]
    pdf = stack_pdf(sheets, tmp_path / "pages.pdf")
    scans = [
        save_scan(scan_sheet(s, 200, seed=i), tmp_path / f"{i}.png", 200)
        for i, s in enumerate(sheets)
    ]
    rules = SeparatorRules.of(["blank"])
    for paths in ([pdf], scans):
        marks = [looked.mark for looked in looked_at(paths, rules)]
        assert [mark.kind for mark in marks] == [
            SeparatorKind.none,
            SeparatorKind.none,
            SeparatorKind.blank,
        ]


def test_small_barcodes_are_read_at_barcode_resolution_from_a_pdf(tmp_path: Path) -> None:
    from separator_sheets import barcode_sheet

    doc = pymupdf.open()
    barcode_sheet(doc, "SPLIT-0009", "Code128", module_mm=0.25)  # 10 mil, a label's size
    barcode_sheet(doc, "SPLIT-0010", "Code39", module_mm=0.25)
    doc.save(tmp_path / "small.pdf")
    marks = [looked.mark for looked in looked_at([tmp_path / "small.pdf"])]
    assert [(mark.kind, mark.text) for mark in marks] == [
        (SeparatorKind.barcode, "SPLIT-0009"),
        (SeparatorKind.barcode, "SPLIT-0010"),
    ]


# --- rules ----------------------------------------------------------------------------------


def invalid(**inbox: object) -> str:
    """What the configuration says of an inbox with these settings."""
    with pytest.raises(ConfigError) as refused:
        parse_config({"inboxes": [{"path": "inbox", **inbox}]}, Path("/srv"))
    return str(refused.value)


def test_split_on_with_an_unknown_kind_is_an_error_that_names_the_choices() -> None:
    assert "'patch_t', 'barcode' or 'blank'" in invalid(split_on=["patch_t", "qr"])


def test_split_on_barcode_without_an_expression_is_an_error() -> None:
    assert "split_barcode is not set" in invalid(split_on=["barcode"])


def test_a_split_barcode_that_is_no_regular_expression_is_an_error() -> None:
    message = invalid(split_on=["barcode"], split_barcode="SPLIT-(")
    assert "split_barcode 'SPLIT-(' is no regular expression" in message


def test_split_barcode_without_barcode_in_split_on_is_an_error() -> None:
    message = invalid(split_on=["patch_t"], split_barcode="SPLIT")
    assert "split_barcode is set but split_on has no 'barcode'" in message


def test_splitting_on_blank_pages_while_collating_is_an_error() -> None:
    assert "'blank' cannot be used with collate: true" in invalid(split_on=["blank"], collate=True)
    config = parse_config(
        {
            "inboxes": [
                {
                    "path": "in",
                    "split_on": ["patch_t", "barcode"],
                    "split_barcode": "SPLIT",
                    "collate": True,
                }
            ]
        },
        Path("/srv"),
    )
    assert config.inboxes[0].split_on == ("patch_t", "barcode")


def test_only_pages_that_may_hold_bars_or_barcodes_are_looked_at_again() -> None:
    everything, blank_only = EVERYTHING, SeparatorRules.of(["blank"])
    assert needs_looking(everything, False) and needs_looking(everything, None)
    assert not needs_looking(everything, True)
    assert judged_by_blankness(everything, True) == SeparatorMark(SeparatorKind.blank, blank=True)
    assert not needs_looking(blank_only, False) and not needs_looking(SeparatorRules(), None)
    assert judged_by_blankness(blank_only, False) == SeparatorMark()


def test_no_split_on_splits_nothing_and_reads_no_barcodes(catalogue_pdf: list[Looked]) -> None:
    rules = SeparatorRules.of([])
    assert not rules.active
    for looked in catalogue_pdf:
        assert not detect_separator(looked.page.image, rules, looked.page.blank).separates


# --- splitting ----------------------------------------------------------------------------

S = SeparatorMark(SeparatorKind.patch_t, "PATCHT", "Code 39")
B = SeparatorMark(SeparatorKind.blank, blank=True)
P = SeparatorMark()  # a page of a document
E = SeparatorMark(blank=True)  # an empty page that is no separator (a blank back)
ALL = ("patch_t", "barcode", "blank")


@pytest.mark.parametrize(
    ("marks", "parts", "separators"),
    [
        ([P, P, P], [(1, 2, 3)], []),
        ([P, S, P, P], [(1,), (3, 4)], [2]),
        ([S, P, P, S], [(2, 3)], [1, 4]),
        ([P, S, S, P], [(1,), (4,)], [2, 3]),
        ([P, S, B, P, S, P], [(1,), (4,), (6,)], [2, 3, 5]),
        ([S, B, S], [], [1, 2, 3]),
        ([], [], []),
    ],
    ids=["none", "one", "first-and-last", "two-in-a-row", "mixed-kinds", "all", "empty"],
)
def test_a_document_is_cut_at_its_separators_and_they_are_dropped(
    marks: list[SeparatorMark], parts: list[tuple[int, ...]], separators: list[int]
) -> None:
    split = split_pages(marks, ALL)
    assert list(split.parts) == parts
    assert split.dropped == separators
    assert split.numbered is (len(parts) > 1)


def test_a_document_without_separators_is_one_part_and_keeps_its_name() -> None:
    split = split_pages([P, E, P], ALL)
    assert split.parts == ((1, 2, 3),) and not split.numbered
    assert split.fields() == {"parts": [[1, 2, 3]], "separators": []}


def test_a_single_part_left_by_separators_keeps_its_name() -> None:
    split = split_pages([S, P, P], ALL)
    assert split.parts == ((2, 3),) and not split.numbered and split.dropped == [1]


def test_only_the_kinds_split_on_cut() -> None:
    split = split_pages([P, S, P, B, P], ["blank"])
    assert split.parts == ((1, 2, 3), (5,))
    assert split.fields() == {
        "parts": [[1, 2, 3], [5]],
        "separators": [{"page": 4, "kind": "blank"}],
    }


def test_a_separator_sheets_blank_back_is_dropped_with_it_in_duplex() -> None:
    # fronts and backs: sheet 1 (P, P), sheet 2 (S, blank back), sheet 3 (P, E)
    split = split_pages([P, P, S, E, P, E], ["patch_t"], duplex=True)
    assert split.parts == ((1, 2), (5, 6))  # the blank back of a content sheet stays
    assert split.dropped == [3, 4] and split.backs == (4,)
    assert split.fields()["separator_backs"] == [4]
    # A separator printed on the back of a sheet takes its blank front with it.
    assert split_pages([P, P, E, S, P, P], ["patch_t"], duplex=True).parts == ((1, 2), (5, 6))
    # Without duplex a blank page after a separator is the next part's first page.
    assert split_pages([P, P, S, E, P, E], ["patch_t"]).parts == ((1, 2), (4, 5, 6))


# --- whole documents --------------------------------------------------------------------

STACK = [
    Sheet("scan", "phototest.tif"),  # document 1: a scan and a PDF page
    Sheet("pdf", "ocrmypdf__linn.pdf"),
    Sheet("patch_t"),
    Sheet("scan", "eurotext.tif"),  # document 2: a scan and an invoice with its own barcode
    Sheet("invoice", "INV-2024-0815"),
    Sheet("qr", "SPLIT-0007"),
    Sheet("scan", "8087_054.3B.tif"),  # document 3: a scan, a nearly blank page, a PDF page
    Sheet("nearly_blank"),
    Sheet("pdf", "sample-files__multicolumn.pdf"),
    Sheet("code128", "SPLIT-0008"),  # a separator at the end
]
STACK_PARTS = ((1, 2), (4, 5), (7, 8, 9))


def test_a_pdf_with_separator_sheets_splits_into_its_documents(tmp_path: Path) -> None:
    pdf = stack_pdf(STACK, tmp_path / "batch.pdf")
    marks = [looked.mark for looked in looked_at([pdf])]
    split = split_pages(marks, ALL)
    assert split.parts == STACK_PARTS
    assert [len(part) for part in split.parts] == [2, 2, 3]
    assert split.fields()["separators"] == [
        {"page": 3, "kind": "patch_t", "symbology": "PATCH bars"},
        {"page": 6, "kind": "barcode", "text": "SPLIT-0007", "symbology": "QR Code"},
        {"page": 10, "kind": "barcode", "text": "SPLIT-0008", "symbology": "Code 128"},
    ]


def test_a_scan_job_folder_with_separator_sheets_splits_into_its_documents(
    tmp_path: Path, corpus: Path
) -> None:
    job = tmp_path / "scan-0001"
    stack_folder(STACK, job, dpi=300, suffix=".tif")
    # a scanner's mix of formats: some pages as PNG and JPEG
    for number, suffix in ((3, ".png"), (6, ".jpg")):
        old = job / f"p{number}.tif"
        save_scan(Image.open(old), old.with_suffix(suffix), 300)
        old.unlink()
    shutil.copy(corpus / "scans" / "phototest.txt", job / "p1-ground-truth.txt")  # no page
    sources = Sources.of(job)
    files, skipped = page_files(sources)
    assert [name.split(":")[0] for name in skipped] == ["p1-ground-truth.txt"]
    order = page_order([1] * len(files), duplex=False)
    paths = [files[index][0] for index, _ in order]
    marks = [looked.mark for looked in looked_at(paths)]
    split = split_pages(marks, ALL)
    assert split.parts == STACK_PARTS
    assert [paths[number - 1].name for number in split.dropped] == ["p3.png", "p6.jpg", "p10.tif"]


def test_a_stack_split_on_blank_sheets_keeps_nearly_blank_pages(tmp_path: Path) -> None:
    sheets = [
        Sheet("scan", "phototest.tif"),
        Sheet("nearly_blank"),
        Sheet("blank"),
        Sheet("pdf", "ocrmypdf__linn.pdf"),
        Sheet("blank"),
        Sheet("blank"),
        Sheet("scan", "eurotext.tif"),
        Sheet("blank"),
    ]
    rules = SeparatorRules.of(["blank"])
    for paths in (
        [stack_pdf(sheets, tmp_path / "batch.pdf")],
        stack_folder(sheets, tmp_path / "job", dpi=200, suffix=".png"),
    ):
        split = split_pages([looked.mark for looked in looked_at(paths, rules)], ["blank"])
        assert split.parts == ((1, 2), (4,), (7,))
        assert split.dropped == [3, 5, 6, 8]


def test_a_stack_of_only_separator_sheets_has_no_parts(tmp_path: Path) -> None:
    pdf = stack_pdf(
        [Sheet("patch_t"), Sheet("blank"), Sheet("qr", "SPLIT-0001")], tmp_path / "a.pdf"
    )
    split = split_pages([looked.mark for looked in looked_at([pdf])], ALL)
    assert split.parts == () and split.dropped == [1, 2, 3]
