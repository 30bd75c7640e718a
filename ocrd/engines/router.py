"""One engine made of many replicas: local `vllm serve` processes (one per GPU), simulated
replica processes, or the servers of a remote fleet. The same code routes and supervises
them all, in parts named for their jobs:

- routing.py: which page gets the next free slot, on which replica (fewest in flight,
  lower priority value first); the engine's `max_concurrency` is the sum of the replicas'
  capacities, so the pipeline's `auto` sizing keeps every replica's batch full;
- supervision.py: keeping each replica alive (start or probe, prove, serve, restart with
  backoff), and health.py: the fleet's health from its replicas' states;
- gate.py: the self-check gate (a replica gets pages only once it reads ocrd's test page);
- sending.py: one request to one replica, and what its failure means;
- blame.py: judging which page killed a replica (a page set aside after two deaths).

Failures that are the page's (the replica answered an error, or it timed out and the
replica still serves) are retried: by the pipeline (`retries=None`, local replicas, as the
in-process engine did) or here on another server (`retries=N`, a remote fleet), with
backoff; a page the server refuses as invalid (HTTP 4xx) fails at once. A server that
refuses ocrd's key or model (401, 403, 404), or cannot be reached, is down, not the page's
fault.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from PIL import Image

from ocrd.config import PromptMode, SamplingConfig
from ocrd.domain import PageImage, PageText
from ocrd.engines import replica_metrics
from ocrd.engines.base import (
    EngineError,
    EngineHealth,
    EngineStartError,
    ReplicaFacts,
    ReplicaState,
)
from ocrd.engines.blame import CrashRecord
from ocrd.engines.gate import SelfCheckGate
from ocrd.engines.health import STARTING, summary
from ocrd.engines.media import PageMedia
from ocrd.engines.recipes import (
    chat_text,
    default_model,
    fit_page,
    prompt_for,
    request_options,
    sampling_for,
)
from ocrd.engines.replica import Replica, RouterSettings
from ocrd.engines.routing import Dispatcher, Kind
from ocrd.engines.sending import Busy, Failed, Gone, NeverSent, Sender
from ocrd.engines.supervision import Supervisor
from ocrd.log import get_logger

SERVER_REST_SECONDS = 5.0  # a server that failed a page gets no new requests for this long
# How long a page's second death waits for news of other workers' deaths (blame.py):
# the deaths of one outage reach ocrd over a few seconds.
OUTAGE_LOOK_SECONDS = 5.0
RETIRE_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class LocalPages:
    """Where local replicas read the pages they are sent as files, and what removes that
    folder once the router stops."""

    folder: Path
    cleanup: Callable[[], None]


class Router:
    """The Engine for a fleet of replicas."""

    def __init__(
        self,
        name: str,
        replicas: list[Replica],
        sampling: SamplingConfig,
        settings: RouterSettings,
        prepare: Callable[[Image.Image], PageMedia],
        local: LocalPages | None = None,
    ) -> None:
        self.name = name
        self.sampling = sampling
        self.settings = settings
        self.recipe = settings.recipe or default_model()
        self.recipe_sampling = sampling_for(self.recipe, sampling)
        self.health = EngineHealth()
        self.log = get_logger(engine=name)
        self._replicas = replicas
        self._prepare = prepare
        self.page_folder = local.folder if local else None  # None: a fleet
        self._cleanup = local.cleanup if local else None
        self._tasks: dict[Replica, asyncio.Task[None]] = {}
        self.recent_mode = PromptMode.layout  # the test page goes with the pages' prompt
        self.dispatcher = Dispatcher(replicas)
        self.sender = Sender(settings.request_timeout, self._mark_down, self.recipe_sampling.strip)
        self.gate = (
            SelfCheckGate(
                self.request_body,
                self.sender.request_id,
                lambda: self.recent_mode,
                settings.request_timeout,
                settings.what_to_do_when_garbled,
                self.recipe,
            )
            if settings.self_check
            else None
        )
        self.supervisor = Supervisor(
            replicas, settings.restart, self.gate, self.health, self.log, self.dispatcher.assign
        )
        self.supervisor.recheck_seconds = settings.self_check_repeat

    def _mark_down(self, replica: Replica, generation: int, problem: str) -> None:
        self.supervisor.mark_down(replica, generation, problem)

    # --- what the daemon reads -----------------------------------------------------------

    @property
    def max_concurrency(self) -> int:
        return sum(replica.capacity for replica in self._replicas)

    @property
    def replicas(self) -> list[ReplicaFacts]:
        checks = self.settings.self_check
        model = self.recipe.name
        return [replace(r.facts, self_checks=checks, model=model) for r in self._replicas]

    def subscribe(self, callback: Callable[[ReplicaFacts], None]) -> None:
        self.supervisor.on_change.append(callback)

    @property
    def loading(self) -> int:
        """Replicas starting or being checked (for systemd's STATUS while the engine loads)."""
        return sum(1 for replica in self._replicas if replica.state in STARTING)

    @property
    def summary(self) -> str:
        """The replicas in a few words, e.g. "2 of 4 replicas ready, 2 loading"."""
        return summary(self._replicas)

    async def metrics_text(self) -> str:
        """The replicas' own Prometheus metrics (vLLM's `vllm:*`), each sample labelled with
        its replica, in one exposition."""
        return await replica_metrics.collect(self._replicas)

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every replica at once; return when each has come up (or failed its first
        start). Raises EngineStartError when ocrd started the replicas and none came up."""
        if self.gate is not None:
            await self.gate.open(self._prepare)
        for replica in self._replicas:
            self._keep(replica)
        starts = [r.started for r in self._replicas if r.started is not None]
        if starts:
            await asyncio.wait(starts)
        self.supervisor.judge()
        if self.settings.local and not any(r.ever_ready or r.self_check for r in self._replicas):
            problems = "; ".join(f"{r.name}: {r.problem or r.state.value}" for r in self._replicas)
            await self.stop()
            raise EngineStartError(f"no {self.name} replica started: {problems}")

    def _keep(self, replica: Replica) -> None:
        """Open the replica's link and start its supervision."""
        replica.started = asyncio.get_running_loop().create_future()
        replica.link.open()
        task = asyncio.create_task(self.supervisor.keep(replica), name=replica.name)
        self._tasks[replica] = task

    def join(self, replica: Replica) -> None:
        """A replica that joins the running fleet (a server registered at a router)."""
        self._replicas.append(replica)
        self._keep(replica)
        self.supervisor.judge()

    async def retire(self, replica: Replica) -> None:
        """A replica that leaves the running fleet: it gets no new page, those in flight on it
        finish (within the request timeout), then it is let go."""
        task = self._tasks.pop(replica, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self.supervisor.set_state(replica, ReplicaState.stopped, "no longer in the fleet")
        deadline = time.monotonic() + self.settings.request_timeout
        while replica.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(RETIRE_POLL_SECONDS)
        await replica.keeper.take_down()
        await replica.link.close()
        self._replicas.remove(replica)
        self.supervisor.judge()
        self.supervisor.tell(replica)

    async def check_health(self) -> None:
        return None  # replicas are restarted, an outage shows in `health`: never dead

    async def stop(self) -> None:
        self.supervisor.stopping = True
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()
        await asyncio.gather(
            *(self._stop_replica(replica) for replica in self._replicas), return_exceptions=True
        )
        if self.gate is not None:
            self.gate.close()
        if self._cleanup is not None:
            self._cleanup()

    async def _stop_replica(self, replica: Replica) -> None:
        await replica.keeper.take_down()
        await replica.link.close()
        self.supervisor.set_state(replica, ReplicaState.stopped, None)

    # --- routing --------------------------------------------------------------------------

    def request_body(self, image_url: str, prompt: str, priority: int = 0) -> dict[str, Any]:
        content: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": image_url}}]
        text = chat_text(prompt)  # the server places the image; "": the image alone
        if text:
            content.append({"type": "text", "text": text})
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": [{"role": "user", "content": content}],
            **request_options(self.recipe_sampling),
        }
        if self.settings.send_priority and priority:
            body["priority"] = priority
        return body

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        """The page's text. A page whose image is a file in `page_folder` already (opened
        lazily by PIL from a PPM a render worker wrote there) is sent as it is, and the file
        is the engine's from then on: removed once answered. Other pages are written there
        (local replicas) or encoded as PNG (a fleet)."""
        number, task = page.number, page.task
        self.recent_mode = mode
        page = await asyncio.to_thread(fit_page, page, self.recipe, self.page_folder)
        media = self._own_file(page.image)
        if media is None:
            media = await asyncio.to_thread(self._prepare, page.image)
        del page  # the file or the PNG is all that waits for a replica, not the pixels
        try:
            body = self.request_body(media.url, prompt_for(self.recipe, mode, task), priority)
            text = await self._route(body, number, priority)
            return replace(text, model=self.recipe.name)  # its parser reads the text
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

    async def _an_outage(self, record: CrashRecord) -> bool:
        """Whether, within a few seconds, other workers are seen to have gone down with
        this page's deaths (see blame.py)."""
        if record.spared:
            return False
        deadline = time.monotonic() + OUTAGE_LOOK_SECONDS
        while not record.in_an_outage(self._replicas, OUTAGE_LOOK_SECONDS):
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.2)
        return True

    async def _route(self, body: dict[str, Any], page: int, priority: int) -> PageText:
        record = CrashRecord(page, self.log)
        failures = 0
        retry_waits = self.settings.retry.delays()
        busy_waits = self.settings.retry.delays()
        avoid: Replica | None = None
        while True:
            kind = record.kind
            replica = await self.dispatcher.acquire(priority, kind, avoid)
            generation = replica.generation
            try:
                confirmed = kind is Kind.fresh or await self.sender.confirm(replica, generation)
            except BaseException:  # cancelled while looking: the slot is given back
                self.dispatcher.release(replica, kind)
                raise
            if not confirmed:
                self.dispatcher.release(replica, kind)
                continue
            record.sent_to.add(replica.name)
            try:
                text = await self.sender.send(replica, body, page, generation)
            except (Gone, NeverSent, Busy, Failed) as error:
                outcome: Exception | None = error
            else:
                outcome = None
            finally:  # the slot is free before any wait below
                self.dispatcher.release(replica, kind)
            match outcome:
                case None:
                    replica.done += 1
                    return text
                case Gone() as gone:
                    if record.would_be_set_aside(replica) and await self._an_outage(record):
                        record.spare(replica, gone)
                    else:
                        record.died_with(replica, generation, gone)
                case Busy():
                    delay = next(busy_waits)
                    replica.resting_until = time.monotonic() + delay
                    await asyncio.sleep(delay)
                case Failed() as failed:
                    failures += 1
                    replica.failed += 1
                    if self.settings.retries is None:
                        raise EngineError(str(failed), page)
                    if failures > self.settings.retries:
                        raise EngineError(  # retried here already: not again by the pipeline
                            f"it failed on the inference servers {failures} times; last: {failed}",
                            page,
                            retryable=False,
                        )
                    replica.resting_until = time.monotonic() + SERVER_REST_SECONDS
                    avoid = replica
                    await asyncio.sleep(next(retry_waits))
                # NeverSent: not sent at all, so simply sent again
