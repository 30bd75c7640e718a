"""Sending one page to one replica, and sorting what came back.

A page answered is text. Otherwise what happened decides what follows (router.py): the
replica could not be reached or refuses ocrd's key or model (401, 403, 404): it is down and
the page never got there; the server is full (429): wait and send again; the connection
broke or the server failed (5xx) and a quick look finds the replica gone: the page was in
flight at its death (blame.py); the replica still serves: the request failed (the page's
failure, retried); a page refused as invalid (another 4xx) fails at once.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

from ocrd.domain import PageText
from ocrd.engines.base import EngineError, ReplicaState
from ocrd.engines.keepers import REFUSES_US
from ocrd.engines.link import Answer, Dropped, TooLarge, Unreachable
from ocrd.engines.replica import Replica
from ocrd.files.dropped import printable


class Gone(Exception):
    """The replica died, hung or dropped the connection with the page in flight."""


class NeverSent(Exception):
    """The replica could not be reached or refuses ocrd: the page never got to it."""


class Busy(Exception):
    """429: the server is up but full; wait and send again, no retry spent."""


class Failed(Exception):
    """The replica still serves, but this request failed."""


REDIRECT = "ocrd follows no redirect: list the server under the URL that answers itself"
MarkDown = Callable[[Replica, int, str], None]

# What a page's answer can hold, from the `max_tokens` it was sent with. A token decodes to a
# few characters; the longest tokens of BPE vocabularies (runs of spaces or dashes) to a few
# dozen, so 64 characters a token is a ceiling no real answer reaches. In the JSON body a
# character takes at most 6 bytes (a `\uXXXX` escape), and the rest of the answer (ids,
# usage, finish reason) fits in 1 MiB. At the default max_tokens (8192): at most 524,288
# characters of text in at most 4 MiB. More is no model's answer: the request fails.
CHARACTERS_PER_TOKEN = 64
JSON_BYTES_PER_CHARACTER = 6
ANSWER_OVERHEAD_BYTES = 1024 * 1024


def answer_limits(max_tokens: int) -> tuple[int, int]:
    """The most bytes of body and characters of text a page's answer may have."""
    characters = max_tokens * CHARACTERS_PER_TOKEN
    return characters * JSON_BYTES_PER_CHARACTER + ANSWER_OVERHEAD_BYTES, characters


