"""Claiming: a ready file is renamed into the work area before anything reads it.

The rename is atomic on one filesystem, so a second event for the same file finds nothing
to claim, and a file is either in the inbox or claimed, never both. What is renamed is
the file that was watched settling: it is checked (a regular file or a job folder, the
same inode, no symbolic link on its way) right before the rename and again right after,
and an entry swapped in between is put back untouched. A file ocrd's user cannot move
out (a folder it may not write, a sticky folder, a file it may not read) is not touched
at all: `NotClaimable` says why and how to fix it. Each claim is a folder
`<work>/<id>/` holding the original at its path relative to the inbox (a file, or a scan
job's whole folder; with duplex collating also the backs file, a companion), and
`.claim.json` with what ocrd knows about it: which originals it holds, how often processing
started, and the settlement it planned before moving anything, so that a restart finishes
a half-done settlement instead of repeating it. The state is written before the originals
are moved in, so a claim found without its original was never completed (or was settled).
Claims left by an earlier run are taken up again at start-up.

Several daemons may share a work area (`ocrd/instances.py`): each keeps its claims in a
folder of its own and holds them under a lease (its `Tenure`). Everything that writes for
a claim asks the tenure first; once the lease is gone, `ClaimLost` ends the work on the
claim without writing anything, since another daemon may be finishing it.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path, PurePath
from typing import Any, Protocol

from ocrd.domain import Outcome
from ocrd.files import fsync_dir, release, rename_new, replace_file, reserve
from ocrd.files.dropped import (
    Identity,
    NotRegularFile,
    kind_of,
    open_folder_beneath,
    open_regular,
    printable,
)

STATE_FILE = ".claim.json"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def new_claim_id() -> str:
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


class Naming(StrEnum):
    """How a settlement names its files: as the original was named; made safe for any
    filesystem (an SMB or FAT target refuses `:` or `?`); or flat, the whole relative path
    in one short name (a path too long for the target)."""

    original = "original"
    safe = "safe"
    flat = "flat"


@dataclass
class Settlement:
    """Where a claim's files go, decided and saved before any of them moves."""

    outcome: Outcome
    original: str  # destination of the original
    markdown: str | None = None
    error_report: str | None = None
    error: dict[str, Any] | None = None
    naming: Naming = Naming.original  # safe, flat: where the target refused the name
    companions: list[str] = field(default_factory=list)  # destinations of the companions
    # A document split at separator sheets: each part's Markdown (`markdown` is the first).
    parts: list[str] = field(default_factory=list)

    @classmethod
    def load(cls, saved: dict[str, Any]) -> Settlement:
        settlement = cls(**saved)
        settlement.outcome = Outcome(settlement.outcome)
        settlement.naming = Naming(settlement.naming)
        return settlement

    def markdowns(self) -> list[Path]:
        """The Markdown it plans: one, or one per part, in the order they are written."""
        if self.parts:
            return [Path(part) for part in self.parts]
        return [Path(self.markdown)] if self.markdown is not None else []

    def written(self) -> bool:
        """Whether every Markdown is in place (each is written after its companions)."""
        markdowns = self.markdowns()
        return bool(markdowns) and all(markdown.is_file() for markdown in markdowns)

    def names(self) -> list[Path]:
        """The names it plans for files (each reserved by the claim that planned it)."""
        names = [*map(str, self.markdowns()), self.original, self.error_report,
                 *self.companions]  # fmt: skip
        return [Path(name) for name in names if name is not None]

    def reserve(self, owner: str) -> bool:
        return all(reserve(name, owner) for name in self.names())

    def release(self, owner: str) -> None:
        for name in self.names():
            release(name, owner)


class ClaimLost(Exception):
    """This daemon no longer holds the claim: its lease ended (the daemon was paused or cut
    off from the share for longer than the lease allows, and another daemon may have taken
    the claim over). Nothing more is written for it."""


