"""One recognised page: the engine's text, its blocks, which of them are figures, its journal.

The same assembly serves the daemon (text from the engine) and `ocrd rerender` (text from a
raw file), so both write the same output for the same text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ocrd.config import PromptMode
from ocrd.domain import (
    Figure,
    PageInfo,
    PageResult,
    PageSource,
    PageText,
    SeparatorMark,
    TextLayer,
)
from ocrd.models import model as recipe_of
from ocrd.text.grounding import Block, Box, parse_page
from ocrd.text.markdown import looks_repetitive, page_markdown

MIN_FIGURE_SIDE_PX = 16  # smaller boxes (on the engine's image) are noise or degenerate

FigureBox = tuple[float, float, float, float]  # fractions (0..1) of the page


def figure_box_px(box: Box, image_size: tuple[int, int]) -> tuple[int, int, int, int]:
    x1, y1, x2, y2 = box.scaled(*image_size)
    return round(x1), round(y1), round(x2), round(y2)


@dataclass(frozen=True)
class FigurePlan:
    """Which of a page's `image` blocks are cut (by block index, as page fractions), which
    share another's cut (the same box again), and how many are left out (over the limit)."""

    regions: dict[int, FigureBox]
    same_as: dict[int, int]
    left_out: int


def figure_plan(page: PageResult, limit: int) -> FigurePlan:
    """Every `image` block's first box worth cutting, at most `limit` of them. A box too
    small to be a figure is no figure; one the page already has (the same pixels) is cut
    once and linked again; neither counts towards the limit."""
    regions: dict[int, FigureBox] = {}
    first_with: dict[tuple[int, int, int, int], int] = {}
    same_as: dict[int, int] = {}
    left_out = 0
    for index, block in enumerate(page.blocks):
        if block.label != "image" or not block.boxes:
            continue
        pixels = figure_box_px(block.boxes[0], page.image_size)
        left, top, right, bottom = pixels
        if right - left < MIN_FIGURE_SIDE_PX or bottom - top < MIN_FIGURE_SIDE_PX:
            continue
        if pixels in first_with:
            if first_with[pixels] in regions:
                same_as[index] = first_with[pixels]
            continue
        first_with[pixels] = index
        if len(regions) >= limit:
            left_out += 1
            continue
        regions[index] = block.boxes[0].scaled(1.0, 1.0)
    return FigurePlan(regions, same_as, left_out)


def figure_name(page: int, number: int) -> str:
    return f"page{page}-figure{number}.png"


def page_blocks(text: PageText, image_size: tuple[int, int]) -> list[Block]:
    """The blocks of an engine's answer, read by the parser of the model that wrote it (on
    the image size its recipe sent the page at); grounded Markdown where no model is
    named, or the one named is not known (a journal of another ocrd)."""
    try:
        recipe = recipe_of(text.model) if text.model is not None else None
    except KeyError:
        recipe = None
    if recipe is None:
        return parse_page(text.text)
    width, height = image_size
    sent = recipe.image.fitted(width, height) if width > 0 and height > 0 else image_size
    return recipe.blocks(text.text, sent)


def assemble_page(
    page: PageInfo,
    text: PageText,
    prompt: PromptMode,
    retried: bool = False,
    source: PageSource = PageSource.engine,
) -> PageResult:
    return PageResult(
        number=page.number,
        text=text,
        prompt=prompt,
        image_size=page.image_size,
        page_size_pt=(page.width_pt, page.height_pt),
        blocks=page_blocks(text, page.image_size),
        retried=retried,
        source=source,
    )


def blank_page(page: PageInfo, prompt: PromptMode) -> PageResult:
    """A page with nothing on it: not sent to the engine, its text empty."""
    return assemble_page(page, PageText("", "stop"), prompt, source=PageSource.blank)


def separator_page(page: PageInfo, prompt: PromptMode, mark: SeparatorMark) -> PageResult:
    """A separator sheet between documents: dropped from the output, not sent to the
    engine."""
    result = assemble_page(page, PageText("", "stop"), prompt, source=PageSource.separator)
    result.separator = mark
    return result


def text_layer_page(number: int, layer: TextLayer, prompt: PromptMode) -> PageResult:
    """A born-digital page, its Markdown taken from its own text layer."""
    text = PageText(layer.markdown, "stop", blocks=layer.blocks)
    return PageResult(
        number=number,
        text=text,
        prompt=prompt,
        image_size=layer.image_size,
        page_size_pt=layer.page_size_pt,
        blocks=parse_page(layer.markdown),  # one text block: Markdown already
        source=PageSource.text_layer,
    )


def yields_nothing(page: PageResult) -> bool:
    """Whether the page gave nothing to write: no text, and no figure."""
    figures = {index: "figure" for index, block in enumerate(page.blocks) if block.label == "image"}
    return not page_markdown(page.blocks, "html", figures)


def without_text(page: PageResult, layer_refused: str | None) -> str:
    """Why a page with content gave no text, for the Markdown and the summary."""
    why = (
        "the engine read no text on it"
        if page.source is PageSource.engine
        else ("it looks blank at the engine's resolution")
    )
    return why + (f", and its text layer was not used ({layer_refused})" if layer_refused else "")


def better(first: PageText, second: PageText) -> PageText:
    """The more useful of two attempts at one page: finished beats unfinished, then the one
    with more distinct words (a loop repeats few)."""

    def score(text: PageText) -> tuple[bool, int]:
        complete = text.finished and not looks_repetitive(text.text)
        return complete, len(set(text.text.split()))

    return second if score(second) > score(first) else first


