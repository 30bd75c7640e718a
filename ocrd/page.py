"""One recognised page: the engine's text, its blocks, its figures and whether it finished.

The same assembly serves the daemon (text from the engine) and `ocrd rerender` (text from a
raw file), so both write the same output for the same text.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ocrd.config import PromptMode
from ocrd.engines.base import PageText
from ocrd.grounding import Block, Box, parse_page
from ocrd.markdown import looks_repetitive
from ocrd.render import PageImage

MIN_FIGURE_SIDE_PX = 16  # smaller crops are noise or degenerate boxes


@dataclass
class PageResult:
    number: int
    text: PageText
    prompt: PromptMode
    image_size: tuple[int, int]
    page_size_pt: tuple[float, float]
    blocks: list[Block]  # parsed from the text: what the Markdown and the figures come from
    figures: dict[int, Path] = field(default_factory=dict)  # image block index: its crop
    retried: bool = False

    @property
    def layout_blocks(self) -> list[Block]:
        """Blocks for the layout file: the engine's own where it has them (RapidOCR's lines)."""
        return list(self.text.blocks) if self.text.blocks is not None else self.blocks

    @cached_property
    def _loops(self) -> bool:
        # Tens of milliseconds on a long page: computed once, asked for by several writers.
        return looks_repetitive(self.text.text)

    @property
    def unfinished(self) -> bool:
        """Stopped before its end (token limit, repetition stop) or ending in a loop."""
        return not self.text.finished or self._loops

    @property
    def finish_reason(self) -> str:
        if self.text.finished and self._loops:
            return "repetition"
        return self.text.finish_reason


def figure_box_px(box: Box, image_size: tuple[int, int]) -> tuple[int, int, int, int]:
    x1, y1, x2, y2 = box.scaled(*image_size)
    return round(x1), round(y1), round(x2), round(y2)


def save_figures(page: PageImage, blocks: list[Block], folder: Path) -> dict[int, Path]:
    """Crop every `image` block's first box out of the rendered page, as PNG files."""
    figures: dict[int, Path] = {}
    number = 0
    for index, block in enumerate(blocks):
        if block.label != "image" or not block.boxes:
            continue
        left, top, right, bottom = figure_box_px(block.boxes[0], page.image.size)
        if right - left < MIN_FIGURE_SIDE_PX or bottom - top < MIN_FIGURE_SIDE_PX:
            continue
        number += 1
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"page{page.number}-figure{number}.png"
        page.image.crop((left, top, right, bottom)).save(path, format="PNG")
        figures[index] = path
    return figures


def assemble_page(
    page: PageImage,
    text: PageText,
    prompt: PromptMode,
    figures_folder: Path | None,
    retried: bool = False,
) -> PageResult:
    blocks = parse_page(text.text)
    figures = save_figures(page, blocks, figures_folder) if figures_folder else {}
    return PageResult(
        number=page.number,
        text=text,
        prompt=prompt,
        image_size=page.image.size,
        page_size_pt=(page.width_pt, page.height_pt),
        blocks=blocks,
        figures=figures,
        retried=retried,
    )


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
    }
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


def text_from_record(record: dict[str, Any]) -> tuple[PageText, PromptMode, bool]:
    """The engine's answer, prompt and retry flag of a raw line; KeyError, TypeError or
    ValueError if it is not one."""
    blocks = record.get("blocks")
    text = PageText(
        text=str(record["text"]),
        finish_reason=str(record.get("finish_reason", "stop")),
        prompt_tokens=int(record.get("prompt_tokens", 0)),
        completion_tokens=int(record.get("completion_tokens", 0)),
        blocks=None
        if blocks is None
        else tuple(
            Block(b["label"], tuple(Box.normalised(*box) for box in b["boxes"]), b["content"])
            for b in blocks
        ),
    )
    prompt = PromptMode(record.get("prompt", PromptMode.layout.value))
    return text, prompt, bool(record.get("retried", False))


class PageJournal:
    """Pages already recognised, appended as they finish, so that a document interrupted at
    page 200 of 300 continues there after a restart instead of at page 1."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self, figures_folder: Path | None) -> dict[int, PageResult]:
        pages: dict[int, PageResult] = {}
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return pages
        for line in lines:
            try:  # the last line may be torn by a kill
                record = json.loads(line)
                text, prompt, retried = text_from_record(record)
                figures = {
                    int(index): figures_folder / name
                    for index, name in record.get("figures", {}).items()
                    if figures_folder is not None and (figures_folder / name).is_file()
                }
                pages[int(record["page"])] = PageResult(
                    number=int(record["page"]),
                    text=text,
                    prompt=prompt,
                    image_size=tuple(record["image_size"]),  # type: ignore[arg-type]
                    page_size_pt=tuple(record["page_size_pt"]),  # type: ignore[arg-type]
                    blocks=parse_page(text.text),
                    figures=figures,
                    retried=retried,
                )
            except (ValueError, KeyError, TypeError):
                continue
        return pages

    def append(self, page: PageResult) -> None:
        record = {
            **page_record(page),
            "image_size": list(page.image_size),
            "page_size_pt": list(page.page_size_pt),
            "figures": {str(index): path.name for index, path in page.figures.items()},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
