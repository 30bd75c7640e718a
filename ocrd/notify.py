"""systemd notifications (sd_notify): readiness, status line, watchdog pings, stopping, and
the reload handshake.

Without NOTIFY_SOCKET in the environment (not started by systemd) every notification does
nothing.

Reloading works the same on every systemd from 249 on. The unit is `Type=notify` with
`ExecReload=ocrd reload --pid $MAINPID` (Type=notify-reload, which needs 253, would do the
signalling itself). `ocrd reload` sends SIGHUP and waits until the daemon has written a
reload record, in the unit's RuntimeDirectory=, for a reload that started after the signal;
systemd keeps the unit "reloading" until `ocrd reload` exits, so `systemctl reload` returns
once the new configuration is in effect, and fails when the file was refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import sdnotify

from ocrd.processes import alive

RELOAD_RECORD = "reload.json"
POLL_SECONDS = 0.1


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock systemd's MONOTONIC_USEC= is read on."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def reload_record_path() -> Path | None:
    """$RUNTIME_DIRECTORY/reload.json (systemd's RuntimeDirectory=; the first if several)."""
    folders = os.environ.get("RUNTIME_DIRECTORY")
    return Path(folders.split(":")[0]) / RELOAD_RECORD if folders else None


@dataclass(frozen=True)
class ReloadRecord:
    """One finished reload: which process, when it started, and whether it applied."""

    pid: int
    started_usec: int
    applied: bool
    reason: str | None = None  # why the file was refused
    refused: list[str] = field(default_factory=list)  # settings kept until a restart


class SystemdNotifier:
    def __init__(self) -> None:
        self._enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._notifier = sdnotify.SystemdNotifier() if self._enabled else None
        self._record = reload_record_path()

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

    def reloading(self) -> int:
        """The reload starts (RELOADING=1); returns its start, for reloaded()."""
        usec = monotonic_usec()
        self._send(f"RELOADING=1\nMONOTONIC_USEC={usec}\nSTATUS=reloading the configuration")
        return usec

    def reloaded(self, record: ReloadRecord, status: str) -> None:
        """The reload is over, applied or refused: the record for `ocrd reload`, then
        READY=1."""
        if self._record is not None:
            with contextlib.suppress(OSError):  # `ocrd reload` then says it timed out
                partial = self._record.with_name(f".{self._record.name}.{os.getpid()}")
                partial.write_text(json.dumps(asdict(record)))
                partial.replace(self._record)
        self.ready(status)

    def extend_timeout(self, seconds: float, status: str) -> None:
        """Ask systemd for `seconds` more to start (re-sent while a model loads)."""
        self._send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}\nSTATUS={status}")

    def status(self, status: str) -> None:
        self._send(f"STATUS={status}")

    def watchdog(self) -> None:
        self._send("WATCHDOG=1")

    def stopping(self, status: str) -> None:
        self._send(f"STOPPING=1\nSTATUS={status}")


class ReloadNotConfirmed(Exception):
    """The daemon did not confirm the reload `ocrd reload` asked for; the message says why."""


def reload_and_wait(pid: int, record: Path, timeout: float) -> ReloadRecord:
    """SIGHUP to `pid`, then the record of the reload that started after it."""
    asked = monotonic_usec()
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        raise ReloadNotConfirmed(f"no process {pid} to reload") from None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = _read_record(record)
        if done is not None and done.pid == pid and done.started_usec >= asked:
            return done
        if not alive(pid):
            raise ReloadNotConfirmed(f"ocrd (process {pid}) ended before it reloaded")
        time.sleep(POLL_SECONDS)
    raise ReloadNotConfirmed(
        f"ocrd (process {pid}) did not confirm the reload in {timeout:g} s (no new {record}); "
        "its log says what it is doing"
    )


def _read_record(path: Path) -> ReloadRecord | None:
    try:
        return ReloadRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None

    return True