class Sender:
    """Posts pages; `mark_down(replica, generation, problem)` is told of a replica seen down."""

    def __init__(
        self, request_timeout: float, mark_down: MarkDown, strip: tuple[str, ...] = ()
    ) -> None:
        self.request_timeout = request_timeout
        self.strip = strip  # the model's tokens that are no text
        self.mark_down = mark_down
        self._requests = itertools.count(1)

    async def send(
        self, replica: Replica, body: dict[str, Any], page: int, generation: int
    ) -> PageText:
        started = time.monotonic()
        request_id = self.request_id(page)
        max_tokens = int(body["max_tokens"])
        byte_limit, character_limit = answer_limits(max_tokens)
        try:
            answer = await replica.link.post(
                "/chat/completions", body, self.request_timeout, request_id, byte_limit
            )
        except TooLarge as error:
            raise Failed(
                f"{replica.name}: {error}, more than an answer of max_tokens {max_tokens} "
                "can be (it was not read further)"
            ) from None
        except Unreachable as error:
            self.mark_down(replica, generation, str(error))
            raise NeverSent from None
        except Dropped as error:
            raise await self._gone_or_failed(replica, generation, str(error)) from None
        status = answer.status
        if status == 200:
            if answer.data is None:
                raise Failed(f"{replica.name}: the answer is not JSON: {excerpt(answer, 200)}")
            try:
                text = page_text(answer.data, time.monotonic() - started, page, self.strip)
            except EngineError as error:  # the server's fault, as an answer not JSON is
                raise Failed(f"{replica.name}: {error}") from None
            if len(text.text) > character_limit:
                raise Failed(
                    f"{replica.name}: its answer holds {len(text.text):,} characters of text, "
                    f"more than max_tokens {max_tokens} can produce "
                    f"(at most {character_limit:,})"
                )
            return text
        said = f"HTTP {status}: {excerpt(answer, 300)}"
        if 300 <= status < 400:  # not followed (link.py): the server is wrongly listed
            self.mark_down(replica, generation, f"answers with a redirect ({said}); {REDIRECT}")
            raise NeverSent
        if status in REFUSES_US:
            self.mark_down(replica, generation, f"refuses ocrd's {REFUSES_US[status]} ({said})")
            raise NeverSent
        if status == 429:
            raise Busy(said)
        if status >= 500:
            raise await self._gone_or_failed(replica, generation, said)
        raise EngineError(
            f"the server at {replica.link.address} refused page {page}: {said}", page, False
        )

    def request_id(self, page: int) -> str:
        """The next request's id (ocrd's test page takes its ids from here too, so that a
        server cannot tell it from a page by its id)."""
        return f"ocrd-{next(self._requests)}-page-{page}"

    async def _gone_or_failed(self, replica: Replica, generation: int, problem: str) -> Exception:
        """After a broken request: did the replica go down (the page was in flight at its
        death), or does it still serve (the request failed)?"""
        if await self._still_serves(replica, generation):
            return Failed(f"{replica.name}: {problem}")
        self.mark_down(replica, generation, problem)
        return Gone(f"{replica.name}: {problem}")

    async def confirm(self, replica: Replica, generation: int) -> bool:
        """Before a page of a death goes again: does the replica it was given still serve?
        In an outage the replicas die one after another, and ocrd learns of each a moment
        late: a page cut off by the first death must not be sent into the next one's (it
        would count as a second death with it, the evidence against a page that kills)."""
        if await self._still_serves(replica, generation):
            return True
        self.mark_down(replica, generation, "it did not answer a look before a page went again")
        return False

    @staticmethod
    async def _still_serves(replica: Replica, generation: int) -> bool:
        if replica.generation != generation or replica.state is not ReplicaState.ready:
            return False
        # One look per start, however many of its requests broke at once.
        confirming = replica.confirming
        if confirming is None or confirming[0] != generation or confirming[1].done():
            replica.confirming = (generation, asyncio.ensure_future(replica.keeper.alive()))
        assert replica.confirming is not None
        alive = await asyncio.shield(replica.confirming[1])
        return alive and replica.generation == generation


def excerpt(answer: Answer, characters: int) -> str:
    """The start of a server's answer, as it can be shown in a report, a log or a chat
    message: its control characters (a terminal's escapes, a forged new line) written out."""
    return printable(answer.text[:characters])


def page_text(
    answer: dict[str, Any], seconds: float, page: int | None, strip: tuple[str, ...] = ()
) -> PageText:
    """The page's text from a chat completion, without the tokens in `strip`."""
    try:
        choice = answer["choices"][0]
        usage = answer.get("usage") or {}
        content = choice["message"]["content"] or ""
        if not isinstance(content, str):
            raise TypeError(f"its content is {type(content).__name__}, not text")
        for token in strip:
            content = content.replace(token, "")
        return PageText(
            text=content,
            finish_reason=_finish_reason(choice.get("finish_reason")),
            prompt_tokens=_token_count(usage.get("prompt_tokens", 0)),
            completion_tokens=_token_count(usage.get("completion_tokens", 0)),
            seconds=seconds,
        )
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
        raise EngineError(f"the server's answer has no completion: {error!r}", page) from None


# The finish reasons vLLM and OpenAI give; any other word is "unknown" (it becomes a metric's
# label and a summary's key: a server must not make one for each page).
FINISH_REASONS = frozenset(
    ("stop", "length", "repetition", "abort", "error", "content_filter", "tool_calls")
)
MOST_TOKENS = 2**31  # more than any model's context: a count over it is no count


def _finish_reason(value: object) -> str:
    if not value:
        return "abort"
    return value if isinstance(value, str) and value in FINISH_REASONS else "unknown"


def _token_count(value: object) -> int:
    """A usage count: a whole number from 0 to MOST_TOKENS (it is added to metrics)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MOST_TOKENS:
        raise ValueError(f"a token count of {str(value)[:40]!r} is not a number of tokens")
    return value
