"""How rendering fails: a message for people, a short reason for metrics."""

from __future__ import annotations

from enum import StrEnum


class RenderFailure(StrEnum):
    """Why a document or page could not be read (the `reason` label of the metrics)."""

    empty = "empty"
    unsupported = "unsupported"
    damaged = "damaged"
    encrypted = "encrypted"
    no_pages = "no_pages"
    too_large = "too_large"
    image = "image"
    timeout = "timeout"
    crashed = "crashed"
    out_of_memory = "out_of_memory"
    unreadable = "unreadable"
    hostile = "hostile"  # an office document's macros, XML entities or outside links
    error = "error"


class RenderError(Exception):
    """A document or one of its pages could not be rendered."""

    def __init__(
        self, message: str, page: int | None = None, code: RenderFailure = RenderFailure.error
    ) -> None:
        super().__init__(message)
        self.page = page
        self.code = RenderFailure(code)
