"""ocrd's HTTP connection to one OpenAI-compatible server (`vllm serve`, or ocrd's simulated
replica), over TCP or a Unix socket.

aiohttp rather than httpx: on the daemon's one core it costs about 0.13 ms of CPU a request
against httpx's 0.7 ms (benchmarks/replicas.py --transport). Failures are sorted into what
the router needs to know: the server could not be reached at all (the page never left),
the connection broke or timed out with the page in flight, or the server answered with an
HTTP status.
"""

from __future__ import annotations

import functools
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

PROBE_TIMEOUT_SECONDS = 10.0
# Below uvicorn's keep-alive (vLLM's default 5 s), so that ocrd never sends a page on a
# connection the server has just closed (which would look like a drop with the page in it).
KEEPALIVE_SECONDS = 4.0
# An answer is read into memory only up to a limit: a server that sends more (a hostile or
# broken one) fails that request, never the daemon's memory. Probes, lists and metrics are
# small; a page's answer gets its own limit from its `max_tokens` (sending.py).
DEFAULT_LIMIT_BYTES = 4 * 1024 * 1024
READ_CHUNK_BYTES = 64 * 1024


class LinkError(Exception):
    """A request to the server did not get an answer."""


class Unreachable(LinkError):
    """No connection could be made: the page never reached the server."""


class Dropped(LinkError):
    """The connection broke, or no answer came in time, with the request in flight."""


class TooLarge(LinkError):
    """The server's answer was longer than the request's limit; it was not read further."""

    def __init__(self, limit: int, request: str) -> None:
        super().__init__(f"its answer to {request} was longer than the limit of {limit:,} bytes")
        self.limit = limit


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    location: str | None = None  # a redirect's Location header (never followed)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    @functools.cached_property
    def data(self) -> dict[str, Any] | None:
        """The body as a JSON object; None if it is not one."""
        try:
            data = json.loads(self.body)
        except ValueError:
            return None
        return data if isinstance(data, dict) else None


class ServerLink:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        socket: Path | None = None,
        connections: int = 100,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")  # ".../v1"
        self.root = self.base_url.removesuffix("/v1")  # /health, /metrics, /version live here
        self.api_key = api_key
        self.socket = socket
        self.connections = connections
        self.tls = tls  # None: the system's CAs (https URLs are always verified)
        self._session: aiohttp.ClientSession | None = None

    @property
    def address(self) -> str:
        return f"unix:{self.socket}" if self.socket is not None else self.base_url

    def open(self) -> None:
        if self._session is not None:
            return
        connector: aiohttp.BaseConnector
        if self.socket is not None:
            connector = aiohttp.UnixConnector(
                path=str(self.socket), limit=self.connections, keepalive_timeout=KEEPALIVE_SECONDS
            )
        else:
            connector = aiohttp.TCPConnector(
                limit=self.connections,
                keepalive_timeout=KEEPALIVE_SECONDS,
                ssl=self.tls if self.tls is not None else True,
            )
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        self._session = aiohttp.ClientSession(connector=connector, headers=headers)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def reset(self) -> None:
        """Drop pooled connections (a restarted server is a new server)."""
        await self.close()
        self.open()

    async def post(
        self,
        path: str,
        body: dict[str, Any],
        timeout: float,
        request_id: str | None = None,
        limit: int = DEFAULT_LIMIT_BYTES,
    ) -> Answer:
        headers = {"X-Request-Id": request_id} if request_id else None
        url = f"{self.base_url}{path}"
        return await self._request("POST", url, timeout, limit, body, headers)

    async def get(
        self,
        path: str,
        timeout: float = PROBE_TIMEOUT_SECONDS,
        root: bool = False,
        limit: int = DEFAULT_LIMIT_BYTES,
    ) -> Answer:
        base = self.root if root else self.base_url
        return await self._request("GET", f"{base}{path}", timeout, limit)

    async def _request(
        self,
        method: str,
        url: str,
        timeout: float,
        limit: int,
        body: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> Answer:
        if self._session is None:
            self.open()
        assert self._session is not None
        try:
            async with self._session.request(
                method,
                url,
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout, connect=min(timeout, 10.0)),
                # A redirect would carry the page (and, to the same host, the key) to a
                # server the trusted set never judged: a 3xx is an answer, not a way on.
                allow_redirects=False,
            ) as response:
                body_read = await _read_bounded(response, limit, f"{method} {url}")
                return Answer(response.status, body_read, response.headers.get("Location"))
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as error:
            raise Unreachable(_describe(error)) from error
        except FileNotFoundError as error:  # a Unix socket not there (yet)
            raise Unreachable(_describe(error)) from error
        except TimeoutError as error:
            raise Dropped(f"no answer within {timeout:g} s") from error
        except (aiohttp.ClientError, ConnectionError) as error:
            raise Dropped(_describe(error)) from error


async def _read_bounded(response: aiohttp.ClientResponse, limit: int, request: str) -> bytes:
    """The body, read in chunks as it arrives (within the request's total timeout), given
    up as soon as it is longer than `limit`: at most `limit` plus one chunk is ever held."""
    if response.content_length is not None and response.content_length > limit:
        raise TooLarge(limit, request)
    body = bytearray()
    async for chunk in response.content.iter_chunked(READ_CHUNK_BYTES):
        body += chunk
        if len(body) > limit:
            raise TooLarge(limit, request)
    return bytes(body)


def _describe(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
