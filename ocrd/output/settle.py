"""Settling: the original leaves the work area for done/ or failed/, exactly once.

Every settlement is planned (destinations chosen and saved in the claim) before anything
moves, and each step is durable before the next, so a restart after a crash at any point
finishes the same settlement instead of starting another: one Markdown file, one original.

Names are planned at one of three levels (`Naming`): as the file was named, made safe, or
flat. A caller that finds its target refusing a name plans again one level down; the
abandoned plan's files are removed first.

Each step asks first whether this daemon still holds the claim (`Claim.check_held`): one
whose lease ended while it was paused writes nothing more for it (ClaimLost), since the
daemon that took the claim over finishes it.
"""

from __future__ import annotations

import contextlib
import filecmp
import os
from pathlib import Path, PurePath
from typing import Any

from ocrd import __version__
from ocrd.config import DocumentOptions, InboxConfig
from ocrd.domain import DocumentFailed, DocumentResult, Outcome
from ocrd.files import (
    candidate_names,
    free_name,
    json_bytes,
    move_new,
    numbered,
    write_new_file,
)
from ocrd.files.beneath import beneath
from ocrd.files.dropped import NotRegularFile, printable
from ocrd.files.reservations import holds
from ocrd.files.storage import OwnerRefused, safe_part, safe_relative
from ocrd.intake.claim import Claim, Naming, Settlement, now_iso
from ocrd.output.write import (
    discard_outputs,
    markdown_path,
    outputs_free,
    part_markdown,
    write_document,
)

ERROR_SUFFIX = ".error.json"


def named(relative: PurePath, naming: Naming) -> PurePath:
    if naming is Naming.safe:
        return safe_relative(relative)
    if naming is Naming.flat:
        return PurePath(safe_part("__".join(relative.parts)))
    return relative


def error_report(
    failure: DocumentFailed, claim: Claim | None, engine: str, path: Path
) -> dict[str, Any]:
    return {
        "file": printable(path.name),
        "document_id": claim.id if claim else None,
        "inbox": claim.state.inbox if claim else None,
        "relative_path": printable(claim.state.relative_path) if claim else None,
        "stage": failure.stage.value,
        "page": failure.page,
        "error_type": failure.error_type,
        "message": failure.message,
        "claimed_at": claim.state.claimed_at if claim else None,
        "failed_at": now_iso(),
        "engine": engine,
        "attempts": claim.state.attempts if claim else 1,
        "ocrd_version": __version__,
    }


def report_path(original: Path) -> Path:
    return original.with_name(original.stem + ERROR_SUFFIX)


def write_report(target: Path, report: dict[str, Any]) -> None:
    write_new_file(target, json_bytes(report, indent=2) + b"\n")


def _move_original(source: Path, target: Path) -> None:
    """Move a claimed original (a file or a job folder) to its planned place, once."""
    if not source.exists() and not source.is_symlink():
        return  # moved by an earlier run that died before releasing the claim
    if (
        source.is_file()
        and target.is_file()
        and (os.path.samefile(source, target) or filecmp.cmp(source, target, False))
    ):
        source.unlink()  # an earlier run put it there and died before removing the source
        return
    # The claim folder is not synced after the move: the target's folder sync makes the
    # rename durable, and a copy across filesystems found again at the source after a
    # power cut is removed above at the next start.
    try:
        move_new(source, target, sync_source=False)
    except FileExistsError:  # someone else's file took the name after it was planned
        move_new(source, free_name(target, ERROR_SUFFIX), sync_source=False)
    except PermissionError as error:
        if source.is_dir() and not os.access(source, os.W_OK):  # its owner's doing
            raise OwnerRefused(
                error.errno,
                "its owner made the folder read-only after ocrd took it, and a folder can "
                "only be moved by a user who may write it; let ocrd's group write it "
                "(chmod -R g+w) and ocrd finishes it at its next start",
                str(source),
            ) from None
        raise


