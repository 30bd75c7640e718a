"""Several daemons on one shared inbox: this daemon's instance name, and its leases in the
work areas it serves, kept in the background from the moment it starts (before the engine
loads) until it stops. The files and the moves on them are `ocrd/sharing/leases.py`.

Each daemon is an *instance* with a name: the host name, or `OCRD_INSTANCE` (several on
one host). It keeps its claims in `<work>/<instance>/`, and renews its lease in each work
area every ninth of `instances.lease_seconds`.

**Two clocks, half a lease apart.** A daemon writes for its claims only while its last
successful renewal began less than half a lease ago by its own monotonic clock (`Lease`,
the claims' tenure, asked before every write: `ClaimLost` otherwise); others take its
claims only once its lease is a whole lease old by the server's clock. So a daemon that
was paused (SIGSTOP, a frozen virtual machine) or cut off from the share stops writing
half a lease before anyone may take its claims over. When it runs again it finds its
lease gone or run out: it stops every document of those claims without writing anything
(`LeaseListener.lease_lost`), says so (`instance.lease_lost`), and takes a new lease for
new work; claims still in its folder are its own again (`lease_regained`).

A daemon takes over the claims of others (`instance.took_over`, then
`LeaseListener.claims_taken_over`) only once it serves, and not in its first seconds, so
that another host starting at the same moment takes its own claims back first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ocrd.config import InstancesConfig
from ocrd.log import get_logger
from ocrd.sharing.lease_folder import LeaseFolder
from ocrd.sharing.leases import (
    INSTANCE_ENV,
    NAME,
    Acquired,
    Holder,
    LeaseConflict,
    LeaseLost,
    Survey,
    TakenOver,
    Waiting,
)
from ocrd.sharing.tenure import ClaimLost
from ocrd.status import InstanceStatus

HOLD_SHARE = 0.5  # of a lease: how long a daemon writes for its claims after a renewal
# A daemon takes nothing over in its first seconds (this, or a lease if that is shorter):
# another host starting at the same moment takes its own claims back first.
TAKEOVER_GRACE_SECONDS = 10.0


class InstanceNameError(ValueError):
    """The instance name (the host name, or OCRD_INSTANCE) cannot name a folder."""


class Stopped(Exception):
    """The daemon was asked to stop while it waited for its lease."""


def instance_name(environ: Mapping[str, str] = os.environ) -> str:
    """This daemon's instance name: `OCRD_INSTANCE`, or the host name."""
    name = environ.get(INSTANCE_ENV) or socket.gethostname()
    if not NAME.match(name):
        raise InstanceNameError(
            f"the instance name {name!r} ({INSTANCE_ENV} or the host name) must be 1 to 100 "
            "letters, digits, '.', '-' or '_', starting with a letter or digit; set "
            f"{INSTANCE_ENV}"
        )
    return name


