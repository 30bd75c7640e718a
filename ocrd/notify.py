"""systemd notifications (sd_notify): readiness, status line, watchdog pings, stopping.

Without NOTIFY_SOCKET in the environment (not started by systemd) every call does nothing.
"""

from __future__ import annotations

import os

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

    def status(self, status: str) -> None:
        self._send(f"STATUS={status}")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def stopping(self, status: str) -> None:
        self._send(f"STOPPING=1\nSTATUS={status}")
