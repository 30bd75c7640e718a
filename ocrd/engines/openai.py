"""An OCR model on remote OpenAI-compatible servers (`vllm serve`): one fleet, many daemons.

The same router as ocrd's own replicas (ocrd/engines/router.py), over servers ocrd did not
start. Each page is sent as a PNG data URL in a chat completion with the same sampling
settings as the in-process engine; the n-gram guard's settings travel in `vllm_xargs`. Each
server takes `max_concurrency` of ocrd's requests at once; a page goes to the least busy
server that is up, and waiting pages queue by priority.

A fleet outage is not a page's fault. A server that does not answer (connection refused,
502/503/504 or a timeout after which it also fails a quick probe), or that refuses ocrd's
credentials or model (401, 403, 404), is marked down and probed with backoff until it
answers again (then it reads ocrd's test page again before it gets pages). While every
server is down the fleet is *unreachable*: pages wait, nothing fails, no retry is spent, and
the daemon stops taking new documents until a probe succeeds. A page that was in flight
each time a server dropped it (went away with the page), twice, fails its document ("the
engine crashed on page N twice"). Only a failure on a server that still answers its probe
counts against the page (`retries`, with backoff, then the page fails); a page the server
refuses as invalid (400, 413, 422) fails at once.

With `router_url` the servers are the workers a router lists (registry.py): they join and
leave while ocrd runs, and each is sent its pages directly, as a listed server; a worker
outside `trusted_workers` (trust.py) is shown refused and sent nothing.
"""

from __future__ import annotations

import asyncio
import os
import ssl
from typing import Any

from ocrd.backoff import Backoff
from ocrd.config import OpenAiConfig, SamplingConfig
from ocrd.engines.base import ReplicaFacts, ReplicaState
from ocrd.engines.keepers import RemoteKeeper
from ocrd.engines.link import ServerLink
from ocrd.engines.media import PageMedia, png_data_url
from ocrd.engines.registry import SHOWN_REFUSALS, Refusal, RouterLink, RouterRegistry
from ocrd.engines.replica import Replica, RouterSettings
from ocrd.engines.replicas import KNOWN_GOOD_TEXT
from ocrd.engines.router import Router
from ocrd.engines.trust import WorkerTrust
from ocrd.models import Model

__all__ = ["OpenAiEngine", "png_data_url"]

MAX_BACKOFF_SECONDS = 30.0
WHAT_TO_DO = (
    f"Run the servers on the vLLM version ocrd is tested with ({KNOWN_GOOD_TEXT}) with "
    "the recipe's settings; files wait in the inbox, and each "
    "server is asked to read the test page again every few minutes."
)


def _data_url(image: Any) -> PageMedia:
    return PageMedia(png_data_url(image))


class OpenAiEngine(Router):
    def __init__(
        self,
        config: OpenAiConfig,
        sampling: SamplingConfig,
        self_check: bool = True,
        recipe: Model | None = None,
    ) -> None:
        self.config = config
        self._key: str | None = None  # read at start
        self._tls = _tls_context(config)
        waits = Backoff(first=config.retry_backoff_seconds, cap=MAX_BACKOFF_SECONDS)
        listed = [] if config.router_url else [self._server(url) for url in config.base_urls]
        settings = RouterSettings(
            model=config.model,
            request_timeout=config.request_timeout_seconds,
            self_check=self_check,
            restart=waits,
            retries=config.retries,
            retry=waits,
            what_to_do_when_garbled=WHAT_TO_DO,
            recipe=recipe,
            self_check_repeat=config.self_check_repeat_seconds,
        )
        super().__init__("openai", listed, sampling, settings, _data_url)
        self.registry = (
            RouterRegistry(
                RouterLink(config.router_url, self._tls),
                config.router_poll_seconds,
                WorkerTrust.of(config),
                self._join,
                self._leave,
                self.log,
            )
            if config.router_url
            else None
        )
        self._following: asyncio.Task[None] | None = None
        self._refused_seen: dict[str, Refusal] = {}

    def _server(self, url: str, name: str | None = None) -> Replica:
        link = ServerLink(
            url, self._key, connections=self.config.max_concurrency + 1, tls=self._tls
        )
        return Replica(name or url, link, RemoteKeeper(link), self.config.max_concurrency)

    @property
    def replicas(self) -> list[ReplicaFacts]:
        """The fleet's servers, and the workers the router lists that ocrd refuses."""
        refused = list(self.registry.refused.values()) if self.registry is not None else []
        return [*super().replicas, *(_refused_facts(r) for r in refused[:SHOWN_REFUSALS])]

    async def start(self) -> None:
        self._key = os.environ.get(self.config.api_key_env) or None  # a reload may change it
        for replica in self._replicas:
            replica.link.api_key = self._key
        if self.registry is None:
            await super().start()
            return
        self.registry.link.api_key = self._key
        self.registry.link.open()
        await self.registry.refresh()  # the workers listed now: their first starts are awaited
        self.supervisor.fleet_problem = self.registry.problem
        await super().start()
        self._following = asyncio.create_task(self._follow(), name="router-registry")

    async def _follow(self) -> None:
        assert self.registry is not None
        while True:
            await asyncio.sleep(self.registry.poll_seconds)
            try:
                await self.registry.refresh()
            except Exception:  # a bug must not end the following silently
                self.log.exception("engine.registry_error", router=self.registry.link.root)
            if self._refused_seen != self.registry.refused:  # the status shows them
                changed = {**self._refused_seen, **self.registry.refused}.values()
                self._refused_seen = dict(self.registry.refused)
                for callback in self.supervisor.on_change:  # thousands are told as a few
                    for refusal in list(changed)[:SHOWN_REFUSALS]:
                        callback(_refused_facts(refusal))
            if self.supervisor.fleet_problem != self.registry.problem:
                self.supervisor.fleet_problem = self.registry.problem
                self.supervisor.judge()

    def _join(self, url: str) -> None:
        replica = self._server(f"{url}/v1", name=url)  # named as the router lists it
        if self._tasks or self._following is not None:  # running: it starts now
            self.join(replica)
        else:  # listed at start: started with the others
            self._replicas.append(replica)

    async def _leave(self, url: str) -> None:
        for replica in [r for r in self._replicas if r.name == url]:
            await self.retire(replica)

    async def stop(self) -> None:
        if self._following is not None:
            self._following.cancel()
            await asyncio.gather(self._following, return_exceptions=True)
        if self.registry is not None:
            await self.registry.link.close()
        await super().stop()


def _tls_context(config: OpenAiConfig) -> ssl.SSLContext | None:
    """The certificates https servers are checked against: `tls_ca`, or (None) the
    system's; either way the certificate's name must match the URL's host."""
    if config.tls_ca is None:
        return None
    return ssl.create_default_context(cafile=config.tls_ca)


def _refused_facts(refusal: Refusal) -> ReplicaFacts:
    return ReplicaFacts(
        name=refusal.url,
        address=refusal.url,
        device=None,
        state=ReplicaState.refused,
        since=refusal.since,
        capacity=0,
        in_flight=0,
        pages_done=0,
        pages_failed=0,
        restarts=0,
        deaths_with_pages=0,
        self_check=None,
        problem=f"refused: {refusal.reason}",
        pid=None,
    )
