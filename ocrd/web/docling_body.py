"""The JSON body of `POST /v1/convert/source`, read as it arrives: its one long string (the
file's `base64_string`) is decoded piece by piece into a file on disk, and the rest of the
JSON, small, is kept to be parsed. A file sent as base64 never lies in memory whole (let
alone three times: the body, the JSON string, the decoded bytes).

The rest of the JSON is limited to `max_bytes` and to `MAX_DEPTH` levels of nesting, so
that parsing it is cheap and never overflows a stack; only one string may be longer than
`LONG_STRING` bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

from ocrd.uploads.receiving import UploadRefused

LONG_STRING = 64 * 1024  # a string longer than this is taken for the file's base64
MAX_DEPTH = 64  # nesting of the JSON's objects and lists
SPOOLED = "\x00ocrd: the long string, decoded on disk\x00"  # stands in for it in the JSON
_STRING_STOP = re.compile(rb'["\\]')
_WHITESPACE_ESCAPE = re.compile(rb"\\[nrt]")


class Base64Sink:
    """Decodes base64 given in pieces (as a JSON string's raw content) into a file."""

    def __init__(self, file: BinaryIO) -> None:
        self.file = file
        self.rest = b""  # characters short of a group of four
        self.size = 0
        # Why the string is no base64, told once the JSON says which string it was.
        self.malformed: str | None = None

    def feed(self, raw: bytes) -> None:
        if self.malformed:
            return
        text = raw.replace(b"\\/", b"/")
        if b"\\" in text:  # line breaks that encoders put in base64 are left out
            text = _WHITESPACE_ESCAPE.sub(b"", text)
            if b"\\" in text:
                self.malformed = "it holds an escaped character base64 has not"
                return
        text = self.rest + text
        whole = len(text) // 4 * 4
        self._decode(text[:whole])
        self.rest = text[whole:]

    def close(self) -> None:
        if self.rest and not self.malformed:
            self.malformed = "it is cut short (its length is no multiple of 4)"

    def _decode(self, text: bytes) -> None:
        try:
            data = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            self.malformed = "it holds characters base64 has not"
            return
        self.file.write(data)
        self.size += len(data)


class BodyScanner:
    """Splits a JSON body, fed in pieces, into the JSON without its long string
    (`skeleton`, the string replaced by `SPOOLED`) and that string decoded into `file`."""

    def __init__(self, file: BinaryIO, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.skeleton = bytearray()
        self.sink = Base64Sink(file)
        self.spooled = False  # the long string was seen (and decoded)
        self._in_string = False
        self._long = False  # the string now read is the long one
        self._string = bytearray()
        self._carry = b""  # a backslash at the end of a piece, waiting for its escape
        self._depth = 0

    def feed(self, data: bytes) -> None:
        data, self._carry = self._carry + data, b""
        at = 0
        while at < len(data):
            if not self._in_string:
                quote = data.find(b'"', at)
                end = len(data) if quote < 0 else quote
                self._structure(data[at:end])
                if quote < 0:
                    return
                self._in_string, at = True, quote + 1
                continue
            stop = _STRING_STOP.search(data, at)
            if stop is None:
                self._content(data[at:])
                return
            if stop.group() == b"\\":
                if stop.start() + 1 >= len(data):  # its escaped character comes next
                    self._content(data[at : stop.start()])
                    self._carry = data[stop.start() :]
                    return
                self._content(data[at : stop.start() + 2])
                at = stop.start() + 2
                continue
            self._content(data[at : stop.start()])
            self._end_string()
            at = stop.start() + 1

    def close(self) -> bytes:
        """The JSON without its long string. UploadRefused where the body ended inside a
        string."""
        if self._in_string or self._carry:
            raise UploadRefused(422, "the body is no JSON: it ends inside a string")
        return bytes(self.skeleton)

    def _structure(self, piece: bytes) -> None:
        for byte in piece:  # only the JSON's punctuation: small
            if byte in b"[{":
                self._depth += 1
                if self._depth > MAX_DEPTH:
                    raise UploadRefused(422, f"the JSON is nested deeper than {MAX_DEPTH} levels")
            elif byte in b"]}":
                self._depth -= 1
        self._keep(piece)

    def _content(self, piece: bytes) -> None:
        if self._long:
            self.sink.feed(piece)
            return
        self._string += piece
        if len(self._string) > LONG_STRING:
            if self.spooled:
                raise UploadRefused(
                    413,
                    f"only the file's base64_string may be longer than {LONG_STRING // 1024} KB",
                )
            self._long = True
            self.sink.feed(bytes(self._string))
            self._string.clear()

    def _end_string(self) -> None:
        if self._long:
            self.sink.close()
            self._keep(b'"' + SPOOLED.encode().replace(b"\x00", b"\\u0000") + b'"')
            self._long, self.spooled = False, True
        else:
            self._keep(b'"' + self._string + b'"')
            self._string.clear()
        self._in_string = False

    def _keep(self, piece: bytes) -> None:
        self.skeleton += piece
        if len(self.skeleton) > self.max_bytes:
            raise UploadRefused(
                413,
                f"the request's JSON, apart from the file's base64_string, is larger than "
                f"{self.max_bytes // 1024} KB",
            )


async def read_json_body(
    read: Callable[[], Awaitable[bytes]], spool: BinaryIO, limit: int, max_json: int
) -> dict[str, Any]:
    """A source request's JSON object, its long string decoded into `spool` (`SPOOLED`
    in its place); UploadRefused naming what is wrong with it."""
    scanner = BodyScanner(spool, max_json)
    size = 0
    while chunk := await read():
        size += len(chunk)
        if size > limit:
            raise UploadRefused(413, "the request is larger than this server takes (max_upload_mb)")
        scanner.feed(chunk)
    try:
        payload = json.loads(scanner.close())
    except (ValueError, RecursionError) as error:
        raise UploadRefused(422, f"the body is no JSON: {error}") from None
    if not isinstance(payload, dict):
        raise UploadRefused(422, "the body must be a JSON object")
    if scanner.spooled:
        _check_spooled(payload, scanner.sink)
    spool.flush()
    spool.seek(0)
    return payload


def _check_spooled(payload: dict[str, Any], sink: Base64Sink) -> None:
    """UploadRefused unless the long string was the file's base64, and base64."""
    where = _spooled_at(payload)
    if where != "sources.0.base64_string":
        raise UploadRefused(
            422,
            f"{where} is longer than {LONG_STRING // 1024} KB; only a file source's "
            "base64_string may be",
        )
    if sink.malformed:
        raise UploadRefused(422, f"the base64_string of the file is malformed: {sink.malformed}")


def _spooled_at(value: Any, path: str = "") -> str | None:
    """Where in the JSON the long string stood, as `key.0.key`."""
    if value == SPOOLED:
        return path or "the body"
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, item in items:
        found = _spooled_at(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None
