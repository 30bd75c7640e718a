"""A request and its reply through a render worker's socket, on the event loop.

The worker reads and writes its end as a `multiprocessing.connection.Connection` (a pickle
behind a length header); the daemon's end is the same socket, non-blocking, read as the
reply arrives (`loop.sock_recv`) instead of in a thread waiting on it: a thread hop costs
the daemon's one Python thread more than the page's reply itself. The framing is that of
`Connection.send_bytes`: a 4-byte big-endian length, or -1 and an 8-byte length beyond 2 GiB.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from typing import Any

SHORT = struct.Struct("!i")
LONG = struct.Struct("!Q")
CHUNK = 1 << 16


def frame(message: Any) -> bytes:
    """`message` as the worker's `Connection.recv` reads it."""
    body = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(body) > 0x7FFFFFFF:
        return SHORT.pack(-1) + LONG.pack(len(body)) + body
    return SHORT.pack(len(body)) + body


def _sizes(received: bytearray) -> tuple[int, int] | None:
    """(header, body) lengths of the frame being read, once its header is in."""
    if len(received) < SHORT.size:
        return None
    size = SHORT.unpack_from(received)[0]
    if size != -1:
        return SHORT.size, size
    if len(received) < SHORT.size + LONG.size:
        return None
    return SHORT.size + LONG.size, LONG.unpack_from(received, SHORT.size)[0]


async def exchange(sock: socket.socket, request: Any) -> Any:
    """Send `request` and read the one reply to it. EOFError where the worker's end
    closed (it died) before the whole reply came. Run it to its end (shielded): a frame
    half sent or half read would put the next request out of step."""
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, frame(request))
    received = bytearray()
    sizes = None
    while sizes is None or len(received) < sum(sizes):
        # The rest of a frame whose length is known, in one read (a page's pixels that did
        # not fit the shared buffer come this way).
        wanted = CHUNK if sizes is None else max(CHUNK, sum(sizes) - len(received))
        chunk = await loop.sock_recv(sock, wanted)
        if not chunk:
            raise EOFError("the render worker closed its end")
        received += chunk
        sizes = _sizes(received)
    header, body = sizes
    return pickle.loads(memoryview(received)[header : header + body])
