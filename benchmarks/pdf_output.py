"""What the searchable PDF costs: CPU time a page, beside rendering the page, and its size.

    python benchmarks/pdf_output.py [--repeat 3] [--archive]

For every PDF and image of the corpus (`real/`, `scans/`) that opens without a password,
each page gets a dense text layer: DeepSeek-style blocks of about 3,000 characters (six
paragraphs over the page; a page with text of its own keeps its own instead). Printed per
file: pages, CPU ms a page for writing the searchable PDF (`write_searchable_pdf`, this
process and its children, best of `--repeat`), CPU ms a page for rendering the page as the
daemon does for the engine (PyMuPDF at 144 DPI with the longest side at most 2048 px, or
Pillow for an image), and the output's size over the input's. With `--archive` the same for
PDF/A-2b output (the validation, and Ghostscript where pikepdf alone is refused, included).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pymupdf
from harness import CORPUS
from PIL import Image

from ocrd.config import PromptMode
from ocrd.domain import InputFormat, PageInfo, PageResult, PageText
from ocrd.output.page import assemble_page
from ocrd.output.searchable import (
    PdfSettings,
    SearchablePdfError,
    SearchablePdfResult,
    write_searchable_pdf,
)
from ocrd.render import RenderError, detect_format

DPI = 144
MAX_SIDE = 2048
TEXT = (
    "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing "
    "matches near the old harbour and every clerk files a yearly report"
)


def paragraph(seed: int, characters: int) -> str:
    words: list[str] = []
    vocabulary = TEXT.split()
    while sum(len(w) + 1 for w in words) < characters:
        words.append(vocabulary[(seed * 7 + len(words) * 13) % len(vocabulary)])
    return " ".join(words)


def dense_answer(number: int) -> str:
    """Six paragraphs of 500 characters in a column over the page, in 0..999 boxes."""
    blocks = []
    for index in range(6):
        top = 60 + index * 150
        text = paragraph(number * 6 + index, 500)
        blocks.append(f"<|ref|>text<|/ref|><|det|>[[80, {top}, 920, {top + 130}]]<|/det|>\n{text}")
    return "\n\n".join(blocks)


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def best_cpu(action: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = cpu_seconds()
        action()
        best = min(best, cpu_seconds() - started)
    return best


def page_sizes(path: Path, fmt: InputFormat) -> list[tuple[float, float]]:
    if fmt is InputFormat.pdf:
        return [(page.rect.width, page.rect.height) for page in pymupdf.open(path)]
    with Image.open(path) as image:
        sizes = []
        for index in range(getattr(image, "n_frames", 1)):
            image.seek(index)
            dpi = float(image.info.get("dpi", (72, 72))[0] or 72)
            sizes.append((image.width * 72 / dpi, image.height * 72 / dpi))
        return sizes


def render_all(path: Path, fmt: InputFormat) -> None:
    """Every page as the daemon renders it for the engine."""
    if fmt is InputFormat.pdf:
        for page in pymupdf.open(path):
            zoom = min(DPI / 72, MAX_SIDE / max(page.rect.width, page.rect.height))
            page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), alpha=False, colorspace="rgb")
        return
    with Image.open(path) as image:
        for index in range(getattr(image, "n_frames", 1)):
            image.seek(index)
            frame = image.convert("RGB")
            scale = min(1.0, MAX_SIDE / max(frame.size))
            if scale < 1.0:
                frame.resize((round(frame.width * scale), round(frame.height * scale)))


def pages_for(sizes: list[tuple[float, float]]) -> list[PageResult]:
    return [
        assemble_page(
            PageInfo(n, (round(w * 2), round(h * 2)), w, h),
            PageText(dense_answer(n), "stop"),
            PromptMode.layout,
        )
        for n, (w, h) in enumerate(sizes, start=1)
    ]


@dataclass
class Writer:
    """One file's searchable PDF, written again on each call; `result` None if refused."""

    path: Path
    fmt: InputFormat
    pages: list[PageResult]
    target: Path
    archive: bool
    result: SearchablePdfResult | None = None

    def write(self) -> None:
        self.target.unlink(missing_ok=True)
        order = [(0, n) for n in range(1, len(self.pages) + 1)]
        try:
            self.result = write_searchable_pdf(
                [(self.path, self.fmt)], order, self.pages, self.target, PdfSettings(self.archive)
            )
        except SearchablePdfError:
            self.result = None


def inputs() -> list[tuple[Path, InputFormat]]:
    found = []
    for path in sorted([*(CORPUS / "real").iterdir(), *(CORPUS / "scans").iterdir()]):
        try:
            fmt = detect_format(path)
        except RenderError:
            continue  # ground-truth text, JSON
        if fmt is InputFormat.pdf and pymupdf.open(path).needs_pass:
            continue
        found.append((path, fmt))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--archive", action="store_true", help="also measure PDF/A-2b output")
    args = parser.parse_args()
    modes = [False, True] if args.archive else [False]
    header = f"{'file':48} {'pages':>5} {'render ms/p':>11}"
    for archive in modes:
        label = "PDF/A" if archive else "PDF"
        header += f" {label + ' ms/p':>11} {label + ' size':>10} {'layered':>7}"
    print(header, flush=True)
    per_page: dict[bool, list[float]] = {mode: [] for mode in modes}
    render_per_page: list[float] = []
    ratios: dict[bool, list[float]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory() as scratch:
        for path, fmt in inputs():
            sizes = page_sizes(path, fmt)
            pages = pages_for(sizes)
            render_cpu = best_cpu(lambda p=path, f=fmt: render_all(p, f), args.repeat)
            line = f"{path.name[:48]:48} {len(pages):5d} {1000 * render_cpu / len(pages):11.1f}"
            render_per_page.append(1000 * render_cpu / len(pages))
            for archive in modes:
                target = Path(scratch) / f"out-{archive}.pdf"
                writer = Writer(path, fmt, pages, target, archive)
                cpu = best_cpu(writer.write, args.repeat)
                if writer.result is None:
                    line += f" {'refused':>11} {'':>10} {'':>7}"
                    continue
                ratio = target.stat().st_size / path.stat().st_size
                per_page[archive].append(1000 * cpu / len(pages))
                ratios[archive].append(ratio)
                layered = f"{len(writer.result.layered_pages)}/{len(pages)}"
                line += f" {1000 * cpu / len(pages):11.1f} {ratio:10.3f} {layered:>7}"
            print(line, flush=True)
    print()
    print(f"median render ms/page: {statistics.median(render_per_page):.1f}")
    for archive in modes:
        label = "PDF/A-2b" if archive else "searchable PDF"
        print(
            f"median {label} ms/page: {statistics.median(per_page[archive]):.1f}; "
            f"size over input: median {statistics.median(ratios[archive]):.3f}, "
            f"max {max(ratios[archive]):.3f}"
        )


if __name__ == "__main__":
    started = time.monotonic()
    main()
    print(f"({time.monotonic() - started:.0f} s)")