class Tenure(Protocol):
    """The right under which a daemon holds the claims of one work area (its lease there)."""

    def holds(self) -> bool:
        """Whether the daemon still holds its claims: it may write for them."""
        ...

    def check(self) -> None:
        """Raise ClaimLost unless the daemon still holds its claims."""
        ...


class Unshared:
    """The tenure of a work area no other daemon shares (the tools, tests of one part)."""

    def holds(self) -> bool:
        return True

    def check(self) -> None:
        return None


UNSHARED = Unshared()


@dataclass
class ClaimState:
    id: str
    inbox: str
    relative_path: str
    claimed_at: str
    attempts: int = 0  # how often processing started (for the failure report)
    # The page of this document that was in the engine each time the engine died with it
    # there: the evidence of crash accounting (a kill from outside is no evidence).
    engine_deaths: list[int] = field(default_factory=list)
    companions: list[str] = field(default_factory=list)  # other originals (a duplex's backs)
    settlement: Settlement | None = None
    # Why a claim is kept for an operator and never processed: what arrived in it is not
    # what was checked, and it could not be put back.
    quarantine: str | None = None


@dataclass
class Claim:
    folder: Path
    state: ClaimState
    tenure: Tenure = field(default=UNSHARED, repr=False, compare=False)

    @property
    def id(self) -> str:
        return self.state.id

    @property
    def relative_path(self) -> PurePath:
        return PurePath(self.state.relative_path)

    @property
    def scratch(self) -> Path:
        """Files made while converting (figure crops), kept with the claim until written."""
        return self.folder / ".scratch"

    @property
    def journal(self) -> Path:
        """Pages recognised so far, for resuming after a restart."""
        return self.folder / ".pages.jsonl"

    @property
    def path(self) -> Path:
        """Where the original (a file, or a job folder) lies while it is claimed."""
        return self.folder / self.relative_path

    @property
    def companion_paths(self) -> tuple[Path, ...]:
        """Where the companions lie while claimed (those still there)."""
        return tuple(self.folder / relative for relative in self.state.companions)

    @property
    def held(self) -> bool:
        """Whether this daemon still holds the claim (see `Tenure`)."""
        return self.tenure.holds()

    def check_held(self) -> None:
        """ClaimLost unless this daemon still holds the claim: asked before every write."""
        self.tenure.check()

    def save(self) -> None:
        """Write the state into the claim folder, which is never made again if it is gone
        (another daemon took the claim over and moved it)."""
        self.check_held()
        data = json.dumps(asdict(self.state), indent=2).encode()
        replace_file(self.folder / STATE_FILE, data, make_folder=False)

    def start_attempt(self) -> int:
        self.state.attempts += 1
        self.save()
        return self.state.attempts

    def quarantine(self, reason: str) -> None:
        self.state.quarantine = reason
        self.save()

    def record_engine_death(self, page: int) -> None:
        """The engine died while page `page` of this document was in it."""
        self.state.engine_deaths.append(page)
        self.save()

    def plan(self, settlement: Settlement) -> None:
        self.state.settlement = settlement
        self.save()

    def release(self) -> None:
        """Remove the claim folder once the original has left it."""
        self.check_held()
        shutil.rmtree(self.folder, ignore_errors=True)
        fsync_dir(self.folder.parent)


