"""A work area's leases folder and the moves on it (see `ocrd/sharing/leases.py` for the
protocol): making, renewing and giving up this daemon's own lease, and taking over the
claims of a daemon that died. Everything here blocks: the daemon calls it in a thread
(`ocrd/sharing/instances.py`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from ocrd.files import rename_checked, rename_new
from ocrd.sharing.leases import (
    LEASES,
    SEPARATOR,
    Acquired,
    Entry,
    EntryKind,
    Holder,
    LeaseConflict,
    LeaseLost,
    Round,
    Seen,
    Survey,
    TakenOver,
    Waiting,
    by_owner,
    claim_folders,
    conflict_message,
    orphans,
    released_holder,
    survey_of,
    takeable,
)


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
        return survey_of(self.work, now)

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
        left = len(claim_folders(ours)) if ours.is_dir() else 0
        if left:
            self.renew(released_holder(holder))
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
            for folder in claim_folders(source):
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
                raise LeaseConflict(conflict_message(seen, survey.now, self.folder))
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
        return Acquired(now, survey, len(own), by_owner(taken), len(adopted))

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
                folders = self.adopt(claim_folders(self.claims_of(owner)))
                if folders:
                    taken.append(TakenOver(owner, folders, None))
        return Round(survey, by_owner(taken))

    def _sweep_own_temporaries(self) -> None:
        """Probes and new leases an earlier run of ours left (named after us: no other
        daemon's is touched)."""
        prefix = f".{self.me}{SEPARATOR}"
        for name in os.listdir(self.folder):
            if name.startswith(prefix):
                with contextlib.suppress(FileNotFoundError):
                    (self.folder / name).unlink()
