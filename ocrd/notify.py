"""systemd notifications (sd_notify): readiness, status line, watchdog pings, stopping.

Without NOTIFY_SOCKET in the environment (not started by systemd) every call does nothing.
"""

from __future__ import annotations

import os
import time

import sdnotify


class SystemdNotifier:
    def __init__(self) -> None:
        self._enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._notifier = sdnotify.SystemdNotifier() if self._enabled else None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between watchdog pings: half of WatchdogSec=, or None when it is off."""
        usec = os.environ.get("WATCHDOG_USEC")
        if not self._enabled or not usec or not usec.isdigit() or int(usec) == 0:
            return None
        pid = os.environ.get("WATCHDOG_PID")
        if pid and pid.isdigit() and int(pid) != os.getpid():
            return None
        return int(usec) / 1_000_000 / 2

    def _send(self, message: str) -> None:
        if self._notifier is not None:
            self._notifier.notify(message)

    def ready(self, status: str) -> None:
        self._send(f"READY=1\nSTATUS={status}")

    def reloading(self) -> None:
        """Type=notify-reload: the reload starts; READY=1 follows when it is done."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self._send(f"RELOADING=1\nMONOTONIC_USEC={usec}\nSTATUS=reloading the configuration")

    def extend_timeout(self, seconds: float, status: str) -> None:
        """Ask systemd for `seconds` more to start (re-sent while a model loads)."""
        self._send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}\nSTATUS={status}")

    def status(self, status: str) -> None:
        self._send(f"STATUS={status}")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def stopping(self, status: str) -> None:
        self._send(f"STOPPING=1\nSTATUS={status}")
