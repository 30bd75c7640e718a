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

The list is a suggestion, not a trust (trust.py): a worker outside the operator's trusted
set is refused, logged once, and shown as refused; it is sent nothing. The list's body is
read up to `MAX_LIST_BYTES`: a router answering more fails that read, not the daemon.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from ocrd.engines.trust import WorkerTrust
from ocrd.log import FilteringBoundLogger

ANSWER_TIMEOUT_SECONDS = 10.0
# A list of thousands of workers is a few hundred KiB; more is not a worker list.
MAX_LIST_BYTES = 4 * 1024 * 1024
CHUNK_BYTES = 64 * 1024
# Whoever reaches the router can list thousands of workers: past this many trusted ones
# the rest are refused (each would cost a connection pool and probes), and of the refused
# ones only this many are logged one by one per read and shown in the status.
MAX_WORKERS = 256
SHOWN_REFUSALS = 20


class RegistryError(Exception):
    """The router's worker list could not be read; the message says why."""


@dataclass(frozen=True)
class FleetChange:
    joined: list[str]
    left: list[str]


@dataclass(frozen=True)
class Refusal:
    """A worker the router lists that ocrd does not trust: it is sent nothing."""

    url: str
    reason: str
    since: float


class RouterLink:
    """GET requests to the router, each answer's body read up to `MAX_LIST_BYTES`."""

    def __init__(self, root: str, tls: ssl.SSLContext | None = None) -> None:
        self.root = root.rstrip("/").removesuffix("/v1")
        self.api_key: str | None = None
        self.tls = tls
        self._session: aiohttp.ClientSession | None = None

    def open(self) -> None:
        if self._session is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            connector = aiohttp.TCPConnector(limit=2, ssl=self.tls if self.tls else True)
            self._session = aiohttp.ClientSession(connector=connector, headers=headers)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def get_json(self, path: str) -> dict[str, Any]:
        """The JSON object at `path`; RegistryError saying why there is none."""
        self.open()
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=ANSWER_TIMEOUT_SECONDS)
        try:
            async with self._session.get(  # a redirect is answered, not followed
                f"{self.root}{path}", timeout=timeout, allow_redirects=False
            ) as response:
                body = await _bounded(response, f"GET {path}")
                status = response.status
        except TimeoutError:
            raise RegistryError(f"no answer within {ANSWER_TIMEOUT_SECONDS:g} s") from None
        except (aiohttp.ClientError, ConnectionError) as error:
            raise RegistryError(f"no answer: {type(error).__name__}: {error}") from None
        text = body[:200].decode("utf-8", errors="replace")
        if status != 200:
            raise RegistryError(f"GET {path} answered HTTP {status}: {text}")
        try:
            data = json.loads(body)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise RegistryError(f"GET {path} answered no JSON object: {text}")
        return data


async def _bounded(response: aiohttp.ClientResponse, what: str) -> bytes:
    """The body, read in chunks and given up on past MAX_LIST_BYTES (also when the router
    announces more), so that a huge or endless answer costs at most that much memory."""
    too_big = RegistryError(
        f"{what} answered more than {MAX_LIST_BYTES // (1024 * 1024)} MiB; "
        "not a worker list, ignored"
    )
    if (response.content_length or 0) > MAX_LIST_BYTES:
        raise too_big
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(CHUNK_BYTES):
        size += len(chunk)
        if size > MAX_LIST_BYTES:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


class RouterRegistry:
    """The worker list of the router at `link`, and keeping the fleet in step with it."""

    def __init__(
        self,
        link: RouterLink,
        poll_seconds: float,
        trust: WorkerTrust,
        join: Callable[[str], None],
        leave: Callable[[str], Awaitable[None]],
        log: FilteringBoundLogger,
    ) -> None:
        self.link = link
        self.poll_seconds = poll_seconds
        self.trust = trust
        self.join = join  # a worker's URL (without /v1) that the fleet gains
        self.leave = leave  # one it loses
        self.log = log
        self.known: list[str] = []  # the trusted workers listed
        self.refused: dict[str, Refusal] = {}  # the others listed, by URL
        self.problem: str | None = None  # what is wrong with the list now (None: all well)
        self.reads = 0

    async def workers(self) -> list[str]:
        """The worker URLs the router lists, in its order."""
        data = await self.link.get_json("/workers")
        listed = data.get("workers")
        if not isinstance(listed, list):
            raise RegistryError(f"GET /workers has no worker list: {json.dumps(data)[:200]}")
        urls = [str(w["url"]).rstrip("/") for w in listed if isinstance(w, dict) and "url" in w]
        return list(dict.fromkeys(urls))

    async def refresh(self) -> FleetChange:
        """Read the list once and make the fleet match its trusted part."""
        try:
            everything = await self.workers()
        except RegistryError as error:
            self._trouble(f"the router at {self.link.root} does not give its workers ({error})")
            return FleetChange([], [])
        self.reads += 1
        listed = self._sift(everything)
        change = FleetChange(
            joined=[url for url in listed if url not in self.known],
            left=[url for url in self.known if url not in listed],
        )
        self.known = listed
        if self.problem is not None:
            self.log.info("engine.registry_read", router=self.link.root, workers=listed)
        self.problem = self._list_problem(listed)
        for url in change.joined:
            self.log.info("engine.worker_joined", router=self.link.root, worker=url)
            self.join(url)
        for url in change.left:
            self.log.info("engine.worker_left", router=self.link.root, worker=url)
            await self.leave(url)
        return change

    def _sift(self, everything: list[str]) -> list[str]:
        """The trusted workers of `everything`; the others are refused, each logged once
        (while it stays listed)."""
        trusted: list[str] = []
        refused: dict[str, Refusal] = {}
        new: list[Refusal] = []
        for url in everything:
            reason = self.trust.refusal(url)
            if reason is None and len(trusted) >= MAX_WORKERS:
                reason = f"the router lists more than {MAX_WORKERS} trusted workers"
            if reason is None:
                trusted.append(url)
                continue
            refused[url] = self.refused.get(url) or Refusal(url, reason, time.time())
            if url not in self.refused:
                new.append(refused[url])
        self.refused = refused
        self._tell_refused(new)
        return trusted

    def _tell_refused(self, new: list[Refusal]) -> None:
        action = (
            "it is sent nothing; if it is not yours, someone reached the router's "
            "/workers: close that port to all but its operators"
        )
        for refusal in new[:SHOWN_REFUSALS]:
            self.log.error(
                "engine.worker_refused",
                router=self.link.root,
                worker=refusal.url,
                reason=refusal.reason,
                action=action,
            )
        if len(new) > SHOWN_REFUSALS:
            self.log.error(
                "engine.workers_refused",
                router=self.link.root,
                count=len(new) - SHOWN_REFUSALS,
                refused=len(self.refused),
                action=f"they are sent nothing (not logged one by one); {action}",
            )

    def _list_problem(self, listed: list[str]) -> str | None:
        shown = list(self.refused.values())[:3]
        refused = "; ".join(f"{r.url} refused: {r.reason}" for r in shown)
        if len(self.refused) > len(shown):
            refused += f"; and {len(self.refused) - len(shown)} more refused"
        if not listed and not refused:
            return f"the router at {self.link.root} lists no worker"
        if not listed:
            return f"the router at {self.link.root} lists no trusted worker ({refused})"
        return refused or None

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
