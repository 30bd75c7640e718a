"""Who goes next: the page budget shared between documents, and each page's priority.

Pages rendered but not yet recognised hold a slot of a global budget, which bounds memory
and keeps the engine's own queue short. The budget is shared fairly: when a slot frees it
goes to the waiting document with the *fewest pages in flight*, and among those to the
one that arrived first. So a one-page scan dropped behind a 400-page book takes the very
next free slot (it holds none, the book holds them all); ten books share the budget
equally; and a book under a stream of small scans still progresses, since whenever it
holds no page it wins against every document that arrived after it.

Inside the engine, pages carry a priority (vLLM's priority scheduling, the fleet's request
queue, the simulated engine): their document's *virtual deadline*, its arrival time plus
`SECONDS_PER_PAGE_LEFT` for every page it still has to do, in milliseconds; lower goes
first. It favours short and old documents. Since ocrd keeps only a quarter of the engine's
batch waiting inside the engine, a page waits there at most until the next running page
finishes, also where vLLM does not preempt a running request for a waiting one.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from ocrd.handoff import WaitingLine

SECONDS_PER_PAGE_LEFT = 0.5


@dataclass(eq=False)
class Ticket:
    """One document's place in the schedule."""

    arrival: float  # monotonic seconds
    pages_left: int
    in_flight: int = 0
    sequence: int = 0  # breaks ties of equal arrival: first issued, first served

    def deadline(self) -> float:
        return self.arrival + SECONDS_PER_PAGE_LEFT * self.pages_left

    def fair_share_key(self) -> tuple[int, float, int]:
        return self.in_flight, self.arrival, self.sequence

    def page_done(self) -> None:
        self.pages_left = max(0, self.pages_left - 1)


class PageBudget:
    """At most `size` pages in flight, each free slot to the document holding fewest."""

    def __init__(self, size: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.size = size
        self.epoch = clock()
        self._clock = clock
        self._free = size
        self._line: WaitingLine[None, Ticket] = WaitingLine(
            pass_on=lambda _, ticket: self.release(ticket), rank=Ticket.fair_share_key
        )
        self._sequence = itertools.count()

    @property
    def in_flight(self) -> int:
        return self.size - self._free

    @property
    def waiting(self) -> int:
        """Pages waiting for a slot."""
        return len(self._line)

    def ticket(self, pages: int, arrival: float | None = None) -> Ticket:
        arrival = self._clock() if arrival is None else arrival
        return Ticket(arrival, pages, sequence=next(self._sequence))

    def priority(self, ticket: Ticket) -> int:
        """The page's priority for the engine: its document's deadline in ms (lower first)."""
        return max(0, round((ticket.deadline() - self.epoch) * 1000))

    async def acquire(self, ticket: Ticket) -> None:
        """Wait for a slot for one page of `ticket`'s document."""
        if self._free > 0 and not self._line:
            self._grant(ticket)
            return
        await self._line.wait(ticket)

    def release(self, ticket: Ticket) -> None:
        """Give back a slot of `ticket`'s document (from a done-callback: always runs)."""
        ticket.in_flight -= 1
        self._free += 1
        while self._free > 0 and self._line.hand_over(None, self._grant):
            pass

    def resize(self, size: int) -> None:
        """A new limit (an engine whose fleet grew or shrank); pages over a smaller one
        finish, and no new one starts until the count is below it."""
        self._free += size - self.size
        self.size = size
        while self._free > 0 and self._line.hand_over(None, self._grant):
            pass

    def _grant(self, ticket: Ticket) -> None:
        self._free -= 1
        ticket.in_flight += 1
