"""A claim: a file (or scan job folder) taken from an inbox into the work area, and what
ocrd knows about it.

Each claim is a folder `<work>/<id>/` holding the original at its path relative to the
inbox (a file, or a scan job's whole folder; with duplex collating also the backs file, a
companion), and `.claim.json` with what ocrd knows about it: which originals it holds, how
often processing started, and the settlement it planned before moving anything, so that a
restart finishes a half-done settlement instead of repeating it. Taking a file into a
claim is `ocrd/intake/claiming.py`.

Several daemons may share a work area (`ocrd/sharing/instances.py`): each keeps its claims
in a folder of its own and holds them under a lease (its `Tenure`). Everything that writes
for a claim asks the tenure first; once the lease is gone, `ClaimLost` ends the work on the
claim without writing anything, since another daemon may be finishing it.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path, PurePath
from typing import Any

from ocrd.domain import Outcome
from ocrd.files import replace_file
from ocrd.files.beneath import beneath_one_of
from ocrd.files.dropped import NotRegularFile
from ocrd.files.reservations import release, reserve
from ocrd.sharing.tenure import STATE_FILE, UNSHARED, Tenure


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
        names = [*map(str, self.markdowns()), self.original, self.error_report, *self.companions]
        return [Path(name) for name in names if name is not None]

    def reserve(self, owner: str, roots: Sequence[Path] = (), plan: Path | None = None) -> bool:
        """Reserve every name for `owner` (by links to `plan`, its saved plan, where they
        can be made: see `reserve`); the markers are made in folders opened below `roots`
        (the output folders) without following a link."""
        for name in self.names():
            with beneath_one_of(roots, name) as held:
                if not reserve(held, owner, plan):
                    return False
        return True

    def release(self, owner: str, roots: Sequence[Path] = ()) -> None:
        for name in self.names():
            gone = contextlib.suppress(FileNotFoundError, NotADirectoryError, NotRegularFile)
            with gone, beneath_one_of(roots, name, make=False) as held:
                release(held, owner)


@dataclass
class ClaimState:
    id: str
    inbox: str
    relative_path: str
    claimed_at: str
    # How often processing started (for the failure report). A new claim is saved with its
    # first attempt counted: the dispatcher starts it at once.
    attempts: int = 0
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
    # Whether the next attempt was counted when the claim was saved (a new claim's first):
    # it then writes nothing, one new file a document less.
    counted: bool = field(default=False, repr=False, compare=False)

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
    def saved(self) -> Path:
        """The claim's state as last saved (replaced by each save, never rewritten)."""
        return self.folder / STATE_FILE

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

    def save(self, sync_folder: bool = True) -> None:
        """Write the state into the claim folder, which is never made again if it is gone
        (another daemon took the claim over and moved it). Without `sync_folder`, a power
        cut may leave the state before (see `replace_file`)."""
        self.check_held()
        data = json.dumps(asdict(self.state), indent=2).encode()
        # Readable by ocrd alone: the names its settlement reserves are links to it.
        replace_file(self.saved, data, make_folder=False, sync_folder=sync_folder, mode=0o600)

    def start_attempt(self) -> int:
        """Count an attempt (ClaimLost where the claim is no longer held). The count must
        outlive a crash of the daemon, which the page cache keeps; one lost in a power cut
        costs nothing but a lower count, so the folder is not synced for it."""
        if self.counted:
            self.counted = False
            self.check_held()
            return self.state.attempts
        self.state.attempts += 1
        self.save(sync_folder=False)
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
        """Remove the claim folder once the original has left it. Not synced: a claim
        folder found again after a power cut holds no original and is settled, or removed,
        at the next start, as after a crash half way through this removal."""
        self.check_held()
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass(frozen=True)
class Destinations:
    """The folders a claim of one inbox may settle into."""

    outbox: Path
    done: Path
    failed: Path

    @property
    def roots(self) -> tuple[Path, Path, Path]:
        return (self.outbox, self.done, self.failed)


def untrusted(state: ClaimState, folder: Path, destinations: Destinations | None) -> str | None:
    """Why a claim's saved state cannot be ocrd's own, in words; None where it can. A claim
    names its originals by paths relative to its folder (no `..`, nothing absolute, no link
    on the way) and plans moves only into its inbox's own outbox, done/ and failed/: a
    state that says otherwise was written by someone else (the work area is checked to be
    ocrd's alone at start, so this is a second line), and is never acted on."""
    for relative in (state.relative_path, *state.companions):
        why = _unsafe_relative(relative) or _link_on_the_way(folder, relative)
        if why is not None:
            return f"its original {relative!r} {why}"
    settlement = state.settlement
    if settlement is None or destinations is None:
        return None
    done = settlement.outcome is Outcome.done
    home = destinations.done if done else destinations.failed
    planned = [(settlement.original, home), *((c, home) for c in settlement.companions)]
    planned += [(str(m), destinations.outbox) for m in settlement.markdowns()] if done else []
    if not done and settlement.error_report is not None:
        planned.append((settlement.error_report, destinations.failed))
    for target, root in planned:
        if not _inside(target, root):
            return f"it plans to move a file to {target!r}, outside {root}"
    return None


def _unsafe_relative(relative: str) -> str | None:
    path = PurePath(relative)
    if not relative or path.is_absolute():
        return "is not a relative path"
    if any(part in ("..", ".") for part in relative.split("/")):
        return "leads out of its folder (..)"
    return None


def _link_on_the_way(folder: Path, relative: str) -> str | None:
    here = folder
    parts = PurePath(relative).parts
    for index, part in enumerate(parts):
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return None  # not there (settled, or never filled): nothing to follow
        if stat.S_ISLNK(mode):
            return "passes through a symbolic link"
        last = index == len(parts) - 1
        if not (stat.S_ISDIR(mode) or (last and stat.S_ISREG(mode))):
            return "is neither a file nor a folder"
    return None


def _inside(target: str, root: Path) -> bool:
    return (
        os.path.isabs(target)
        and os.path.normpath(target) == target
        and Path(target).is_relative_to(root)
        and Path(target) != root
    )
