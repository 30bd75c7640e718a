"""The daemon's lifecycle, top to bottom: check, start the engine, announce, serve, drain, stop.

Data flows one way through it: watch (a file becomes ready), claim (it moves into the work
area), convert (render and recognise), write (Markdown into the outbox) and settle (the
original into done/ or failed/). What happens to one document is `ocrd/document.py`'s job;
this module owns the loop that feeds documents to it.

Serving is one main loop. Each tick collects the files that became ready, claims and starts
documents, watches the engine, and at their intervals rescans the inboxes, reports status
and pings systemd's watchdog: a stuck or dead loop stops the pings, and systemd restarts
the service. An unexpected error in a tick is logged with its traceback and ends the daemon
with exit status 70, as does a dead in-process engine. An unreachable inference fleet ends
nothing: dispatching pauses until it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from ocrd.claim import Claim, WorkArea
from ocrd.config import Config
from ocrd.document import Documents, Inbox, still_growing
from ocrd.domain import DocumentFailed, DocumentSettings, PageResult
from ocrd.engines import Engine, EngineDeadError, EngineState, choose_engine, create_engine
from ocrd.files import remove_stale_temporaries
from ocrd.log import get_logger
from ocrd.notify import SystemdNotifier
from ocrd.pipeline import Pipeline
from ocrd.settle import Settler
from ocrd.watch import InboxWatcher, SettleTracker, stat_all

EXIT_OK = 0
EXIT_FATAL = 70  # EX_SOFTWARE: systemd restarts the unit
EXIT_CONFIG = 78  # EX_CONFIG: the unit does not restart (RestartPreventExitStatus=78)

TICK_SECONDS = 0.1
HEALTH_CHECK_SECONDS = 2.0


class StartupError(Exception):
    """The daemon cannot start with this configuration; one line per problem."""


def check_folders(config: Config, create: bool = True) -> list[str]:
    """Problems with the configured folders, each a line saying which folder and why."""
    problems: list[str] = []
    inboxes = [inbox.path for inbox in config.inboxes]
    for inbox in config.inboxes:
        if not inbox.path.is_dir():
            problems.append(f"inbox {inbox.path} does not exist or is not a folder; create it")
            continue
        if not os.access(inbox.path, os.W_OK | os.X_OK):
            problems.append(
                f"inbox {inbox.path} is not writable by this user (files are moved out of it)"
            )
        for role in ("outbox", "done", "failed", "work"):
            folder: Path = getattr(inbox, role)
            for watched in inboxes:
                if folder == watched or folder.is_relative_to(watched):
                    problems.append(
                        f"{role} folder {folder} lies inside the watched inbox {watched}; "
                        "move it out, or ocrd would read its own output"
                    )
            if not folder.exists() and create and folder.parent.is_dir():
                with contextlib.suppress(OSError):
                    folder.mkdir()
            if not folder.is_dir():
                if create or not folder.parent.is_dir():
                    problems.append(f"{role} folder {folder} does not exist; create it")
            elif not os.access(folder, os.W_OK | os.X_OK):
                problems.append(f"{role} folder {folder} is not writable by this user")
        if inbox.work.is_dir() and inbox.work.stat().st_dev != inbox.path.stat().st_dev:
            problems.append(
                f"work folder {inbox.work} is on another filesystem than inbox {inbox.path}; "
                "claiming needs an atomic rename, so put it on the same filesystem"
            )
    return problems


class Throughput:
    """Pages per second over a recent window, for the status line."""

    def __init__(self, window_seconds: float = 60.0) -> None:
        self.window = window_seconds
        self._times: deque[float] = deque()

    def add(self, _: PageResult | None = None) -> None:
        self._times.append(time.monotonic())

    def pages_per_second(self) -> float:
        cutoff = time.monotonic() - self.window
        while self._times and self._times[0] < cutoff:
            self._times.popleft()
        return len(self._times) / self.window


class LoopLag:
    """How late the main loop's sleeps wake up: the event loop's responsiveness."""

    def __init__(self) -> None:
        self.worst_since_report = 0.0
        self.worst = 0.0

    def record(self, seconds: float) -> None:
        self.worst_since_report = max(self.worst_since_report, seconds)
        self.worst = max(self.worst, seconds)

    def take_report(self) -> float:
        worst, self.worst_since_report = self.worst_since_report, 0.0
        return worst


@dataclass
class Job:
    inbox: Inbox
    path: Path | None = None  # a ready file in the inbox, still to be claimed
    claim: Claim | None = None  # or a claim recovered from the work area
    failure: DocumentFailed | None = None  # known to fail before it is read

    @property
    def needs_isolation(self) -> bool:
        """Struck by a crash, and not yet tried alone: it runs with nothing else in flight."""
        return self.claim is not None and self.claim.struck and not self.claim.state.alone


class Daemon:
    def __init__(self, config: Config, engine_kind: str | None = None) -> None:
        self.config = config
        self.engine_kind = engine_kind
        self.log = get_logger()
        self.notifier = SystemdNotifier()
        self.throughput = Throughput()
        self.lag = LoopLag()
        self.exit_code = EXIT_OK
        self.inboxes: list[Inbox] = []
        self.engine: Engine | None = None
        self.pipeline: Pipeline | None = None
        self.documents: Documents | None = None
        self.max_documents = 1
        self._stop = asyncio.Event()
        self._jobs: deque[Job] = deque()
        self._queued: set[Path] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._isolated: asyncio.Task[None] | None = None
        self._engine_state = EngineState.loading
        self._last_watchdog = 0.0

    # --- lifecycle ---------------------------------------------------------------------

    async def run(self) -> int:
        try:
            self.check()
        except StartupError as error:
            for line in str(error).splitlines():
                self.log.error("startup.refused", reason=line)
            return EXIT_CONFIG
        self.install_signal_handlers()
        try:
            await self.start_engine()
            await self.start_inboxes()
            self.notifier.ready(self.status_line())
            self.log.info("daemon.ready", inboxes=[str(i.config.path) for i in self.inboxes])
            await self.serve()
        except Exception:
            self.log.exception("daemon.failed", action="exiting so that systemd restarts ocrd")
            self.exit_code = EXIT_FATAL
        finally:
            await self.drain()
            await self.stop()
        return self.exit_code

    def check(self) -> None:
        problems = check_folders(self.config)
        if problems:
            raise StartupError("\n".join(problems))

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.request_stop, signum)

    def request_stop(self, signum: int | None = None) -> None:
        if not self._stop.is_set():
            name = signal.Signals(signum).name if signum else None
            self.log.info("daemon.stopping", signal=name, documents_in_flight=len(self._tasks))
            self._stop.set()

    async def start_engine(self) -> None:
        engine_config = self.config.engine
        if self.engine_kind:
            engine_config = engine_config.model_copy(update={"kind": self.engine_kind})
        choice = choose_engine(engine_config)
        self.log.info("engine.selected", engine=choice.kind, reason=choice.reason)
        self.notifier.status(f"loading the {choice.kind} engine")
        started = time.monotonic()
        self.engine = create_engine(engine_config, choice.kind)
        await self.engine.start()
        self.log.info(
            "engine.ready", engine=choice.kind, seconds=round(time.monotonic() - started, 1)
        )
        self.watch_engine()
        side = max(inbox.max_image_side for inbox in self.config.inboxes)
        self.pipeline = Pipeline.create(self.engine, self.config.pipeline, side)
        self.pipeline.on_page_done.append(self.throughput.add)
        self.max_documents = self.config.pipeline.documents_in_flight_for(
            self.engine.max_concurrency
        )
        self.documents = Documents(self.pipeline, self.engine.name)
        self.documents.on_storage_fault.append(lambda _: self.report_status())
        await self.pipeline.renderers.warm_up()

    async def start_inboxes(self) -> None:
        assert self.engine is not None
        for config in self.config.inboxes:
            inbox = Inbox(
                config=config,
                work=WorkArea(config.path, config.work),
                tracker=SettleTracker(config),
                settler=Settler(config, self.engine.name),
                settings=DocumentSettings.of(config),
            )
            claims = await asyncio.to_thread(self._prepare_folders, inbox)
            for claim in claims:
                self.log.info(
                    "document.recovered",
                    doc=claim.id,
                    path=claim.state.relative_path,
                    attempts=claim.state.attempts,
                )
                self._jobs.append(Job(inbox, claim=claim))
            inbox.watcher = InboxWatcher(config, asyncio.get_running_loop(), inbox.tracker.observe)
            await inbox.watcher.start()
            self.log.info("inbox.watching", inbox=str(config.path), polling=config.polling)
            self.inboxes.append(inbox)

    @staticmethod
    def _prepare_folders(inbox: Inbox) -> list[Claim]:
        """Sweep temporaries a killed run left; the claims it left, oldest first."""
        for folder in (inbox.config.outbox, inbox.config.done, inbox.config.failed):
            if folder is not None and folder.is_dir():
                remove_stale_temporaries(folder)
        return inbox.work.recover()

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        tick = 0
        while not self._stop.is_set():
            before = loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), TICK_SECONDS)
            self.lag.record(max(0.0, loop.time() - before - TICK_SECONDS))
            if self._stop.is_set():
                break
            await self.on_tick(tick)
            tick += 1

    async def drain(self) -> None:
        """No new files; in-flight documents get the grace period, the rest stay claimed."""
        self.notifier.stopping(f"draining {len(self._tasks)} documents")
        for inbox in self.inboxes:
            if inbox.watcher is not None:
                inbox.watcher.stop()
        if self._tasks:
            grace = self.config.pipeline.shutdown_grace_seconds
            _, pending = await asyncio.wait(self._tasks, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def stop(self) -> None:
        if self.pipeline is not None:
            self.pipeline.renderers.shutdown()
        if self.engine is not None:
            await self.engine.stop()
        self.log.info(
            "daemon.stopped", exit_code=self.exit_code, loop_lag_worst_ms=self._ms(self.lag.worst)
        )

    # --- serving -----------------------------------------------------------------------

    async def on_tick(self, tick: int) -> None:
        """Everything the main loop does; per-file problems are handled where they occur."""
        await self.collect_ready_files()
        self.watch_engine()
        await self.dispatch()
        if self._due(tick, self.config.pipeline.rescan_interval_seconds):
            for inbox in self.inboxes:
                if inbox.watcher is not None:
                    await inbox.watcher.rescan()
        if self._due(tick, self.config.pipeline.status_interval_seconds):
            self.report_status()
        if self._due(tick, HEALTH_CHECK_SECONDS):
            await self.check_engine()
        self.ping_watchdog()

    @staticmethod
    def _due(tick: int, seconds: float) -> bool:
        return tick % max(1, round(seconds / TICK_SECONDS)) == 0

    async def collect_ready_files(self) -> None:
        for inbox in self.inboxes:
            paths = inbox.tracker.due()
            if not paths:
                continue
            outcomes = await asyncio.to_thread(stat_all, paths)
            for ready in inbox.tracker.settle(outcomes):
                if ready.path in self._queued:
                    continue
                self._queued.add(ready.path)
                failure = still_growing(inbox.config) if ready.still_growing else None
                self._jobs.append(Job(inbox, path=ready.path, failure=failure))

    def watch_engine(self) -> None:
        """Log the engine's changes of state; a dead engine ends the daemon."""
        assert self.engine is not None
        health = self.engine.health
        if health.state is self._engine_state:
            return
        previous, self._engine_state = self._engine_state, health.state
        if health.state is EngineState.unreachable:
            self.log.error(
                "engine.unreachable",
                since=_clock(health.since),
                error=health.problem,
                action="files wait in the inbox and claimed pages wait; nothing fails; "
                "ocrd probes the servers and resumes by itself",
            )
        elif health.state is EngineState.ready and previous is EngineState.unreachable:
            self.log.info("engine.reachable", outage_seconds=round(time.time() - health.since))
        self.report_status()

    async def check_engine(self) -> None:
        assert self.engine is not None
        try:
            await self.engine.check_health()
        except EngineDeadError as error:
            self.engine_died(error)

    def engine_died(self, error: EngineDeadError) -> None:
        self.log.error(
            "engine.dead",
            error=str(error),
            action="exiting so that systemd restarts ocrd; claimed files stay in the work area",
        )
        self.exit_code = EXIT_FATAL
        self._stop.set()

    async def dispatch(self) -> None:
        """Claim ready files and start their documents, while there is room and the engine
        takes pages. A document struck by a crash runs alone: it waits for the others to
        finish, and nothing starts beside it."""
        assert self.engine is not None and self.documents is not None
        while self._jobs and len(self._tasks) < self.max_documents:
            if self._stop.is_set() or self.engine.health.state is not EngineState.ready:
                return
            if self._isolated is not None:
                return
            job = self._jobs[0]
            alone = job.needs_isolation
            if alone and self._tasks:
                return
            self._jobs.popleft()
            claim = job.claim or await self._claim(job)
            if claim is None:
                continue
            task = asyncio.create_task(self.documents.run(job.inbox, claim, job.failure, alone))
            self._tasks.add(task)
            task.add_done_callback(self._document_finished)
            if alone:
                self._isolated = task

    async def _claim(self, job: Job) -> Claim | None:
        assert job.path is not None
        self._queued.discard(job.path)
        try:
            claim = await asyncio.to_thread(job.inbox.work.claim, job.path)
        except OSError as error:
            self.log.error(
                "file.claim_failed",
                path=str(job.path),
                error=str(error),
                action="left in the inbox; the next rescan tries again",
            )
            return None
        if claim is None:
            self.log.info("file.vanished", path=str(job.path), reason="gone before it was claimed")
            return None
        self.log.info(
            "document.claimed",
            doc=claim.id,
            path=claim.state.relative_path,
            inbox=str(job.inbox.config.path),
        )
        return claim

    def _document_finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if task is self._isolated:
            self._isolated = None
        if task.cancelled():
            return
        error = task.exception()
        if isinstance(error, EngineDeadError):
            self.engine_died(error)
        elif error is not None:  # the state machine itself failed: a bug; restart clean
            self.log.error(
                "document.crashed",
                error=repr(error),
                exc_info=error,
                action="exiting so that systemd restarts ocrd; the claim stays",
            )
            self.exit_code = EXIT_FATAL
            self._stop.set()

    # --- reporting -----------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return len(self._jobs) + sum(len(inbox.tracker) for inbox in self.inboxes)

    def status_line(self) -> str:
        problems = []
        if self.engine is not None and self.engine.health.state is EngineState.unreachable:
            health = self.engine.health
            problems.append(
                f"INFERENCE FLEET UNREACHABLE since {_clock(health.since)}, retrying: "
                f"{health.problem}"
            )
        if self.documents is not None and self.documents.storage.fault:
            problems.append(f"STORAGE FAULT, retrying: {self.documents.storage.fault}")
        for inbox in self.inboxes:
            if inbox.watcher is not None and inbox.watcher.missing:
                problems.append(f"INBOX MISSING: {inbox.config.path}")
        pages = self.pipeline.pages_in_flight if self.pipeline else 0
        return "".join(f"{p}; " for p in problems) + (
            f"{self.waiting} waiting, {len(self._tasks)} documents ({pages} pages) in flight, "
            f"{self.throughput.pages_per_second():.2f} pages/s"
        )

    def report_status(self) -> None:
        self.notifier.status(self.status_line())
        self.log.debug(
            "daemon.status",
            waiting=self.waiting,
            documents_in_flight=len(self._tasks),
            pages_in_flight=self.pipeline.pages_in_flight if self.pipeline else 0,
            loop_lag_worst_ms=self._ms(self.lag.take_report()),
        )

    def ping_watchdog(self) -> None:
        interval = self.notifier.watchdog_interval
        now = time.monotonic()
        if interval and now - self._last_watchdog >= interval:
            self._last_watchdog = now
            self.notifier.watchdog()

    @staticmethod
    def _ms(seconds: float) -> float:
        return round(seconds * 1000, 1)


def _clock(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall))
