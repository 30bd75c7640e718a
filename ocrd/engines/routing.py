"""Routing pages to replicas: which page gets the next free slot, and on which replica.

Each replica takes up to its `capacity` pages at once. A page waits in one queue, lower
priority value first (the pipeline passes its document's deadline), and goes to the ready
replica with the fewest pages in flight (ties take turns). Pages that were in flight at a
replica's death wait in lines of their own that go first (see blame.py): a suspect page
(one death) not beside an isolated one, an isolated page (a death among several such
pages) only to a replica holding no other such page, so that the next death names it.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ocrd.engines.base import ReplicaState
from ocrd.engines.replica import Replica


class Kind(enum.Enum):
    """What a page has been through: nothing; one death of a replica while it was in flight
    (it goes again at once, with the others of that death); or a death while it was in flight
    with other such pages, so that which of them caused it is not known: it goes alone (the
    only such page on its replica), and the next death there names it."""

    fresh = "fresh"
    suspect = "suspect"
    isolated = "isolated"


@dataclass(order=True)
class _Waiter:
    priority: int
    order: int
    future: asyncio.Future[Replica] = field(compare=False)
    kind: Kind = field(compare=False)
    avoid: Replica | None = field(compare=False)


class Dispatcher:
    """Slots on the ready replicas of `replicas` (the router's own list, which may change)."""

    def __init__(self, replicas: list[Replica]) -> None:
        self._replicas = replicas
        self._queue: list[_Waiter] = []
        self._suspects: deque[_Waiter] = deque()
        self._isolated: deque[_Waiter] = deque()
        self._order = itertools.count()
        self._turn = 0

    async def acquire(self, priority: int, kind: Kind, avoid: Replica | None) -> Replica:
        """A slot on a ready replica: the least busy; lower priority values are served first.
        Pages that were in flight at a death go before the others; an isolated one only to a
        replica holding no other such page, a suspect one not beside an isolated one."""
        future: asyncio.Future[Replica] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(priority, next(self._order), future, kind, avoid)
        line = self._line(kind)
        if line is None:
            heapq.heappush(self._queue, waiter)
        else:
            line.append(waiter)
        self.assign()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self.release(future.result(), kind)  # given a slot, then cancelled
            elif line is not None:
                with contextlib.suppress(ValueError):
                    line.remove(waiter)
            elif waiter in self._queue:
                self._queue.remove(waiter)
                heapq.heapify(self._queue)
            raise

    def _line(self, kind: Kind) -> deque[_Waiter] | None:
        if kind is Kind.isolated:
            return self._isolated
        return self._suspects if kind is Kind.suspect else None

    def release(self, replica: Replica, kind: Kind) -> None:
        replica.in_flight -= 1
        if kind is not Kind.fresh:
            replica.suspects -= 1
        if kind is Kind.isolated:
            replica.isolated -= 1
        self.assign()

    def assign(self) -> None:
        """Hand free slots to waiting pages: first those of a death, then the queue."""
        free = [
            r for r in self._replicas if r.state is ReplicaState.ready and r.in_flight < r.capacity
        ]
        if not free:
            return
        lines: list[tuple[deque[_Waiter], Callable[[Replica], bool]]] = [
            (self._isolated, lambda r: r.suspects == 0),
            (self._suspects, lambda r: r.isolated == 0),
        ]
        for line, fits in lines:
            for waiter in list(line):
                if waiter.future.done():
                    line.remove(waiter)
                    continue
                choices = [r for r in free if r.in_flight < r.capacity and fits(r)]
                if choices:
                    line.remove(waiter)
                    self._grant(waiter, self._pick(choices, waiter.avoid))
        while self._queue:
            choices = [r for r in free if r.in_flight < r.capacity]
            if not choices:
                return
            waiter = heapq.heappop(self._queue)
            if not waiter.future.done():
                self._grant(waiter, self._pick(choices, waiter.avoid))

    def _pick(self, choices: list[Replica], avoid: Replica | None) -> Replica:
        now = time.monotonic()
        rested = [r for r in choices if r is not avoid and r.resting_until <= now]
        pool = rested or choices
        fewest = min(r.in_flight for r in pool)
        tied = [r for r in pool if r.in_flight == fewest]
        self._turn += 1
        return tied[self._turn % len(tied)]

    @staticmethod
    def _grant(waiter: _Waiter, replica: Replica) -> None:
        replica.in_flight += 1
        if waiter.kind is not Kind.fresh:
            replica.suspects += 1
        if waiter.kind is Kind.isolated:
            replica.isolated += 1
        waiter.future.set_result(replica)
