"""One member of a fleet (a local `vllm serve` or simulated replica, or a remote server): how
to reach it, what keeps it, where it stands; and the settings the router runs a fleet with."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from ocrd.backoff import Backoff
from ocrd.engines.base import ReplicaFacts, ReplicaState, SelfCheckResult
from ocrd.engines.keepers import Keeper
from ocrd.engines.link import ServerLink
from ocrd.models import Model

PAGE_RETRY = Backoff(first=1.0, cap=30.0)


class Replica:
    """One member of the fleet: how to reach it, what keeps it, where it stands."""

    def __init__(
        self,
        name: str,
        link: ServerLink,
        keeper: Keeper,
        capacity: int,
        device: str | None = None,
        vllm_version: Callable[[], str | None] | None = None,
    ) -> None:
        self.name = name
        self.link = link
        self.keeper = keeper
        self.capacity = capacity
        self.device = device
        self.vllm_version = vllm_version
        self.state = ReplicaState.loading
        self.since = time.time()
        self.problem: str | None = None
        self.self_check: SelfCheckResult | None = None
        self.in_flight = 0
        self.suspects = 0  # pages in flight here that were in flight at a death before
        self.isolated = 0  # of those, pages sent alone (see routing.Kind.isolated)
        self.done = 0
        self.failed = 0
        self.restarts = 0
        self.deaths_with_pages = 0
        self.generation = 0  # one per start (or reconnection)
        self.resting_until = 0.0
        self.down = asyncio.Event()  # the router saw it go down
        self.ever_ready = False
        self.started: asyncio.Future[None] | None = None  # its first start settled
        self.counted_death = 0  # the generation whose death was counted
        self.death_seen = 0  # the generation whose death was last seen
        self.suspects_at_death = 0  # suspects in flight at that moment
        self.confirming: tuple[int, asyncio.Task[bool]] | None = None  # see sending.py

    @property
    def facts(self) -> ReplicaFacts:
        return ReplicaFacts(
            name=self.name,
            address=self.link.address,
            device=self.device,
            state=self.state,
            since=self.since,
            capacity=self.capacity,
            in_flight=self.in_flight,
            pages_done=self.done,
            pages_failed=self.failed,
            restarts=self.restarts,
            deaths_with_pages=self.deaths_with_pages,
            self_check=self.self_check,
            problem=self.problem,
            pid=self.keeper.pid,
        )


@dataclass(frozen=True)
class RouterSettings:
    model: str  # the model name in requests
    request_timeout: float
    self_check: bool
    restart: Backoff  # waits between a replica's restarts (or reconnection probes)
    retries: int | None = None  # None: a failed page goes back to the pipeline at once
    retry: Backoff = PAGE_RETRY
    send_priority: bool = False  # the servers schedule by priority (ocrd started them)
    local: bool = False  # ocrd started the replicas: if none ever starts, start() fails
    what_to_do_when_garbled: str = ""
    recipe: Model | None = None  # the OCR model served (None: ocrd.models.DEFAULT)
    self_check_repeat: float = 0.0  # mean seconds between unannounced checks (0: none)


def settle(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)
