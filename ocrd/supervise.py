"""Supervision: the engine's health, systemd's watchdog and start timeout, and the main
loop's own pulse.

The engine says what state it is in; the health_watch logs each change (an unreachable
fleet, and when it answers again), checks now and then that an in-process engine is still
alive (a dead one ends the daemon with exit status 70, for systemd to restart it), pings
systemd's watchdog from the main loop only (a stuck loop stops the pings), and while a
model loads keeps asking systemd for more time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from ocrd.engines import Engine, EngineDeadError, EngineState
from ocrd.engines.models import model_health, pause_reason
from ocrd.log import get_logger
from ocrd.notify import SystemdNotifier

HEALTH_CHECK_SECONDS = 2.0
STUCK_AFTER_SECONDS = 10.0  # /healthz fails when the main loop has not ticked this long
START_TIMEOUT_EXTENSION_SECONDS = 60.0  # asked of systemd again and again while loading
START_TIMEOUT_RESEND_SECONDS = 20.0


@dataclass
class Liveness:
    alive: bool
    seconds_since_tick: float


class LoopPulse:
    """When the main loop last ticked, and how late its sleeps woke up (its lag)."""

    def __init__(self) -> None:
        self.last_tick: float | None = None  # monotonic; None until serving
        self.worst_since_report = 0.0
        self.worst = 0.0

    def tick(self, lag: float) -> None:
        self.last_tick = time.monotonic()
        self.worst_since_report = max(self.worst_since_report, lag)
        self.worst = max(self.worst, lag)

    def take_report(self) -> float:
        worst, self.worst_since_report = self.worst_since_report, 0.0
        return worst

    def liveness(self) -> Liveness:
        """Alive if the loop ticked lately (or has not started serving yet)."""
        if self.last_tick is None:
            return Liveness(True, 0.0)
        since = time.monotonic() - self.last_tick
        return Liveness(since < STUCK_AFTER_SECONDS, since)


class HealthWatch:
    def __init__(self, notifier: SystemdNotifier, engine_died: Callable[[str], None]) -> None:
        """`engine_died(reason)` ends the daemon (exit status 70)."""
        self.notifier = notifier
        self.engine_died = engine_died
        self.pulse = LoopPulse()
        self.log = get_logger()
        self._state = EngineState.loading
        self._degraded: str | None = None
        self._paused: dict[str, EngineState] = {}  # models whose engine takes no pages
        self._last_watchdog = 0.0

    @asynccontextmanager
    async def loading(self, engine: Engine, kind: str) -> AsyncIterator[None]:
        """While a model loads, ask systemd for more time again and again, so that no
        fixed start timeout has to cover the slowest first download; STATUS says how many
        replicas are loading, at once when one of them changes."""
        started = time.monotonic()
        loaded = asyncio.Event()

        def ask(_: object = None) -> None:
            if loaded.is_set():
                return  # loaded: a replica's later changes are the service's to report
            elapsed = round(time.monotonic() - started)
            self.notifier.extend_timeout(
                START_TIMEOUT_EXTENSION_SECONDS,
                f"loading the {kind} engine ({engine.summary}), {elapsed} s so far",
            )

        async def keep_asking() -> None:
            while True:
                await asyncio.sleep(START_TIMEOUT_RESEND_SECONDS)
                ask()

        ask()
        engine.subscribe(ask)
        asking = asyncio.create_task(keep_asking())
        try:
            yield
        finally:
            loaded.set()
            asking.cancel()
        self.log.info(
            "engine.ready",
            engine=kind,
            seconds=round(time.monotonic() - started, 1),
            replicas=engine.summary,
        )

    def watch(self, engine: Engine) -> bool:
        """Log the engine's changes of state and of its serving replicas; true if either
        changed."""
        degraded = self._watch_degraded(engine)
        return self._watch_state(engine) or degraded

    def watch_models(self, engine: Engine, inboxes: dict[str, list[str]]) -> bool:
        """Where several models are served (`inboxes`: each model's inboxes), log each
        model whose engine stops taking pages, or takes them again: its inboxes pause or go
        on, the others' are not touched. True if one did."""
        if len(inboxes) < 2:
            return False
        paused: dict[str, EngineState] = {}
        for model in inboxes:
            health = model_health(engine, model)
            if health.state is not EngineState.ready:
                paused[model] = health.state
                if self._paused.get(model) is not health.state:
                    self.log.error(
                        "model.paused",
                        model=model,
                        inboxes=inboxes[model],
                        reason=pause_reason(health),
                        action="its inboxes' files wait (nothing fails); the other models' "
                        "inboxes go on; ocrd resumes them by itself once its engine reads",
                    )
        for model in self._paused.keys() - paused.keys():
            self.log.info("model.resumed", model=model, inboxes=inboxes.get(model, []))
        changed = paused != self._paused
        self._paused = paused
        return changed

    def _watch_state(self, engine: Engine) -> bool:
        health = engine.health
        if health.state is self._state:
            return False
        previous, self._state = self._state, health.state
        if health.state is EngineState.unreachable:
            self.log.error(
                "engine.unreachable",
                since=clock(health.since),
                error=health.problem,
                action="files wait in the inbox and claimed pages wait; nothing fails; "
                "ocrd probes the servers and resumes by itself",
            )
        elif health.state is EngineState.garbled:
            self.log.error(
                "engine.garbled",
                error=health.problem,
                action="no page is sent to it: files wait in the inbox; ocrd asks the "
                "replicas to read its test page again now and then",
            )
        elif health.state is EngineState.ready and previous is EngineState.unreachable:
            self.log.info("engine.reachable", outage_seconds=round(time.time() - health.since))
        return True

    def _watch_degraded(self, engine: Engine) -> bool:
        """Log when the engine starts or stops serving with fewer replicas than it has."""
        degraded = engine.health.degraded
        if degraded == self._degraded:
            return False
        self._degraded = degraded
        if degraded:
            self.log.warning("engine.degraded", replicas=engine.summary, problem=degraded)
        else:
            self.log.info("engine.whole", replicas=engine.summary)
        return True

    async def check(self, engine: Engine) -> None:
        try:
            await engine.check_health()
        except EngineDeadError as error:
            self.dead(error)

    def dead(self, error: BaseException) -> None:
        self.log.error(
            "engine.dead",
            error=str(error),
            action="exiting so that systemd restarts ocrd; claimed files stay in the work area",
        )
        self.engine_died(str(error))

    def ping_watchdog(self) -> None:
        interval = self.notifier.watchdog_interval
        now = time.monotonic()
        if interval and now - self._last_watchdog >= interval:
            self._last_watchdog = now
            self.notifier.watchdog()

    @staticmethod
    def problems(engine: Engine | None) -> list[str]:
        """What about the engine keeps ocrd from being ready."""
        health = engine.health if engine is not None else None
        if health is None or health.state is EngineState.loading:
            return ["the engine is loading"]
        if health.state is EngineState.unreachable:
            return [
                f"INFERENCE FLEET UNREACHABLE since {clock(health.since)}, retrying: "
                f"{health.problem}"
            ]
        if health.state is EngineState.garbled:
            return [f"ENGINE OUTPUT GARBLED: {health.problem}"]
        if health.state is EngineState.dead:
            return [f"the engine died: {health.problem}"]
        return []


def clock(wall: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall))