class Settler:
    """Blocking file work: call its methods off the event loop."""

    def __init__(self, inbox: InboxConfig, engine: str) -> None:
        self.inbox = inbox
        self.engine = engine
        # The operator's folders: a problem at one of them is not a document's.
        self.roots = (inbox.outbox, inbox.done, inbox.failed)

    def done(
        self,
        claim: Claim,
        result: DocumentResult,
        settings: DocumentOptions,
        naming: Naming = Naming.original,
    ) -> Settlement:
        claim.check_held()
        parts = result.parts()
        # An earlier attempt that planned these names and died (or hit a storage fault)
        # before finishing left its plan: reusing it overwrites what it left, adding no copy.
        settlement = self._reused(claim, Outcome.done, naming, len(parts))
        settlement = settlement or self._plan_done(claim, naming, len(parts))
        for part, markdown in zip(parts, settlement.markdowns(), strict=True):
            if not markdown.is_file():
                claim.check_held()
                with beneath(self.inbox.outbox, markdown) as held:  # no link followed
                    write_document(part, settings, held, claim.relative_path.name)
        self._finish(claim, settlement)
        return settlement

    def failed(
        self, claim: Claim, failure: DocumentFailed, naming: Naming = Naming.original
    ) -> Settlement:
        claim.check_held()
        settlement = self._reused(claim, Outcome.failed, naming, 0)
        if settlement is None:
            settlement = self._plan_failed(claim, failure, naming)
        return self._finish_failed(claim, settlement)

    def _plan_done(self, claim: Claim, naming: Naming, parts: int) -> Settlement:
        """The first number free for the original in done/ and its Markdown and companions
        in the outbox together, so that `done/x-2.pdf` goes with `outbox/x-2.md`; a
        document split into parts gets `x-1.md`, `x-2.md`, ... (all free) beside it."""
        relative = named(claim.relative_path, naming)
        number = 0
        while True:
            number += 1
            original = numbered(self.inbox.done / relative, number)
            markdown = markdown_path(self.inbox.outbox, relative, number)
            markdowns = (
                [part_markdown(markdown, k) for k in range(1, parts + 1)]
                if parts > 1
                else [markdown]
            )
            if original.exists() or not all(outputs_free(m) for m in markdowns):
                continue
            settlement = Settlement(
                Outcome.done,
                str(original),
                markdown=str(markdowns[0]),
                naming=naming,
                companions=self._free_companions(claim, self.inbox.done, naming),
                parts=[str(m) for m in markdowns] if parts > 1 else [],
            )
            if self._take(claim, settlement):
                return settlement

    def _plan_failed(self, claim: Claim, failure: DocumentFailed, naming: Naming) -> Settlement:
        relative = named(claim.relative_path, naming)
        for original in candidate_names(self.inbox.failed / relative):
            if original.exists() or report_path(original).exists():
                continue
            settlement = Settlement(
                outcome=Outcome.failed,
                original=str(original),
                error_report=str(report_path(original)),
                error=error_report(failure, claim, self.engine, claim.path),
                naming=naming,
                companions=self._free_companions(claim, self.inbox.failed, naming),
            )
            if self._take(claim, settlement):
                return settlement
        raise FileExistsError(f"no free name in {self.inbox.failed} for {relative}")

    def _take(self, claim: Claim, settlement: Settlement) -> bool:
        """Save the plan, then reserve its names (so that documents of the same name
        settling at the same moment, from another inbox sharing these folders or another
        host, never plan the same files); false, holding nothing, where another planner
        holds one of them."""
        claim.plan(settlement)  # first: after a crash the claim knows which names may be ours
        if settlement.reserve(claim.id, self.roots, claim.saved):
            return True
        settlement.release(claim.id, self.roots)
        return False

    def _reused(
        self, claim: Claim, outcome: Outcome, naming: Naming, parts: int
    ) -> Settlement | None:
        """The plan an earlier attempt saved, if it is for this outcome, naming and number
        of parts and its names are (still, or now) this claim's; otherwise it is
        abandoned."""
        settlement = claim.state.settlement
        if settlement is None:
            return None
        fits = settlement.outcome == outcome and settlement.naming == naming
        complete = outcome is Outcome.failed or len(settlement.markdowns()) == parts
        if fits and complete and settlement.reserve(claim.id, self.roots, claim.saved):
            return settlement
        self._abandon(settlement, claim.id)
        return None

    @staticmethod
    def _free_companions(claim: Claim, folder: Path, naming: Naming) -> list[str]:
        """Free names in `folder` for the claim's companions (a duplex's backs)."""
        return [
            str(free_name(folder / named(PurePath(relative), naming), ERROR_SUFFIX))
            for relative in claim.state.companions
        ]

    def _abandon(self, settlement: Settlement, owner: str) -> None:
        """Remove what a plan that will not be finished wrote (its original never moved),
        and give up its names; what another planner holds is not touched."""
        gone = (FileNotFoundError, NotADirectoryError, NotRegularFile)
        for markdown in settlement.markdowns():
            with contextlib.suppress(*gone), beneath(self.inbox.outbox, markdown, False) as held:
                if holds(held, owner):
                    discard_outputs(held, with_markdown=True)
        if settlement.error_report is not None and holds(Path(settlement.original), owner):
            report = Path(settlement.error_report)
            with contextlib.suppress(*gone), beneath(self.inbox.failed, report, False) as held:
                held.unlink(missing_ok=True)
        settlement.release(owner, self.roots)

    def _finish_failed(self, claim: Claim, settlement: Settlement) -> Settlement:
        report = Path(settlement.error_report or report_path(Path(settlement.original)))
        if not report.is_file():
            claim.check_held()
            with beneath(self.inbox.failed, report) as held:  # no link followed
                write_report(held, settlement.error or {})
        self._finish(claim, settlement)
        return settlement

    def resume(self, claim: Claim) -> Settlement | None:
        """Finish a settlement an earlier run planned; None if the document must be redone."""
        claim.check_held()
        settlement = claim.state.settlement
        if settlement is None:
            return None
        if settlement.outcome is Outcome.failed:
            return self._finish_failed(claim, settlement)
        if not settlement.written():
            return None  # died before the Markdown was in place: convert again
        self._finish(claim, settlement)
        return settlement

    def _finish(self, claim: Claim, settlement: Settlement) -> None:
        """Companions first, the original last: a claim whose original is gone is settled.
        The names' reservations go before the claim does, so a crash in between finds the
        plan again and finishes it. An original missing from a claim this daemon holds was
        moved by an earlier attempt; from a claim it no longer holds, by the daemon that
        took it over: so the claim is asked for first."""
        claim.check_held()
        home = self.inbox.done if settlement.outcome is Outcome.done else self.inbox.failed
        for source, target in zip(claim.companion_paths, settlement.companions, strict=True):
            with beneath(home, Path(target)) as held:  # no link followed
                _move_original(source, held)
        with beneath(home, Path(settlement.original)) as held:
            _move_original(claim.path, held)
        claim.check_held()
        settlement.release(claim.id, self.roots)
        claim.release()
