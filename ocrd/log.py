"""Structured logging: JSON lines for journald and files, readable lines on a terminal."""

from __future__ import annotations

import logging
import sys
from typing import Literal

import structlog

LogFormat = Literal["auto", "json", "console"]
FilteringBoundLogger = structlog.typing.FilteringBoundLogger


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
    # Libraries that log through the standard library (vLLM, RapidOCR) go to stderr too,
    # but only their warnings: their per-request chatter would drown ocrd's own events.
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    logging.getLogger("RapidOCR").setLevel(logging.WARNING)
    # watchdog warns when its thread is stopped while events are queued: every stop does that.
    logging.getLogger("watchdog").setLevel(logging.ERROR)
    # A malformed request is the client's mistake, answered 400; a traceback a request would
    # let anyone flood the journal (whose rate limit then drops ocrd's own events).
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)


def get_logger(**context: object) -> FilteringBoundLogger:
    logger: FilteringBoundLogger = structlog.get_logger("ocrd").bind(**context)
    return logger
