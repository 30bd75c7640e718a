"""DeepSeek-OCR-2 on remote OpenAI-compatible servers (`vllm serve`): one fleet, many daemons.

Each page is sent as a PNG data URL in a chat completion with the same sampling settings as
the in-process engine; the n-gram guard's settings travel in `vllm_xargs`. With several base
URLs each request goes to the server with the fewest requests of ours in flight. Connection
errors, timeouts, 429 and 5xx answers are retried with exponential backoff on another
server where there is one, and the failing server rests for a few seconds. When every
retry failed the fleet counts as gone: the daemon exits non-zero, and systemd restarts it
with the claimed files still in the work area.
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import time
from typing import Any

import httpx
from PIL import Image

from ocrd.config import OpenAiConfig, PromptMode, SamplingConfig
from ocrd.engines.base import EngineDeadError, EngineError, PageText
from ocrd.engines.deepseek import END_OF_SENTENCE, PROMPTS, ngram_args
from ocrd.render import PageImage

MAX_BACKOFF_SECONDS = 30.0
SERVER_REST_SECONDS = 10.0  # a server that just failed gets no new requests for this long


class _Retryable(Exception):
    pass


def png_data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)  # lossless; speed over size on a LAN
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


class OpenAiEngine:
    name = "openai"

    def __init__(self, config: OpenAiConfig, sampling: SamplingConfig) -> None:
        self.config = config
        self.sampling = sampling
        self._client: httpx.AsyncClient | None = None
        self._slots = asyncio.Semaphore(config.max_concurrency)
        self._in_flight = dict.fromkeys(config.base_urls, 0)
        self._resting_until = dict.fromkeys(config.base_urls, 0.0)  # after a failure
        self._next = 0

    @property
    def max_concurrency(self) -> int:
        return self.config.max_concurrency

    async def start(self) -> None:
        headers = {}
        key = os.environ.get(self.config.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(self.config.request_timeout_seconds, connect=10.0),
            limits=httpx.Limits(max_connections=self.config.max_concurrency),
        )

    async def check_health(self) -> None:
        return None  # a dead fleet shows up as requests that fail every retry

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

    def _pick_server(self, avoid: str | None) -> str:
        """The least busy server that has not just failed (and not `avoid`); ties rotate."""
        urls = self.config.base_urls
        self._next = (self._next + 1) % len(urls)
        rotated = urls[self._next :] + urls[: self._next]
        now = time.monotonic()
        usable = [u for u in rotated if u != avoid and self._resting_until[u] <= now]
        others = [u for u in rotated if u != avoid]
        return min(usable or others or rotated, key=lambda url: self._in_flight[url])

    async def recognise(self, page: PageImage, mode: PromptMode) -> PageText:
        image_url = await asyncio.to_thread(png_data_url, page.image)
        body = self.request_body(image_url, PROMPTS[mode])
        async with self._slots:
            return await self._post_with_retries(body, page.number)

    async def _post_with_retries(self, body: dict[str, Any], page: int) -> PageText:
        delay = self.config.retry_backoff_seconds
        problem = ""
        url = None
        for attempt in range(self.config.retries + 1):
            if attempt:
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)
            url = self._pick_server(avoid=url)
            try:
                return await self._post(url, body, page)
            except _Retryable as error:
                problem = str(error)
                self._resting_until[url] = time.monotonic() + SERVER_REST_SECONDS
        raise EngineDeadError(
            f"no inference server answered after {self.config.retries + 1} attempts; "
            f"last: {problem}"
        )

    async def _post(self, url: str, body: dict[str, Any], page: int) -> PageText:
        assert self._client is not None, "start() first"
        started = time.monotonic()
        self._in_flight[url] += 1
        try:
            response = await self._client.post(f"{url.rstrip('/')}/chat/completions", json=body)
        except httpx.TransportError as error:  # refused, reset, timed out
            raise _Retryable(f"{url}: {type(error).__name__}: {error}") from error
        finally:
            self._in_flight[url] -= 1
        if response.status_code == 429 or response.status_code >= 500:
            raise _Retryable(f"{url}: HTTP {response.status_code}: {response.text[:200]}")
        if response.status_code != 200:
            raise EngineError(
                f"the server at {url} refused the page: HTTP {response.status_code}: "
                f"{response.text[:300]}",
                page,
            )
        return _page_text(response.json(), time.monotonic() - started, page)

    async def stop(self) -> None:
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
