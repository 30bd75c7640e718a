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

Everything here blocks: the daemon calls it in a thread (`ocrd/instances.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path

from ocrd import __version__
from ocrd.files import rename_checked, rename_new
from ocrd.intake.claim import STATE_FILE

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
            instance, socket.gethostname(), _boot_id(), pid, _process_start(pid),
            secrets.token_hex(4), lease_seconds,
        )  # fmt: skip

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


class LeaseFolder:
    """One work area's leases and the claim folders they cover, for instance `me`.
    Blocking file operations: call them in a thread."""

    def __init__(self, work: Path, me: str) -> None:
        self.work = work
        self.me = me
        self.folder = work / LEASES
        self.current = self.folder / me  # the name our lease has now

    def claims_of(self, instance: str) -> Path:
        return self.work / instance

    def _name(self, *parts: str) -> Path:
        return self.folder / SEPARATOR.join(parts)

    # --- clocks and looks ----------------------------------------------------------------

    def server_time(self) -> float:
        """The server's clock now: the modification time of a file just written."""
        probe = self.folder / f".{self.me}{SEPARATOR}probe{SEPARATOR}{secrets.token_hex(4)}"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, b"\n")
            os.fsync(fd)  # the data reached the server, which stamped the time
            return os.fstat(fd).st_mtime
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                probe.unlink()

    def survey(self, now: float) -> Survey:
        seen = []
        for name in sorted(os.listdir(self.folder)):
            entry = None if name.startswith(".") else Entry.parse(name)
            if entry is None:
                continue  # probes, temporaries, .nfsXXXX files
            try:  # opening revalidates what a network client has cached of it
                fd = os.open(self.folder / name, os.O_RDONLY | os.O_CLOEXEC)
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
        with os.scandir(self.work) as entries:
            for child in entries:
                if child.name.startswith(".") or not child.is_dir(follow_symlinks=False):
                    continue
                if os.path.lexists(os.path.join(child.path, STATE_FILE)):
                    legacy.append(child.name)
                else:
                    claims[child.name] = len(_claim_folders(Path(child.path)))
        return Survey(now, seen, claims, sorted(legacy))

    # --- our own lease -------------------------------------------------------------------

    def _write(self, path: Path, holder: Holder, create: bool = False) -> float:
        """Write `holder` into `path`; the server's time of the write."""
        flags = os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            os.write(fd, holder.encode())
            os.fsync(fd)
            return os.fstat(fd).st_mtime
        finally:
            os.close(fd)

    def create(self, holder: Holder) -> float:
        """A new lease of ours, where none is (LeaseConflict where one appeared)."""
        temporary = self.folder / f".{self.me}{SEPARATOR}new{SEPARATOR}{secrets.token_hex(4)}"
        try:
            now = self._write(temporary, holder, create=True)
            try:
                rename_new(temporary, self.folder / self.me)
            except FileExistsError:
                raise LeaseConflict(
                    f"another daemon made a lease named {self.me} in {self.folder} at the "
                    "same moment"
                ) from None
        finally:
            temporary.unlink(missing_ok=True)
        self.current = self.folder / self.me
        return now

    def renew(self, holder: Holder) -> float:
        """Rewrite our lease; the server's time of it. LeaseLost if it was taken over."""
        away = self._name(self.me, "renew", secrets.token_hex(4))
        try:
            rename_checked(self.current, away)
        except FileNotFoundError:
            raise LeaseLost(f"its lease {self.current.name} was taken over") from None
        self.current = away
        try:
            now = self._write(away, holder)
        except FileNotFoundError:
            raise LeaseLost("its lease was taken over while it was being renewed") from None
        try:
            rename_new(away, self.folder / self.me)
        except FileNotFoundError:
            raise LeaseLost("its lease was taken over while it was being renewed") from None
        except FileExistsError:
            raise LeaseConflict(
                f"another daemon made a lease named {self.me} in {self.folder}"
            ) from None
        self.current = self.folder / self.me
        return now

    def release(self, holder: Holder) -> int:
        """Give our lease up (a clean stop): removed where no claim is left in our folder,
        else marked released so that another daemon takes the claims over at once. The
        claims left."""
        ours = self.claims_of(self.me)
        left = len(_claim_folders(ours)) if ours.is_dir() else 0
        if left:
            self.renew(_released(holder))
            return left
        with contextlib.suppress(FileNotFoundError, OSError):
            ours.rmdir()  # empty (hidden leftovers keep it, harmlessly)
        away = self._name(self.me, "renew", secrets.token_hex(4))
        rename_checked(self.current, away)  # fails (LeaseLost's FileNotFoundError) if taken
        with contextlib.suppress(FileNotFoundError):
            away.unlink()
        return 0

    # --- taking over -------------------------------------------------------------------

    def take(
        self,
        seen: Seen,
        check_unchanged: bool = True,
        giving_back: dict[str, str] | None = None,
    ) -> Path | None:
        """Rename `seen`'s entry to a marker of ours; None if another daemon (or its owner,
        renewing it) was quicker, or if it changed since it was judged: then it is given
        back, and where that fails it is noted in `giving_back` (marker -> lease name) to
        be given back later (`_give_back`), never completed while its owner may write."""
        source = self.folder / seen.entry.name
        marker = self._name(seen.entry.owner, "to", self.me, secrets.token_hex(4))
        try:
            rename_checked(source, marker)
        except FileNotFoundError:
            return None
        if check_unchanged and seen.entry.kind is not EntryKind.marker:
            fd = os.open(marker, os.O_RDONLY | os.O_CLOEXEC)
            try:
                info = os.fstat(fd)
            finally:
                os.close(fd)
            if (info.st_mtime_ns, info.st_ino) != seen.stamp:  # renewed at the last moment
                try:
                    rename_new(marker, source)
                    return None
                except FileExistsError:
                    pass  # its owner has a new lease: these claims are no longer its own
                except OSError:
                    if giving_back is None:
                        raise
                    giving_back[marker.name] = source.name
                    return None
        return marker

    def _give_back(self, giving_back: dict[str, str]) -> list[TakenOver]:
        """Leases taken at the moment their owner renewed them, whose giving back failed:
        tried again; where the owner has made a new lease meanwhile (it found its lease
        gone, so it stopped writing), the takeover goes ahead."""
        taken = []
        for name, original in list(giving_back.items()):
            marker = self.folder / name
            try:
                rename_new(marker, self.folder / original)
            except FileExistsError:
                owner = Entry.parse(name)
                assert owner is not None
                taken.append(TakenOver(owner.owner, self.complete(marker, owner.owner), None))
            except FileNotFoundError:
                pass
            except OSError:
                continue  # tried again at the next round
            del giving_back[name]
        return taken

    def complete(self, marker: Path, owner: str) -> list[Path]:
        """Move `owner`'s claims into our folder under the marker we hold, then remove it."""
        moved: list[Path] = []
        source = self.claims_of(owner)
        if owner != self.me and source.is_dir():
            ours = self.claims_of(self.me)
            ours.mkdir(mode=0o700, exist_ok=True)
            for folder in _claim_folders(source):
                target = ours / folder.name
                try:  # a claim's id is unique: nothing lies at the target
                    rename_checked(folder, target)
                except FileNotFoundError:
                    continue
                moved.append(target)
            with contextlib.suppress(OSError):
                source.rmdir()  # hidden leftovers (.nfsXXXX) keep it, harmlessly
        with contextlib.suppress(FileNotFoundError):
            marker.unlink()
        return moved

    def adopt(self, folders: list[Path]) -> list[Path]:
        """Rename claim folders (an older ocrd's, or an orphan's) into our folder; those
        that another daemon took first are left out."""
        ours = self.claims_of(self.me)
        moved = []
        for folder in folders:
            try:
                rename_checked(folder, ours / folder.name)
            except FileNotFoundError:
                continue
            moved.append(ours / folder.name)
        return moved

    # --- a daemon's moves ----------------------------------------------------------------

    def acquire(self, holder: Holder, lease_seconds: float) -> Acquired | Waiting:
        """Take this instance's lease: refuse where a lease of its name is fresh and its
        writer may still run (LeaseConflict); wait while another daemon is taking its
        claims (or take that takeover over, where its taker died); take its earlier leases
        back, make a new lease, then finish what an earlier run of it began."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._sweep_own_temporaries()
        survey = self.survey(self.server_time())
        for seen in survey.leases_of(self.me):
            fresh = seen.holder is not None and not survey.expired(seen, lease_seconds)
            if fresh and seen.holder is not None and seen.holder.may_run_beside(holder):
                raise LeaseConflict(_conflict(seen, survey.now, self.folder))
        own = []  # markers on this instance's claims, now ours: removed once our lease is made
        for seen in survey.markers():
            taker = seen.entry.holder
            if seen.entry.owner != self.me:
                continue
            if taker != self.me and survey.alive(taker, lease_seconds):
                return Waiting(f"{taker} is taking over this instance's claims")
            marker = self.take(seen)  # its taker died: what it did not move is ours again
            if marker is None:
                return Waiting("another daemon took this instance's claims a moment ago")
            own.append(marker)
        for seen in survey.leases_of(self.me):
            marker = self.take(seen, check_unchanged=False)
            if marker is None:
                return Waiting("another daemon took this instance's lease a moment ago")
            own.append(marker)
        now = self.create(holder)
        for marker in own:  # only now, with a lease of ours in place (see `takeable`)
            self.complete(marker, self.me)
        self.claims_of(self.me).mkdir(mode=0o700, exist_ok=True)
        taken = self._finish_own_takeovers(survey)
        adopted = self.adopt([self.work / name for name in survey.legacy])
        return Acquired(now, survey, len(own), taken, len(adopted))

    def _finish_own_takeovers(
        self, survey: Survey, giving_back: dict[str, str] | None = None
    ) -> list[TakenOver]:
        """Takeovers this instance began and did not finish (a run of it died, or a move
        failed): ours to finish, since we hold them and live (not those to give back)."""
        taken = []
        for seen in survey.markers():
            entry = seen.entry
            if entry.holder == self.me and entry.owner != self.me:
                if giving_back is not None and entry.name in giving_back:
                    continue
                folders = self.complete(self.folder / entry.name, entry.owner)
                taken.append(TakenOver(entry.owner, folders, None))
        return taken

    def look(
        self,
        now: float,
        lease_seconds: float,
        take_over: bool,
        first_seen: dict[str, float],
        giving_back: dict[str, str],
    ) -> Round:
        """After a renewal (at the server's time `now`): look at the others' leases and
        (with `take_over`) take over the claims of those that died. `first_seen` (entry or
        folder name -> server time) and `giving_back` are kept between rounds by the
        caller."""
        taken = self._give_back(giving_back)
        survey = self.survey(now)
        names = {s.entry.name for s in survey.seen} | {f"/{n}" for n in survey.claims}
        for name in list(first_seen):
            if name not in names:
                del first_seen[name]
        for name in names:
            first_seen.setdefault(name, now)
        taken += self._finish_own_takeovers(survey, giving_back)
        if take_over:
            for seen in takeable(survey, self.me, lease_seconds, first_seen):
                marker = self.take(seen, giving_back=giving_back)
                if marker is not None:
                    folders = self.complete(marker, seen.entry.owner)
                    age = None if seen.entry.kind is EntryKind.marker else seen.age(now)
                    taken.append(TakenOver(seen.entry.owner, folders, age))
            for owner in orphans(survey, lease_seconds, first_seen):
                folders = self.adopt(_claim_folders(self.claims_of(owner)))
                if folders:
                    taken.append(TakenOver(owner, folders, None))
        return Round(survey, taken)

    def _sweep_own_temporaries(self) -> None:
        """Probes and new leases an earlier run of ours left (named after us: no other
        daemon's is touched)."""
        prefix = f".{self.me}{SEPARATOR}"
        for name in os.listdir(self.folder):
            if name.startswith(prefix):
                with contextlib.suppress(FileNotFoundError):
                    (self.folder / name).unlink()


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


def _claim_folders(folder: Path) -> list[Path]:
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


def _released(holder: Holder) -> Holder:
    return Holder(**{**asdict(holder), "released": True})


def _conflict(seen: Seen, now: float, folder: Path) -> str:
    other = seen.holder
    assert other is not None
    return (
        f"another daemon holds the lease of instance {other.instance} in {folder} (host "
        f"{other.host}, pid {other.pid}, renewed {seen.age(now):.0f} s ago): give each "
        f"daemon its own name with {INSTANCE_ENV}; if that daemon is gone, start again once "
        f"its lease is {other.lease_seconds:g} s old"
    )
