"""One engine made of many replicas: local `vllm serve` processes (one per GPU), simulated
replica processes, or the servers of a remote fleet. The same code routes and supervises
them all.

Routing. Each replica takes up to its `capacity` pages at once. A page waits in one queue,
lower priority value first (the pipeline passes its document's deadline), and goes to the
replica with the fewest pages in flight that is ready (ties take turns). The engine's
`max_concurrency` is the sum of the replicas' capacities, so the pipeline's `auto` sizing
keeps every replica's batch full.

Supervision. Each replica runs one loop: bring it up (start its process, or probe the
server), prove it reads (ocrd's test page, see selfcheck.py), serve until it goes down,
take it down, wait with backoff (Backoff), start again. The others keep working meanwhile.
A page in flight on a replica that went down is sent again and counts against no document.
But a page can be what kills its replica: a page that was in flight each time a replica
died, twice, is set aside (PageCrashedError: its document fails with "the engine crashed
on page N twice"). The second death must name it, not its neighbours: pages that were in
flight at a death go again first, together (most were innocent bystanders and finish at
once); if a replica dies with several of them in flight, none is blamed yet, and each goes
alone from then on (the only such page on its replica), so the next death there names the
page that caused it. A remote server that drops the connection (or stops answering) with
the page in flight counts the same.

Failures that are the page's (the replica answered an error, or it timed out and the
replica still serves) are retried: by the pipeline (`retries=None`, local replicas, as the
in-process engine did) or here on another server (`retries=N`, a remote fleet), with
backoff; a page the server refuses as invalid (HTTP 4xx) fails at once. A server that
refuses ocrd's key or model (401, 403, 404), or cannot be reached, is down, not the page's
fault.

Health. `ready` while at least one replica reads; `degraded` names the ones that do not;
`loading` until the first replica is ready; `garbled` when every replica answers but none
read the test page (nothing is dispatched, files wait in the inbox); `unreachable` when
none serves after the start (restarting, or a fleet that does not answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import itertools
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from ocrd.backoff import Backoff
from ocrd.config import PromptMode, SamplingConfig
from ocrd.domain import PageImage, PageText
from ocrd.engines import selfcheck
from ocrd.engines.base import (
    EngineError,
    EngineHealth,
    EngineStartError,
    EngineState,
    PageCrashedError,
    ReplicaFacts,
    ReplicaState,
    SelfCheckResult,
)
from ocrd.engines.deepseek import END_OF_SENTENCE, PROMPTS, ngram_args
from ocrd.engines.keepers import REFUSES_US, Keeper, ReplicaUnavailable
from ocrd.engines.link import Dropped, LinkError, ServerLink, Unreachable
from ocrd.engines.media import PageMedia
from ocrd.log import get_logger

SERVER_REST_SECONDS = 5.0  # a server that failed a page gets no new requests for this long
HEALTHY_SECONDS = 300.0  # up this long: the next restart's backoff starts from the first wait
RECHECK = Backoff(first=60.0, factor=2.0, cap=900.0)  # a garbled replica is asked again
PAGE_RETRY = Backoff(first=1.0, cap=30.0)
METRICS_TIMEOUT_SECONDS = 3.0


class _Gone(Exception):
    """The replica died, hung or dropped the connection with the page in flight."""


class _NeverSent(Exception):
    """The replica could not be reached or refuses ocrd: the page never got to it."""


class _Busy(Exception):
    """429: the server is up but full; wait and send again, no retry spent."""


class _Failed(Exception):
    """The replica still serves, but this request failed."""


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
        self.isolated = 0  # of those, pages sent alone (see _Kind.isolated)
        self.done = 0
        self.failed = 0
        self.restarts = 0
        self.deaths_with_pages = 0
        self.generation = 0  # one per start (or reconnection)
        self.resting_until = 0.0
        self.down = asyncio.Event()  # the router saw it go down
        self.ever_ready = False
        self.started: asyncio.Future[None] | None = None  # its first start settled
        self._counted_death = 0  # the generation whose death was counted
        self.death_seen = 0  # the generation whose death was last seen
        self.suspects_at_death = 0  # suspects in flight at that moment
        self._confirming: tuple[int, asyncio.Task[bool]] | None = None

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


class _Kind(enum.Enum):
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
    kind: _Kind = field(compare=False)
    avoid: Replica | None = field(compare=False)


class Router:
    """The Engine for a fleet of replicas."""

    def __init__(
        self,
        name: str,
        replicas: list[Replica],
        sampling: SamplingConfig,
        settings: RouterSettings,
        prepare: Callable[[Image.Image], PageMedia],
        cleanup: Callable[[], None] | None = None,
        page_folder: Path | None = None,
    ) -> None:
        self.name = name
        self.sampling = sampling
        self.settings = settings
        self.health = EngineHealth()
        self.log = get_logger(engine=name)
        self.on_change: list[Callable[[ReplicaFacts], None]] = []
        self._replicas = replicas
        self._prepare = prepare
        self.page_folder = page_folder  # where local replicas read pages (None: a fleet)
        self._cleanup = cleanup
        self._queue: list[_Waiter] = []
        self._suspects: deque[_Waiter] = deque()
        self._isolated: deque[_Waiter] = deque()
        self._order = itertools.count()
        self._turn = 0
        self._requests = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._check_media: PageMedia | None = None
        self._stopping = False

    # --- what the daemon reads -----------------------------------------------------------

    @property
    def max_concurrency(self) -> int:
        return sum(replica.capacity for replica in self._replicas)

    @property
    def replicas(self) -> list[ReplicaFacts]:
        return [replica.facts for replica in self._replicas]

    def subscribe(self, callback: Callable[[ReplicaFacts], None]) -> None:
        self.on_change.append(callback)

    @property
    def loading(self) -> int:
        """Replicas starting or being checked (for systemd's STATUS while the engine loads)."""
        starting = (ReplicaState.loading, ReplicaState.checking)
        return sum(1 for replica in self._replicas if replica.state in starting)

    @property
    def summary(self) -> str:
        """The replicas in a few words, e.g. "2 of 4 replicas ready, 2 loading"."""
        counts: dict[str, int] = {}
        for replica in self._replicas:
            counts[replica.state.value] = counts.get(replica.state.value, 0) + 1
        ready = counts.pop(ReplicaState.ready.value, 0)
        rest = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        return f"{ready} of {len(self._replicas)} replicas ready" + (f", {rest}" if rest else "")

    async def metrics_text(self) -> str:
        """The replicas' own Prometheus metrics (vLLM's `vllm:*`), each sample labelled with
        its replica, in one exposition."""
        serving = (ReplicaState.ready, ReplicaState.garbled, ReplicaState.checking)
        replicas = [r for r in self._replicas if r.state in serving]
        texts = await asyncio.gather(*(self._metrics_of(r) for r in replicas))
        return merge_metrics([(r.name, t) for r, t in zip(replicas, texts, strict=True) if t])

    async def _metrics_of(self, replica: Replica) -> str:
        try:
            answer = await replica.link.get("/metrics", METRICS_TIMEOUT_SECONDS, root=True)
        except LinkError:
            return ""
        return answer.text if answer.status == 200 else ""

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every replica at once; return when each has come up (or failed its first
        start). Raises EngineStartError when ocrd started the replicas and none came up."""
        if self.settings.self_check:
            self._check_media = await asyncio.to_thread(self._prepare, selfcheck.check_page())
        loop = asyncio.get_running_loop()
        for replica in self._replicas:
            replica.started = loop.create_future()
            replica.link.open()
            self._tasks.append(asyncio.create_task(self._keep(replica), name=replica.name))
        await asyncio.wait([r.started for r in self._replicas if r.started is not None])
        self._refresh_health()
        if self.settings.local and not any(r.ever_ready or r.self_check for r in self._replicas):
            problems = "; ".join(f"{r.name}: {r.problem or r.state.value}" for r in self._replicas)
            await self.stop()
            raise EngineStartError(f"no {self.name} replica started: {problems}")

    async def check_health(self) -> None:
        return None  # replicas are restarted, an outage shows in `health`: never dead

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await asyncio.gather(
            *(self._stop_replica(replica) for replica in self._replicas), return_exceptions=True
        )
        if self._check_media is not None:
            self._check_media.release()
        if self._cleanup is not None:
            self._cleanup()

    async def _stop_replica(self, replica: Replica) -> None:
        await replica.keeper.take_down()
        await replica.link.close()
        self._set_state(replica, ReplicaState.stopped, None)

    # --- supervision ----------------------------------------------------------------------

    async def _keep(self, replica: Replica) -> None:
        """Bring the replica up, prove it reads, serve until it goes down; again, with backoff."""
        delays = self.settings.restart.delays()
        while True:
            replica.generation += 1
            replica.down.clear()
            if replica.keeper.local or replica.generation == 1:  # a fleet's server stays down
                self._set_state(replica, ReplicaState.loading, replica.problem)
            up_since: float | None = None
            try:
                await replica.keeper.bring_up()
                up_since = time.monotonic()
                await self._prove(replica)
                reason = await self._serve_until_down(replica)
            except ReplicaUnavailable as error:
                reason = str(error)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a bug must not end supervision silently
                self.log.exception("engine.replica_error", replica=replica.name)
                reason = f"{type(error).__name__}: {error}"
            self._went_down(replica, reason, served=up_since is not None)
            await replica.keeper.take_down()
            _settle(replica.started)
            if up_since is not None and time.monotonic() - up_since >= HEALTHY_SECONDS:
                delays = self.settings.restart.delays()
            delay = next(delays)
            self.log.info(
                "engine.replica_restarting",
                replica=replica.name,
                address=replica.link.address,
                in_seconds=round(delay, 1),
            )
            await asyncio.sleep(delay)
            replica.restarts += 1

    async def _prove(self, replica: Replica) -> None:
        """Ready if it reads ocrd's test page (or the check is off); garbled if it answers
        without reading it; ReplicaUnavailable if it does not answer."""
        if self._check_media is None:
            self._became_ready(replica)
            return
        self._set_state(replica, ReplicaState.checking, None)
        result = await self._read_test_page(replica)
        replica.self_check = result
        if result.passed:
            self.log.info(
                "engine.self_check_passed",
                replica=replica.name,
                words=f"{result.words_found}/{result.words_expected}",
                seconds=round(result.seconds, 1),
            )
            self._became_ready(replica)
            return
        problem = self._garbled_problem(replica, result)
        self.log.error(
            "engine.self_check_failed",
            replica=replica.name,
            words=f"{result.words_found}/{result.words_expected}",
            vllm_version=result.vllm_version,
            answer=result.answer,
            error=problem,
        )
        self._set_state(replica, ReplicaState.garbled, problem)
        _settle(replica.started)

    async def _read_test_page(self, replica: Replica) -> SelfCheckResult:
        assert self._check_media is not None
        body = self.request_body(self._check_media.url, PROMPTS[PromptMode.layout])
        body["max_tokens"] = min(selfcheck.MAX_TOKENS, self.sampling.max_tokens)
        started = time.monotonic()
        request_id = f"ocrd-self-check-{replica.name}-{replica.generation}"
        try:
            answer = await replica.link.post(
                "/chat/completions", body, self.settings.request_timeout, request_id
            )
        except LinkError as error:
            raise ReplicaUnavailable(f"no answer to ocrd's test page: {error}") from None
        if answer.status != 200 or answer.data is None:
            raise ReplicaUnavailable(
                f"ocrd's test page was answered HTTP {answer.status}: {answer.text[:200]}"
            )
        try:
            text = _page_text(answer.data, 0.0, None).text
        except EngineError as error:
            raise ReplicaUnavailable(f"ocrd's test page: {error}") from None
        score = selfcheck.score(text)
        version = await self._version_of(replica)
        return SelfCheckResult(
            passed=score.passed,
            words_found=score.found,
            words_expected=score.expected,
            seconds=time.monotonic() - started,
            at=time.time(),
            answer=re.sub(r"\s+", " ", text)[:200],
            vllm_version=version,
        )

    async def _version_of(self, replica: Replica) -> str | None:
        if replica.vllm_version is not None:
            return replica.vllm_version()
        try:
            answer = await replica.link.get("/version", root=True)
        except LinkError:
            return None
        version = (answer.data or {}).get("version") if answer.status == 200 else None
        return str(version) if version else None

    def _garbled_problem(self, replica: Replica, result: SelfCheckResult) -> str:
        version = f"vLLM {result.vllm_version}" if result.vllm_version else "its vLLM"
        return (
            f"{replica.name} answers but its output is garbled: it read "
            f"{result.words_found} of {result.words_expected} words of ocrd's test page "
            f"({version}; it wrote: {result.answer[:80]!r}). "
            f"{self.settings.what_to_do_when_garbled}"
        ).strip()

    async def _serve_until_down(self, replica: Replica) -> str:
        """Wait until the replica goes down; a garbled one is asked to read the page again
        now and then (someone may have fixed the server)."""
        rechecks = RECHECK.delays()
        while True:
            waits = [
                asyncio.ensure_future(replica.keeper.until_down()),
                asyncio.ensure_future(replica.down.wait()),
            ]
            if replica.state is ReplicaState.garbled:
                waits.append(asyncio.ensure_future(asyncio.sleep(next(rechecks))))
            try:
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            if waits[0] in done:
                return str(waits[0].result())
            if waits[1] in done:
                return replica.problem or "went down"
            await self._prove(replica)  # a garbled replica's recheck

    def _became_ready(self, replica: Replica) -> None:
        replica.ever_ready = True
        self._set_state(replica, ReplicaState.ready, None)
        self.log.info(
            "engine.replica_ready",
            replica=replica.name,
            address=replica.link.address,
            device=replica.device,
            pid=replica.keeper.pid,
            restarts=replica.restarts,
        )
        _settle(replica.started)
        self._assign()

    def _went_down(self, replica: Replica, reason: str, served: bool) -> None:
        if not served and replica.generation > 1:  # a restart (or probe) that did not succeed
            self.log.info("engine.replica_still_down", replica=replica.name, error=reason)
            self._set_state(replica, ReplicaState.down, reason)
            return
        self.log.error(
            "engine.replica_down",
            replica=replica.name,
            address=replica.link.address,
            error=reason,
            action="its pages go to the other replicas; it is "
            + ("restarted" if replica.keeper.local else "probed until it answers")
            + " with backoff",
        )
        self._set_state(replica, ReplicaState.down, reason)

    def _mark_down(self, replica: Replica, generation: int, problem: str) -> None:
        """The router saw it fail: no more pages to it; its supervisor takes it down."""
        if replica.generation != generation or replica.state is ReplicaState.down:
            return
        replica.problem = problem
        replica.down.set()
        self._set_state(replica, ReplicaState.down, problem)

    def _set_state(self, replica: Replica, state: ReplicaState, problem: str | None) -> None:
        if state is ReplicaState.down and replica.death_seen != replica.generation:
            # Before any of its pages learns of the death and lets go of its slot.
            replica.death_seen = replica.generation
            replica.suspects_at_death = replica.suspects
        if replica.state is not state:
            replica.since = time.time()
        replica.state, replica.problem = state, problem
        self._refresh_health()
        facts = replica.facts
        for callback in self.on_change:
            callback(facts)

    def _refresh_health(self) -> None:
        if self._stopping:
            return  # the last state stays for whoever reads it after the stop
        states = [replica.state for replica in self._replicas]
        others = [r for r in self._replicas if r.state is not ReplicaState.ready]
        if ReplicaState.ready in states:
            self.health.degraded = (
                "; ".join(
                    f"{r.name} {r.state.value}: {r.problem or 'no problem told'}" for r in others
                )
                if others
                else None
            )
            self.health.set(EngineState.ready)
            return
        self.health.degraded = None
        first_start = [r for r in self._replicas if r.started is None or not r.started.done()]
        garbled = [r for r in self._replicas if r.state is ReplicaState.garbled]
        if first_start and not any(r.ever_ready for r in self._replicas):
            self.health.set(EngineState.loading, self.summary)
        elif garbled:
            count = len(self._replicas)
            share = f"{len(garbled)} of {count} replicas garbled; " if count > 1 else ""
            self.health.set(EngineState.garbled, share + (garbled[0].problem or ""))
        else:
            problems = "; ".join(f"{r.name}: {r.problem or r.state.value}" for r in self._replicas)
            self.health.set(EngineState.unreachable, problems)

    # --- routing --------------------------------------------------------------------------

    def request_body(self, image_url: str, prompt: str, priority: int = 0) -> dict[str, Any]:
        text = prompt.removeprefix("<image>").lstrip("\n")  # the server places the image
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": image_url}},
                        {"type": "text", "text": text},
                    ],
                }
            ],
            "temperature": 0.0,
            "max_tokens": self.sampling.max_tokens,
            "skip_special_tokens": False,
        }
        xargs = ngram_args(self.sampling)
        if xargs:
            body["vllm_xargs"] = xargs
        if self.settings.send_priority and priority:
            body["priority"] = priority
        return body

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        """The page's text. A page whose image is a file in `page_folder` already (opened
        lazily by PIL from a PPM a render worker wrote there) is sent as it is, and the file
        is the engine's from then on: removed once answered. Other pages are written there
        (local replicas) or encoded as PNG (a fleet)."""
        number = page.number
        media = self._own_file(page.image)
        if media is None:
            media = await asyncio.to_thread(self._prepare, page.image)
        del page  # the file or the PNG is all that waits for a replica, not the pixels
        try:
            body = self.request_body(media.url, PROMPTS[mode], priority)
            return await self._route(body, number, priority)
        finally:
            media.release()

    def _own_file(self, image: Image.Image) -> PageMedia | None:
        filename = getattr(image, "filename", "")
        if not filename or self.page_folder is None:
            return None
        path = Path(filename)
        if path.parent != self.page_folder or path.suffix not in (".ppm", ".bmp", ".png"):
            return None
        image.close()  # the file goes as it is: PIL need not keep it open meanwhile
        return PageMedia(path.as_uri(), path)

    async def _route(self, body: dict[str, Any], page: int, priority: int) -> PageText:
        kind = _Kind.fresh
        crashes = failures = 0
        retry_waits = self.settings.retry.delays()
        busy_waits = self.settings.retry.delays()
        avoid: Replica | None = None
        while True:
            replica = await self._acquire(priority, kind, avoid)
            generation = replica.generation
            try:
                text = await self._send(replica, body, page, generation)
            except (_Gone, _NeverSent, _Busy, _Failed) as error:
                outcome: Exception | None = error
            else:
                outcome = None
            finally:  # the slot is free before any wait below
                self._release(replica, kind)
            try:
                if outcome is not None:
                    raise outcome
            except _Gone as error:
                crashes += 1
                self._count_death(replica, generation)
                alone = kind is not _Kind.fresh and replica.suspects_at_death <= 1
                self.log.warning(
                    "engine.page_in_crash",
                    page=page,
                    replica=replica.name,
                    crashes=crashes,
                    alone=alone,
                    error=str(error),
                )
                if crashes >= 2 and alone:
                    self.log.error(
                        "engine.page_set_aside",
                        page=page,
                        crashes=crashes,
                        reason="it was in flight each time a replica died",
                    )
                    raise PageCrashedError(page, crashes) from None
                kind = _Kind.suspect if crashes == 1 else _Kind.isolated
                continue
            except _NeverSent:
                continue
            except _Busy:
                delay = next(busy_waits)
                replica.resting_until = time.monotonic() + delay
                await asyncio.sleep(delay)
                continue
            except _Failed as error:
                failures += 1
                replica.failed += 1
                if self.settings.retries is None:
                    raise EngineError(str(error), page) from None
                if failures > self.settings.retries:
                    raise EngineError(  # retried here already: not again by the pipeline
                        f"it failed on the inference servers {failures} times; last: {error}",
                        page,
                        retryable=False,
                    ) from None
                replica.resting_until = time.monotonic() + SERVER_REST_SECONDS
                avoid = replica
                await asyncio.sleep(next(retry_waits))
                continue
            replica.done += 1
            return text

    async def _send(
        self, replica: Replica, body: dict[str, Any], page: int, generation: int
    ) -> PageText:
        started = time.monotonic()
        request_id = f"ocrd-{next(self._requests)}-page-{page}"
        try:
            answer = await replica.link.post(
                "/chat/completions", body, self.settings.request_timeout, request_id
            )
        except Unreachable as error:
            self._mark_down(replica, generation, str(error))
            raise _NeverSent from None
        except Dropped as error:
            raise await self._gone_or_failed(replica, generation, str(error)) from None
        status = answer.status
        if status == 200:
            if answer.data is None:
                raise _Failed(f"{replica.name}: the answer is not JSON: {answer.text[:200]}")
            return _page_text(answer.data, time.monotonic() - started, page)
        said = f"HTTP {status}: {answer.text[:300]}"
        if status in REFUSES_US:
            self._mark_down(replica, generation, f"refuses ocrd's {REFUSES_US[status]} ({said})")
            raise _NeverSent
        if status == 429:
            raise _Busy(said)
        if status >= 500:
            raise await self._gone_or_failed(replica, generation, said)
        raise EngineError(
            f"the server at {replica.link.address} refused page {page}: {said}", page, False
        )

    async def _gone_or_failed(self, replica: Replica, generation: int, problem: str) -> Exception:
        """After a broken request: did the replica go down (the page was in flight at its
        death), or does it still serve (the request failed)?"""
        if await self._still_serves(replica, generation):
            return _Failed(f"{replica.name}: {problem}")
        self._mark_down(replica, generation, problem)
        return _Gone(f"{replica.name}: {problem}")

    async def _still_serves(self, replica: Replica, generation: int) -> bool:
        if replica.generation != generation or replica.state is not ReplicaState.ready:
            return False
        # One look per start, however many of its requests broke at once.
        confirming = replica._confirming
        if confirming is None or confirming[0] != generation or confirming[1].done():
            replica._confirming = (generation, asyncio.ensure_future(replica.keeper.alive()))
        assert replica._confirming is not None
        alive = await asyncio.shield(replica._confirming[1])
        return alive and replica.generation == generation

    def _count_death(self, replica: Replica, generation: int) -> None:
        if replica._counted_death != generation:
            replica._counted_death = generation
            replica.deaths_with_pages += 1

    async def _acquire(self, priority: int, kind: _Kind, avoid: Replica | None) -> Replica:
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
        self._assign()
        try:
            return await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release(future.result(), kind)  # given a slot, then cancelled
            elif line is not None:
                with contextlib.suppress(ValueError):
                    line.remove(waiter)
            elif waiter in self._queue:
                self._queue.remove(waiter)
                heapq.heapify(self._queue)
            raise

    def _line(self, kind: _Kind) -> deque[_Waiter] | None:
        if kind is _Kind.isolated:
            return self._isolated
        return self._suspects if kind is _Kind.suspect else None

    def _release(self, replica: Replica, kind: _Kind) -> None:
        replica.in_flight -= 1
        if kind is not _Kind.fresh:
            replica.suspects -= 1
        if kind is _Kind.isolated:
            replica.isolated -= 1
        self._assign()

    def _assign(self) -> None:
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
        if waiter.kind is not _Kind.fresh:
            replica.suspects += 1
        if waiter.kind is _Kind.isolated:
            replica.isolated += 1
        waiter.future.set_result(replica)


def _settle(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


def _page_text(answer: dict[str, Any], seconds: float, page: int | None) -> PageText:
    try:
        choice = answer["choices"][0]
        usage = answer.get("usage") or {}
        return PageText(
            text=(choice["message"]["content"] or "").replace(END_OF_SENTENCE, ""),
            finish_reason=str(choice.get("finish_reason") or "abort"),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            seconds=seconds,
        )
    except (KeyError, IndexError, TypeError, ValueError) as error:
        raise EngineError(f"the server's answer has no completion: {error!r}", page) from None


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?(\s.*)$")


def merge_metrics(texts: list[tuple[str, str]], prefix: str = "vllm:") -> str:
    """The `prefix` families of several Prometheus expositions as one, each sample labelled
    `replica="<name>"`; HELP and TYPE once per family."""
    families: dict[str, list[str]] = {}
    headers: dict[str, list[str]] = {}
    for name, text in texts:
        label = 'replica="' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
        family = ""
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                if family.startswith(prefix) and family not in headers:
                    headers[family] = []
                if family.startswith(prefix) and len(headers[family]) < 2:
                    headers[family].append(line)
                continue
            match = _SAMPLE.match(line)
            if match is None or not match.group(1).startswith(prefix):
                continue
            metric, labels, rest = match.groups()
            inner = labels[1:-1] if labels else ""
            merged = f"{{{label},{inner}}}" if inner else f"{{{label}}}"
            families.setdefault(family or metric, []).append(f"{metric}{merged}{rest}")
    lines: list[str] = []
    for family in sorted(set(families) | set(headers)):
        lines += headers.get(family, [])
        lines += families.get(family, [])
    return "\n".join(lines) + ("\n" if lines else "")
