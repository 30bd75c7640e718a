"""Leases on a shared work area, as files: the protocol by which several daemons share one
inbox's work folder, each holding its own claims and taking over those of one that died.

    <work>/.leases/gpu1                   gpu1's lease
    <work>/.leases/gpu1~renew~<token>     gpu1's lease while gpu1 renews it
    <work>/.leases/gpu1~to~gpu2~<token>   gpu2 is taking gpu1's claims over (a marker)
    <work>/gpu1/<claim id>/               gpu1's claims

A lease is a small file that its daemon rewrites every ninth of `instances.lease_seconds`,
so that the shared filesystem's server stamps its modification time. A lease's age is the
server's time of a fresh write (one's own renewal, or a probe file) minus the server's
time on the lease: the hosts' clocks never enter.

**Renewing** renames the lease away to a name of its own, rewrites it and renames it back.
A rename names the file by its folder and its name on the server, so once another daemon
has taken the lease, the owner's next renewal fails and it knows (a write through an open
file, or through a path its client still has cached, would not notice).

**Taking over** is a rename of the lease to a marker `<owner>~to~<taker>~<token>`: of
several daemons trying at the same moment exactly one succeeds. If the lease changed
between the taker's look at it and the rename (its owner renewed at the last moment), it
is given back. The taker renames each claim folder into its own folder, keeping the
claim's id, so that the names its settlement reserved (`.<name>.ocrd-reserved`, holding
the id) are the taker's own; then it removes the marker. A marker whose holder died is
taken over in turn. An instance that starts takes its own earlier lease back at once
(its claims are its own again) and waits while another daemon is taking them; where a
lease of its name is fresh and its writer may still run (two daemons given one name) it
refuses (LeaseConflict). One that stops cleanly removes its lease, or, where claims are
left, marks it released, so that another daemon takes them over at once.

Network filesystems' quirks: every rename here is checked by its result (a retried
request that says "no such file" although it was done counts as done, `files.py`); no
`O_EXCL` is relied on; hidden names (`.nfsXXXX`, probes, temporaries) are never leases or
claims; and every lease is opened before it is judged, which makes an NFS client fetch its
attributes afresh rather than trust its cache.

Everything here blocks: the daemon calls it in a thread (`ocrd/sharing/instances.py`).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from ocrd import __version__
from ocrd.sharing.tenure import STATE_FILE

INSTANCE_ENV = "OCRD_INSTANCE"
LEASES = ".leases"
SEPARATOR = "~"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")  # an instance's name


class LeaseLost(Exception):
    """The daemon's lease in a work area was taken over: its claims there are not its own."""


class LeaseConflict(Exception):
    """A lease of this instance's name is fresh and its writer may still run: two daemons
    were given the same instance name."""


