"""The main loop is supervised: a bug in it ends the daemon loudly (exit 70, traceback), and
a loop that stops ticking stops the systemd watchdog pings, so systemd restarts ocrd.

These run `Daemon` in the test's own process, with the simulated engine and real sd_notify
datagrams, and break the loop on purpose by replacing one of its steps."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
import structlog
from conftest import NotifySocket, write_config

from ocrd.config import load_config
from ocrd.daemon import EXIT_FATAL, Daemon
from ocrd.documents.dispatch import DocumentDispatcher
from ocrd.intake.inboxes import Intake, Job


async def wait_for(condition, seconds: float, what: str) -> None:
    async with asyncio.timeout(seconds):
        while not condition():
            await asyncio.sleep(0.05)
    assert condition(), what


def test_an_unexpected_error_in_the_loop_exits_70_with_its_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = load_config(write_config(tmp_path))
    ticks = 0
    original = DocumentDispatcher.dispatch

    async def failing_dispatch(self: DocumentDispatcher) -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 5:
            raise RuntimeError("a bug in dispatching")
        await original(self)

    monkeypatch.setattr(DocumentDispatcher, "dispatch", failing_dispatch)
    with structlog.testing.capture_logs() as logs:
        code = asyncio.run(Daemon(config).run())
    assert code == EXIT_FATAL
    [failed] = [entry for entry in logs if entry["event"] == "daemon.failed"]
    assert failed["exc_info"] is True or "a bug in dispatching" in repr(failed)
    assert "systemd restarts" in failed["action"]
    [stopped] = [entry for entry in logs if entry["event"] == "daemon.stopped"]
    assert stopped["exit_code"] == EXIT_FATAL


def test_watchdog_pings_stop_while_the_loop_is_stuck_and_resume_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    notify = NotifySocket(tmp_path / "notify.sock")
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify.path))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # a ping every 0.1 s
    config = load_config(write_config(tmp_path))
    stuck = threading.Event()
    release = threading.Event()
    original = Intake.collect

    async def collect(self: Intake) -> list[Job]:
        if stuck.is_set():  # a stat that hangs, as on a hard-mounted NFS share
            await asyncio.to_thread(release.wait)
        return await original(self)

    monkeypatch.setattr(Intake, "collect", collect)

    def pings() -> int:
        return sum(m == "WATCHDOG=1" for m in notify.messages)

    async def scenario() -> tuple[int, int, int, int]:
        daemon = Daemon(config)
        run = asyncio.create_task(daemon.run())
        await wait_for(lambda: any("READY=1" in m for m in notify.messages), 60, "READY")
        await asyncio.sleep(0.5)
        before = pings()
        stuck.set()
        await asyncio.sleep(0.4)
        stuck_at = pings()
        await asyncio.sleep(1.5)
        still = pings()
        stuck.clear()
        release.set()
        await asyncio.sleep(0.5)
        after = pings()
        daemon.request_stop()
        assert await run == 0
        return before, stuck_at, still, after

    try:
        before, stuck_at, still, after = asyncio.run(scenario())
    finally:
        notify.close()
    assert before >= 3
    assert still == stuck_at, "WATCHDOG=1 was sent while the loop was stuck"
    assert after > still
