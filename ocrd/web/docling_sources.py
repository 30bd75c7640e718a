"""The sources of `POST /v1/convert/source`: a file sent as base64, or an `http` source
fetched by ocrd, which is off unless `http.docling.url_hosts` lists the URL's host.

A URL source never reaches an internal address: every address its host resolves to must be
public (not loopback, private, link-local, multicast or reserved), unless the list names
that address itself (`127.0.0.1`, a deliberate choice of the operator); redirects are not
followed (a redirect could lead anywhere); the body is limited to `max_upload_mb` and the
whole fetch to `upload_timeout_seconds`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

import httpx

from ocrd.config import InboxConfig
from ocrd.uploads.receiving import Receiving, UploadRefused, clean_filename
from ocrd.uploads.tasks import TaskOptions, register, remove_record, write_record
from ocrd.uploads.uploads import Uploads
from ocrd.web.docling_body import SPOOLED

FETCH_CHUNK_BYTES = 256 * 1024
COPY_BYTES = 1024 * 1024  # a spooled file copied into the inbox at a time
_LINE_BREAKS = str.maketrans("", "", "\n\r\t")


@dataclass(frozen=True)
class Fetched:
    """A source's file: its bytes, or a file on disk holding them (a spooled base64)."""

    name: str
    data: bytes = b""
    file: BinaryIO | None = None

    def pieces(self) -> Iterator[bytes]:
        """Its bytes, a piece at a time. Blocking."""
        if self.file is None:
            yield self.data
            return
        while piece := self.file.read(COPY_BYTES):
            yield piece


def file_source(source: dict[str, Any], max_bytes: int, spool: BinaryIO) -> Fetched:
    """A `file` source: its base64 content decoded (a long one already was, into
    `spool`, as the request arrived: `ocrd/web/docling_body.py`)."""
    encoded = source.get("base64_string")
    name = source.get("filename")
    if not isinstance(encoded, str) or not isinstance(name, str):
        raise UploadRefused(422, "a file source needs 'base64_string' and 'filename'")
    if encoded == SPOOLED:
        if os.fstat(spool.fileno()).st_size > max_bytes:
            raise UploadRefused(413, "the file is larger than this server takes (max_upload_mb)")
        return Fetched(name, file=spool)
    if len(encoded) > max_bytes * 4 // 3 + 4:
        raise UploadRefused(413, "the file is larger than this server takes (max_upload_mb)")
    try:  # line breaks that encoders put in base64 are left out, as from a long one
        data = base64.b64decode(encoded.translate(_LINE_BREAKS), validate=True)
    except (binascii.Error, ValueError):
        raise UploadRefused(422, f"the base64 content of {name!r} is malformed") from None
    if not data:
        raise UploadRefused(400, "the file is empty")
    return Fetched(name, data)


def _public(address: str) -> bool:
    return ipaddress.ip_address(address.split("%")[0]).is_global


async def resolve(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to (the system's resolver)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(address[0]) for *_, address in infos]


async def _checked_address(host: str, port: int, allowed: tuple[str, ...]) -> str:
    """The address to fetch from: UploadRefused unless the host is listed and resolves to no
    internal address. The fetch connects to this address, not to what a second lookup of
    the name might say (a name that resolves public at the check and internal at the
    fetch, DNS rebinding, reaches nothing internal)."""
    listed = {entry.lower().strip("[]") for entry in allowed}
    if host.lower() not in listed:
        why = (
            "URL sources are off (http.docling.url_hosts is empty)"
            if not allowed
            else (f"its host {host!r} is not in http.docling.url_hosts")
        )
        raise UploadRefused(422, f"the http source is refused: {why}")
    try:
        addresses = await resolve(host, port)
    except OSError as error:
        raise UploadRefused(422, f"the http source's host {host!r} is unknown: {error}") from None
    for ip in addresses:
        if not _public(ip) and ip not in listed:
            raise UploadRefused(
                422,
                f"the http source's host {host!r} resolves to the internal address {ip}; ocrd "
                "fetches only from public addresses (or one http.docling.url_hosts names)",
            )
    if not addresses:
        raise UploadRefused(422, f"the http source's host {host!r} resolves to no address")
    return addresses[0]


def _to_address(parts: SplitResult, address: str) -> str:
    """The URL with its host replaced by the address checked (the name goes as Host and,
    for https, as the name the certificate must carry)."""
    host = f"[{address}]" if ":" in address else address
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


async def url_source(
    source: dict[str, Any], allowed: tuple[str, ...], max_bytes: int, timeout: float
) -> Fetched:
    """An `http` source fetched, within the limits above."""
    url = source.get("url")
    if not isinstance(url, str):
        raise UploadRefused(422, "an http source needs a 'url'")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UploadRefused(422, f"the http source {url!r} is no http(s) URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as malformed:  # a port out of range, or not a number
        raise UploadRefused(422, f"the http source {url!r} is malformed: {malformed}") from None
    address = await _checked_address(parts.hostname, port, allowed)
    headers = source.get("headers") or {}
    if not isinstance(headers, dict):
        raise UploadRefused(422, "an http source's 'headers' must be an object")
    sent = {str(k): str(v) for k, v in headers.items() if str(k).lower() != "host"}
    sent["Host"] = parts.netloc.rsplit("@", 1)[-1]
    try:
        async with (
            asyncio.timeout(timeout),
            httpx.AsyncClient(follow_redirects=False, timeout=timeout) as client,
            client.stream(
                "GET",
                _to_address(parts, address),
                headers=sent,
                extensions={"sni_hostname": parts.hostname},
            ) as answer,
        ):
            if answer.status_code != 200:
                raise UploadRefused(
                    422,
                    f"fetching {url!r} was answered {answer.status_code} "
                    "(redirects are not followed)",
                )
            data = bytearray()
            async for chunk in answer.aiter_bytes(FETCH_CHUNK_BYTES):
                data += chunk
                if len(data) > max_bytes:
                    raise UploadRefused(
                        413, f"{url!r} is larger than this server takes (max_upload_mb)"
                    )
    except (httpx.HTTPError, TimeoutError) as error:
        raise UploadRefused(422, f"fetching {url!r} failed: {error or 'too slow'}") from None
    if not data:
        raise UploadRefused(422, f"{url!r} answered an empty file")
    name = unquote(parts.path.rsplit("/", 1)[-1]) or "download"
    return Fetched(name, bytes(data))


def write_fetched(
    uploads: Uploads, inbox: InboxConfig, fetched: Fetched, record: TaskOptions
) -> Receiving:
    """A source's file written into the inbox as an upload with its task record, or
    nothing of it left. Blocking."""
    receiving = uploads.begin(inbox, clean_filename(fetched.name), fetched.name)
    try:
        for piece in fetched.pieces():
            receiving.write(piece)
        write_record(receiving.folder, record)
        register(inbox, receiving.id, record)
        receiving.commit()
    except BaseException:
        receiving.abort()
        remove_record(inbox, receiving.id)
        raise
    return receiving