# --- who wrote a lease ------------------------------------------------------------------


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str:
    """When process `pid` started (clock ticks since boot), or "" if there is none: with
    the pid it names one process, whatever pid reuse does."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]  # field 22; the name may hold spaces


@dataclass(frozen=True)
class Holder:
    """Who wrote a lease: enough to tell whether that daemon may still run."""

    instance: str
    host: str
    boot: str
    pid: int
    process_start: str
    incarnation: str  # this lease's token: a new one each time a lease is taken
    lease_seconds: float
    released: bool = False  # given up by a daemon that stopped with claims left
    ocrd_version: str = __version__

    @classmethod
    def here(cls, instance: str, lease_seconds: float) -> Holder:
        pid = os.getpid()
        return cls(
            instance,
            socket.gethostname(),
            _boot_id(),
            pid,
            _process_start(pid),
            secrets.token_hex(4),
            lease_seconds,
        )

    def encode(self) -> bytes:
        return json.dumps(asdict(self)).encode() + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> Holder | None:
        try:
            return cls(**json.loads(data))
        except (ValueError, TypeError):
            return None  # torn by a kill, or not ocrd's

    def may_run_beside(self, other: Holder) -> bool:
        """Whether this lease's writer may still be running, other than `other`: on another
        host, or this very process (same boot, same pid, same start)."""
        if self.host != other.host:
            return True
        if self.boot != other.boot:
            return False
        return self.pid != other.pid and _process_start(self.pid) == self.process_start != ""


# --- what lies in the leases folder ------------------------------------------------------


class EntryKind(StrEnum):
    lease = "lease"
    renewing = "renewing"
    marker = "marker"  # a takeover: the owner's claims are the holder's to move


@dataclass(frozen=True)
class Entry:
    name: str
    owner: str  # whose claims it covers
    kind: EntryKind
    holder: str  # who holds it: the owner, or the taker of a marker

    @classmethod
    def parse(cls, name: str) -> Entry | None:
        parts = name.split(SEPARATOR)
        if not all(NAME.match(part) for part in parts):
            return None
        if len(parts) == 1:
            return cls(name, name, EntryKind.lease, name)
        if len(parts) == 3 and parts[1] == "renew":
            return cls(name, parts[0], EntryKind.renewing, parts[0])
        if len(parts) == 4 and parts[1] == "to":
            return cls(name, parts[0], EntryKind.marker, parts[2])
        return None


@dataclass(frozen=True)
class Seen:
    """An entry as one look found it."""

    entry: Entry
    mtime: float  # the server's clock
    stamp: tuple[int, int]  # mtime (ns) and inode: changes when it is renewed
    holder: Holder | None  # what it says

    def age(self, now: float) -> float:
        return now - self.mtime


@dataclass
class Survey:
    """One look at a work area: the leases and markers, and the claims of each instance."""

    now: float  # the server's clock, from a write made just before
    seen: list[Seen]
    claims: dict[str, int]  # instance folder -> claim folders in it
    legacy: list[str]  # claim folders straight in the work folder (an older ocrd's)

    def leases_of(self, instance: str) -> list[Seen]:
        return [
            s
            for s in self.seen
            if s.entry.owner == instance and s.entry.kind is not EntryKind.marker
        ]

    def leases_of_others(self, instance: str) -> list[Seen]:
        return [
            s
            for s in self.seen
            if s.entry.owner != instance and s.entry.kind is not EntryKind.marker
        ]

    def markers(self) -> list[Seen]:
        return [s for s in self.seen if s.entry.kind is EntryKind.marker]

    def expired(self, seen: Seen, lease_seconds: float) -> bool:
        """A lease (or renewing lease) whose owner is taken to be dead: released, or a
        whole lease old (the longer of ours and the one it was written with)."""
        if seen.holder is not None and seen.holder.released:
            return True
        written = seen.holder.lease_seconds if seen.holder is not None else 0.0
        return seen.age(self.now) > max(lease_seconds, written)

    def alive(self, instance: str, lease_seconds: float) -> bool:
        return any(not self.expired(s, lease_seconds) for s in self.leases_of(instance))

    def instances(self) -> list[str]:
        names = {s.entry.owner for s in self.seen} | {s.entry.holder for s in self.seen}
        return sorted(names | set(self.claims))


@dataclass(frozen=True)
class TakenOver:
    """Claims moved into this daemon's folder from another instance's."""

    owner: str
    folders: list[Path]
    lease_age: float | None  # of the owner's lease when it was taken; None for a marker


def by_owner(taken: list[TakenOver]) -> list[TakenOver]:
    """One takeover an instance: a daemon killed while renewing may leave its lease under
    two names (linked, not yet unlinked), each taken in the same round."""
    merged: dict[str, TakenOver] = {}
    for one in taken:
        before = merged.get(one.owner)
        if before is None:
            merged[one.owner] = one
            continue
        age = before.lease_age if before.lease_age is not None else one.lease_age
        merged[one.owner] = TakenOver(one.owner, before.folders + one.folders, age)
    return list(merged.values())


@dataclass
class Round:
    """What one renewal round found and did."""

    survey: Survey
    taken: list[TakenOver]


@dataclass
class Acquired:
    now: float  # the server's time of the new lease
    survey: Survey  # the look taken before it
    taken_back: int  # earlier leases and markers of this instance taken back
    taken: list[TakenOver]  # takeovers an earlier run of it began, finished now
    adopted: int  # claims an older ocrd left straight in the work folder


@dataclass(frozen=True)
class Waiting:
    reason: str


def survey_of(work: Path, now: float) -> Survey:
    """One look at the work area `work`: its leases and markers (each opened, which makes
    a network client fetch its attributes afresh), and the claim folders of each instance."""
    folder = work / LEASES
    seen = []
    for name in sorted(os.listdir(folder)):
        entry = None if name.startswith(".") else Entry.parse(name)
        if entry is None:
            continue  # probes, temporaries, .nfsXXXX files
        try:  # opening revalidates what a network client has cached of it
            fd = os.open(folder / name, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # renamed meanwhile
        try:
            data, info = os.read(fd, 65536), os.fstat(fd)
        finally:
            os.close(fd)
        stamp = (info.st_mtime_ns, info.st_ino)
        seen.append(Seen(entry, info.st_mtime, stamp, Holder.decode(data)))
    claims: dict[str, int] = {}
    legacy: list[str] = []
    with os.scandir(work) as entries:
        for child in entries:
            if child.name.startswith(".") or not child.is_dir(follow_symlinks=False):
                continue
            if os.path.lexists(os.path.join(child.path, STATE_FILE)):
                legacy.append(child.name)
            else:
                claims[child.name] = len(claim_folders(Path(child.path)))
    return Survey(now, seen, claims, sorted(legacy))


def takeable(
    survey: Survey, me: str, lease_seconds: float, first_seen: dict[str, float]
) -> list[Seen]:
    """The entries whose claims another daemon (`me`) may take over now: leases of others
    that expired or were released; markers whose holder is not alive and that have been
    there for a whole lease (an instance taking its own lease back at start holds such a
    marker for a moment, before its new lease is made)."""
    found = []
    for seen in survey.seen:
        entry = seen.entry
        if entry.kind is EntryKind.marker:
            if entry.holder == me or survey.alive(entry.holder, lease_seconds):
                continue
            if survey.now - first_seen.get(entry.name, survey.now) < lease_seconds:
                continue
        elif entry.owner == me or not survey.expired(seen, lease_seconds):
            continue
        found.append(seen)
    return found


def orphans(survey: Survey, lease_seconds: float, first_seen: dict[str, float]) -> list[str]:
    """Instance folders holding claims with no lease and no marker for a whole lease (their
    lease was deleted by hand): their claims are taken claim by claim."""
    covered = {s.entry.owner for s in survey.seen}
    return [
        name
        for name, count in survey.claims.items()
        if count
        and name not in covered
        and survey.now - first_seen.get(f"/{name}", survey.now) >= lease_seconds
    ]


def claim_folders(folder: Path) -> list[Path]:
    """The claim folders in an instance's folder (hidden names are none)."""
    try:
        with os.scandir(folder) as entries:
            return sorted(
                Path(entry.path)
                for entry in entries
                if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False)
            )
    except FileNotFoundError:
        return []


def released_holder(holder: Holder) -> Holder:
    return Holder(**{**asdict(holder), "released": True})


def conflict_message(seen: Seen, now: float, folder: Path) -> str:
    other = seen.holder
    assert other is not None
    return (
        f"another daemon holds the lease of instance {other.instance} in {folder} (host "
        f"{other.host}, pid {other.pid}, renewed {seen.age(now):.0f} s ago): give each "
        f"daemon its own name with {INSTANCE_ENV}; if that daemon is gone, start again once "
        f"its lease is {other.lease_seconds:g} s old"
    )
