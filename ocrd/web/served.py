"""Serving a document's output files over HTTP: each opened without following a link
(`Outputs.open`), read in a thread a piece at a time, never held whole in memory. The
Markdown of a split document's parts is served as one, each part after a comment naming it.
"""

from __future__ import annotations

import asyncio
import mimetypes
import os
from collections.abc import Sequence
from urllib.parse import quote

from aiohttp import web

from ocrd.files.dropped import printable
from ocrd.web.documents import Outputs

READ_BYTES = 256 * 1024  # read from a file at a time
CONTENT_TYPES = {
    ".md": "text/markdown; charset=utf-8",
    ".json": "application/json",
    ".jsonl": "application/x-ndjson",
}


class MissingOutput(Exception):
    """A file asked for is not among the document's outputs (any more)."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


async def serve(
    request: web.Request, outputs: Outputs, *files: Sequence[str]
) -> web.StreamResponse:
    """Output files, read in a thread a piece at a time; never through a link. Several
    (the parts' Markdown of a split document) follow each other, each introduced by a
    comment naming its part."""
    opened: list[tuple[bytes, int, int]] = []  # (introduction, descriptor, size)
    try:
        for number, parts in enumerate(files, start=1):
            try:
                fd, size = await asyncio.to_thread(_opened, outputs, parts)
            except OSError:
                raise MissingOutput("/".join(parts)) from None
            opened.append((_introduction(number, len(files), parts[-1]), fd, size))
        name = files[0][-1] if len(files) == 1 else "markdown.md"
        response = web.StreamResponse(
            headers={
                "Content-Type": _content_type(name),
                "X-Content-Type-Options": "nosniff",
                "Content-Disposition": f"inline; filename*=UTF-8''{quote(printable(name))}",
            }
        )
        response.content_length = sum(len(text) + size for text, _, size in opened)
        response.force_close()
        await response.prepare(request)
        for text, fd, size in opened:
            await response.write(text)
            await _copy(fd, size, response)
        await response.write_eof()
        return response
    finally:
        for _, fd, _ in opened:
            await asyncio.to_thread(os.close, fd)


def _introduction(number: int, count: int, name: str) -> bytes:
    """What comes before a part's Markdown served with the others: nothing for a single
    file; a comment naming the part (and a blank line after the part before)."""
    if count == 1:
        return b""
    gap = b"\n\n" if number > 1 else b""
    return gap + f"<!-- part {number} of {count}: {printable(name)} -->\n\n".encode()


async def _copy(fd: int, size: int, response: web.StreamResponse) -> None:
    """`size` bytes of `fd` to the response, a piece at a time, read in a thread."""
    left = size
    while left > 0:
        chunk = await asyncio.to_thread(os.read, fd, min(READ_BYTES, left))
        if not chunk:
            break
        await response.write(chunk)
        left -= len(chunk)


def _opened(outputs: Outputs, parts: Sequence[str]) -> tuple[int, int]:
    fd = outputs.open(parts)
    return fd, os.fstat(fd).st_size


def _content_type(name: str) -> str:
    suffix = name[name.rfind(".") :].lower() if "." in name else ""
    return CONTENT_TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"
