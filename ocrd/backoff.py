"""Waiting between retries: one policy type for every retry loop in ocrd.

A policy is data (first wait, factor, cap, and optionally how many waits or how many seconds
in all), so each caller states how patient it is and none writes its own doubling loop:

    for delay in STORAGE.delays():
        try:
            return do_it()
        except OSError:
            await asyncio.sleep(delay)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    first: float  # seconds before the second try
    factor: float = 2.0
    cap: float = 60.0  # no wait is longer than this
    attempts: int | None = None  # waits at most this many times (None: no limit)
    deadline: float | None = None  # gives up once this many seconds have passed in all

    def delays(self, clock: Callable[[], float] = time.monotonic) -> Iterator[float]:
        """The waits between tries, each `factor` times the last up to `cap`; ends when the
        attempts or the deadline are used up (a wait that would pass the deadline is cut)."""
        started = clock()
        delay = self.first
        waited = 0
        while self.attempts is None or waited < self.attempts:
            if self.deadline is not None:
                left = self.deadline - (clock() - started)
                if left <= 0:
                    return
                delay = min(delay, left)
            yield delay
            waited += 1
            delay = min(delay * self.factor, self.cap)

    def nth(self, retry: int) -> float:
        """The wait before retry number `retry` (1-based), for callers that count."""
        return min(self.first * self.factor ** max(0, retry - 1), self.cap)
