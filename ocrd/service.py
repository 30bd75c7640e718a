"""Serving: the main loop, once every part runs.

Each tick delegates: intake collects the files that became ready, the dispatcher claims
and starts documents while there is room and the engine takes pages, the health_watch
watches the engine; at their intervals the inboxes are rescanned, the status reported and
systemd's watchdog pinged (from this loop only, so a stuck loop stops the pings). SIGHUP
asks for a reload, which the next tick applies. The status report is put together from
the parts that own each fact.

Beside the loop, this daemon's leases are kept in the background (`ocrd/sharing/instances.py`);
the service is told when one is lost (its documents are stopped), taken anew (its claims
left are recovered) or brings claims over from a daemon that died (they are dispatched).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ocrd import __version__
from ocrd.config import Config, ConfigError, checks, load_config
from ocrd.config.reload import plan_reload
from ocrd.config.strict import strict_mode_problems
from ocrd.documents.dispatch import DocumentDispatcher
from ocrd.documents.document import DocumentRunner
from ocrd.documents.pipeline import Pipeline
from ocrd.engines import Engine, EngineState, ReplicaFacts
from ocrd.engines.models import model_health, pause_reason
from ocrd.intake.inboxes import Inbox, Intake
from ocrd.log import get_logger
from ocrd.notify import ReloadRecord, SystemdNotifier
from ocrd.sharing.instances import Instances
from ocrd.sharing.leases import TakenOver
from ocrd.status import (
    WAITING_LISTED,
    FinishedDocument,
    InboxStatus,
    ReplicaStatus,
    StatusReport,
)
from ocrd.supervise import HEALTH_CHECK_SECONDS, HealthWatch
from ocrd.web.activity import Activity
from ocrd.web.server import WebServer

TICK_SECONDS = 0.1


@dataclass(kw_only=True)
class Service:
    """The parts it serves with, each passed by name; every part was given its listeners
    when it was made (`ocrd/daemon.py`)."""

    config: Config
    config_path: Path | None  # re-read on SIGHUP
    engine: Engine
    pipeline: Pipeline
    runner: DocumentRunner
    intake: Intake
    dispatcher: DocumentDispatcher
    health_watch: HealthWatch
    activity: Activity
    notifier: SystemdNotifier
    web: WebServer
    stopping: asyncio.Event
    instances: Instances
    engine_kind: str | None = None  # `ocrd run --engine`: its model folders are judged

    def __post_init__(self) -> None:
        self.log = get_logger()
        self.reload_requested = False
        self.apply_pipeline_settings()

    # --- the main loop -------------------------------------------------------------------

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        self.instances.serving()
        tick = 0
        while not self.stopping.is_set():
            before = loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), TICK_SECONDS)
            self.health_watch.pulse.tick(max(0.0, loop.time() - before - TICK_SECONDS))
            if self.stopping.is_set():
                break
            await self.tick(tick)
            tick += 1

    async def tick(self, tick: int) -> None:
        """Everything the main loop does; per-file problems are handled where they occur.
        A stop asked for meanwhile ends it after the step under way (claiming ends at once:
        the dispatcher looks before each claim)."""
        self.dispatcher.add(await self.intake.collect())
        watched = self.health_watch.watch(self.engine)
        if self.health_watch.watch_models(self.engine, self.inboxes_by_model()) or watched:
            self.report_status()
        if self.engine.health.state is EngineState.ready:
            await self.dispatcher.dispatch()
        if self.stopping.is_set():
            return
        if self.reload_requested:
            self.reload_requested = False
            await self.reload()
        pipeline = self.config.pipeline
        if _due(tick, pipeline.rescan_interval_seconds):
            await self.intake.rescan()
        if _due(tick, pipeline.status_interval_seconds):
            self.report_status()
        if _due(tick, HEALTH_CHECK_SECONDS):
            await self.health_watch.check(self.engine)
        self.health_watch.ping_watchdog()

    async def drain(self) -> None:
        """No new files; in-flight documents get the grace period, the rest stay claimed.
        The documents are drained whatever stopping the intake met: the parts stopped after
        this (the render pool, the engine) must never be stopped under a document."""
        self.notifier.stopping(f"draining {self.dispatcher.running} documents")
        try:
            await self.intake.stop()
        finally:
            await self.dispatcher.drain(self.config.pipeline.shutdown_grace_seconds)

    # --- several daemons on one inbox (the daemon's instances.LeaseListener) -------------

    def serves(self, work: Path) -> bool:
        """Whether an inbox served now has its work area in `work`."""
        return bool(self.intake.on_work(work))

    async def lease_lost(self, work: Path, reason: str) -> list[str]:
        return await self.dispatcher.give_up(work)

    async def lease_regained(self, work: Path) -> None:
        self.dispatcher.add(await self.intake.regained(work))

    async def claims_taken_over(self, work: Path, taken: TakenOver) -> None:
        self.dispatcher.add(await self.intake.taken_over(work, taken))

    # --- reloading -----------------------------------------------------------------------

    def request_reload(self) -> None:
        self.reload_requested = True  # applied at the next tick, between documents

    async def reload(self) -> None:
        """Re-read the configuration file (SIGHUP); an invalid one changes nothing."""
        started = self.notifier.reloading()
        try:
            new = await asyncio.to_thread(self._read_config)
        except ConfigError as error:
            self.log.error(
                "config.reload_failed",
                reason=str(error),
                action="the configuration in use stays in effect; fix the file and reload again",
            )
            refused = ReloadRecord(os.getpid(), started, applied=False, reason=str(error))
            self.notifier.reloaded(refused, self.status_line())
            return
        plan = plan_reload(self.config, new)
        for line in plan.refused:
            self.log.warning("config.reload_refused", reason=line)
        for path in plan.removed:
            await self._remove_inbox(path)
        for config in plan.changed:
            old, _ = await self.intake.replace(config)
            if old is not None:  # its files not yet claimed are found again, with new settings
                self.dispatcher.forget(old)
        for config in plan.added:
            _, recovered = await self.intake.add(config)
            self.dispatcher.add(recovered)
        self.config = plan.config
        if self.web.uploads is not None:
            self.web.uploads.configure(plan.config)
        if self.web.documents is not None:
            self.web.documents.configure(plan.config)
        self.apply_pipeline_settings()
        if plan.http_changed:
            await self.web.serve(plan.config.http)
        self.log.info(
            "config.reloaded",
            added=[str(i.path) for i in plan.added],
            removed=[str(p) for p in plan.removed],
            changed=[str(i.path) for i in plan.changed],
            http_restarted=plan.http_changed,
            refused=len(plan.refused),
        )
        applied = ReloadRecord(os.getpid(), started, applied=True, refused=list(plan.refused))
        self.notifier.reloaded(applied, self.status_line())

    def _read_config(self) -> Config:
        if self.config_path is None:
            raise ConfigError("no configuration file to re-read")
        new = load_config(self.config_path)
        # A configuration refused for who may change it makes none of its folders.
        problems = strict_mode_problems(self.config_path, new, self.engine_kind)
        if not problems:
            problems = checks.problems(new)
        if problems:
            raise ConfigError("\n".join(problems))
        return new

    async def _remove_inbox(self, path: Path) -> None:
        """Stop watching an inbox. Files not yet claimed stay in it; documents already
        claimed from it finish under its settings."""
        inbox = await self.intake.remove(path)
        if inbox is not None:
            unclaimed = self.dispatcher.forget(inbox)
            self.log.info("inbox.removed", inbox=str(path), files_left_unclaimed=unclaimed)

    def apply_pipeline_settings(self) -> None:
        """The pipeline settings that take effect while running (see ocrd/config/reload.py)."""
        settings = self.config.pipeline
        self.follow_engine_capacity()
        self.pipeline.retry_pages(settings.page_retries, settings.page_retry_backoff_seconds)

    def follow_engine_capacity(self) -> None:
        """Size the page budget and admission by the engine's capacity now: a fleet behind
        a router grows and shrinks while ocrd runs."""
        settings = self.config.pipeline
        capacity = self.engine.max_concurrency
        self.dispatcher.admission.resize(settings.documents_in_flight_for(capacity))
        self.pipeline.budget.resize(settings.pages_in_flight_for(capacity))

    # --- reporting -----------------------------------------------------------------------

    def problems(self) -> list[str]:
        """What keeps ocrd from being ready; empty when all is well."""
        problems = self.health_watch.problems(self.engine)
        if self.runner.storage.fault:
            problems.append(f"STORAGE FAULT, retrying: {self.runner.storage.fault}")
        problems += self.intake.problems()
        problems += self.instances.problems()
        if self.web.uploads is not None:
            problems += self.web.uploads.problems()
        if self.stopping.is_set():
            problems.append("stopping")
        return problems

    def inboxes_by_model(self) -> dict[str, list[str]]:
        """Each served model's inboxes (none for a model no inbox names)."""
        served: dict[str, list[str]] = {m: [] for m in self.config.engine.served_models}
        for inbox in self.config.inboxes:
            served.setdefault(inbox.model, []).append(str(inbox.path))
        return served

    def paused_models(self) -> dict[str, str]:
        """The models whose engine takes no pages now, and why: their inboxes' new
        documents wait (the service's own problems say so where every model is down)."""
        reasons = {m: pause_reason(model_health(self.engine, m)) for m in self.inboxes_by_model()}
        return {model: reason for model, reason in reasons.items() if reason is not None}

    def attention(self) -> list[str]:
        """What needs a person although ocrd serves: files it cannot take, stuck claims."""
        stuck = [f"needs an operator: {reason}" for reason in self.runner.stuck.values()]
        return self.intake.attention() + stuck

    def status_line(self) -> str:
        problems = [p for p in self.problems() if p != "the engine is loading"]
        problems += self.attention()
        if self.web.problem:
            problems.append(self.web.problem)
        if self.engine.health.degraded:
            problems.append(f"DEGRADED: {self.engine.health.degraded}")
        waiting = self.intake.waiting_count() + len(self.dispatcher.jobs)
        replicas = f"{self.engine.summary}, " if len(self.engine.replicas) > 1 else ""
        return (
            "".join(f"{p}; " for p in problems)
            + replicas
            + (
                f"{waiting} waiting, {self.dispatcher.running} documents "
                f"({self.pipeline.pages_in_flight} pages) in flight, "
                f"{self.activity.pages_per_second():.2f} pages/s"
            )
        )

    def report_status(self, *_: object) -> None:
        self.notifier.status(self.status_line())
        self.log.debug(
            "daemon.status",
            waiting=self.intake.waiting_count() + len(self.dispatcher.jobs),
            documents_in_flight=self.dispatcher.running,
            pages_in_flight=self.pipeline.pages_in_flight,
            loop_lag_worst_ms=round(self.health_watch.pulse.take_report() * 1000, 1),
        )

    def status_report(self) -> StatusReport:
        now = time.monotonic()
        problems = self.problems()
        return StatusReport(
            version=__version__,
            instance=self.instances.name,
            engine=self.engine.name,
            engine_state=self.engine.health.state.value,
            engine_summary=self.engine.summary,
            degraded=self.engine.health.degraded,
            replicas=[replica_status(facts) for facts in self.engine.replicas],
            ready=not problems,
            problems=problems,
            paused_models=self.paused_models(),
            attention=self.attention(),
            pages_per_second=round(self.activity.pages_per_second(), 3),
            documents_in_flight=self.dispatcher.running,
            pages_in_flight=self.pipeline.pages_in_flight,
            inboxes=[self._inbox_status(inbox, now) for inbox in self.intake.inboxes],
            finished=[FinishedDocument.of(s) for s in self.activity.finished],
            history=self.activity.history(),
        )

    def _inbox_status(self, inbox: Inbox, now: float) -> InboxStatus:
        waiting = self.intake.arriving(inbox) + self.dispatcher.queued(inbox)
        oldest = heapq.nsmallest(WAITING_LISTED, waiting, key=lambda w: w[0])  # thousands: cheap
        root = str(inbox.config.path)
        return InboxStatus(
            path=root,
            watching=inbox.watcher.watching,
            waiting_count=len(waiting),
            oldest_waiting_seconds=round(now - oldest[0][0], 1) if oldest else None,
            waiting=[self.intake.listed(inbox, w, now) for w in oldest],
            in_flight=[
                flight.report(now)
                for flight in self.runner.in_flight.values()
                if flight.inbox == root
            ],
            blocked=self.intake.blocked_files(inbox),
            instances=self.instances.report(inbox.config.work),
            uploads=inbox.config.uploads,
            uploads_problem=self.web.uploads.unusable.get(root) if self.web.uploads else None,
            model=inbox.config.model,
            paused=pause_reason(model_health(self.engine, inbox.config.model)),
        )


def replica_status(facts: ReplicaFacts) -> ReplicaStatus:
    check = facts.self_check
    return ReplicaStatus(
        name=facts.name,
        device=facts.device,
        state=facts.state.value,
        since=facts.since,
        capacity=facts.capacity,
        in_flight=facts.in_flight,
        pages_done=facts.pages_done,
        pages_failed=facts.pages_failed,
        restarts=facts.restarts,
        deaths_with_pages=facts.deaths_with_pages,
        self_check=f"read {check.words_found} of {check.words_expected} words" if check else None,
        self_check_passed=check.passed if check and facts.self_checks else None,
        self_check_state=_self_check_state(facts),
        problem=facts.problem,
        pid=facts.pid,
        model=facts.model,
    )


def _self_check_state(facts: ReplicaFacts) -> Literal["none", "pending", "passed", "failed"]:
    if not facts.self_checks:
        return "none"
    if facts.self_check is None:
        return "pending"
    return "passed" if facts.self_check.passed else "failed"


def _due(tick: int, seconds: float) -> bool:
    return tick % max(1, round(seconds / TICK_SECONDS)) == 0
