"""Where the words of ocrd's searchable PDF lie, measured against OCRmyPDF's.

    python benchmarks/word_boxes.py [--ocrmypdf PATH] [--reference-dir DIR] [FILE ...]

For each scanned page (the first page of each FILE; by default a handful from the corpus's
`scans/` and `real/`, read in place), OCRmyPDF (Tesseract) writes its searchable PDF, and
its words are the page's text. ocrd then writes its own searchable PDF of the same page
from that same text, once per way a model places its text, so that only the placement
differs:

- `deepseek-ocr-2`: one box per block, as DeepSeek-OCR-2's grounding gives (here the box
  around each of Tesseract's blocks, a tight box: the model's own are looser);
- `lightonocr-2`, `olmocr-2`, `glm-ocr`, `paddleocr-vl-1.5`: the page's Markdown and no
  positions at all, each read by its own model's parser (GLM-OCR and PaddleOCR-VL as they
  read a whole page's Markdown today, without the layout stage);
- `rapidocr`: RapidOCR's own lines and text (the real engine on the page; its text is its
  own, so fewer words match);
- `line boxes`: Tesseract's own line boxes, each with its line's text: the best a
  placement that knows lines, not words, can do.

Both PDFs' words (PyMuPDF `page.get_text("words")`) are matched by their text in order;
for the matched words it prints the share of ocrd's word boxes whose centre lies inside
OCRmyPDF's box of the same word, the median IoU of the two boxes and the median distance
between their centres in points, a table per placement, a row per page and one for all.

Needs `ocrmypdf` (on PATH, or `--ocrmypdf`) and Tesseract: a benchmark's tools, not ocrd's
dependencies (`apt-get install tesseract-ocr`, `pip install ocrmypdf` into a venv of its
own). `--reference-dir` keeps OCRmyPDF's outputs there and reuses them on the next run.
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pymupdf
from harness import CORPUS
from PIL import Image

from ocrd.config import PromptMode
from ocrd.domain import InputFormat, PageInfo, PageText
from ocrd.output.linefind import LineFinder
from ocrd.output.page import assemble_page
from ocrd.output.searchable import PdfSettings, image_dpi, write_searchable_pdf
from ocrd.render import detect_format
from ocrd.text.grounding import SCALE, Block, Box
from ocrd.text.lines import TextLine, lines_to_markdown

DEFAULT_PAGES = (
    "scans/phototest.tif",
    "scans/eurotext.tif",
    "scans/8087_054.3B.tif",
    "real/ocrmypdf__c02-22.pdf",
    "real/ocrmypdf__skew.pdf",
    "real/ocrmypdf__typewriter.png",
)
RENDER_DPI, MAX_SIDE = 144, 2048  # as the daemon renders a PDF page for an engine
NO_POSITION_MODELS = ("lightonocr-2", "olmocr-2", "glm-ocr", "paddleocr-vl-1.5")
PUNCTUATION = "\"'.,;:!?()[]{}<>«»„“”‘’*_#|`"


@dataclass(frozen=True)
class Word:
    text: str
    x0: float
    y0: float
    x1: float
    y1: float
    block: int = 0
    line: int = 0

    @property
    def centre(self) -> tuple[float, float]:
        return ((self.x0 + self.x1) / 2, (self.y0 + self.y1) / 2)


@dataclass(frozen=True)
class Page:
    """One scanned page: its file, its image as an engine gets it, and its size."""

    path: Path
    fmt: InputFormat
    image: Image.Image
    size_pt: tuple[float, float]


def load_page(path: Path) -> Page:
    if path.suffix.lower() == ".pdf":
        with pymupdf.open(path) as doc:
            page = doc[0]
            zoom = min(RENDER_DPI / 72, MAX_SIDE / max(page.rect.width, page.rect.height))
            pixmap = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom))
            image = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples)
            return Page(path, InputFormat.pdf, image, (page.rect.width, page.rect.height))
    with Image.open(path) as opened:
        dpi_x, dpi_y = image_dpi(opened.info, opened.size)
        image = opened.convert("RGB")
    size = (image.width * 72 / dpi_x, image.height * 72 / dpi_y)
    return Page(path, detect_format(path), image, size)


def page_words(pdf: Path) -> tuple[list[Word], tuple[float, float]]:
    with pymupdf.open(pdf) as doc:
        page = doc[0]
        found = [Word(w[4], *w[:4], w[5], w[6]) for w in page.get_text("words")]
        return found, (page.rect.width, page.rect.height)


# --- OCRmyPDF's page ------------------------------------------------------------------------


def reference_pdf(page: Page, ocrmypdf: str, folder: Path) -> Path:
    """OCRmyPDF's searchable PDF of the page's file (its first page read), kept in `folder`."""
    target = folder / f"{page.path.stem}.ocrmypdf.pdf"
    if target.exists():
        return target
    command = [ocrmypdf, "--output-type", "pdf", "--optimize", "0", "--jobs", "1", "-q"]
    command += ["--pages", "1"]
    if page.fmt is not InputFormat.pdf:  # the same page size as ocrd gives the image
        command += ["--image-dpi", str(round(page.image.width * 72 / page.size_pt[0]))]
    env = {**os.environ, "OMP_THREAD_LIMIT": "1"}
    done = subprocess.run([*command, str(page.path), str(target)], env=env, capture_output=True)
    if done.returncode != 0:
        raise RuntimeError(f"ocrmypdf failed on {page.path.name}: {done.stderr.decode()[-400:]}")
    return target


def grouped(words: Sequence[Word]) -> list[list[list[Word]]]:
    """Words as blocks of lines, in the order OCRmyPDF wrote them (Tesseract's)."""
    blocks: dict[int, dict[int, list[Word]]] = {}
    for word in words:
        blocks.setdefault(word.block, {}).setdefault(word.line, []).append(word)
    return [list(lines.values()) for lines in blocks.values()]


def line_text(line: Sequence[Word]) -> str:
    return " ".join(word.text for word in line)


# --- ocrd's pages, one per placement ---------------------------------------------------------


def box_of(words: Sequence[Word], size: tuple[float, float]) -> Box:
    x0, y0 = min(w.x0 for w in words), min(w.y0 for w in words)
    x1, y1 = max(w.x1 for w in words), max(w.y1 for w in words)
    return Box.normalised(
        x0 / size[0] * SCALE, y0 / size[1] * SCALE, x1 / size[0] * SCALE, y1 / size[1] * SCALE
    )


def grounded_answer(blocks: list[list[list[Word]]], size: tuple[float, float]) -> str:
    """DeepSeek-OCR-2's grounded Markdown: a box per block, then its lines."""
    parts = []
    for block in blocks:
        box = box_of([w for line in block for w in line], size)
        det = f"[[{box.x1:.0f}, {box.y1:.0f}, {box.x2:.0f}, {box.y2:.0f}]]"
        lines = "\n".join(line_text(line) for line in block)
        parts.append(f"<|ref|>text<|/ref|><|det|>{det}<|/det|>\n{lines}")
    return "\n\n".join(parts)


def markdown_answer(blocks: list[list[list[Word]]]) -> str:
    """A page's Markdown without positions: a paragraph a block, its lines as read."""
    return "\n\n".join("\n".join(line_text(line) for line in block) for block in blocks)


def line_blocks(lines: Sequence[TextLine], image_size: tuple[int, int]) -> tuple[Block, ...]:
    width, height = image_size
    return tuple(
        Block("text", (Box.from_pixels(ln.x0, ln.y0, ln.x1, ln.y1, width, height),), ln.text)
        for ln in lines
    )


def tesseract_lines(
    page: Page, blocks: list[list[list[Word]]], size: tuple[float, float]
) -> PageText:
    sx, sy = page.image.width / size[0], page.image.height / size[1]
    lines = [
        TextLine(
            min(w.x0 for w in line) * sx,
            min(w.y0 for w in line) * sy,
            max(w.x1 for w in line) * sx,
            max(w.y1 for w in line) * sy,
            line_text(line),
        )
        for block in blocks
        for line in block
    ]
    return PageText(lines_to_markdown(lines), "stop", blocks=line_blocks(lines, page.image.size))


def rapidocr_text(page: Page) -> PageText:
    """The real RapidOCR engine's lines on the page, as ocrd's engine passes them on."""
    from rapidocr import RapidOCR

    ocr = RapidOCR(params={"Global.log_level": "warning"})
    output = ocr(np.asarray(page.image)[:, :, ::-1])
    lines = []
    for box, text in zip(
        output.boxes if output.boxes is not None else [], output.txts or (), strict=False
    ):
        xs, ys = [float(p[0]) for p in box], [float(p[1]) for p in box]
        lines.append(TextLine(min(xs), min(ys), max(xs), max(ys), str(text)))
    return PageText(lines_to_markdown(lines), "stop", blocks=line_blocks(lines, page.image.size))


def ocrd_pdf(page: Page, text: PageText, target: Path, finder: LineFinder | None) -> Path:
    info = PageInfo(1, page.image.size, *page.size_pt)
    result = assemble_page(info, text, PromptMode.layout)
    settings = PdfSettings(line_finder=finder)
    write_searchable_pdf([(page.path, page.fmt)], [(0, 1)], [result], target, settings)
    return target


Answer = Callable[[Page, list[list[list[Word]]], tuple[float, float]], PageText]


@dataclass(frozen=True)
class Placement:
    answer: Answer
    finder: str = ""  # the writer finds the lines: "" not, "detected", "read" (and read)


def unwrapped_answer(blocks: list[list[list[Word]]]) -> str:
    """A page's Markdown without positions, a paragraph on one line (as LightOnOCR writes)."""
    return "\n\n".join(" ".join(line_text(line) for line in block) for block in blocks)


def placements() -> dict[str, Placement]:
    kinds = {
        "deepseek-ocr-2 (block boxes)": Placement(
            lambda page, blocks, size: PageText(
                grounded_answer(blocks, size), "stop", model="deepseek-ocr-2"
            )
        )
    }
    ways = (
        ("", "no lines found"),
        ("detected", "over detected lines"),
        ("read", "over read lines"),
    )
    for finds, how in ways:
        # The four parse a page without positions alike; the middle way is shown for one.
        for model in NO_POSITION_MODELS if finds != "detected" else NO_POSITION_MODELS[:1]:
            kinds[f"{model} (no positions, {how})"] = Placement(
                lambda page, blocks, size, m=model: PageText(
                    markdown_answer(blocks), "stop", model=m
                ),
                finds,
            )
    for finds, how in ways:
        kinds[f"lightonocr-2 (no positions, a paragraph a line, {how})"] = Placement(
            lambda page, blocks, size: PageText(
                unwrapped_answer(blocks), "stop", model="lightonocr-2"
            ),
            finds,
        )
    kinds["rapidocr (its own lines and text)"] = Placement(
        lambda page, blocks, size: rapidocr_text(page)
    )
    kinds["line boxes (Tesseract's lines)"] = Placement(tesseract_lines)
    return kinds


# --- comparing ------------------------------------------------------------------------------


def key(text: str) -> str:
    return text.strip(PUNCTUATION).casefold()


def matched(ours: Sequence[Word], theirs: Sequence[Word]) -> list[tuple[Word, Word]]:
    """Pairs of the same word, matched by text in order (punctuation and case aside)."""
    a = [w for w in ours if key(w.text)]
    b = [w for w in theirs if key(w.text)]
    matcher = difflib.SequenceMatcher(
        None, [key(w.text) for w in a], [key(w.text) for w in b], autojunk=False
    )
    return [(a[m.a + i], b[m.b + i]) for m in matcher.get_matching_blocks() for i in range(m.size)]


def iou(a: Word, b: Word) -> float:
    w = max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0))
    h = max(0.0, min(a.y1, b.y1) - max(a.y0, b.y0))
    union = (a.x1 - a.x0) * (a.y1 - a.y0) + (b.x1 - b.x0) * (b.y1 - b.y0) - w * h
    return w * h / union if union > 0 else 0.0


