"""Keeping a replica alive: one loop per replica brings it up (starts its process, or
probes the server), proves it reads (the self-check gate), serves until it goes down,
takes it down, waits with backoff (Backoff), and starts again. The others keep working
meanwhile. A garbled replica is asked to read the test page again now and then (someone
may have fixed the server: from a minute on, doubling, never longer apart than a serving
replica's checks); a serving one too, at random times (`recheck_seconds` on
average), so that a server that read the test page and then answers work badly is caught
and taken out of rotation. Every change of a replica's state is told to the router's
listeners and judged into the fleet's health (health.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ocrd.backoff import Backoff
from ocrd.engines.base import EngineHealth, ReplicaFacts, ReplicaState
from ocrd.engines.blame import note_death
from ocrd.engines.gate import SelfCheckGate
from ocrd.engines.health import judge
from ocrd.engines.keepers import ReplicaUnavailable
from ocrd.engines.replica import Replica, settle
from ocrd.log import FilteringBoundLogger

HEALTHY_SECONDS = 300.0  # up this long: the next restart's backoff starts from the first wait
RECHECK = Backoff(first=60.0, factor=2.0, cap=900.0)  # a garbled replica is asked again


class Supervisor:
    """Keeps each replica of `replicas` (the router's own list) serving."""

    def __init__(
        self,
        replicas: list[Replica],
        restart: Backoff,
        gate: SelfCheckGate | None,
        health: EngineHealth,
        log: FilteringBoundLogger,
        on_ready: Callable[[], None],
    ) -> None:
        self.replicas = replicas
        self.restart = restart
        self.gate = gate  # None: the self-check is off
        self.health = health
        self.log = log
        self.on_ready = on_ready  # a replica became ready: hand it waiting pages
        self.on_change: list[Callable[[ReplicaFacts], None]] = []
        self.stopping = False
        self.fleet_problem: str | None = None  # what is wrong with the fleet's list
        self.recheck_seconds = 0.0  # mean wait between a serving replica's checks (0: none)

    async def keep(self, replica: Replica) -> None:
        """Bring the replica up, prove it reads, serve until it goes down; again, with backoff."""
        delays = self.restart.delays()
        while True:
            replica.generation += 1
            replica.down.clear()
            if replica.keeper.local or replica.generation == 1:  # a fleet's server stays down
                self.set_state(replica, ReplicaState.loading, replica.problem)
            up_since: float | None = None
            try:
                await replica.keeper.bring_up()
                up_since = time.monotonic()
                await self._prove(replica)
                reason = await self._serve_until_down(replica)
            except ReplicaUnavailable as error:
                reason = str(error)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # a bug must not end supervision silently
                self.log.exception("engine.replica_error", replica=replica.name)
                reason = f"{type(error).__name__}: {error}"
            self._went_down(replica, reason, served=up_since is not None)
            await replica.keeper.take_down()
            settle(replica.started)
            if up_since is not None and time.monotonic() - up_since >= HEALTHY_SECONDS:
                delays = self.restart.delays()
            delay = next(delays)
            self.log.info(
                "engine.replica_restarting",
                replica=replica.name,
                address=replica.link.address,
                in_seconds=round(delay, 1),
            )
            await asyncio.sleep(delay)
            replica.restarts += 1

    async def _prove(self, replica: Replica) -> None:
        """Ready if it reads ocrd's test page (or the check is off); garbled if it answers
        without reading it; ReplicaUnavailable if it does not answer."""
        if self.gate is None:
            self._became_ready(replica)
            return
        if replica.state is not ReplicaState.garbled:  # asked again, it stays out meanwhile
            self.set_state(replica, ReplicaState.checking, None)
        result = await self.gate.read_test_page(replica)
        replica.self_check = result
        if result.passed:
            self.log.info(
                "engine.self_check_passed",
                replica=replica.name,
                words=f"{result.words_found}/{result.words_expected}",
                seconds=round(result.seconds, 1),
            )
            self._became_ready(replica)
            return
        problem = self.gate.garbled_problem(replica, result)
        self.log.error(
            "engine.self_check_failed",
            replica=replica.name,
            words=f"{result.words_found}/{result.words_expected}",
            vllm_version=result.vllm_version,
            answer=result.answer,
            error=problem,
        )
        self.set_state(replica, ReplicaState.garbled, problem)
        settle(replica.started)

    async def _serve_until_down(self, replica: Replica) -> str:
        """Wait until the replica goes down; a garbled one is asked to read the page again
        now and then (someone may have fixed the server)."""
        rechecks = self._garbled_rechecks().delays()
        while True:
            waits = [
                asyncio.ensure_future(replica.keeper.until_down()),
                asyncio.ensure_future(replica.down.wait()),
            ]
            if replica.state is ReplicaState.garbled:
                waits.append(asyncio.ensure_future(asyncio.sleep(next(rechecks))))
            elif self.gate is not None and self.recheck_seconds > 0:
                unannounced = self.gate.next_recheck(self.recheck_seconds)
                waits.append(asyncio.ensure_future(asyncio.sleep(unannounced)))
            try:
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for wait in waits:
                    wait.cancel()
            if waits[0] in done:
                return str(waits[0].result())
            if waits[1] in done:
                return replica.problem or "went down"
            if replica.state is ReplicaState.garbled:
                await self._prove(replica)  # a garbled replica's recheck
            else:
                await self._recheck(replica)

    def _garbled_rechecks(self) -> Backoff:
        """The waits before a garbled replica is asked again: from a minute, doubling up to
        15 minutes; never longer than a serving one waits for its unannounced check
        (`recheck_seconds`), so that a fleet checked often is seen mended as soon."""
        if self.recheck_seconds <= 0:
            return RECHECK
        cap = min(RECHECK.cap, self.recheck_seconds)
        return Backoff(first=min(RECHECK.first, cap), factor=RECHECK.factor, cap=cap)

    async def _recheck(self, replica: Replica) -> None:
        """An unannounced check of a serving replica; it serves on meanwhile. One that
        fails it is taken out of rotation (garbled, asked again later like any)."""
        assert self.gate is not None
        try:
            result = await self.gate.read_test_page(replica)
        except ReplicaUnavailable as error:  # busy or failing: its pages' requests tell
            self.log.info("engine.self_check_unanswered", replica=replica.name, error=str(error))
            return  # whether it is down; the next unannounced check comes as planned
        replica.self_check = result
        words = f"{result.words_found}/{result.words_expected}"
        if result.passed:
            self.log.info("engine.self_check_repeated", replica=replica.name, words=words)
            return
        problem = "it failed an unannounced check while serving: " + self.gate.garbled_problem(
            replica, result
        )
        self.log.error(
            "engine.self_check_failed",
            replica=replica.name,
            words=words,
            unannounced=True,
            vllm_version=result.vllm_version,
            answer=result.answer,
            error=problem,
            action="it gets no more pages; pages it answered since its last check may be garbled",
        )
        self.set_state(replica, ReplicaState.garbled, problem)

    def _became_ready(self, replica: Replica) -> None:
        replica.ever_ready = True
        self.set_state(replica, ReplicaState.ready, None)
        self.log.info(
            "engine.replica_ready",
            replica=replica.name,
            address=replica.link.address,
            device=replica.device,
            pid=replica.keeper.pid,
            restarts=replica.restarts,
        )
        settle(replica.started)
        self.on_ready()

    def _went_down(self, replica: Replica, reason: str, served: bool) -> None:
        if not served and replica.generation > 1:  # a restart (or probe) that did not succeed
            self.log.info("engine.replica_still_down", replica=replica.name, error=reason)
            self.set_state(replica, ReplicaState.down, reason)
            return
        self.log.error(
            "engine.replica_down",
            replica=replica.name,
            address=replica.link.address,
            error=reason,
            action="its pages go to the other replicas; it is "
            + ("restarted" if replica.keeper.local else "probed until it answers")
            + " with backoff",
        )
        self.set_state(replica, ReplicaState.down, reason)

    def mark_down(self, replica: Replica, generation: int, problem: str) -> None:
        """The router saw it fail: no more pages to it; its supervisor takes it down."""
        if replica.generation != generation or replica.state is ReplicaState.down:
            return
        replica.problem = problem
        replica.down.set()
        self.set_state(replica, ReplicaState.down, problem)

    def set_state(self, replica: Replica, state: ReplicaState, problem: str | None) -> None:
        if state is ReplicaState.down:
            note_death(replica)
        if replica.state is not state:
            replica.since = time.time()
        replica.state, replica.problem = state, problem
        self.judge()
        self.tell(replica)

    def tell(self, replica: Replica) -> None:
        """Tell the listeners of the replica's change (its state, or its joining or leaving
        the fleet: the engine's capacity changed)."""
        facts = replica.facts
        for callback in self.on_change:
            callback(facts)

    def judge(self) -> None:
        if not self.stopping:  # else the last state stays for whoever reads it after the stop
            judge(self.health, self.replicas, self.fleet_problem)
