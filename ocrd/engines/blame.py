"""Judging which page killed a replica.

A page in flight on a replica that went down is sent again and counts against no document.
But a page can be what kills its replica: a page that was in flight each time a replica
died, twice, is set aside (PageCrashedError: its document fails with "the engine crashed on
page N twice"). The second death must name it, not its neighbours: pages that were in
flight at a death go again first, together (most were innocent bystanders and finish at
once); if a replica dies with several of them in flight, none is blamed yet, and each goes
alone from then on (the only such page on its replica, routing.Kind.isolated), so the next
death there names the page that caused it. A remote server that drops the connection (or
stops answering) with the page in flight counts the same.

A whole fleet going down at once (a switch, a power cut, every worker restarted) is no
evidence either, but its deaths are seen one after another: a page cut off by the first
may be sent to a worker that dies a moment later with the outage. So before a second death
sets a page aside, the router looks a few seconds for a worker that went down at about the
same time without ever having had the page: where one did, the deaths were an outage and
the page goes again (once: a page in flight at a third death is set aside whatever else
died).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from ocrd.engines.base import PageCrashedError, ReplicaState
from ocrd.engines.replica import Replica
from ocrd.engines.routing import Kind
from ocrd.log import FilteringBoundLogger


def note_death(replica: Replica) -> None:
    """The replica went down: how many pages of earlier deaths it held at that moment
    (before any of its pages learns of the death and lets go of its slot)."""
    if replica.death_seen != replica.generation:
        replica.death_seen = replica.generation
        replica.suspects_at_death = replica.suspects


class CrashRecord:
    """What one page has been through: the deaths it was in flight at, and so how it goes."""

    def __init__(self, page: int, log: FilteringBoundLogger) -> None:
        self.page = page
        self.log = log
        self.kind = Kind.fresh
        self.crashes = 0
        self.sent_to: set[str] = set()  # the replicas this page was sent to
        self.first_death_at: float | None = None  # wall clock, as Replica.since
        self.spared = False  # a death already put down to an outage

    def _alone(self, replica: Replica) -> bool:
        """Whether this page, sent again after a death, was the only such page on `replica`
        when it died: then a death there names it."""
        return self.kind is not Kind.fresh and replica.suspects_at_death <= 1

    def would_be_set_aside(self, replica: Replica) -> bool:
        """Whether a death of `replica` now would set this page aside (see died_with)."""
        return self.crashes + 1 >= 2 and self._alone(replica)

    def in_an_outage(self, fleet: Iterable[Replica], window: float) -> bool:
        """Whether a replica that never had this page went down within `window` seconds
        of this page's first death: the deaths were the fleet's, not the page's doing."""
        if self.first_death_at is None:
            return False
        since = self.first_death_at - window
        return any(
            replica.name not in self.sent_to
            and replica.state is ReplicaState.down
            and replica.since >= since
            for replica in fleet
        )

    def spare(self, replica: Replica, error: Exception) -> None:
        """This death was part of an outage: counted against no page; the page goes again,
        alone."""
        self.spared = True
        self.kind = Kind.isolated
        self.log.warning(
            "engine.page_in_outage",
            page=self.page,
            replica=replica.name,
            crashes=self.crashes,
            error=str(error),
            action="other workers went down at the same time: not this page's doing",
        )

    def died_with(self, replica: Replica, generation: int, error: Exception) -> None:
        """The replica went down with this page in flight. Raises PageCrashedError where the
        page is to blame: its second death, the only such page on the replica."""
        self.crashes += 1
        if self.first_death_at is None:
            self.first_death_at = time.time()
        if replica.counted_death != generation:
            replica.counted_death = generation
            replica.deaths_with_pages += 1
        alone = self._alone(replica)
        self.log.warning(
            "engine.page_in_crash",
            page=self.page,
            replica=replica.name,
            crashes=self.crashes,
            alone=alone,
            error=str(error),
        )
        if self.crashes >= 2 and alone:
            self.log.error(
                "engine.page_set_aside",
                page=self.page,
                crashes=self.crashes,
                reason="it was in flight each time a replica died",
            )
            raise PageCrashedError(self.page, self.crashes) from None
        self.kind = Kind.suspect if self.crashes == 1 else Kind.isolated
