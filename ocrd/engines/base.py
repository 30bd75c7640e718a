"""The one small interface every OCR engine implements."""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from ocrd.config import PromptMode
from ocrd.domain import PageImage, PageText

__all__ = ["Engine", "EngineDeadError", "EngineError", "EngineHealth", "EngineState", "PageText"]


class EngineError(Exception):
    """A page could not be recognised; the engine itself is still usable.

    `retryable` is false where sending the same page again cannot help (the server refused
    it as invalid), so the page fails at once instead of after every retry.
    """

    def __init__(self, message: str, page: int | None = None, retryable: bool = True) -> None:
        super().__init__(message)
        self.page = page
        self.retryable = retryable


class EngineDeadError(Exception):
    """The engine is gone (its process died); the daemon must exit so systemd restarts it.

    `page` is the page that was in the engine when it died (evidence against its document
    in crash accounting), None for a request that came after the death."""

    def __init__(self, message: str, page: int | None = None) -> None:
        super().__init__(message)
        self.page = page


class EngineState(StrEnum):
    loading = "loading"
    ready = "ready"
    unreachable = "unreachable"  # a fleet that does not answer: pages wait, nothing fails
    dead = "dead"


@dataclass
class EngineHealth:
    """What an engine says about itself: its state, since when, and what is wrong."""

    state: EngineState = EngineState.loading
    since: float = 0.0  # wall-clock seconds
    problem: str | None = None

    def set(self, state: EngineState, problem: str | None = None) -> bool:
        """Change state; true if it changed."""
        if state is self.state and problem == self.problem:
            return False
        if state is not self.state:
            self.since = time.time()
        self.state, self.problem = state, problem
        return True


class Engine(Protocol):
    name: str
    health: EngineHealth

    @property
    def max_concurrency(self) -> int:
        """Pages the engine works on at once: what keeps it busy."""
        ...

    async def start(self) -> None: ...

    async def check_health(self) -> None:
        """Raise EngineDeadError if the engine is gone."""
        ...

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        """The page's text; lower `priority` goes first where the engine has a queue."""
        ...

    async def stop(self) -> None: ...
