"""Claiming: a ready file is renamed into the work area before anything reads it.

The rename is atomic on one filesystem, so a second event for the same file finds nothing
to claim, and a file is either in the inbox or claimed, never both. What is renamed is
the file that was watched settling: it is checked (a regular file or a job folder, the
same inode, no symbolic link on its way) right before the rename and again right after,
and an entry swapped in between is put back untouched. A file ocrd's user cannot move
out (a folder it may not write, a sticky folder, a file it may not read) is not touched
at all: `NotClaimable` says why and how to fix it. The claim's state (`ocrd/intake/claim.py`)
is written before the originals are moved in, so a claim found without its original was
never completed (or was settled). Claims left by an earlier run are taken up again at
start-up.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path, PurePath

from ocrd.files import fsync_dir, rename_new
from ocrd.files.dropped import (
    Identity,
    NotRegularFile,
    kind_of,
    open_folder_beneath,
    open_regular,
    printable,
)
from ocrd.intake.claim import (
    Claim,
    ClaimState,
    Destinations,
    Settlement,
    new_claim_id,
    now_iso,
    untrusted,
)
from ocrd.sharing.tenure import STATE_FILE, UNSHARED, Tenure
from ocrd.uploads.receiving import mismatch, read_record, upload_of


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


class _User:
    """ocrd's user, named in a refusal."""

    def __str__(self) -> str:
        try:
            return pwd.getpwuid(os.geteuid()).pw_name
        except KeyError:
            return str(os.geteuid())


SHARED_INBOX_FIX = "or set the inbox up as the manual's 'A shared inbox' (docs/sharing.md) says"


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
    user = _User()  # its name is read from the user database only for a refusal
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


def _check_upload(place: Place, relative: PurePath, entry: os.stat_result) -> None:
    """NotClaimable where a file in an upload's folder is not the file uploaded there (its
    record names it): it is never taken for the upload, nor converted beside it."""
    upload = upload_of(str(relative))
    record = read_record(place.folder)
    if upload is None:
        if record:  # ocrd's own record: someone renamed the uploads folder (uploads/guard.py)
            raise NotClaimable(
                f"it is upload {printable(str(record.get('id')))} moved out of the uploads "
                "folder by someone who may write the inbox; it is converted only as that "
                "upload",
                "ocrd renames the uploads folder back; nothing to do",
            )
        return
    why = mismatch(record, place.name, entry)
    if why is not None:
        raise NotClaimable(
            f"it lies in the folder of upload {upload} but is not that upload ({why})",
            "ocrd never takes it; only ocrd's user or root can have put it there: look at "
            "it, then remove it",
        )


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

    def __init__(
        self,
        inbox: Path,
        work: Path,
        tenure: Tenure = UNSHARED,
        destinations: Destinations | None = None,
    ) -> None:
        self.inbox = inbox
        self.work = work
        self.tenure = tenure  # replaced by a new lease after one was lost
        self.destinations = destinations  # where claims may settle (checked when loaded)

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
            _check_upload(place, relative, entry)
            claim_id = new_claim_id()
            folder = self.work / claim_id
            self.work.mkdir(mode=0o700, parents=True, exist_ok=True)
            folder.mkdir(mode=0o700)  # people who may read the inbox may not look in here
            state = ClaimState(
                claim_id,
                str(self.inbox),
                str(relative),
                now_iso(),
                attempts=1,
                companions=[str(c.relative_to(self.inbox)) for c in companions],
            )
            claim = Claim(folder, state, tenure, counted=True)
            try:
                # First: a claim folder without its original is known empty. Where the
                # original lands in the claim folder itself, the folder sync after the move
                # makes both names durable.
                claim.save(sync_folder=claim.path.parent != folder)
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
        if target.parent != claim.folder:  # a companion in a subfolder
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
        """The claim in `folder`; quarantined (kept, never acted on) where what it says
        cannot be ocrd's own (see `untrusted`)."""
        state = self._saved_state(folder)
        if state is not None:
            claim = Claim(folder, state, self.tenure)
            why = untrusted(state, folder, self.destinations)
            if why is not None:
                state.quarantine = f"its state cannot be ocrd's own: {why}"
                return claim
            if claim.path.exists() or claim.path.is_symlink():
                return claim
            if state.settlement is not None:  # settled: the run died before tidying up
                roots = self.destinations.roots if self.destinations else ()
                state.settlement.release(claim.id, roots)
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
        why = untrusted(state, folder, None)
        if why is not None:
            state.quarantine = f"what it holds cannot be ocrd's own: {why}"
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