class Lease:
    """This daemon's hold on its claims in one work area, for one lease (the `Tenure` of
    its claims there): held while its last renewal began less than half a lease ago."""

    def __init__(
        self, work: Path, lease_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.work = work
        self.hold_seconds = lease_seconds * HOLD_SHARE
        self.clock = clock
        self.renewed_at = -float("inf")
        self.ended: str | None = None

    def renewed(self, began: float) -> None:
        """A renewal that began at `began` (monotonic) succeeded."""
        if self.ended is None:
            self.renewed_at = max(self.renewed_at, began)

    def holds(self) -> bool:
        return self.ended is None and self.clock() - self.renewed_at < self.hold_seconds

    def check(self) -> None:
        if self.ended is not None:
            raise ClaimLost(f"this daemon's lease on {self.work} ended: {self.ended}")
        silent = self.clock() - self.renewed_at
        if silent >= self.hold_seconds:
            raise ClaimLost(
                f"this daemon's lease on {self.work} was not renewed for {silent:.0f} s, so "
                "another daemon may take its claims over"
            )

    def end(self, reason: str) -> None:
        if self.ended is None:
            self.ended = reason


class LeaseListener(Protocol):
    """What the daemon does when a lease is lost, taken anew, or brings claims over, or
    when it cannot be kept at all; and which work areas it serves."""

    def serves(self, work: Path) -> bool:
        """Whether the daemon serves a work area still (an inbox removed by a reload keeps
        its lease until the daemon stops, but takes nothing over)."""
        ...

    def lease_conflict(self, error: LeaseConflict) -> None:
        """Two daemons were given one name: the daemon ends (exit 78)."""
        ...

    def lease_failed(self, error: BaseException) -> None:
        """A bug in keeping a lease: the daemon ends (exit 70)."""
        ...

    async def lease_lost(self, work: Path, reason: str) -> list[str]:
        """Stop every document of the work area's claims (they write nothing more); return
        once they have stopped, with the paths of those given up."""
        ...

    async def lease_regained(self, work: Path) -> None:
        """A new lease: the claims left in this daemon's folder are its own again."""
        ...

    async def claims_taken_over(self, work: Path, taken: TakenOver) -> None:
        """Claims moved into this daemon's folder: documents to run."""
        ...


@dataclass
class Area:
    """One work area as this daemon holds it."""

    work: Path
    folder: LeaseFolder
    lease: Lease
    holder: Holder | None = None
    survey: Survey | None = None
    first_seen: dict[str, float] = field(default_factory=dict)
    giving_back: dict[str, str] = field(default_factory=dict)
    taken_from: dict[str, int] = field(default_factory=dict)  # claims taken over, by owner
    lost: int = 0  # leases lost since this daemon started
    problem: str | None = None  # why the lease is not held now
    failing_since: float | None = None  # renewals failing (monotonic)
    task: asyncio.Task[None] | None = None


class Instances:
    """This daemon's leases in every work area it serves, renewed in the background from
    the moment it starts (before the engine loads) until it stops."""

    def __init__(self, name: str, config: InstancesConfig, listener: LeaseListener) -> None:
        self.name = name
        self.config = config
        self.listener = listener
        self.areas: dict[Path, Area] = {}
        self.take_over_from: float | None = None  # monotonic; None: not serving yet
        self.log = get_logger(instance=name)

    def claims_folder(self, work: Path) -> Path:
        return work / self.name

    def lease(self, work: Path) -> Lease:
        return self.areas[work].lease

    async def join(self, work: Path, stopping: asyncio.Event | None = None) -> Lease:
        """Hold a lease in `work` (waiting while another daemon takes this instance's claims
        there); the lease already held, if any. LeaseConflict, Stopped."""
        area = self.areas.get(work)
        if area is not None:
            return area.lease
        area = Area(work, LeaseFolder(work, self.name), Lease(work, self.config.lease_seconds))
        await self._acquire(area, stopping)
        self.areas[work] = area
        area.task = asyncio.create_task(self._keep(area), name=f"lease {work}")
        return area.lease

    def serving(self) -> None:
        """Start taking over the claims of daemons that died (after a short grace)."""
        if self.take_over_from is None:
            grace = min(TAKEOVER_GRACE_SECONDS, self.config.lease_seconds)
            self.take_over_from = time.monotonic() + grace

    async def leave(self) -> None:
        """A clean stop: leases removed, or released where claims are left."""
        for area in self.areas.values():
            if area.task is not None:
                area.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await area.task
        for area in self.areas.values():
            if area.holder is None or not area.lease.holds():
                continue
            try:
                left = await asyncio.to_thread(area.folder.release, area.holder)
            except (OSError, LeaseLost, LeaseConflict) as error:
                self.log.warning(
                    "instance.lease_not_released", work=str(area.work), error=str(error)
                )
                continue
            area.lease.end("released")
            self.log.info(
                "instance.lease_released",
                work=str(area.work),
                claims_left=left,
                action="another daemon takes them over at once" if left else None,
            )

    # --- keeping a lease ---------------------------------------------------------------

    async def _acquire(self, area: Area, stopping: asyncio.Event | None) -> None:
        holder = Holder.here(self.name, self.config.lease_seconds)
        waited_for: str | None = None
        while True:
            began = time.monotonic()
            try:
                result = await asyncio.to_thread(
                    area.folder.acquire, holder, self.config.lease_seconds
                )
            except OSError as error:
                result = Waiting(f"the work area cannot be reached: {error}")
            if isinstance(result, Acquired):
                break
            area.problem = f"waiting for the lease on {area.work}: {result.reason}"
            if result.reason != waited_for:
                waited_for = result.reason
                self.log.warning(
                    "instance.lease_waiting", work=str(area.work), reason=result.reason
                )
            if stopping is None:
                await asyncio.sleep(self.config.renew_seconds)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), self.config.renew_seconds)
                if stopping.is_set():
                    raise Stopped
        acquired: Acquired = result
        area.lease = Lease(area.work, self.config.lease_seconds)
        area.lease.renewed(began)
        area.holder, area.problem, area.failing_since = holder, None, None
        area.survey = acquired.survey  # who else serves here, until the first renewal
        self.log.info(
            "instance.lease_acquired",
            work=str(area.work),
            lease_seconds=self.config.lease_seconds,
            taken_back=acquired.taken_back,
            adopted=acquired.adopted,
        )
        for taken in acquired.taken:
            await self._took_over(area, taken)

    async def _keep(self, area: Area) -> None:
        while True:
            await asyncio.sleep(self.config.renew_seconds)
            try:
                await self._upkeep(area)
            except Exception as error:  # a bug: without its lease the daemon would idle
                self.log.exception("instance.failed", work=str(area.work))
                self.listener.lease_failed(error)
                return

    async def _upkeep(self, area: Area) -> None:
        lease = area.lease
        if not lease.holds():  # not renewed for half a lease: paused, or cut off
            silent = time.monotonic() - lease.renewed_at
            await self._lost(area, f"not renewed for {silent:.0f} s (paused, or cut off)")
            return
        assert area.holder is not None
        began = time.monotonic()
        take_over = (
            self.take_over_from is not None
            and began >= self.take_over_from
            and self.listener.serves(area.work)
        )
        try:
            now = await asyncio.to_thread(area.folder.renew, area.holder)
        except LeaseLost as lost:
            await self._lost(area, str(lost))
            return
        except LeaseConflict as conflict:
            self.listener.lease_conflict(conflict)
            return
        except OSError as error:
            self._renewal_failed(area, began, error)
            return
        lease.renewed(began)
        if area.failing_since is not None:
            self.log.info("instance.lease_renewed", work=str(area.work))
            area.failing_since = None
        try:
            result = await asyncio.to_thread(
                area.folder.look,
                now,
                self.config.lease_seconds,
                take_over,
                area.first_seen,
                area.giving_back,
            )
        except OSError as error:
            self.log.warning("instance.look_failed", work=str(area.work), error=str(error))
            return
        area.survey = result.survey
        for taken in result.taken:
            await self._took_over(area, taken)

    def _renewal_failed(self, area: Area, began: float, error: OSError) -> None:
        if area.failing_since is None:
            area.failing_since = began
            self.log.warning(
                "instance.lease_renewal_failed",
                work=str(area.work),
                error=str(error),
                action="tried again; without a renewal for half a lease this daemon stops "
                "writing for its claims",
            )

    async def _lost(self, area: Area, reason: str) -> None:
        """The lease is gone (taken over, or run out): stop every document of its claims,
        then take a new lease for new work."""
        area.lease.end(reason)
        area.lost += 1
        area.problem = f"LEASE LOST on {area.work} ({reason}); taking a new one"
        given_up = await self.listener.lease_lost(area.work, reason)
        self.log.error(
            "instance.lease_lost",
            work=str(area.work),
            reason=reason,
            documents_given_up=given_up,
            action="nothing more is written for the claims it held there; a new lease is "
            "taken for new work, and claims still in its folder are its own again",
        )
        try:
            await self._acquire(area, None)
        except LeaseConflict as conflict:
            self.listener.lease_conflict(conflict)
            return
        await self.listener.lease_regained(area.work)

    async def _took_over(self, area: Area, taken: TakenOver) -> None:
        area.taken_from[taken.owner] = area.taken_from.get(taken.owner, 0) + len(taken.folders)
        self.log.warning(
            "instance.took_over",
            work=str(area.work),
            from_instance=taken.owner,
            lease_age_seconds=taken.lease_age,  # unrounded: the figure the rule decided on
            claims=[folder.name for folder in taken.folders],
        )
        # also without claims: it sweeps what the dead one left
        await self.listener.claims_taken_over(area.work, taken)

    # --- reporting ---------------------------------------------------------------------

    def shared(self, work: Path) -> bool:
        """Whether another daemon's lease on `work` was alive at the last look."""
        area = self.areas.get(work)
        if area is None or area.survey is None:
            return False
        names = {s.entry.owner for s in area.survey.leases_of_others(self.name)}
        return any(area.survey.alive(name, self.config.lease_seconds) for name in names)

    def problems(self) -> list[str]:
        return [area.problem for area in self.areas.values() if area.problem]

    def report(self, work: Path) -> list[InstanceStatus]:
        """Every instance seen in `work`'s leases and folders at the last renewal."""
        area = self.areas.get(work)
        if area is None:
            return []
        survey = area.survey
        names = set(survey.instances() if survey else ()) | set(area.taken_from) | {self.name}
        return [self._status(area, survey, name) for name in sorted(names)]

    def _status(self, area: Area, survey: Survey | None, name: str) -> InstanceStatus:
        lease_seconds = self.config.lease_seconds
        leases = survey.leases_of(name) if survey else []
        ages = [seen.age(survey.now) for seen in leases] if survey else []
        holder = next((s.holder for s in leases if s.holder is not None), None)
        taker = next(
            (
                s.entry.holder
                for s in (survey.markers() if survey else [])
                if s.entry.owner == name and s.entry.holder != name
            ),
            None,
        )
        this = name == self.name
        alive = bool(survey and survey.alive(name, lease_seconds))
        return InstanceStatus(
            name=name,
            this=this,
            alive=area.lease.holds() if this else alive,
            lease_age_seconds=round(min(ages), 1) if ages else None,
            claims=survey.claims.get(name, 0) if survey else 0,
            host=holder.host if holder else None,
            taken_over_by=taker,
            taken_over=area.taken_from.get(name, 0),
            leases_lost=area.lost if this else 0,
        )
