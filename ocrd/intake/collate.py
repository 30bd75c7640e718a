"""Duplex from a single-sided feeder: the fronts, then the backs, become one document.

People with a simplex scanner scan a stack's fronts, turn it over and scan the backs. In an
inbox with `collate: true` the first file that is ready waits as the fronts; the next one
ready within `collate_window_seconds` is its backs (in reverse order; `ocrd/documents/sources.py`
interleaves them). A fronts file still alone when the window ends is a document of its own,
and the log says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class WaitingFronts:
    path: Path
    ready_at: float  # monotonic
    first_seen: float


class Collator:
    def __init__(self, window_seconds: float, clock: Callable[[], float] = time.monotonic):
        self.window = window_seconds
        self.clock = clock
        self.fronts: WaitingFronts | None = None

    def add(self, path: Path, first_seen: float) -> tuple[Path, Path] | None:
        """A file is ready: it becomes the fronts, or completes a pair (fronts, backs)."""
        if self.fronts is None:
            self.fronts = WaitingFronts(path, self.clock(), first_seen)
            return None
        fronts, self.fronts = self.fronts, None
        return fronts.path, path

    def expired(self) -> WaitingFronts | None:
        """The fronts file whose window has passed without backs, taken out of waiting."""
        if self.fronts is not None and self.clock() - self.fronts.ready_at >= self.window:
            fronts, self.fronts = self.fronts, None
            return fronts
        return None