class NotClaimable(Exception):
    """A ready file that ocrd's user cannot move out of the inbox. It stays where it is,
    listed (status page, `ocrd status`, metrics) with the reason and the fix, and is tried
    again at every rescan."""

    def __init__(self, reason: str, fix: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.fix = fix


class Changed(Exception):
    """What lies at the path is no longer what was watched settling (swapped, replaced by
    a link): it is left alone (or, where it could not be put back, its claim quarantined:
    `quarantined` names the claim folder)."""

    def __init__(self, reason: str, quarantined: Path | None = None) -> None:
        super().__init__(reason)
        self.quarantined = quarantined


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


SHARED_INBOX_FIX = "or set the inbox up as the README's 'A shared inbox' says"


@dataclass(frozen=True)
class Place:
    """Where a ready entry lies: its folder, held open (reached from the inbox without
    following any link), and its name there. Every check and the rename go through the
    folder's descriptor, so a folder swapped for a link meanwhile changes nothing."""

    folder: int
    name: str
    shown: str  # the folder, relative to the inbox, for people


def check_claimable(place: Place, entry: os.stat_result) -> None:
    """Raise NotClaimable where ocrd's user could not move the entry out of its folder
    (and read it): nothing is touched to find out. Changed if the entry is no longer
    `entry` (a refusal then says nothing about the file that was checked). Blocking."""
    where = place.shown
    user = _user()
    refusal: NotClaimable | None = None
    parent = os.stat(place.folder)
    if not os.access(".", os.W_OK | os.X_OK, dir_fd=place.folder):
        refusal = NotClaimable(
            f"ocrd's user ({user}) may not write {where}, so it cannot move the file out",
            f"let ocrd's group write it (chgrp ocrd; chmod g+w) {SHARED_INBOX_FIX}",
        )
    elif parent.st_mode & stat.S_ISVTX and os.geteuid() not in (0, entry.st_uid, parent.st_uid):
        refusal = NotClaimable(
            f"{where} has the sticky bit (like /tmp) and neither it nor the file belongs to "
            f"ocrd's user ({user}): only the file's owner may move it",
            f"remove the sticky bit (chmod o-t) {SHARED_INBOX_FIX}",
        )
    elif stat.S_ISDIR(entry.st_mode):
        mode = os.R_OK | os.W_OK | os.X_OK
        if not os.access(place.name, mode, dir_fd=place.folder, follow_symlinks=False):
            refusal = NotClaimable(
                f"ocrd's user ({user}) may not write this scan job folder, and a folder can "
                "only be moved by a user who may write it",
                f"let ocrd's group read and write it (chgrp -R ocrd; chmod -R g+rwX) "
                f"{SHARED_INBOX_FIX}",
            )
    elif not _readable(place, entry):
        refusal = NotClaimable(
            f"ocrd's user ({user}) may not read the file",
            f"let ocrd's group read it (chgrp ocrd; chmod g+r) {SHARED_INBOX_FIX}",
        )
    if refusal is not None:
        _still(place, entry)
        raise refusal


def _readable(place: Place, entry: os.stat_result) -> bool:
    """Whether ocrd's user may read the regular file `entry` (ACLs included): opened to
    find out, never through a link, never blocking; Changed if something else lies there
    now."""
    try:
        fd = open_regular(Path(place.name), place.folder)
    except PermissionError:
        return False
    except OSError:  # gone, or a link or FIFO now
        raise Changed("it changed while it was being checked") from None
    try:
        if Identity.of(os.fstat(fd)) != Identity.of(entry):
            raise Changed("another file took its place while it was being checked")
    finally:
        os.close(fd)
    return True


def _still(place: Place, entry: os.stat_result) -> None:
    """Raise Changed unless the entry is still the file `entry` describes."""
    try:
        now = os.stat(place.name, dir_fd=place.folder, follow_symlinks=False)
    except FileNotFoundError:
        raise Changed("it went away while it was being checked") from None
    if Identity.of(now) != Identity.of(entry):
        raise Changed("another file took its place while it was being checked")


def _arrived(target: Path, identity: Identity) -> bool:
    """Whether the checked file is at `target` although its rename said "no such file" (a
    network share's client sent the rename again after losing the first reply)."""
    try:
        return Identity.of(os.lstat(target)) == identity
    except FileNotFoundError:
        return False


def _sync_quietly(folder: int) -> None:
    """Make a rename out of a person's folder durable where the folder lets us: one that
    refuses (its owner took our read permission) cannot undo a rename that is done."""
    with contextlib.suppress(OSError):
        os.fsync(folder)


class WorkArea:
    """The claim folders of one inbox that this daemon holds: `work`, the work folder
    itself, or its instance's folder in a work area several daemons share."""

    def __init__(self, inbox: Path, work: Path, tenure: Tenure = UNSHARED) -> None:
        self.inbox = inbox
        self.work = work
        self.tenure = tenure  # replaced by a new lease after one was lost

    def claim(
        self,
        path: Path,
        identity: Identity | None = None,
        companions: tuple[Path, ...] = (),
    ) -> Claim | None:
        """Move `path` (a file or a job folder inside the inbox) and its companions into a
        new claim; None if `path` is already gone (a companion gone is left out).

        `identity` is the file that was watched settling: anything else at `path` raises
        Changed and is left where it is. NotClaimable where ocrd's user cannot move it out.
        Other OS errors (EMFILE, EIO) before the move leave nothing behind and are the
        caller's to retry; once the entry is in the claim, the claim goes on. ClaimLost
        while this daemon's lease on the work area is not held."""
        tenure = self.tenure
        tenure.check()
        with self._place(path) as place:
            entry = self._checked(place, identity) if place is not None else None
            if place is None or entry is None:
                return None
            relative = path.relative_to(self.inbox)
            claim_id = new_claim_id()
            folder = self.work / claim_id
            self.work.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.mkdir(mode=0o700)  # people who may read the inbox may not look in here
            state = ClaimState(
                claim_id,
                str(self.inbox),
                str(relative),
                now_iso(),
                companions=[str(c.relative_to(self.inbox)) for c in companions],
            )
            claim = Claim(folder, state, tenure)
            try:
                claim.save()  # first: a claim folder without its original is known empty
                moved = self._move_in(place, claim, claim.path, Identity.of(entry))
            except BaseException:
                if not claim.path.exists() and not claim.path.is_symlink():
                    shutil.rmtree(folder, ignore_errors=True)  # nothing moved in yet
                raise
            if not moved:
                shutil.rmtree(folder, ignore_errors=True)  # it was gone before the rename
                return None
        taken = [c for c in companions if self._companion_in(c, claim)]
        if len(taken) != len(companions):
            state.companions = [str(c.relative_to(self.inbox)) for c in taken]
            claim.save()
        return claim

    @contextmanager
    def _place(self, path: Path) -> Iterator[Place | None]:
        """`path`'s folder held open, reached from the inbox without following links
        (Changed if a link is on the way); None if that folder is gone."""
        try:
            folder = open_folder_beneath(self.inbox, path.parent)
        except NotRegularFile:
            raise Changed("a folder on its way is a symbolic link") from None
        except (FileNotFoundError, NotADirectoryError):
            yield None
            return
        try:
            shown = str(path.parent.relative_to(self.inbox))
            yield Place(folder, path.name, printable(shown) if shown != "." else "the inbox")
        finally:
            os.close(folder)

    @staticmethod
    def _checked(place: Place, identity: Identity | None) -> os.stat_result | None:
        """What lies there, if it is the file (or job folder) that was watched and ocrd
        may move it; None if nothing lies there."""
        try:
            entry = os.stat(place.name, dir_fd=place.folder, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if not (stat.S_ISREG(entry.st_mode) or stat.S_ISDIR(entry.st_mode)):
            raise Changed(f"it is {kind_of(entry.st_mode)} now")
        if identity is not None and Identity.of(entry) != identity:
            raise Changed("another file took its place after it was checked")
        check_claimable(place, entry)
        return entry

    def _companion_in(self, source: Path, claim: Claim) -> bool:
        try:
            with self._place(source) as place:
                entry = self._checked(place, None) if place is not None else None
                if place is None or entry is None or not stat.S_ISREG(entry.st_mode):
                    return False
                target = claim.folder / source.relative_to(self.inbox)
                return self._move_in(place, claim, target, Identity.of(entry))
        except (Changed, NotClaimable):
            return False  # the pair is converted without it; the log says so

    @staticmethod
    def _move_in(place: Place, claim: Claim, target: Path, identity: Identity) -> bool:
        """Rename the entry into the claim; what arrived must be the file that was checked,
        or it goes straight back (never opened, never followed). Where it cannot go back
        (its name was taken meanwhile), the claim is quarantined: kept, never processed,
        listed for an operator; nothing that arrived is ever deleted."""
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(place.name, target, src_dir_fd=place.folder)
        except FileNotFoundError:
            if not _arrived(target, identity):  # else a network share's retried rename
                return False
        except PermissionError as error:  # an ACL or a mount option the checks missed
            raise NotClaimable(
                f"the system refused to move it ({error.strerror})",
                f"let ocrd's user write the folder it lies in {SHARED_INBOX_FIX}",
            ) from None
        arrived = os.lstat(target)
        if Identity.of(arrived) != identity or stat.S_ISLNK(arrived.st_mode):
            try:  # swapped between the check and the rename
                rename_new(target, Path(place.name), target_dir=place.folder)
            except OSError as error:
                reason = (
                    f"{kind_of(arrived.st_mode)} arrived instead of the file that was "
                    f"checked, and could not go back ({error.strerror})"
                )
                claim.quarantine(reason)
                raise Changed(reason, claim.folder) from None
            raise Changed("another file took its place while it was being claimed")
        _sync_quietly(place.folder)  # a person's folder: may refuse, the move is done anyway
        fsync_dir(target.parent)
        return True

    def recover(self) -> list[Claim]:
        """Claims an earlier run left behind, oldest first; empty claim folders are removed.
        Hidden names are not claims (`.nfsXXXX` files a network share keeps for a file that
        was deleted while open, temporaries)."""
        if not self.work.is_dir():
            return []
        folders = [
            entry
            for entry in self.work.iterdir()
            if entry.is_dir() and not entry.name.startswith(".")
        ]
        claims = []
        for folder in sorted(folders):
            claim = self.adopt(folder)
            if claim is not None:
                claims.append(claim)
        return claims

    def adopt(self, folder: Path) -> Claim | None:
        """The claim in `folder` (in this work area: left by an earlier run, or just taken
        over from another daemon), held under this area's tenure; None, and the folder
        removed, if it holds no original (never filled, or settled)."""
        claim = self._load(folder)
        if claim is None:
            shutil.rmtree(folder, ignore_errors=True)
        return claim

    def _load(self, folder: Path) -> Claim | None:
        state = self._saved_state(folder)
        if state is not None:
            claim = Claim(folder, state, self.tenure)
            if claim.path.exists() or claim.path.is_symlink():
                return claim
            if state.settlement is not None:  # settled: the run died before tidying up
                state.settlement.release(claim.id)
            return None  # never filled, or settled
        originals = [
            path
            for path in folder.rglob("*")
            if (path.is_file() or path.is_symlink())
            and not any(part.startswith(".") for part in path.relative_to(folder).parts)
        ]  # hidden names are ocrd's own: the state file and the figures made so far
        if len(originals) != 1:
            return None  # settled (original moved out) before the folder was removed
        relative = originals[0].relative_to(folder)  # a claim of an earlier ocrd's making
        state = ClaimState(folder.name, str(self.inbox), str(relative), now_iso())
        return Claim(folder, state, self.tenure)

    @staticmethod
    def _saved_state(folder: Path) -> ClaimState | None:
        try:
            saved = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
            settlement = saved.pop("settlement", None)
            known = {f.name for f in fields(ClaimState)}  # an older ocrd's keys are dropped
            state = ClaimState(**{k: v for k, v in saved.items() if k in known})
            state.settlement = Settlement.load(settlement) if settlement else None
        except (OSError, ValueError, TypeError):
            return None
        return state
