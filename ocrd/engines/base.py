"""The one small interface every OCR engine implements."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from ocrd.config import PromptMode
from ocrd.domain import PageImage, PageText

__all__ = [
    "Engine",
    "EngineDeadError",
    "EngineError",
    "EngineHealth",
    "EngineStartError",
    "EngineState",
    "InProcess",
    "PageCrashedError",
    "PageText",
    "ReplicaFacts",
    "ReplicaState",
    "SelfCheckResult",
]


class EngineError(Exception):
    """A page could not be recognised; the engine itself is still usable.

    `retryable` is false where sending the same page again cannot help (the server refused
    it as invalid), so the page fails at once instead of after every retry.
    """

    def __init__(self, message: str, page: int | None = None, retryable: bool = True) -> None:
        super().__init__(message)
        self.page = page
        self.retryable = retryable


class PageCrashedError(EngineError):
    """A page was in flight each time an engine replica died (or a server dropped it), twice,
    the second time as the only such page there: it is set aside, so that one page cannot
    take the engine down again and again."""

    def __init__(self, page: int | None, crashes: int = 2) -> None:
        times = "twice" if crashes == 2 else f"{crashes} times"
        super().__init__(f"the engine crashed on page {page} {times}", page, retryable=False)


class EngineDeadError(Exception):
    """The engine is gone (its process died); the daemon must exit so systemd restarts it.

    `page` is the page that was in the engine when it died (evidence against its document
    in crash accounting), None for a request that came after the death."""

    def __init__(self, message: str, page: int | None = None) -> None:
        super().__init__(message)
        self.page = page


class EngineStartError(Exception):
    """No replica of the engine could be started at all: the configuration, the model or the
    installation is wrong (the message says what each replica reported)."""


class EngineState(StrEnum):
    loading = "loading"
    ready = "ready"
    unreachable = "unreachable"  # a fleet that does not answer: pages wait, nothing fails
    garbled = "garbled"  # every replica answers, none reads ocrd's test page: pages wait
    dead = "dead"


@dataclass
class EngineHealth:
    """What an engine says about itself: its state, since when, and what is wrong."""

    state: EngineState = EngineState.loading
    since: float = 0.0  # wall-clock seconds
    problem: str | None = None
    # Ready, but not every replica serves: which ones do not, and why (None: all serve).
    degraded: str | None = None

    def set(self, state: EngineState, problem: str | None = None) -> bool:
        """Change state; true if it changed."""
        if state is self.state and problem == self.problem:
            return False
        if state is not self.state:
            self.since = time.time()
        self.state, self.problem = state, problem
        return True


class ReplicaState(StrEnum):
    """Where one replica (an engine process on a GPU, or a server of a fleet) stands."""

    loading = "loading"  # its process starts and loads the model, or a server is first probed
    checking = "checking"  # it answers; ocrd's test page is being read
    ready = "ready"  # it read the test page: it gets pages
    garbled = "garbled"  # it answers but did not read the test page: it gets no pages
    down = "down"  # died, hangs or does not answer: restarted (or probed) with backoff
    stopped = "stopped"
    refused = "refused"  # a router lists it but the operator does not trust it: sent nothing


@dataclass(frozen=True)
class SelfCheckResult:
    """How well a replica read ocrd's built-in test page."""

    passed: bool
    words_found: int
    words_expected: int
    seconds: float
    at: float  # wall-clock seconds
    answer: str  # the start of what it wrote, for the operator
    vllm_version: str | None = None


@dataclass(frozen=True)
class ReplicaFacts:
    """One replica as the status page, metrics and `ocrd status` show it."""

    name: str  # "gpu0", "replica1", or a server's address
    address: str  # its URL, or the private socket of a local replica
    device: str | None  # the CUDA devices it is pinned to (None: a remote server)
    state: ReplicaState
    since: float  # wall-clock seconds of the last change of state
    capacity: int  # pages it works on at once
    in_flight: int
    pages_done: int
    pages_failed: int  # requests that failed on it while it stayed up
    restarts: int  # restarts (local) or reconnections (remote) after the first start
    deaths_with_pages: int  # times it died or dropped the connection with pages in flight
    self_check: SelfCheckResult | None
    problem: str | None
    pid: int | None  # its process (local replicas)
    model: str | None = None  # the OCR model it serves (ocrd.models' name)
    # False where it reads no test page before work: an engine without a self-check
    # (RapidOCR, simulated), or one with `engine.self_check` off.
    self_checks: bool = True


class Engine(Protocol):
    name: str
    health: EngineHealth
    # Where the engine reads pages from files (local replica processes), so that render
    # workers write them there; None where pages are handed over as pixels.
    page_folder: Path | None

    @property
    def max_concurrency(self) -> int:
        """Pages the engine works on at once: what keeps it busy."""
        ...

    @property
    def replicas(self) -> list[ReplicaFacts]:
        """Each replica's state and counts (an in-process engine is one replica)."""
        ...

    @property
    def summary(self) -> str:
        """The replicas in a few words, e.g. "2 of 4 replicas ready, 2 loading"."""
        ...

    async def metrics_text(self) -> str:
        """The replicas' own Prometheus metrics, labelled by replica ("" if none)."""
        ...

    def subscribe(self, callback: Callable[[ReplicaFacts], None]) -> None:
        """Have `callback` called with a replica's facts at each change of its state."""
        ...

    async def start(self) -> None: ...

    async def check_health(self) -> None:
        """Raise EngineDeadError if the engine is gone."""
        ...

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        """The page's text; lower `priority` goes first where the engine has a queue."""
        ...

    async def stop(self) -> None: ...


class InProcess:
    """What an engine inside the daemon's process reports as its one replica."""

    health: EngineHealth
    page_folder: Path | None = None  # pages come as pixels, in this process
    self_check_result: SelfCheckResult | None = None
    self_checks: bool = True  # see ReplicaFacts.self_checks
    _in_flight: int = 0
    _done: int = 0
    _failed: int = 0

    @property
    def max_concurrency(self) -> int:
        raise NotImplementedError

    @property
    def replicas(self) -> list[ReplicaFacts]:
        state = {
            EngineState.ready: ReplicaState.ready,
            EngineState.garbled: ReplicaState.garbled,
            EngineState.dead: ReplicaState.down,
        }.get(self.health.state, ReplicaState.loading)
        return [
            ReplicaFacts(
                name="in-process",
                address="in-process",
                device=os.environ.get("CUDA_VISIBLE_DEVICES"),
                state=state,
                since=self.health.since,
                capacity=self.max_concurrency,
                in_flight=self._in_flight,
                pages_done=self._done,
                pages_failed=self._failed,
                restarts=0,
                deaths_with_pages=0,
                self_check=self.self_check_result,
                problem=self.health.problem,
                pid=os.getpid(),
                model=self.model_name,
                self_checks=self.self_checks,
            )
        ]

    @property
    def summary(self) -> str:
        return f"in-process engine {self.health.state.value}"

    @property
    def model_name(self) -> str | None:
        """The OCR model it serves (None: it reads without one, RapidOCR)."""
        recipe = getattr(self, "recipe", None)
        return str(recipe.name) if recipe is not None else None

    async def metrics_text(self) -> str:
        return ""  # vLLM's in-process metrics are in the daemon's own registry

    def subscribe(self, callback: Callable[[ReplicaFacts], None]) -> None:
        """Nothing to follow: the one replica's state is the engine's, which the daemon's
        supervisor watches."""