def inside(point: tuple[float, float], box: Word) -> bool:
    return box.x0 <= point[0] <= box.x1 and box.y0 <= point[1] <= box.y1


def distance(a: Word, b: Word) -> float:
    (ax, ay), (bx, by) = a.centre, b.centre
    return float(((ax - bx) ** 2 + (ay - by) ** 2) ** 0.5)


@dataclass(frozen=True)
class Score:
    pairs: list[tuple[Word, Word]]
    reference_words: int
    seconds: list[float]  # CPU time writing ocrd's PDF, a page

    def row(self, name: str) -> str:
        if not self.pairs:
            return f"| {name} | 0 / {self.reference_words} | - | - | - | - |"
        share = sum(inside(o.centre, t) for o, t in self.pairs) / len(self.pairs)
        median_iou = statistics.median(iou(o, t) for o, t in self.pairs)
        median_distance = statistics.median(distance(o, t) for o, t in self.pairs)
        return (
            f"| {name} | {len(self.pairs)} / {self.reference_words} | {share:.0%} "
            f"| {median_iou:.2f} | {median_distance:.1f} "
            f"| {1000 * statistics.mean(self.seconds):.0f} |"
        )


def scaled(words: Sequence[Word], by: tuple[float, float]) -> list[Word]:
    return [Word(w.text, w.x0 * by[0], w.y0 * by[1], w.x1 * by[0], w.y1 * by[1]) for w in words]