def page_record(page: PageResult) -> dict[str, Any]:
    """A page as one JSON object: the raw line `ocrd rerender` reads back."""
    record: dict[str, Any] = {
        "page": page.number,
        "text": page.text.text,
        "finish_reason": page.text.finish_reason,
        "prompt": page.prompt.value,
        "retried": page.retried,
        "prompt_tokens": page.text.prompt_tokens,
        "completion_tokens": page.text.completion_tokens,
        "source": page.source.value,
    }
    if page.text.model is not None:
        record["model"] = page.text.model
    if page.separator is not None:
        record["separator"] = page.separator.record()
    if page.no_text is not None:
        record["no_text"] = page.no_text
    if page.text.blocks is not None:
        record["blocks"] = [
            {
                "label": b.label,
                "boxes": [[x.x1, x.y1, x.x2, x.y2] for x in b.boxes],
                "content": b.content,
            }
            for b in page.text.blocks
        ]
    return record


@dataclass(frozen=True)
class RawPage:
    """A page as its raw line records it: what the engine (or the text layer) said."""

    text: PageText
    prompt: PromptMode
    retried: bool
    source: PageSource
    separator: SeparatorMark | None = None
    no_text: str | None = None

    def result(self, page: PageInfo) -> PageResult:
        """The page assembled again from its raw line, on the page as rendered."""
        result = assemble_page(page, self.text, self.prompt, self.retried, self.source)
        result.separator, result.no_text = self.separator, self.no_text
        return result


def text_from_record(record: dict[str, Any]) -> RawPage:
    """The engine's answer, prompt, retry flag and source of a raw line; KeyError,
    TypeError or ValueError if it is not one."""
    blocks = record.get("blocks")
    text = PageText(
        text=str(record["text"]),
        finish_reason=str(record.get("finish_reason", "stop")),
        prompt_tokens=int(record.get("prompt_tokens", 0)),
        completion_tokens=int(record.get("completion_tokens", 0)),
        model=str(record["model"]) if record.get("model") is not None else None,
        blocks=None
        if blocks is None
        else tuple(
            Block(b["label"], tuple(Box.normalised(*box) for box in b["boxes"]), b["content"])
            for b in blocks
        ),
    )
    prompt = PromptMode(record.get("prompt", PromptMode.layout.value))
    source = PageSource(record.get("source", PageSource.engine.value))
    mark = record.get("separator")
    separator = SeparatorMark.of_record(mark) if mark is not None else None
    no_text = record.get("no_text")
    return RawPage(
        text,
        prompt,
        bool(record.get("retried", False)),
        source,
        separator,
        None if no_text is None else str(no_text),
    )


def _figure_record(figure: Figure) -> dict[str, Any]:
    return {
        "name": figure.path.name,
        "width": figure.width,
        "height": figure.height,
        "source_box": list(figure.source_box),
        "source_dpi": figure.source_dpi,
    }


def _figure_from_record(value: dict[str, Any], folder: Path) -> Figure | None:
    path = folder / value["name"]
    if not path.is_file():
        return None
    box = value["source_box"]
    return Figure(path, int(value["width"]), int(value["height"]), tuple(box), value["source_dpi"])


def _pair(value: Any, kind: type[int] | type[float]) -> Any:
    """Two numbers of a JSON record; ValueError if it is not two."""
    first, second = value
    return kind(first), kind(second)


class PageJournal:
    """Pages already recognised, appended as they finish, so that a document interrupted at
    page 200 of 300 continues there after a restart instead of at page 1."""

    def __init__(self, path: Path, check: Callable[[], None] | None = None) -> None:
        self.path = path
        # Asked before each page is added: raises once the journal is no longer this
        # daemon's to write (its claim was taken over by another daemon).
        self.check = check

    def load(self, figures_folder: Path | None) -> dict[int, PageResult]:
        pages: dict[int, PageResult] = {}
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return pages
        for line in lines:
            try:  # the last line may be torn by a kill
                record = json.loads(line)
                if "page" not in record:
                    continue  # a note an older ocrd wrote for crash accounting
                raw = text_from_record(record)
                figures = {}
                for index, value in record.get("figures", {}).items():
                    figure = _figure_from_record(value, figures_folder) if figures_folder else None
                    if figure is not None:
                        figures[int(index)] = figure
                pages[int(record["page"])] = PageResult(
                    number=int(record["page"]),
                    text=raw.text,
                    prompt=raw.prompt,
                    image_size=_pair(record["image_size"], int),
                    page_size_pt=_pair(record["page_size_pt"], float),
                    blocks=page_blocks(raw.text, _pair(record["image_size"], int)),
                    figures=figures,
                    retried=raw.retried,
                    source=raw.source,
                    separator=raw.separator,
                    no_text=raw.no_text,
                    figures_left_out=int(record.get("figures_left_out", 0)),
                )
            except (ValueError, KeyError, TypeError):
                continue
        return pages

    def append(self, page: PageResult) -> None:
        """Blocking: call it off the event loop.

        Written and flushed but not fsynced: what was written survives the daemon's death,
        and a page lost to a power cut is only recognised again (the journal saves work;
        it does not decide what is done)."""
        record = {
            **page_record(page),
            "image_size": list(page.image_size),
            "page_size_pt": list(page.page_size_pt),
            "figures": {str(i): _figure_record(f) for i, f in page.figures.items()},
            "figures_left_out": page.figures_left_out,
        }
        self._write(record)

    def _write(self, record: dict[str, Any]) -> None:
        if self.check is not None:
            self.check()
        # Its folder (the claim's) is not made here: one that was moved away stays away.
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
