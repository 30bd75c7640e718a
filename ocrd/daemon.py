"""The daemon's lifecycle, top to bottom: check, start the HTTP server and the engine,
announce, serve, drain, stop.

Data flows one way through it: watch (a file becomes ready), claim (it moves into the work
area), convert (render and recognise), write (Markdown into the outbox) and settle (the
original into done/ or failed/). What happens to one document is `ocrd/document.py`'s job;
this module owns the loop that feeds documents to it.

Serving is one main loop. Each tick collects the files that became ready, claims and starts
documents, watches the engine, reloads the configuration when SIGHUP asked for it, and at
their intervals rescans the inboxes, reports status and pings systemd's watchdog: a stuck
or dead loop stops the pings, and systemd restarts the service. An unexpected error in a
tick is logged with its traceback and ends the daemon with exit status 70, as does a dead
in-process engine. An unreachable inference fleet ends nothing: dispatching pauses until
it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from ocrd import __version__
from ocrd.activity import Activity
from ocrd.claim import Changed, Claim, NotClaimable, WorkArea
from ocrd.collate import Collator
from ocrd.config import Config, ConfigError, InboxConfig, load_config
from ocrd.document import Blocked, Documents, Inbox, still_growing
from ocrd.domain import DocumentFailed, DocumentSettings
from ocrd.dropped import Identity, printable
from ocrd.engines import Engine, EngineDeadError, EngineState, choose_engine, create_engine
from ocrd.files import remove_stale_temporaries
from ocrd.hooks import Hooks
from ocrd.log import get_logger
from ocrd.metrics import Metrics
from ocrd.notify import SystemdNotifier
from ocrd.pipeline import Pipeline
from ocrd.reload import plan_reload
from ocrd.settle import Settler
from ocrd.signals import EarlySignals
from ocrd.status import (
    WAITING_LISTED,
    BlockedFile,
    DocumentProgress,
    FinishedDocument,
    InboxStatus,
    StatusReport,
    WaitingFile,
    eta,
)
from ocrd.watch import InboxWatcher, SettleTracker, stat_all
from ocrd.web import Liveness, WebServer

EXIT_OK = 0
EXIT_FATAL = 70  # EX_SOFTWARE: systemd restarts the unit
EXIT_CONFIG = 78  # EX_CONFIG: the unit does not restart (RestartPreventExitStatus=78)

TICK_SECONDS = 0.1
# Running out of descriptors or memory is the daemon's state, not the file's: try again.
RETRY_CLAIM_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOSPC})
HEALTH_CHECK_SECONDS = 2.0
STUCK_AFTER_SECONDS = 10.0  # /healthz fails when the main loop has not ticked this long
START_TIMEOUT_EXTENSION_SECONDS = 60.0  # asked of systemd again and again while loading
START_TIMEOUT_RESEND_SECONDS = 20.0


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


def check_http(config: Config) -> list[str]:
    """Problems with the HTTP settings that only show in the environment."""
    http = config.http
    if http.enabled and not http.trust_loopback and not os.environ.get(http.token_env):
        return [
            f"http.trust_loopback is false but {http.token_env} is not set: every client "
            "would be refused; set the token in the environment (an EnvironmentFile=)"
        ]
    return []


def folder_warnings(config: Config) -> list[str]:
    """What will keep some dropped files from being taken, though ocrd can start."""
    warnings = []
    uid = os.geteuid()
    for inbox in config.inboxes:
        with contextlib.suppress(OSError):
            info = inbox.path.stat()
            if info.st_mode & 0o1000 and uid not in (0, info.st_uid):
                warnings.append(
                    f"inbox {inbox.path} has the sticky bit and is not ocrd's: files other "
                    "users drop there cannot be moved out (remove it: chmod o-t)"
                )
    return warnings


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
    identity: Identity | None = None  # the file that settled there
    companions: tuple[Path, ...] = ()  # claimed with it: a duplex's backs file
    claim: Claim | None = None  # or a claim recovered from the work area
    failure: DocumentFailed | None = None  # known to fail before it is read
    since: float = field(default_factory=time.monotonic)  # first seen

    @property
    def needs_isolation(self) -> bool:
        """Struck by a crash: it runs with nothing else in flight."""
        return self.claim is not None and self.claim.struck

    @property
    def relative_path(self) -> str:
        if self.claim is not None:
            return self.claim.state.relative_path
        assert self.path is not None
        return str(self.path.relative_to(self.inbox.config.path))


class Daemon:
    def __init__(
        self,
        config: Config,
        engine_kind: str | None = None,
        config_path: Path | None = None,
        early_signals: EarlySignals | None = None,
    ) -> None:
        self.config = config
        self.config_path = config_path  # re-read on SIGHUP
        self.engine_kind = engine_kind
        self.early_signals = early_signals or EarlySignals()
        self.log = get_logger()
        self.notifier = SystemdNotifier()
        self.activity = Activity()
        self.metrics = Metrics(self.status_report)
        self.hooks = Hooks(lambda *labels: self.metrics.hooks.labels(*labels).inc())
        self.lag = LoopLag()
        self.exit_code = EXIT_OK
        self.inboxes: list[Inbox] = []
        self.engine: Engine | None = None
        self.pipeline: Pipeline | None = None
        self.documents: Documents | None = None
        self.web: WebServer | None = None
        self.web_problem: str | None = None
        self.max_documents = 1
        self._stop = asyncio.Event()
        self._reload_requested = False
        self._jobs: deque[Job] = deque()
        self._queued: set[Path] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._isolated: asyncio.Task[None] | None = None
        self._engine_state = EngineState.loading
        self._last_watchdog = 0.0
        self._last_tick: float | None = None  # monotonic; None until serving

    # --- lifecycle ---------------------------------------------------------------------

    async def run(self) -> int:
        self.install_signal_handlers()
        try:
            self.check()
        except StartupError as error:
            for line in str(error).splitlines():
                self.log.error("startup.refused", reason=line)
            return EXIT_CONFIG
        try:
            await self.start_http()
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
        problems = check_folders(self.config) + check_http(self.config)
        if problems:
            raise StartupError("\n".join(problems))
        for warning in folder_warnings(self.config):
            self.log.warning("startup.warning", reason=warning)

    def install_signal_handlers(self) -> None:
        """The event loop takes the signals over; those that came before it could (the
        process had started but not got this far) are acted on now."""
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.request_stop, signum)
        loop.add_signal_handler(signal.SIGHUP, self.request_reload)
        for signum in self.early_signals.take():
            if signum == signal.SIGHUP:
                self.request_reload()
            else:
                self.request_stop(signum)

    def request_stop(self, signum: int | None = None) -> None:
        if not self._stop.is_set():
            name = signal.Signals(signum).name if signum else None
            self.log.info("daemon.stopping", signal=name, documents_in_flight=len(self._tasks))
            self._stop.set()

    def request_reload(self) -> None:
        self._reload_requested = True  # the main loop reloads at its next tick

    async def start_http(self) -> None:
        """Early, so that /healthz and /readyz answer while the engine loads."""
        if not self.config.http.enabled:
            return
        web = WebServer(self.config.http, self.status_report, self.liveness, self.metrics)
        try:
            address = await web.start()
        except OSError as error:  # OCR goes on without it; the status line says so
            self.web_problem = f"HTTP server not started on {self.config.http.listen}: {error}"
            self.log.error("http.failed", error=self.web_problem)
            return
        self.web, self.web_problem = web, None
        self.log.info("http.listening", address=address, url=f"http://{address}/")

    async def start_engine(self) -> None:
        engine_config = self.config.engine
        if self.engine_kind:
            engine_config = engine_config.model_copy(update={"kind": self.engine_kind})
        choice = choose_engine(engine_config)
        self.log.info("engine.selected", engine=choice.kind, reason=choice.reason)
        self.notifier.status(f"loading the {choice.kind} engine")
        started = time.monotonic()
        self.engine = create_engine(engine_config, choice.kind)
        keep_alive = asyncio.create_task(self._extend_start_timeout(choice.kind, started))
        try:
            await self.engine.start()
        finally:
            keep_alive.cancel()
        self.log.info(
            "engine.ready", engine=choice.kind, seconds=round(time.monotonic() - started, 1)
        )
        self.watch_engine()
        side = max(inbox.max_image_side for inbox in self.config.inboxes)
        self.pipeline = Pipeline.create(self.engine, self.config.pipeline, side)
        self.pipeline.on_page_done += [self.activity.page_done, self.metrics.page_done]
        self.apply_pipeline_settings()
        self.documents = Documents(self.pipeline, self.engine.name)
        self.documents.on_finished += [
            lambda _, summary: self.activity.document_finished(summary),
            lambda _, summary: self.metrics.document_finished(summary),
            self.hooks.document_finished,
        ]
        self.documents.on_storage_fault += [self.metrics.storage_fault, self.report_status]
        await self.pipeline.renderers.warm_up()

    async def _extend_start_timeout(self, kind: str, started: float) -> None:
        """While a model loads, ask systemd for more time, so that no fixed start timeout
        has to cover the slowest first download."""
        while True:
            elapsed = round(time.monotonic() - started)
            self.notifier.extend_timeout(
                START_TIMEOUT_EXTENSION_SECONDS, f"loading the {kind} engine, {elapsed} s so far"
            )
            await asyncio.sleep(START_TIMEOUT_RESEND_SECONDS)

    async def start_inboxes(self) -> None:
        for config in self.config.inboxes:
            await self.add_inbox(config)

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        tick = 0
        while not self._stop.is_set():
            self._last_tick = time.monotonic()
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
                await asyncio.to_thread(inbox.watcher.stop)
        if self._tasks:
            grace = self.config.pipeline.shutdown_grace_seconds
            _, pending = await asyncio.wait(self._tasks, timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    async def stop(self) -> None:
        await self.hooks.stop()
        if self.pipeline is not None:
            self.pipeline.renderers.shutdown()
        if self.engine is not None:
            await self.engine.stop()
        if self.web is not None:
            await self.web.stop()
        self.log.info(
            "daemon.stopped", exit_code=self.exit_code, loop_lag_worst_ms=self._ms(self.lag.worst)
        )

    # --- inboxes -----------------------------------------------------------------------

    async def add_inbox(self, config: InboxConfig, recover: bool = True) -> Inbox:
        """Serve an inbox: sweep what a killed run left, take up its claims, watch it."""
        assert self.engine is not None
        inbox = Inbox(
            config=config,
            work=WorkArea(config.path, config.work),
            tracker=SettleTracker(config),
            settler=Settler(config, self.engine.name),
            settings=DocumentSettings.of(config, self.engine.name),
            collator=Collator(config.collate_window_seconds) if config.collate else None,
        )
        if recover:
            for claim in await asyncio.to_thread(self._prepare_folders, inbox):
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
        return inbox

    @staticmethod
    def _prepare_folders(inbox: Inbox) -> list[Claim]:
        """Sweep temporaries a killed run left; the claims it left, oldest first."""
        for folder in (inbox.config.outbox, inbox.config.done, inbox.config.failed):
            if folder is not None and folder.is_dir():
                remove_stale_temporaries(folder)
        return inbox.work.recover()

    async def remove_inbox(self, path: Path) -> Inbox | None:
        """Stop watching an inbox. Files not yet claimed stay in it; documents already
        claimed from it finish under its settings."""
        inbox = next((i for i in self.inboxes if i.config.path == path), None)
        if inbox is None:
            return None
        if inbox.watcher is not None:
            await asyncio.to_thread(inbox.watcher.stop)
        self.inboxes.remove(inbox)
        unclaimed = [job for job in self._jobs if job.inbox is inbox and job.claim is None]
        for job in unclaimed:
            self._jobs.remove(job)
            self._queued.difference_update((job.path, *job.companions))
        self.log.info("inbox.removed", inbox=str(path), files_left_unclaimed=len(unclaimed))
        return inbox

    async def replace_inbox(self, config: InboxConfig) -> None:
        """New settings for an inbox: files not yet claimed get them; documents in flight
        (and claims recovered at start) keep the ones they started with."""
        old = await self.remove_inbox(config.path)
        new = await self.add_inbox(config, recover=False)
        if old is not None:
            for job in self._jobs:
                if job.inbox is old and job.claim is None:
                    job.inbox = new
            if old.collator is not None and new.collator is not None:
                new.collator.fronts = old.collator.fronts  # a fronts file keeps waiting

    # --- serving -----------------------------------------------------------------------

    async def on_tick(self, tick: int) -> None:
        """Everything the main loop does; per-file problems are handled where they occur."""
        await self.collect_ready_files()
        self.watch_engine()
        await self.dispatch()
        if self._reload_requested:
            self._reload_requested = False
            await self.reload()
        if self._due(tick, self.config.pipeline.rescan_interval_seconds):
            for inbox in self.inboxes:
                if inbox.watcher is not None:
                    await inbox.watcher.rescan()
                if inbox.blocked:
                    await asyncio.to_thread(self._prune_blocked, inbox)
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
            self._collate_expired(inbox)
            paths = inbox.tracker.due()
            if not paths:
                continue
            outcomes = await asyncio.to_thread(stat_all, paths, inbox.config.path)
            for ready in inbox.tracker.settle(outcomes):
                if ready.path in self._queued:
                    continue
                self._queued.add(ready.path)
                if ready.still_growing:
                    failure = still_growing(inbox.config)
                    self._jobs.append(
                        Job(inbox, ready.path, failure=failure, since=ready.first_seen)
                    )
                elif inbox.collator is not None and not ready.folder:
                    self._collate(inbox, ready.path, ready.first_seen)
                else:
                    job = Job(inbox, ready.path, ready.identity, since=ready.first_seen)
                    self._jobs.append(job)

    def _collate(self, inbox: Inbox, path: Path, first_seen: float) -> None:
        """In a collating inbox a file waits as the fronts, or completes a pair."""
        assert inbox.collator is not None
        pair = inbox.collator.add(path, first_seen)
        if pair is None:
            self.log.info(
                "collate.fronts_waiting",
                path=str(path),
                window_seconds=inbox.config.collate_window_seconds,
            )
            return
        fronts, backs = pair
        self.log.info("collate.paired", fronts=str(fronts), backs=str(backs))
        self._jobs.append(Job(inbox, fronts, companions=(backs,), since=first_seen))

    def _collate_expired(self, inbox: Inbox) -> None:
        alone = inbox.collator.expired() if inbox.collator is not None else None
        if alone is not None:
            self.log.info(
                "collate.alone",
                path=str(alone.path),
                reason=f"no backs file came within {inbox.config.collate_window_seconds:g} s; "
                "converted as it is",
            )
            self._jobs.append(Job(inbox, alone.path, since=alone.first_seen))

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
        self._queued.difference_update(job.companions)
        inbox, path = job.inbox, job.path
        shown = printable(str(path))
        try:
            claim = await asyncio.to_thread(inbox.work.claim, path, job.identity, job.companions)
        except NotClaimable as blocked:
            self._block(inbox, path, blocked)
            return None
        except Changed as changed:
            self.log.warning(
                "file.changed",
                path=shown,
                reason=str(changed),
                action="left alone; if it is a file it is looked at again",
            )
            inbox.tracker.observe(path)
            return None
        except OSError as error:
            transient = error.errno in RETRY_CLAIM_ERRNOS
            self.log.error(
                "file.claim_deferred" if transient else "file.claim_failed",
                path=shown,
                error=printable(str(error)),
                action="left in the inbox; tried again "
                + ("shortly" if transient else "at the next rescan"),
            )
            if transient:
                inbox.tracker.observe(path)
            return None
        if inbox.blocked.pop(path, None) is not None:
            self.log.info("file.unblocked", path=shown)
        if claim is None:
            self.log.info("file.vanished", path=shown, reason="gone before it was claimed")
            return None
        self.log.info(
            "document.claimed",
            doc=claim.id,
            path=printable(claim.state.relative_path),
            inbox=str(job.inbox.config.path),
            **({"companions": claim.state.companions} if claim.state.companions else {}),
        )
        return claim

    def _block(self, inbox: Inbox, path: Path, blocked: NotClaimable) -> None:
        """List a file ocrd cannot take (once, not at every rescan)."""
        known = inbox.blocked.get(path)
        if known is not None and known.reason == blocked.reason:
            return
        inbox.blocked[path] = Blocked(blocked.reason, blocked.fix, time.time())
        self.log.warning(
            "file.blocked",
            path=printable(str(path)),
            reason=blocked.reason,
            fix=blocked.fix,
            action="left in the inbox and listed on the status page; tried again at every rescan",
        )

    @staticmethod
    def _prune_blocked(inbox: Inbox) -> None:
        """Forget blocked files that are gone (their owner moved or deleted them). Blocking."""
        for path in [p for p in inbox.blocked if not os.path.lexists(p)]:
            inbox.blocked.pop(path, None)

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

    # --- reloading ---------------------------------------------------------------------

    async def reload(self) -> None:
        """Re-read the configuration file (SIGHUP); an invalid one changes nothing."""
        self.notifier.reloading()
        if self.config_path is None:
            self.log.warning("config.reload_failed", reason="no configuration file to re-read")
            self.notifier.ready(self.status_line())
            return
        try:
            new = await asyncio.to_thread(load_config, self.config_path)
            problems = await asyncio.to_thread(check_folders, new)
            if problems:
                raise ConfigError("\n".join(problems))
        except ConfigError as error:
            self.log.error(
                "config.reload_failed",
                reason=str(error),
                action="the configuration in use stays in effect; fix the file and reload again",
            )
            self.notifier.ready(self.status_line())
            return
        plan = plan_reload(self.config, new)
        for line in plan.refused:
            self.log.warning("config.reload_refused", reason=line)
        for path in plan.removed:
            await self.remove_inbox(path)
        for config in plan.changed:
            await self.replace_inbox(config)
        for config in plan.added:
            await self.add_inbox(config)
        http_changed = plan.http_changed
        self.config = plan.config
        self.apply_pipeline_settings()
        if http_changed:
            if self.web is not None:
                await self.web.stop()
                self.web = None
            await self.start_http()
        self.log.info(
            "config.reloaded",
            added=[str(i.path) for i in plan.added],
            removed=[str(p) for p in plan.removed],
            changed=[str(i.path) for i in plan.changed],
            http_restarted=http_changed,
            refused=len(plan.refused),
        )
        self.notifier.ready(self.status_line())

    def apply_pipeline_settings(self) -> None:
        """The pipeline settings that take effect while running (see ocrd/reload.py)."""
        assert self.engine is not None and self.pipeline is not None
        settings = self.config.pipeline
        self.max_documents = settings.documents_in_flight_for(self.engine.max_concurrency)
        self.pipeline.page_retries = settings.page_retries
        self.pipeline.retry_backoff_seconds = settings.page_retry_backoff_seconds

    # --- reporting -----------------------------------------------------------------------

    @property
    def waiting(self) -> int:
        collating = sum(1 for i in self.inboxes if i.collator is not None and i.collator.fronts)
        return len(self._jobs) + sum(len(inbox.tracker) for inbox in self.inboxes) + collating

    def problems(self) -> list[str]:
        """What keeps ocrd from being ready, or needs an operator; empty when all is well."""
        problems = []
        health = self.engine.health if self.engine is not None else None
        if health is None or health.state is EngineState.loading:
            problems.append("the engine is loading")
        elif health.state is EngineState.unreachable:
            problems.append(
                f"INFERENCE FLEET UNREACHABLE since {_clock(health.since)}, retrying: "
                f"{health.problem}"
            )
        elif health.state is EngineState.dead:
            problems.append(f"the engine died: {health.problem}")
        if self.documents is not None and self.documents.storage.fault:
            problems.append(f"STORAGE FAULT, retrying: {self.documents.storage.fault}")
        for inbox in self.inboxes:
            if inbox.watcher is not None and inbox.watcher.missing:
                problems.append(f"INBOX MISSING: {inbox.config.path}")
            elif inbox.watcher is None or not inbox.watcher.watching:
                problems.append(f"inbox not watched: {inbox.config.path}")
        if self._stop.is_set():
            problems.append("stopping")
        return problems

    def attention(self) -> list[str]:
        """What needs a person although ocrd serves: files it cannot take, stuck claims."""
        lines = []
        for inbox in self.inboxes:
            if inbox.blocked:
                count = len(inbox.blocked)
                lines.append(
                    f"{count} file{'s' if count > 1 else ''} in {inbox.config.path} cannot be "
                    "taken (no permission); see the status page for why and how to fix it"
                )
        if self.documents is not None:
            lines += [f"needs an operator: {reason}" for reason in self.documents.stuck.values()]
        return lines

    def status_line(self) -> str:
        problems = [p for p in self.problems() if p != "the engine is loading"]
        problems += self.attention()
        if self.web_problem:
            problems.append(self.web_problem)
        pages = self.pipeline.pages_in_flight if self.pipeline else 0
        return "".join(f"{p}; " for p in problems) + (
            f"{self.waiting} waiting, {len(self._tasks)} documents ({pages} pages) in flight, "
            f"{self.activity.pages_per_second():.2f} pages/s"
        )

    def status_report(self) -> StatusReport:
        now = time.monotonic()
        problems = self.problems()
        health = self.engine.health if self.engine is not None else None
        return StatusReport(
            version=__version__,
            engine=self.engine.name if self.engine is not None else "loading",
            engine_state=(health.state if health else EngineState.loading).value,
            ready=not problems,
            problems=problems,
            attention=self.attention(),
            pages_per_second=round(self.activity.pages_per_second(), 3),
            documents_in_flight=len(self._tasks),
            pages_in_flight=self.pipeline.pages_in_flight if self.pipeline else 0,
            inboxes=[self._inbox_status(inbox, now) for inbox in self.inboxes],
            finished=[FinishedDocument.of(s) for s in self.activity.finished],
            history=self.activity.history(),
        )

    def _inbox_status(self, inbox: Inbox, now: float) -> InboxStatus:
        root = inbox.config.path
        waiting = [
            WaitingFile(path=_shown(path, root), waiting_seconds=now - seen, ready=False)
            for path, seen in inbox.tracker.waiting()
            if path not in inbox.blocked
        ] + [
            WaitingFile(
                path=printable(job.relative_path), waiting_seconds=now - job.since, ready=True
            )
            for job in self._jobs
            if job.inbox is inbox
        ]
        fronts = inbox.collator.fronts if inbox.collator is not None else None
        if fronts is not None:
            waiting.append(
                WaitingFile(
                    path=_shown(fronts.path, root),
                    waiting_seconds=now - fronts.first_seen,
                    ready=True,
                )
            )
        waiting.sort(key=lambda f: -f.waiting_seconds)
        in_flight = [
            DocumentProgress(
                doc=flight.doc,
                path=printable(flight.path),
                pages=flight.progress.pages or None,
                pages_done=flight.progress.done,
                seconds=round(now - flight.progress.started, 1),
                eta_seconds=eta(
                    flight.progress.pages, flight.progress.done, now - flight.progress.started
                ),
                alone=flight.alone,
            )
            for flight in (self.documents.in_flight.values() if self.documents else ())
            if flight.inbox == str(root)
        ]
        return InboxStatus(
            path=str(root),
            watching=inbox.watcher is not None and inbox.watcher.watching,
            waiting_count=len(waiting),
            oldest_waiting_seconds=round(waiting[0].waiting_seconds, 1) if waiting else None,
            waiting=[w.model_copy(update={"waiting_seconds": round(w.waiting_seconds, 1)})
                     for w in waiting[:WAITING_LISTED]],
            in_flight=in_flight,
            blocked=[
                BlockedFile(path=_shown(path, root), reason=b.reason, fix=b.fix, since=b.since)
                for path, b in list(inbox.blocked.items())[:WAITING_LISTED]
            ],
        )  # fmt: skip

    def liveness(self) -> Liveness:
        """The main loop is alive if it ticked lately (or has not started serving yet)."""
        if self._last_tick is None:
            return Liveness(True, 0.0)
        since = time.monotonic() - self._last_tick
        return Liveness(since < STUCK_AFTER_SECONDS, since)

    def report_status(self, *_: object) -> None:
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


def _shown(path: Path, root: Path) -> str:
    return printable(str(path.relative_to(root)))


def _clock(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall))