def measure(
    paths: Sequence[Path], ocrmypdf: str, references: Path, work: Path, only: str = ""
) -> dict[str, dict[str, Score]]:
    kinds = {name: kind for name, kind in placements().items() if only in name}
    scores: dict[str, dict[str, Score]] = {name: {} for name in kinds}
    finders = {"detected": LineFinder(read=False), "read": LineFinder(read=True)}
    for path in paths:
        page = load_page(path)
        theirs, their_size = page_words(reference_pdf(page, ocrmypdf, references))
        blocks = grouped(theirs)
        for index, (name, placement) in enumerate(kinds.items()):
            text = placement.answer(page, blocks, their_size)
            finds = finders.get(placement.finder)
            started = time.process_time()
            target = ocrd_pdf(page, text, work / f"{index}.pdf", finds)
            seconds = time.process_time() - started
            ours, our_size = page_words(target)
            # OCRmyPDF's page was made the same size; scaled all the same, to be sure.
            reference = scaled(theirs, (our_size[0] / their_size[0], our_size[1] / their_size[1]))
            scores[name][path.name] = Score(matched(ours, reference), len(theirs), [seconds])
    return scores


def all_pages(pages: dict[str, Score]) -> Score:
    return Score(
        [pair for score in pages.values() for pair in score.pairs],
        sum(score.reference_words for score in pages.values()),
        [second for score in pages.values() for second in score.seconds],
    )


