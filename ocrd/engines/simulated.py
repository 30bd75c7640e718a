"""A simulated engine, for tests of the daemon's own logic and benchmarks at GPU speed.

It models an engine with continuous batching: up to `capacity` pages are recognised at once,
each taking `seconds_per_page`; more wait their turn. Its text is derived from the page's
pixels, so the same page always gives the same text and different pages different text.
It never reads anything on the page and is never chosen by `auto`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

from ocrd.config import PromptMode, SimulatedConfig
from ocrd.engines.base import PageText
from ocrd.render import PageImage


class SimulatedEngine:
    name = "simulated"

    def __init__(self, config: SimulatedConfig) -> None:
        self.config = config
        self._slots = asyncio.Semaphore(config.capacity)

    @property
    def max_concurrency(self) -> int:
        return self.config.capacity

    async def start(self) -> None:
        return None

    async def recognise(self, page: PageImage, mode: PromptMode) -> PageText:
        started = time.monotonic()
        async with self._slots:
            await asyncio.sleep(self.config.seconds_per_page)
        digest = hashlib.sha256(page.image.tobytes()).hexdigest()[:16]
        width, height = page.image.size
        heading = "# " if mode is PromptMode.layout else ""
        text = (
            f"{heading}Simulated page {page.number}\n\n"
            f"Image {width}x{height} px, pixel digest {digest}."
        )
        return PageText(
            text=text,
            finish_reason="stop",
            prompt_tokens=257,
            completion_tokens=self.config.tokens_per_page,
            seconds=time.monotonic() - started,
        )

    async def check_health(self) -> None:
        return None

    async def stop(self) -> None:
        return None
