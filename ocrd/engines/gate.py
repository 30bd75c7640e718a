"""The self-check gate: a replica gets pages only once it has read ocrd's test page
(selfcheck.py), at its start and after each restart or reconnection, and again at
unannounced times while it serves (supervision.py). One that answers without reading it is
garbled; one that does not answer is not up yet.

The test page goes as a page goes: the same request body (the prompt of the pages sent
lately, the pages' max_tokens) and an id from the pages' own sequence with a page number,
no header of its own; so a server cannot answer the check well and the work badly by
telling them apart by the request. Nor by the picture: each check is a page drawn afresh
(selfcheck.draw_check), judged by the words drawn for it."""

from __future__ import annotations

import asyncio
import random
import re
import time
from collections.abc import Callable
from typing import Any

from PIL import Image

from ocrd.config import PromptMode
from ocrd.engines import selfcheck
from ocrd.engines.base import EngineError, SelfCheckResult
from ocrd.engines.keepers import ReplicaUnavailable
from ocrd.engines.link import Answer, LinkError
from ocrd.engines.media import PageMedia
from ocrd.engines.recipes import default_model, prompt_for
from ocrd.engines.replica import Replica
from ocrd.engines.sending import excerpt, page_text
from ocrd.files.dropped import printable
from ocrd.models import Model

RequestBody = Callable[[str, str], dict[str, Any]]  # (image URL, prompt) -> request body
RequestId = Callable[[int], str]  # page number -> the next request's id
PAGE_NUMBERS = 30  # the test page passes for page 1 to this of some document


class SelfCheckGate:
    def __init__(
        self,
        request_body: RequestBody,
        request_id: RequestId,
        recent_mode: Callable[[], PromptMode],
        request_timeout: float,
        what_to_do: str,
        recipe: Model | None = None,
    ) -> None:
        # The model's own prompt, and its parser to read the answer before it is judged.
        self.recipe = recipe or default_model()
        self.request_body = request_body
        self.request_id = request_id
        self.recent_mode = recent_mode  # the prompt mode of the pages sent lately
        self.request_timeout = request_timeout
        self.what_to_do = what_to_do
        self._prepare: Callable[[Image.Image], PageMedia] | None = None
        self._draws = random.SystemRandom()

    async def open(self, prepare: Callable[[Image.Image], PageMedia]) -> None:
        """Take the form the replicas take pages in (each check's page is drawn anew)."""
        self._prepare = prepare

    def close(self) -> None:
        self._prepare = None

    async def read_test_page(self, replica: Replica) -> SelfCheckResult:
        """How well the replica reads a freshly drawn test page; ReplicaUnavailable if it
        does not answer."""
        assert self._prepare is not None
        page = await asyncio.to_thread(selfcheck.draw_check, self._draws)
        media = await asyncio.to_thread(self._prepare, page.image)
        try:
            body = self.request_body(media.url, prompt_for(self.recipe, self.recent_mode()))
            started = time.monotonic()
            request_id = self.request_id(self._draws.randint(1, PAGE_NUMBERS))
            answer = await self._post(replica, body, request_id)
        finally:
            media.release()
        if answer.status != 200 or answer.data is None:
            raise ReplicaUnavailable(
                f"ocrd's test page was answered HTTP {answer.status}: {excerpt(answer, 200)}"
            )
        try:
            text = page_text(answer.data, 0.0, None, self.recipe.sampling.strip).text
        except EngineError as error:
            raise ReplicaUnavailable(f"ocrd's test page: {error}") from None
        # Judged on what the model's parser reads from the answer: its markup never counts.
        blocks = self.recipe.blocks(text, page.image.size)
        score = page.score("\n".join(block.content for block in blocks))
        version = await self._version_of(replica)
        return SelfCheckResult(
            passed=score.passed,
            words_found=score.found,
            words_expected=score.expected,
            seconds=time.monotonic() - started,
            at=time.time(),
            answer=printable(re.sub(r"\s+", " ", text)[:200]),
            vllm_version=version,
        )

    async def _post(self, replica: Replica, body: dict[str, Any], request_id: str) -> Answer:
        try:
            return await replica.link.post(
                "/chat/completions", body, self.request_timeout, request_id
            )
        except LinkError as error:
            raise ReplicaUnavailable(f"no answer to ocrd's test page: {error}") from None

    @staticmethod
    async def _version_of(replica: Replica) -> str | None:
        if replica.vllm_version is not None:
            return replica.vllm_version()
        try:
            answer = await replica.link.get("/version", root=True)
        except LinkError:
            return None
        version = (answer.data or {}).get("version") if answer.status == 200 else None
        return str(version) if version else None

    def next_recheck(self, mean_seconds: float) -> float:
        """Seconds until a serving replica's next unannounced check: drawn between half and
        one and a half times the mean, so that a server cannot expect it."""
        return self._draws.uniform(0.5 * mean_seconds, 1.5 * mean_seconds)

    def garbled_problem(self, replica: Replica, result: SelfCheckResult) -> str:
        version = f"vLLM {result.vllm_version}" if result.vllm_version else "its vLLM"
        return (
            f"{replica.name} answers but its output is garbled: it read "
            f"{result.words_found} of {result.words_expected} words of ocrd's test page "
            f"({version}; it wrote: {result.answer[:80]!r}). "
            f"{self.what_to_do}"
        ).strip()
