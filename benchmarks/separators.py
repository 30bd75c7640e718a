"""Separator detection's CPU time per page, beside the time to render the page for the engine.

    python benchmarks/separators.py [--repeat 5]

Pages: real corpus pages (born-digital and scanned PDFs, TIFF scans at 200 and 300 DPI) and
separator sheets as people print them (tests/separator_sheets.py), as PDF pages and as
300 DPI scans. For each page, in this process, on one core (time.process_time, the best of
`--repeat` runs):

- render: what a render worker does for the engine (ocrd.render's own source classes):
  the page at 144 DPI, longest side at most 2048, RGB, judged blank or not;
- detection for each `split_on`: what a render worker will do on top, in its own request:
  render the PDF page again in grey at 200 DPI (or decode the scan's own pixels again, at
  most 300 DPI) and look at it (`detect_on_pdf_page`, `detect_on_scan`), given the
  blankness from the render; `blank` alone costs nothing more;
- "144 only": `detect_separator` on the engine's image itself (no second render), which
  misses barcodes with modules under about 0.33 mm (see the tests).

A page rendering judged blank is never looked at again (`needs_looking`): its cost is 0.
"""

from __future__ import annotations

import argparse
import mmap
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from separator_sheets import CORPUS, Sheet, save_scan, scan_sheet, stack_pdf  # noqa: E402

from ocrd.config import RenderSettings  # noqa: E402
from ocrd.render import RenderLimits  # noqa: E402
from ocrd.render.image import RasterSource  # noqa: E402
from ocrd.render.pdf import PdfSource  # noqa: E402
from ocrd.render.protocol import RenderedPage  # noqa: E402
from ocrd.render.separators import (  # noqa: E402
    SeparatorRules,
    detect_on_pdf_page,
    detect_on_scan,
    detect_separator,
    judged_by_blankness,
    needs_looking,
)

RULES = {
    "patch_t": SeparatorRules.of(["patch_t"]),
    "barcode": SeparatorRules.of(["barcode"], r"SPLIT-\d{4}"),
    "all": SeparatorRules.of(["patch_t", "barcode", "blank"], r"SPLIT-\d{4}"),
}
REAL_PDFS = (
    ("ocrmypdf__linn.pdf", 1),  # a scanned page
    ("ocrmypdf__cardinal.pdf", 1),
    ("ocrmypdf__jbig2.pdf", 1),
    ("sample-files__multicolumn.pdf", 1),  # born-digital
    ("sample-files__pdflatex-4-pages.pdf", 2),
)
SCANS = ("phototest.tif", "eurotext.tif", "8087_054.3B.tif")
SHEETS = (
    ("PATCH-T sheet", Sheet("patch_t")),
    ("QR SPLIT-0001", Sheet("qr", "SPLIT-0001")),
    ("Code 128 SPLIT-0002", Sheet("code128", "SPLIT-0002")),
    ("invoice, other barcode", Sheet("invoice", "INV-2024-0815")),
    ("blank sheet", Sheet("blank")),
    ("a few words", Sheet("nearly_blank")),
)


def best_ms(work: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The least CPU time of `repeat` runs, in ms, and the last run's result."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.process_time()
        result = work()
        best = min(best, time.process_time() - start)
    return best * 1000, result


def engine_pixels(rendered: RenderedPage, buffer: mmap.mmap) -> Image.Image:
    """The page as the engine gets it, from the shared buffer or the reply."""
    pixels = rendered.payload if rendered.payload is not None else bytes(buffer[: rendered.size])
    return Image.frombytes("RGB", (rendered.width, rendered.height), pixels)


def measure_pdf(path: Path, number: int, repeat: int, buffer: mmap.mmap) -> dict[str, Any]:
    source = PdfSource(path, RenderSettings(), RenderLimits())
    render_ms, rendered = best_ms(lambda: source.render(number, buffer), repeat)
    width, height, blank = rendered.width, rendered.height, rendered.blank
    engine_image = engine_pixels(rendered, buffer)
    page = source.doc.load_page(number - 1)
    row: dict[str, Any] = {"render": render_ms, "size": f"{width}x{height}", "blank": blank}
    for name, rules in RULES.items():
        row[name], mark = best_ms(lambda r=rules: detect_on_pdf_page(page, r, blank), repeat)
        row[f"{name}_mark"] = mark
    row["144 only"], _ = best_ms(
        lambda: detect_separator(engine_image, RULES["all"], blank), repeat
    )
    return row


def measure_scan(path: Path, number: int, repeat: int, buffer: mmap.mmap) -> dict[str, Any]:
    source = RasterSource(path, RenderSettings(), RenderLimits())
    render_ms, rendered = best_ms(lambda: source.render(number, buffer), repeat)
    width, height, blank = rendered.width, rendered.height, rendered.blank
    engine_image = engine_pixels(rendered, buffer)
    dpi = source._dpi()
    row: dict[str, Any] = {"render": render_ms, "size": f"{width}x{height}", "blank": blank}
    for name, rules in RULES.items():
        row[name], mark = best_ms(  # the frame is decoded again, as a separate request would
            lambda r=rules: (
                detect_on_scan(source._frame(number), dpi, r, blank)
                if needs_looking(r, blank)
                else judged_by_blankness(r, blank)
            ),
            repeat,
        )
        row[f"{name}_mark"] = mark
    row["144 only"], _ = best_ms(
        lambda: detect_separator(engine_image, RULES["all"], blank), repeat
    )
    return row


def pages(folder: Path) -> list[tuple[str, str, Path, int]]:
    """(what, how, file, page number) of every page measured."""
    found = [(name, "PDF", CORPUS / "real" / name, number) for name, number in REAL_PDFS]
    found += [(name, "scan", CORPUS / "scans" / name, 1) for name in SCANS]
    for index, (name, sheet) in enumerate(SHEETS):
        pdf = stack_pdf([sheet], folder / f"sheet{index}.pdf")
        found.append((name, "PDF", pdf, 1))
        scan = save_scan(scan_sheet(sheet, 300, seed=index), folder / f"{index}.tif", 300)
        found.append((name, "scan 300 DPI", scan, 1))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    buffer = mmap.mmap(-1, 2048 * 2048 * 4)  # a page as the workers hand it over (RGBX)
    columns = ("render", "patch_t", "barcode", "all", "144 only")
    print(f"CPU ms per page, best of {args.repeat} (one core)")
    header = f"{'page':38} {'as':13} {'engine px':>10} " + " ".join(f"{c:>9}" for c in columns)
    print(header + "  found (all)")
    totals: dict[str, list[float]] = {column: [] for column in columns}
    with tempfile.TemporaryDirectory() as folder:
        for what, how, path, number in pages(Path(folder)):
            measure = measure_pdf if how == "PDF" else measure_scan
            row = measure(path, number, args.repeat, buffer)
            for column in columns:
                totals[column].append(row[column])
            figures = " ".join(f"{row[column]:9.1f}" for column in columns)
            found = row["all_mark"].describe()
            print(f"{what[:38]:38} {how:13} {row['size']:>10} {figures}  {found}")
    means = " ".join(f"{sum(v) / len(v):9.1f}" for v in totals.values())
    print(f"{'mean':38} {'':13} {'':>10} {means}")


if __name__ == "__main__":
    main()
