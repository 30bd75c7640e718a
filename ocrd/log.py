"""Structured logging: JSON lines for journald and files, readable lines on a terminal.

Every line ocrd writes is an event: its own (structlog), and what libraries log through
the standard library (aiohttp, asyncio, RapidOCR, vLLM in-process) and Python's warnings,
which become `library.log` and `python.warning` events with the logger's name and the
message made printable. A library that adds a handler of its own writing to the terminal
(RapidOCR's coloured one) or stops its records from reaching ocrd's handler has neither
effect: loggers made after `configure_logging` are `_LibraryLogger`s, and those made
before are set right there.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

LogFormat = Literal["auto", "json", "console"]
FilteringBoundLogger = structlog.typing.FilteringBoundLogger
LIBRARY_LEVEL = logging.WARNING  # libraries' per-request chatter would drown ocrd's events
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colours and cursor moves
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class _LibraryLogger(logging.Logger):
    """A library's logger whose records always reach ocrd's handler, and which takes no
    handler that would write to the terminal by itself (files and the like it keeps)."""

    @property
    def propagate(self) -> bool:
        return True

    @propagate.setter
    def propagate(self, value: bool) -> None:
        pass  # a library's `propagate = False` would hide its warnings from the journal

    def addHandler(self, handler: logging.Handler) -> None:
        if not _writes_to_terminal(handler):
            super().addHandler(handler)


def _writes_to_terminal(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and not isinstance(
        handler, logging.FileHandler
    )


# A library's message may hold what it was given: watchdog's warning about a watch held
# every path under the inbox (200 KB a line once a member had renamed folders in a loop),
# past what journald keeps of a line (48 KB) and enough to bury the events around it.
MAX_LIBRARY_MESSAGE_CHARS = 2000


def _adopt_existing_loggers() -> None:
    """Loggers libraries made before logging was configured: the same as `_LibraryLogger`."""
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if isinstance(logger, logging.Logger) and not isinstance(logger, _LibraryLogger):
            logger.propagate = True
            for handler in [h for h in logger.handlers if _writes_to_terminal(h)]:
                logger.removeHandler(handler)


def _library_event(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """A record of the standard library's logging as an event of ocrd's own kind."""
    record = event.get("_record")
    name = record.name if record is not None else "?"
    message = _CONTROLS.sub(" ", _ANSI.sub("", str(event.get("event", "")))).strip()
    if len(message) > MAX_LIBRARY_MESSAGE_CHARS:
        cut = len(message) - MAX_LIBRARY_MESSAGE_CHARS
        message = f"{message[:MAX_LIBRARY_MESSAGE_CHARS]} ... ({cut} characters more left out)"
    event["event"] = "python.warning" if name == "py.warnings" else "library.log"
    event["logger"] = name
    event["message"] = message
    return event


def configure_logging(fmt: LogFormat = "auto", level: str = "info") -> None:
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    _route_libraries(renderer)


def _route_libraries(renderer: structlog.typing.Processor) -> None:
    """The standard library's logging (and Python's warnings) into the same stream, as
    events, at warning level and above."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(LIBRARY_LEVEL)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                _library_event,
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(LIBRARY_LEVEL)
    logging.setLoggerClass(_LibraryLogger)
    _adopt_existing_loggers()
    logging.captureWarnings(True)
    # watchdog warns when its thread is stopped while events are queued: every stop does that.
    logging.getLogger("watchdog").setLevel(logging.ERROR)
    # A malformed request is the client's mistake, answered 400; a traceback a request would
    # let anyone flood the journal (whose rate limit then drops ocrd's own events).
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)


def get_logger(**context: object) -> FilteringBoundLogger:
    logger: FilteringBoundLogger = structlog.get_logger("ocrd").bind(**context)
    return logger
