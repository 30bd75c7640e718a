"""DeepSeek-OCR-2 on remote OpenAI-compatible servers (`vllm serve`): one fleet, many daemons.

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
"""

from __future__ import annotations

import os
from typing import Any

from ocrd.backoff import Backoff
from ocrd.config import OpenAiConfig, SamplingConfig
from ocrd.engines.keepers import RemoteKeeper
from ocrd.engines.link import ServerLink
from ocrd.engines.media import PageMedia, png_data_url
from ocrd.engines.replicas import KNOWN_GOOD_TEXT
from ocrd.engines.router import Replica, Router, RouterSettings

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
        self, config: OpenAiConfig, sampling: SamplingConfig, self_check: bool = True
    ) -> None:
        self.config = config
        waits = Backoff(first=config.retry_backoff_seconds, cap=MAX_BACKOFF_SECONDS)
        replicas = []
        for url in config.base_urls:
            link = ServerLink(url, connections=config.max_concurrency + 1)
            replicas.append(Replica(url, link, RemoteKeeper(link), config.max_concurrency))
        settings = RouterSettings(
            model=config.model,
            request_timeout=config.request_timeout_seconds,
            self_check=self_check,
            restart=waits,
            retries=config.retries,
            retry=waits,
            what_to_do_when_garbled=WHAT_TO_DO,
        )
        super().__init__("openai", replicas, sampling, settings, _data_url)

    async def start(self) -> None:
        key = os.environ.get(self.config.api_key_env)  # read at start: a reload may change it
        for replica in self._replicas:
            replica.link.api_key = key or None
        await super().start()

    @property
    def servers(self) -> list[dict[str, Any]]:
        """Each server's state, for status reports."""
        return [
            {
                "url": facts.name,
                "up": facts.state.value == "ready",
                "in_flight": facts.in_flight,
                "problem": facts.problem,
            }
            for facts in self.replicas
        ]
