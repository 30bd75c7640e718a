"""Signals that arrive before the daemon's event loop can take them.

`systemctl reload` may send SIGHUP right after the process starts, and SIGHUP's default
action ends the process. So `ocrd run` records SIGHUP, SIGTERM and SIGINT from its first
lines on, and the daemon acts on what was recorded once its own handlers are in place.
"""

from __future__ import annotations

import signal
from types import FrameType

HANDLED = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)


class EarlySignals:
    def __init__(self) -> None:
        self._received: list[int] = []

    def install(self) -> EarlySignals:
        for signum in HANDLED:
            signal.signal(signum, self._record)
        return self

    def _record(self, signum: int, _: FrameType | None) -> None:
        self._received.append(signum)

    def take(self) -> list[int]:
        """The signals recorded so far, in order; recording goes on until the event loop's
        handlers replace these."""
        received, self._received = self._received, []
        return received
