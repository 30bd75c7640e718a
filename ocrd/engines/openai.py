"""DeepSeek-OCR-2 on remote OpenAI-compatible servers (`vllm serve`): one fleet, many daemons.

Each page is sent as a PNG data URL in a chat completion with the same sampling settings as
the in-process engine; the n-gram guard's settings travel in `vllm_xargs`. Each server takes
`max_concurrency` of ocrd's requests at once; a page goes to the least busy server that is
up, and waiting pages queue by priority.

A fleet outage is not a page's fault. A server that does not answer (connection refused or
reset, 502/503/504, or a timeout after which it also fails a quick probe), or that refuses
ocrd's credentials or model (401, 403, 404), is marked down and probed with backoff until it
answers again. While every server is down the fleet is *unreachable*: pages wait, nothing
fails, no retry is spent, and the daemon stops taking new documents until a probe succeeds.
Only a failure on a server that still answers its probe counts against the page (`retries`,
with backoff, then the page fails); a page the server refuses as invalid (400, 413, 422)
fails at once.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import time
from dataclasses import dataclass
from typing import Any

import httpx
from PIL import Image

from ocrd.config import OpenAiConfig, PromptMode, SamplingConfig
from ocrd.domain import PageImage, PageText
from ocrd.engines.base import EngineError, EngineHealth, EngineState
from ocrd.engines.deepseek import END_OF_SENTENCE, PROMPTS, ngram_args
from ocrd.engines.slots import PrioritySlots
from ocrd.log import get_logger

MAX_BACKOFF_SECONDS = 30.0
PROBE_TIMEOUT_SECONDS = 10.0
SERVER_REST_SECONDS = 5.0  # a server that failed a page gets no new requests for this long
REFUSES_US = {401: "credentials", 403: "credentials", 404: "model or address"}


class _ServerDown(Exception):
    """Not the page's fault: the server is gone or will not serve ocrd at all."""


class _PageFailed(Exception):
    """The server is up, but this request failed; worth a retry."""


class _Busy(Exception):
    """429: the server is up but full; wait and send again, no retry spent."""


def png_data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)  # lossless; speed over size on a LAN
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclass
class _Server:
    url: str
    in_flight: int = 0
    up: bool = True
    resting_until: float = 0.0
    problem: str | None = None
    probe: asyncio.Task[None] | None = None


