"""CPU OCR with RapidOCR (PP-OCR models in ONNX, shipped inside the wheel; no GPU, no network).

RapidOCR finds text lines; `ocrd/text/lines.py` puts them back into rows, paragraphs and headings
in reading order as Markdown, so both engines give the outbox the same kind of file.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ocrd.config import PromptMode, RapidOcrConfig
from ocrd.domain import PageImage, PageText
from ocrd.engines.base import EngineError, EngineHealth, EngineState, InProcess
from ocrd.engines.slots import PrioritySlots
from ocrd.text.grounding import Block, Box
from ocrd.text.lines import TextLine, lines_to_markdown


def _to_lines(boxes: Any, texts: Sequence[str]) -> list[TextLine]:
    result = []
    for box, text in zip(boxes, texts, strict=False):
        xs = [float(point[0]) for point in box]
        ys = [float(point[1]) for point in box]
        result.append(TextLine(min(xs), min(ys), max(xs), max(ys), str(text)))
    return result


class RapidOcrEngine(InProcess):
    name = "rapidocr"

    self_checks = False  # it has none: no test page is read before work

    def __init__(self, config: RapidOcrConfig) -> None:
        self.config = config
        self.health = EngineHealth()
        self.slots = PrioritySlots(config.concurrency)
        self._ocr: Any = None
        self._executor = ThreadPoolExecutor(
            max_workers=config.concurrency, thread_name_prefix="rapidocr"
        )

    @property
    def max_concurrency(self) -> int:
        return self.config.concurrency

    async def start(self) -> None:
        from rapidocr import RapidOCR

        params = {
            "Global.log_level": "warning",
            "EngineConfig.onnxruntime.intra_op_num_threads": self.config.threads,
        }
        loop = asyncio.get_running_loop()
        self._ocr = await loop.run_in_executor(self._executor, lambda: RapidOCR(params=params))
        self.health.set(EngineState.ready)

    def _recognise_sync(self, page: PageImage) -> PageText:
        started = time.monotonic()
        try:
            output = self._ocr(np.asarray(page.image)[:, :, ::-1])  # RapidOCR wants BGR
        except Exception as error:
            raise EngineError(f"RapidOCR failed on page {page.number}: {error}") from error
        lines = [] if output.boxes is None else _to_lines(output.boxes, output.txts or ())
        width, height = page.image.size
        blocks = tuple(
            Block("text", (Box.from_pixels(ln.x0, ln.y0, ln.x1, ln.y1, width, height),), ln.text)
            for ln in lines
        )
        return PageText(
            text=lines_to_markdown(lines),
            finish_reason="stop",
            seconds=time.monotonic() - started,
            blocks=blocks,
        )

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        loop = asyncio.get_running_loop()
        async with self.slots.slot(priority):
            self._in_flight += 1
            try:
                text = await loop.run_in_executor(self._executor, self._recognise_sync, page)
            except EngineError:
                self._failed += 1
                raise
            finally:
                self._in_flight -= 1
        self._done += 1
        return text

    async def check_health(self) -> None:
        return None

    async def stop(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
