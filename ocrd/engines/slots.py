"""A concurrency limit whose waiting line is ordered by priority (lower first, then arrival)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from ocrd.handoff import WaitingLine


class PrioritySlots:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.busy = 0
        self._line: WaitingLine[None, int] = WaitingLine(pass_on=lambda *_: self._release())

    @property
    def waiting(self) -> int:
        return len(self._line)

    @asynccontextmanager
    async def slot(self, priority: int = 0) -> AsyncIterator[None]:
        if self.busy < self.capacity and not self._line:
            self.busy += 1
        else:
            await self._line.wait(priority)  # the slot was counted when it was handed over
        try:
            yield
        finally:
            self._release()

    def set_capacity(self, capacity: int) -> None:
        """Change the limit (a fleet's servers come and go); waiters get new room at once."""
        self.capacity = capacity
        self._wake()

    def _release(self) -> None:
        self.busy -= 1
        self._wake()

    def _wake(self) -> None:
        while self.busy < self.capacity and self._line.hand_over(None, self._take):
            pass

    def _take(self, _: int) -> None:
        self.busy += 1
