"""The one small interface every OCR engine implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ocrd.config import PromptMode
from ocrd.grounding import Block
from ocrd.render import PageImage


class EngineError(Exception):
    """A page could not be recognised; the engine itself is still usable."""

    def __init__(self, message: str, page: int | None = None) -> None:
        super().__init__(message)
        self.page = page


class EngineDeadError(Exception):
    """The engine is gone (its process died); the daemon must exit so systemd restarts it."""


@dataclass(frozen=True)
class PageText:
    text: str
    finish_reason: str  # stop, length, repetition, abort, error (vLLM's words)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    token_ids: tuple[int, ...] = ()
    # When the engine itself first scheduled the page and produced its last token
    # (monotonic clock, comparable across processes on one machine); None if unknown.
    engine_interval: tuple[float, float] | None = None
    # Blocks the engine found itself (RapidOCR's lines); None: parse them from `text`.
    blocks: tuple[Block, ...] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason == "stop"


class Engine(Protocol):
    name: str

    @property
    def max_concurrency(self) -> int:
        """Pages worth having in flight at once to keep the engine busy."""
        ...

    async def start(self) -> None: ...

    async def check_health(self) -> None:
        """Raise EngineDeadError if the engine is gone."""
        ...

    async def recognise(self, page: PageImage, mode: PromptMode) -> PageText: ...

    async def stop(self) -> None: ...
