"""Claiming: a ready file is renamed into the work area before anything reads it.

The rename is atomic on one filesystem, so a second event for the same file finds nothing
to claim, and a file is either in the inbox or claimed, never both. Each claim is a folder
`<work>/<id>/` holding the original at its path relative to the inbox (a file, or a scan
job's whole folder; with duplex collating also the backs file, a companion), and
`.claim.json` with what ocrd knows about it: which originals it holds, how often processing
started, and the settlement it planned before moving anything, so that a restart finishes
a half-done settlement instead of repeating it. The state is written before the originals
are moved in, so a claim found without its original was never completed (or was settled).
Claims left by an earlier run are taken up again at start-up.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePath
from typing import Any

from ocrd.files import fsync_dir, replace_file

STATE_FILE = ".claim.json"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def new_claim_id() -> str:
    return f"{datetime.now(UTC):%Y%m%dT%H%M%S}-{secrets.token_hex(3)}"


@dataclass
class Settlement:
    """Where a claim's files go, decided and saved before any of them moves."""

    outcome: str  # "done" or "failed"
    original: str  # destination of the original
    markdown: str | None = None
    error_report: str | None = None
    error: dict[str, Any] | None = None
    naming: str = "original"  # or "safe", "flat": where the target refused the name
    companions: list[str] = field(default_factory=list)  # destinations of the companions


@dataclass
class ClaimState:
    id: str
    inbox: str
    relative_path: str
    claimed_at: str
    # Attempts that started and did not end cleanly: the running one, and any during which
    # the daemon or its engine died. A clean stop takes its attempt back.
    attempts: int = 0
    alone: bool = False  # the last attempt ran with no other document in flight
    journal_at_start: int = 0  # bytes of the page journal when the last attempt started
    companions: list[str] = field(default_factory=list)  # other originals (a duplex's backs)
    settlement: Settlement | None = None


@dataclass
class Claim:
    folder: Path
    state: ClaimState

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

    def save(self) -> None:
        replace_file(self.folder / STATE_FILE, json.dumps(asdict(self.state), indent=2).encode())

    def start_attempt(self, alone: bool = False) -> int:
        self.state.attempts += 1
        self.state.alone = alone
        self.state.journal_at_start = self._journal_size()
        self.save()
        return self.state.attempts

    def _journal_size(self) -> int:
        try:
            return self.journal.stat().st_size
        except FileNotFoundError:
            return 0

    def end_attempt_cleanly(self) -> None:
        """A clean stop (shutdown, outage) is no evidence against the document."""
        self.state.attempts = max(0, self.state.attempts - 1)
        self.save()

    @property
    def struck(self) -> bool:
        """The daemon or its engine died while this document was in flight."""
        return self.state.attempts > 0

    def plan(self, settlement: Settlement) -> None:
        self.state.settlement = settlement
        self.save()

    def release(self) -> None:
        """Remove the claim folder once the original has left it."""
        shutil.rmtree(self.folder, ignore_errors=True)
        fsync_dir(self.folder.parent)


class WorkArea:
    """The claim folders of one inbox."""

    def __init__(self, inbox: Path, work: Path) -> None:
        self.inbox = inbox
        self.work = work

    def claim(self, path: Path, companions: tuple[Path, ...] = ()) -> Claim | None:
        """Move `path` (a file or a job folder inside the inbox), and its companions, into
        a new claim; None if `path` is already gone (a companion gone is left out)."""
        relative = path.relative_to(self.inbox)
        claim_id = new_claim_id()
        folder = self.work / claim_id
        folder.mkdir(parents=True)
        state = ClaimState(
            claim_id,
            str(self.inbox),
            str(relative),
            now_iso(),
            companions=[str(c.relative_to(self.inbox)) for c in companions],
        )
        claim = Claim(folder, state)
        claim.save()  # first: a claim folder without its original is known to be empty
        if not self._move_in(path, claim.path):
            shutil.rmtree(folder, ignore_errors=True)
            return None
        moved = [c for c in companions if self._move_in(c, folder / c.relative_to(self.inbox))]
        if len(moved) != len(companions):
            state.companions = [str(c.relative_to(self.inbox)) for c in moved]
            claim.save()
        return claim

    @staticmethod
    def _move_in(source: Path, target: Path) -> bool:
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(source, target)
        except FileNotFoundError:
            return False
        fsync_dir(source.parent)
        fsync_dir(target.parent)
        return True

    def recover(self) -> list[Claim]:
        """Claims an earlier run left behind, oldest first; empty claim folders are removed."""
        if not self.work.is_dir():
            return []
        claims = []
        for folder in sorted(entry for entry in self.work.iterdir() if entry.is_dir()):
            claim = self._load(folder)
            if claim is None:
                shutil.rmtree(folder, ignore_errors=True)
            else:
                claims.append(claim)
        return claims

    def _load(self, folder: Path) -> Claim | None:
        state = self._saved_state(folder)
        if state is not None:
            claim = Claim(folder, state)
            return claim if claim.path.exists() else None  # never filled, or settled
        originals = [
            path
            for path in folder.rglob("*")
            if (path.is_file() or path.is_symlink())
            and not any(part.startswith(".") for part in path.relative_to(folder).parts)
        ]  # hidden names are ocrd's own: the state file and the figures made so far
        if len(originals) != 1:
            return None  # settled (original moved out) before the folder was removed
        relative = originals[0].relative_to(folder)  # a claim of an earlier ocrd's making
        return Claim(folder, ClaimState(folder.name, str(self.inbox), str(relative), now_iso()))

    @staticmethod
    def _saved_state(folder: Path) -> ClaimState | None:
        try:
            saved = json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
            settlement = saved.pop("settlement", None)
            state = ClaimState(**saved)
            state.settlement = Settlement(**settlement) if settlement else None
        except (OSError, ValueError, TypeError):
            return None
        return state