class OpenAiEngine:
    name = "openai"

    def __init__(self, config: OpenAiConfig, sampling: SamplingConfig) -> None:
        self.config = config
        self.sampling = sampling
        self.health = EngineHealth()
        self.log = get_logger(engine="openai")
        self._client: httpx.AsyncClient | None = None
        self._servers = [_Server(url) for url in config.base_urls]
        self._slots = PrioritySlots(self.max_concurrency)
        self._any_up = asyncio.Event()
        self._next = 0

    @property
    def max_concurrency(self) -> int:
        return self.config.max_concurrency * len(self._servers)

    @property
    def servers(self) -> list[dict[str, Any]]:
        """Each server's state, for status reports."""
        return [
            {"url": s.url, "up": s.up, "in_flight": s.in_flight, "problem": s.problem}
            for s in self._servers
        ]

    async def start(self) -> None:
        headers = {}
        key = os.environ.get(self.config.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(self.config.request_timeout_seconds, connect=10.0),
            limits=httpx.Limits(max_connections=self.max_concurrency + len(self._servers)),
        )
        answers = await asyncio.gather(*(self._probe(server) for server in self._servers))
        for server, problem in zip(self._servers, answers, strict=True):
            if problem is None:
                self._server_up(server)
            else:
                self._server_down(server, problem)
        self._update_health()

    async def check_health(self) -> None:
        return None  # an outage shows in `health`; it never ends the daemon

    def request_body(self, image_url: str, prompt: str) -> dict[str, Any]:
        text = prompt.removeprefix("<image>").lstrip("\n")  # the server places the image
        body: dict[str, Any] = {
            "model": self.config.model,
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
        return body

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        number = page.number
        image_url = await asyncio.to_thread(png_data_url, page.image)
        del page  # the PNG is all that waits for a server, not the raw pixels
        body = self.request_body(image_url, PROMPTS[mode])
        async with self._slots.slot(priority):
            return await self._send(body, number)

    async def _send(self, body: dict[str, Any], page: int) -> PageText:
        failures = 0
        delay = self.config.retry_backoff_seconds
        avoid: _Server | None = None
        while True:
            server = await self._choose(avoid)
            try:
                return await self._post(server, body, page)
            except _ServerDown as error:
                self._server_down(server, str(error))
            except _Busy:
                server.resting_until = time.monotonic() + delay
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
            except _PageFailed as error:
                problem = await self._probe(server)
                if problem is not None:  # the server went away: not the page's fault
                    self._server_down(server, problem)
                    continue
                failures += 1
                if failures > self.config.retries:
                    raise EngineError(  # retried here already: not again by the pipeline
                        f"it failed on the inference servers {failures} times; last: {error}",
                        page,
                        retryable=False,
                    ) from None
                server.resting_until = time.monotonic() + SERVER_REST_SECONDS
                avoid = server
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)

    async def _choose(self, avoid: _Server | None) -> _Server:
        """The least busy server that is up, rested and not `avoid`; waits while none is up."""
        while True:
            await self._any_up.wait()
            up = [s for s in self._servers if s.up]
            if up:
                break
        self._next = (self._next + 1) % len(up)
        rotated = up[self._next :] + up[: self._next]  # ties rotate
        now = time.monotonic()
        rested = [s for s in rotated if s is not avoid and s.resting_until <= now]
        return min(rested or rotated, key=lambda server: server.in_flight)

    async def _post(self, server: _Server, body: dict[str, Any], page: int) -> PageText:
        assert self._client is not None, "start() first"
        started = time.monotonic()
        server.in_flight += 1
        try:
            url = f"{server.url.rstrip('/')}/chat/completions"
            response = await self._client.post(url, json=body)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError) as error:
            raise _ServerDown(f"{type(error).__name__}: {error}") from error
        except httpx.TransportError as error:  # read timeout, reset mid-answer
            raise _PageFailed(f"{server.url}: {type(error).__name__}: {error}") from error
        finally:
            server.in_flight -= 1
        status = response.status_code
        if status == 200:
            return _page_text(response.json(), time.monotonic() - started, page)
        answer = f"HTTP {status}: {response.text[:300]}"
        if status in (502, 503, 504):
            raise _ServerDown(answer)
        if status in REFUSES_US:
            raise _ServerDown(f"refuses ocrd's {REFUSES_US[status]} ({answer})")
        if status == 429:
            raise _Busy(answer)
        if status >= 500:
            raise _PageFailed(f"{server.url}: {answer}")
        raise EngineError(f"the server at {server.url} refused page {page}: {answer}", page, False)

    async def _probe(self, server: _Server) -> str | None:
        """None if the server serves ocrd (its model list answers), else what is wrong."""
        assert self._client is not None
        try:
            response = await self._client.get(
                f"{server.url.rstrip('/')}/models", timeout=PROBE_TIMEOUT_SECONDS
            )
        except httpx.TransportError as error:
            return f"{type(error).__name__}: {error or 'no answer'}"
        status = response.status_code
        if status == 200:
            return None
        if status in REFUSES_US:
            return f"refuses ocrd's {REFUSES_US[status]} (HTTP {status})"
        return f"HTTP {status}"

    def _server_down(self, server: _Server, problem: str) -> None:
        server.problem = problem
        if not server.up:
            return
        server.up = False
        self.log.error(
            "engine.server_down",
            server=server.url,
            error=problem,
            action="its pages go to other servers; it is probed until it answers again",
        )
        server.probe = asyncio.create_task(self._probe_until_up(server))
        self._update_health()

    def _server_up(self, server: _Server) -> None:
        if not server.up:
            self.log.info("engine.server_up", server=server.url)
        server.up, server.problem, server.probe = True, None, None
        self._update_health()

    async def _probe_until_up(self, server: _Server) -> None:
        delay = self.config.retry_backoff_seconds
        while True:
            await asyncio.sleep(delay)
            problem = await self._probe(server)
            if problem is None:
                self._server_up(server)
                return
            server.problem = problem
            self._update_health()
            delay = min(delay * 2, MAX_BACKOFF_SECONDS)

    def _update_health(self) -> None:
        up = [s for s in self._servers if s.up]
        self._slots.set_capacity(self.config.max_concurrency * len(up))
        if up:
            self._any_up.set()
            self.health.set(EngineState.ready)
        else:
            self._any_up.clear()
            problems = "; ".join(f"{s.url}: {s.problem}" for s in self._servers)
            self.health.set(EngineState.unreachable, problems)

    async def stop(self) -> None:
        for server in self._servers:
            if server.probe is not None:
                server.probe.cancel()
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def _page_text(answer: dict[str, Any], seconds: float, page: int) -> PageText:
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
