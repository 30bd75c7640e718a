"""Reading a page as the pipelines of PaddleOCR-VL-1.5 and GLM-OCR do: a layout stage, then
one request per region with its element's prompt, the answers assembled in reading order.

`LayoutEngine` stands in front of a model's engine where `engine.layout.detector` is set
(ocrd/engines/models.py): the detector (ocrd/layout/, in processes of its own) finds the
page's regions; what each label becomes (a block label and a prompt task, or kept unread,
or dropped) is the model's `Layout` (ocrd/models/); each region to be read is cut from the
rendered page and sent to the engine as a request of its own with its task's prompt. All
of a page's regions are sent at once, and so are the regions of every page in flight, so
that the engine's batches stay full. The answers become the model's blocks, each with its
region's box, written as the model's published pipeline writes a page (the model's
`write`), so that its parser, the Markdown, the searchable PDF's text layer, the figures
cut from the source, DoclingDocument provenance and chunks all get the regions' places.

A page on which the detector finds no region to keep is sent whole, as without a
detector: whole-page reading is the fallback. A region whose request fails fails the
page (the other regions' requests are cancelled), as a page's own failure would; the
daemon's retries send the page again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

from PIL import Image

from ocrd.config import LayoutConfig, PromptMode
from ocrd.config.engine import PUBLISHED_DETECTOR
from ocrd.domain import PageImage, PageText
from ocrd.engines.base import Engine, EngineError, EngineHealth, EngineStartError, ReplicaFacts
from ocrd.layout import DetectorError, Detectors, DetectorSettings, Region, cleaned, reading_order
from ocrd.models import Layout, Model, RegionKind
from ocrd.text.grounding import Block, Box

HEADINGS = {"title": "# ", "sub_title": "## "}


def detector_settings(recipe: Model, settings: LayoutConfig) -> DetectorSettings:
    """The detector for `recipe` as configured; ValueError for a model without a layout
    stage, or without a detector set."""
    layout = recipe.layout
    if layout is None:
        raise ValueError(
            f"engine.layout.detector: {recipe.name} reads whole pages; its pipeline has no "
            "layout stage (only paddleocr-vl-1.5 and glm-ocr have one): remove the setting"
        )
    if settings.detector is None:
        raise ValueError("engine.layout.detector is not set")
    source = layout.detector if settings.detector == PUBLISHED_DETECTOR else settings.detector
    threshold = layout.threshold if settings.threshold is None else settings.threshold
    return DetectorSettings(source, threshold, settings.device, settings.max_regions)


class LayoutEngine:
    """A model's engine, sent regions of each page instead of whole pages."""

    page_folder: Path | None = None  # the page is needed as pixels, to be cut

    def __init__(self, engine: Engine, recipe: Model, settings: LayoutConfig) -> None:
        self.engine = engine
        self.recipe = recipe
        self.detector = detector_settings(recipe, settings)
        assert recipe.layout is not None  # detector_settings refuses a model without one
        self.layout: Layout = recipe.layout
        self.detectors = Detectors(self.detector, settings.workers, settings.timeout_seconds)
        self.name = engine.name
        self.health: EngineHealth = engine.health

    @property
    def max_concurrency(self) -> int:
        return self.engine.max_concurrency

    @property
    def replicas(self) -> list[ReplicaFacts]:
        return self.engine.replicas

    @property
    def summary(self) -> str:
        return f"{self.engine.summary}; layout detector {self.detector.source}"

    async def metrics_text(self) -> str:
        return await self.engine.metrics_text()

    def subscribe(self, callback: Callable[[ReplicaFacts], None]) -> None:
        self.engine.subscribe(callback)

    async def start(self) -> None:
        """The detector first (its checkpoint must load), then the engine."""
        try:
            await self.detectors.start()
        except DetectorError as error:
            await self.detectors.stop()
            raise EngineStartError(
                f"{error}; engine.layout.detector must name a transformers object-detection "
                "checkpoint (a folder with config.json, preprocessor_config.json and "
                "model.safetensors, or a hub id) that the installed transformers can load"
            ) from None
        try:
            await self.engine.start()
        except BaseException:
            await self.detectors.stop()
            raise

    async def check_health(self) -> None:
        await self.engine.check_health()

    async def stop(self) -> None:
        try:
            await self.engine.stop()
        finally:
            await self.detectors.stop()

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        started = time.monotonic()
        regions = await self.regions(page)
        if not regions:  # nothing found: the page is read whole
            return await self.engine.recognise(page, mode, priority)
        try:
            async with asyncio.TaskGroup() as group:  # one failure cancels the rest
                tasks = [
                    group.create_task(self._read(page, region, element, mode, priority))
                    for region, element in regions
                ]
        except BaseExceptionGroup as failed:  # the page fails as its first region did
            raise failed.exceptions[0] from None
        size = page.image.size
        answers = [task.result() for task in tasks]
        blocks = [
            _block(r, e, self._content(e, a), size)
            for (r, e), a in zip(regions, answers, strict=True)
        ]
        unfinished = [a.finish_reason for a in answers if a is not None and not a.finished]
        return PageText(
            text=self.recipe.write(blocks, self.recipe.image.fitted(*size)),
            finish_reason=unfinished[0] if unfinished else "stop",
            prompt_tokens=sum(a.prompt_tokens for a in answers if a is not None),
            completion_tokens=sum(a.completion_tokens for a in answers if a is not None),
            seconds=time.monotonic() - started,
            model=self.recipe.name,
        )

    def _content(self, element: RegionKind, answer: PageText | None) -> str:
        """A region's answer as the model's pipeline makes it a block's content."""
        if answer is None or element.task is None:
            return ""
        return self.layout.content(element.task, answer.text.strip())

    async def regions(self, page: PageImage) -> list[tuple[Region, RegionKind]]:
        """The page's regions to keep, in reading order, each with what it becomes."""
        try:
            found = await self.detectors.detect(page.image)
        except DetectorError as error:
            raise EngineError(f"page {page.number}: {error}", page.number) from None
        width, height = page.image.size
        regions = cleaned(found.regions, width, height, self.detector.max_regions)
        if not found.ordered:
            regions = reading_order(regions)
        kept = [(region, self.layout.element(region.label)) for region in regions]
        return [(region, element) for region, element in kept if element is not None]

    async def _read(
        self,
        page: PageImage,
        region: Region,
        element: RegionKind,
        mode: PromptMode,
        priority: int,
    ) -> PageText | None:
        """The model's answer for one region (None for a region kept unread)."""
        if element.task is None:
            return None
        crop = await asyncio.to_thread(_cut, page.image, region)
        part = dataclasses.replace(page, image=crop, task=element.task, blank=False)
        return await self.engine.recognise(part, mode, priority)


def _cut(image: Image.Image, region: Region) -> Image.Image:
    box = (int(region.x1), int(region.y1), round(region.x2), round(region.y2))
    crop = image.crop(box)
    crop.load()
    return crop


def _block(region: Region, element: RegionKind, text: str, size: tuple[int, int]) -> Block:
    """One region's block: its element's label, its box, the model's answer as Markdown."""
    box = Box.from_pixels(region.x1, region.y1, region.x2, region.y2, *size)
    label = element.label
    if label in HEADINGS and text and not text.startswith("#"):
        text = HEADINGS[label] + text
    elif label == "equation" and text and not text.startswith(("$", "\\[")):
        text = f"$$\n{text}\n$$"
    return Block(label, (box,), text)
