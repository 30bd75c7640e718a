"""Handing over what frees up (a render worker, a slot of the page budget, a slot of an
engine) to whoever waits for it, so that a cancellation can never lose it.

A waiter is a future in a line. The one served next is the waiter whose key ranks lowest
at the moment something frees up (ranks may change while waiting: the page budget ranks a
document by the pages it holds), first come first served among equals. The thing is put
into the chosen waiter's future at once; if that waiter is cancelled before it wakes, it
passes the thing on (to the next waiter, or back to its owner), the way arq's worker gives
a job's slot back in its done-callback whatever happened to the job.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")  # what is handed over
K = TypeVar("K")  # what a waiter is ranked by


@dataclass(eq=False)
class _Receiver(Generic[T, K]):
    key: K
    order: int
    future: asyncio.Future[T] = field(repr=False)


def _as_is(key: Any) -> Any:
    return key


class WaitingLine(Generic[T, K]):
    def __init__(
        self,
        pass_on: Callable[[T, K], None],
        rank: Callable[[K], Any] = _as_is,
    ) -> None:
        """`pass_on(thing, key)` takes back a thing handed to a waiter that was cancelled
        before it woke; `rank(key)` orders the waiters (lowest first)."""
        self._pass_on = pass_on
        self._rank = rank
        self._waiters: list[_Receiver[T, K]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._waiters)

    def keys(self) -> list[K]:
        return [waiter.key for waiter in self._waiters]

    async def wait(self, key: K) -> T:
        """Wait in line until something is handed over."""
        waiter: _Receiver[T, K] = _Receiver(
            key, next(self._order), asyncio.get_running_loop().create_future()
        )
        self._waiters.append(waiter)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self._pass_on(waiter.future.result(), key)  # handed over, but too late
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def hand_over(self, thing: T, taken: Callable[[K], None] | None = None) -> bool:
        """Give `thing` to the best waiter (telling `taken` whose key it was, before the
        waiter wakes); false, with nothing taken, when nobody waits. A waiter cancelled
        meanwhile is skipped."""
        while self._waiters:
            chosen = min(self._waiters, key=lambda w: (self._rank(w.key), w.order))
            self._waiters.remove(chosen)
            if not chosen.future.done():
                if taken is not None:
                    taken(chosen.key)
                chosen.future.set_result(thing)
                return True
        return False
