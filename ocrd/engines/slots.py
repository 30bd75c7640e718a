"""A concurrency limit whose waiting line is ordered by priority (lower first, then arrival)."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class PrioritySlots:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.busy = 0
        self._order = itertools.count()
        self._waiting: list[tuple[int, int, asyncio.Future[None]]] = []

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @asynccontextmanager
    async def slot(self, priority: int = 0) -> AsyncIterator[None]:
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, priority: int) -> None:
        if self.busy < self.capacity and not self._waiting:
            self.busy += 1
            return
        future = asyncio.get_running_loop().create_future()
        entry = (priority, next(self._order), future)
        heapq.heappush(self._waiting, entry)
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # handed a slot, but cancelled before it woke: pass it on
            elif entry in self._waiting:
                self._waiting.remove(entry)
                heapq.heapify(self._waiting)
            raise

    def set_capacity(self, capacity: int) -> None:
        """Change the limit (a fleet's servers come and go); waiters get new room at once."""
        self.capacity = capacity
        self._wake()

    def _release(self) -> None:
        self.busy -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self.busy < self.capacity:
            *_, future = heapq.heappop(self._waiting)
            if not future.done():
                self.busy += 1
                future.set_result(None)