def report(scores: dict[str, dict[str, Score]]) -> None:
    header = (
        "| page | words matched | centre in OCRmyPDF's box | median IoU "
        "| median centre distance (pt) | CPU ms a page, writing |"
    )
    print(f"### All pages\n\n{header.replace('page', 'placement', 1)}\n|---|---|---|---|---|---|")
    for name, pages in scores.items():
        print(all_pages(pages).row(name))
    for name, pages in scores.items():
        print(f"\n### {name}\n\n{header}\n|---|---|---|---|---|---|")
        for page, score in pages.items():
            print(score.row(page))
        print(all_pages(pages).row("**all**"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="scanned pages (default: a handful)")
    parser.add_argument("--ocrmypdf", default=shutil.which("ocrmypdf"), help="its executable")
    parser.add_argument("--reference-dir", type=Path, help="keep and reuse OCRmyPDF's PDFs here")
    parser.add_argument("--only", default="", help="only the placements whose name has this")
    args = parser.parse_args()
    if not args.ocrmypdf:
        sys.exit("ocrmypdf not found: put it on PATH or name it with --ocrmypdf")
    paths = args.files or [CORPUS / name for name in DEFAULT_PAGES]
    with tempfile.TemporaryDirectory() as scratch:
        references = args.reference_dir or Path(scratch) / "references"
        references.mkdir(parents=True, exist_ok=True)
        work = Path(scratch) / "ocrd"
        work.mkdir()
        report(measure(paths, args.ocrmypdf, references, work, args.only))


if __name__ == "__main__":
    main()
