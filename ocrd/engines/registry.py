"""A fleet whose list is kept by a router (vllm-router, or SGLang's router it descends from):
the router is the registry, ocrd does the routing.

Every `router_poll_seconds` ocrd reads `GET <router>/workers` (the workers registered with
`vllm-router --worker-urls`, `POST /workers` or `/add_worker`, or found by its Kubernetes
discovery) and makes the fleet match: a new worker joins (ocrd probes it, it reads the test
page, then it gets pages), a worker no longer listed leaves once its pages in flight are
answered. Pages go to each worker directly, as to a listed server, so every guarantee of
listed servers holds: a garbling worker gets no page, a page that kills workers is blamed,
one refusal is one page's, and the fleet's health is what the workers themselves answer,
not what a forwarded probe finds on whichever worker the router picks. A router that does
not answer changes nothing: the workers last listed keep working, and it shows in the
engine's state (degraded, or unreachable with no worker known).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ocrd.engines.link import LinkError, ServerLink
from ocrd.log import FilteringBoundLogger

ANSWER_TIMEOUT_SECONDS = 10.0


class RegistryError(Exception):
    """The router's worker list could not be read; the message says why."""


@dataclass(frozen=True)
class FleetChange:
    joined: list[str]
    left: list[str]


class RouterRegistry:
    """The worker list of the router at `link`, and keeping the fleet in step with it."""

    def __init__(
        self,
        link: ServerLink,
        poll_seconds: float,
        join: Callable[[str], None],
        leave: Callable[[str], Awaitable[None]],
        log: FilteringBoundLogger,
    ) -> None:
        self.link = link
        self.poll_seconds = poll_seconds
        self.join = join  # a worker's URL (without /v1) that the fleet gains
        self.leave = leave  # one it loses
        self.log = log
        self.known: list[str] = []
        self.problem: str | None = None  # what is wrong with the list now (None: all well)
        self.reads = 0

    async def workers(self) -> list[str]:
        """The worker URLs the router lists, in its order."""
        try:
            answer = await self.link.get("/workers", ANSWER_TIMEOUT_SECONDS, root=True)
        except LinkError as error:
            raise RegistryError(f"no answer: {error}") from None
        if answer.status != 200 or answer.data is None:
            raise RegistryError(f"GET /workers answered HTTP {answer.status}: {answer.text[:200]}")
        listed = answer.data.get("workers")
        if not isinstance(listed, list):
            raise RegistryError(f"GET /workers has no worker list: {answer.text[:200]}")
        urls = [str(w["url"]).rstrip("/") for w in listed if isinstance(w, dict) and "url" in w]
        return list(dict.fromkeys(urls))

    async def refresh(self) -> FleetChange:
        """Read the list once and make the fleet match it."""
        try:
            listed = await self.workers()
        except RegistryError as error:
            self._trouble(f"the router at {self.link.root} does not give its workers ({error})")
            return FleetChange([], [])
        self.reads += 1
        change = FleetChange(
            joined=[url for url in listed if url not in self.known],
            left=[url for url in self.known if url not in listed],
        )
        self.known = listed
        if self.problem is not None:
            self.log.info("engine.registry_read", router=self.link.root, workers=listed)
        self.problem = None if listed else f"the router at {self.link.root} lists no worker"
        for url in change.joined:
            self.log.info("engine.worker_joined", router=self.link.root, worker=url)
            self.join(url)
        for url in change.left:
            self.log.info("engine.worker_left", router=self.link.root, worker=url)
            await self.leave(url)
        return change

    def _trouble(self, problem: str) -> None:
        if problem != self.problem:
            self.log.error(
                "engine.registry_unreadable",
                router=self.link.root,
                error=problem,
                workers=self.known,
                action="the workers last listed keep working; ocrd reads the list again "
                f"every {self.poll_seconds:g} s",
            )
        self.problem = problem
