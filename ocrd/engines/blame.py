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
"""

from __future__ import annotations

from ocrd.engines.base import PageCrashedError
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

    def died_with(self, replica: Replica, generation: int, error: Exception) -> None:
        """The replica went down with this page in flight. Raises PageCrashedError where the
        page is to blame: its second death, the only such page on the replica."""
        self.crashes += 1
        if replica.counted_death != generation:
            replica.counted_death = generation
            replica.deaths_with_pages += 1
        alone = self.kind is not Kind.fresh and replica.suspects_at_death <= 1
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
