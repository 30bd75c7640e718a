"""A simulated engine, for tests of the daemon's own logic and benchmarks at GPU speed.

It models an engine with continuous batching: up to `capacity` pages are recognised at once,
each taking `seconds_per_page`; more wait their turn, lower priority first (as vLLM's
priority scheduling does). Its text is derived from the page's pixels, so the same page
always gives the same text and different pages different text, written in the format of
the model it stands in for (simulated_answers.py): a title, a paragraph and one figure. With
`unfinished_every: N` every Nth page stops at "max_tokens" in layout mode (the plain-text
retry then finishes). With `fatal_colour`, a page whose centre pixel has that colour kills
the engine half-way through its time, as a page that crashes a real engine would. It
never reads anything on the page and is never chosen by `auto`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time

from PIL import Image

from ocrd.config import PromptMode, SimulatedConfig
from ocrd.domain import PageImage, PageText
from ocrd.engines.base import EngineDeadError, EngineHealth, EngineState, InProcess
from ocrd.engines.recipes import default_model, fit_page
from ocrd.engines.simulated_answers import element_answer, page_answer
from ocrd.engines.slots import PrioritySlots
from ocrd.models import Model


def fingerprint(image: Image.Image) -> str:
    """A short digest of what a page looks like, cheap enough to cost a GPU's stand-in
    nothing: 64x64 pixels sampled from the page, not every pixel."""
    sample = image.resize((64, 64), Image.Resampling.NEAREST)
    return hashlib.sha256(sample.tobytes()).hexdigest()[:16]


class SimulatedEngine(InProcess):
    name = "simulated"
    self_checks = False  # it reads nothing: no self-check

    def __init__(self, config: SimulatedConfig, recipe: Model | None = None) -> None:
        self.config = config
        self.recipe = recipe or default_model()  # the model it answers as
        self.health = EngineHealth()
        self.slots = PrioritySlots(config.capacity)

    @property
    def max_concurrency(self) -> int:
        return self.config.capacity

    async def start(self) -> None:
        self.health.set(EngineState.ready)

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        started = time.monotonic()
        self._raise_if_dead()
        page = await asyncio.to_thread(fit_page, page, self.recipe)  # the model's image size
        # What it needs of the pixels is taken at once, as a real engine turns a page into
        # tensors on arrival: the page's memory is not held while it waits its turn.
        number, (width, height), digest = page.number, page.image.size, fingerprint(page.image)
        task = page.task
        fatal = self._is_fatal(page)
        del page
        async with self.slots.slot(priority):
            self._in_flight += 1
            try:
                if fatal:
                    await asyncio.sleep(self.config.seconds_per_page / 2)
                    self.health.set(EngineState.dead, f"page {number} crashed it")
                self._raise_if_dead(number)  # it died with this page in it
                await asyncio.sleep(self.config.seconds_per_page)
                self._raise_if_dead(number)
            finally:
                self._in_flight -= 1
        self._done += 1
        unfinished = (
            mode is PromptMode.layout
            and self.config.unfinished_every > 0
            and number % self.config.unfinished_every == 0
        )
        return PageText(
            model=self.recipe.name,
            text=page_answer(self.recipe, number, (width, height), digest, mode)
            if task is None
            else element_answer(self.recipe, task, number, (width, height), digest),
            finish_reason="length" if unfinished else "stop",
            prompt_tokens=257,
            completion_tokens=self.config.tokens_per_page,
            seconds=time.monotonic() - started,
        )

    def _raise_if_dead(self, page: int | None = None) -> None:
        if self.health.state is EngineState.dead:
            raise EngineDeadError(f"the simulated engine died: {self.health.problem}", page)

    def _is_fatal(self, page: PageImage) -> bool:
        if self.config.fatal_colour is None:
            return False
        width, height = page.image.size
        return page.image.getpixel((width // 2, height // 2)) == self.config.fatal_colour

    async def check_health(self) -> None:
        self._raise_if_dead()

    async def stop(self) -> None:
        return None
