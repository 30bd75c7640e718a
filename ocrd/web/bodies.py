"""Reading a request's body, for every route that takes one (uploads, the docling API):
the client must keep sending (nothing for `header_timeout_seconds` drops it), a form field
is short, and a file is streamed into its inbox in pieces, never held in memory, and left
there only once it is complete.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import BodyPartReader

from ocrd.config import HttpConfig
from ocrd.uploads.receiving import Receiving, UploadRefused, clean_filename
from ocrd.uploads.uploads import Uploads

WRITE_BYTES = 1024 * 1024  # written to disk at a time, in a thread
MAX_FIELD_BYTES = 4096  # a form field other than the file


class RequestBodies:
    """Request bodies read under the HTTP server's limits, files into the inboxes."""

    def __init__(self, uploads: Uploads, config: HttpConfig) -> None:
        self.uploads = uploads
        self.config = config

    async def idle_limited(self, read: Callable[[], Awaitable[Any]]) -> Any:
        """`read()`, unless the client sends nothing for `header_timeout_seconds`."""
        idle = self.config.header_timeout_seconds
        try:
            async with asyncio.timeout(idle):
                return await read()
        except TimeoutError:
            raise UploadRefused(
                408, f"nothing arrived for {idle:g} s (header_timeout_seconds); dropped"
            ) from None

    async def field(self, part: BodyPartReader) -> str:
        """A form field's value (UploadRefused where it is too long)."""
        value = b""
        while chunk := await self.idle_limited(lambda: part.read_chunk(MAX_FIELD_BYTES)):
            value += chunk
            if len(value) > MAX_FIELD_BYTES:
                raise UploadRefused(400, f"the form field {part.name!r} is too long")
        return value.decode("utf-8", "replace")

    def too_large(self) -> str:
        return (
            f"the file is larger than this server takes (max_upload_mb: "
            f"{self.config.max_upload_mb:g})"
        )

    async def store(
        self,
        inbox_name: str | None,
        filename: str | None,
        read: Callable[[], Awaitable[bytes]],
        before_commit: Callable[[Receiving], Awaitable[None]] | None = None,
    ) -> Receiving:
        """Stream the file into its inbox; whatever goes wrong, nothing is left there.
        `before_commit` runs once the file is complete and before it is in the inbox (an
        upload's answer is made then, a task's record written): the commit is the last
        step."""
        inbox = self.uploads.inbox_for(inbox_name)
        name = clean_filename(filename)
        receiving = await asyncio.to_thread(self.uploads.begin, inbox, name, filename)
        limit = self.config.max_upload_bytes
        try:
            pending = bytearray()
            while chunk := await self.idle_limited(read):
                if receiving.size + len(pending) + len(chunk) > limit:
                    raise UploadRefused(413, self.too_large())
                pending += chunk
                if len(pending) >= WRITE_BYTES:
                    await asyncio.to_thread(receiving.write, pending)
                    pending = bytearray()
            if pending:
                await asyncio.to_thread(receiving.write, pending)
            if receiving.size == 0:
                raise UploadRefused(400, "the file is empty")
            if before_commit is not None:
                await before_commit(receiving)
            await asyncio.to_thread(receiving.commit)
        except BaseException:
            cleanup = asyncio.ensure_future(asyncio.to_thread(receiving.abort))
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(cleanup)  # finished even if this task is cancelled
            raise
        return receiving
