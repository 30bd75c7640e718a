"""Settling: the original leaves the work area for done/ or failed/, exactly once.

Every settlement is planned (destinations chosen and saved in the claim) before anything
moves, and each step is durable before the next, so a restart after a crash at any point
finishes the same settlement instead of starting another: one Markdown file, one original.

Names are planned at one of three levels: as the file was named; made safe for any
filesystem (an SMB or FAT target refuses `:` or `?`); or flat, the whole relative path in
one short name (a path too long for the target). A caller that finds its target refusing
a name plans again one level down; the abandoned plan's files are removed first.
"""

from __future__ import annotations

import filecmp
import json
import os
from enum import StrEnum
from pathlib import Path, PurePath
from typing import Any

from ocrd import __version__
from ocrd.claim import Claim, Settlement, now_iso
from ocrd.config import InboxConfig
from ocrd.domain import DocumentFailed, DocumentResult, DocumentSettings, Outcome
from ocrd.files import free_name, move_new, numbered, write_new_file
from ocrd.storage import safe_part, safe_relative
from ocrd.write import discard_outputs, markdown_path, outputs_free, write_document

ERROR_SUFFIX = ".error.json"


class Naming(StrEnum):
    original = "original"
    safe = "safe"
    flat = "flat"


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
        "file": path.name,
        "document_id": claim.id if claim else None,
        "inbox": claim.state.inbox if claim else None,
        "relative_path": claim.state.relative_path if claim else None,
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
    write_new_file(target, (json.dumps(report, indent=2, ensure_ascii=False) + "\n").encode())


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
    try:
        move_new(source, target)
    except FileExistsError:  # someone else's file took the name after it was planned
        move_new(source, free_name(target, ERROR_SUFFIX))


class Settler:
    """Blocking file work: call its methods off the event loop."""

    def __init__(self, inbox: InboxConfig, engine: str) -> None:
        self.inbox = inbox
        self.engine = engine

    def done(
        self,
        claim: Claim,
        result: DocumentResult,
        settings: DocumentSettings,
        naming: Naming = Naming.original,
    ) -> Settlement:
        settlement = claim.state.settlement
        reusable = (
            settlement is not None
            and settlement.outcome == Outcome.done
            and settlement.markdown is not None
            and settlement.naming == naming
        )
        if not reusable:
            self._abandon(settlement)
            settlement = self._plan_done(named(claim.relative_path, naming), naming)
            settlement.companions = self._plan_companions(claim, self.inbox.done, naming)
            claim.plan(settlement)
        # else: an earlier attempt planned these names and died (or hit a storage fault)
        # before finishing; reusing them overwrites what it left instead of adding a copy.
        assert settlement is not None and settlement.markdown is not None
        if not Path(settlement.markdown).is_file():
            write_document(result, settings, Path(settlement.markdown), claim.relative_path.name)
        self._finish(claim, settlement)
        return settlement

    def _plan_done(self, relative: PurePath, naming: Naming) -> Settlement:
        """The first number free for the original in done/ and its Markdown and companions
        in the outbox together, so that `done/x-2.pdf` goes with `outbox/x-2.md`."""
        number = 1
        while True:
            original = numbered(self.inbox.done / relative, number)
            markdown = markdown_path(self.inbox.outbox, relative, number)
            if not original.exists() and outputs_free(markdown):
                return Settlement(
                    Outcome.done, str(original), markdown=str(markdown), naming=naming
                )
            number += 1

    def failed(
        self, claim: Claim, failure: DocumentFailed, naming: Naming = Naming.original
    ) -> Settlement:
        settlement = claim.state.settlement
        reusable = (
            settlement is not None
            and settlement.outcome == Outcome.failed
            and settlement.naming == naming
        )
        if not reusable:
            self._abandon(settlement)
            relative = named(claim.relative_path, naming)
            original = free_name(self.inbox.failed / relative, ERROR_SUFFIX)
            settlement = Settlement(
                outcome=Outcome.failed,
                original=str(original),
                error_report=str(report_path(original)),
                error=error_report(failure, claim, self.engine, claim.path),
                naming=naming,
                companions=self._plan_companions(claim, self.inbox.failed, naming),
            )
            claim.plan(settlement)
        assert settlement is not None
        return self._finish_failed(claim, settlement)

    @staticmethod
    def _plan_companions(claim: Claim, folder: Path, naming: Naming) -> list[str]:
        """Free names in `folder` for the claim's companions (a duplex's backs file)."""
        return [
            str(free_name(folder / named(PurePath(relative), naming), ERROR_SUFFIX))
            for relative in claim.state.companions
        ]

    @staticmethod
    def _abandon(settlement: Settlement | None) -> None:
        """Remove what a plan that will not be finished wrote (its original never moved)."""
        if settlement is None:
            return
        if settlement.markdown is not None:
            discard_outputs(Path(settlement.markdown), with_markdown=True)
        if settlement.error_report is not None:
            Path(settlement.error_report).unlink(missing_ok=True)

    def _finish_failed(self, claim: Claim, settlement: Settlement) -> Settlement:
        report = Path(settlement.error_report or report_path(Path(settlement.original)))
        if not report.is_file():
            write_report(report, settlement.error or {})
        self._finish(claim, settlement)
        return settlement

    def resume(self, claim: Claim) -> Settlement | None:
        """Finish a settlement an earlier run planned; None if the document must be redone."""
        settlement = claim.state.settlement
        if settlement is None:
            return None
        if settlement.outcome == Outcome.failed:
            return self._finish_failed(claim, settlement)
        if settlement.markdown is None or not Path(settlement.markdown).is_file():
            return None  # died before the Markdown was in place: convert again
        self._finish(claim, settlement)
        return settlement

    def _finish(self, claim: Claim, settlement: Settlement) -> None:
        """Companions first, the original last: a claim whose original is gone is settled."""
        for source, target in zip(claim.companion_paths, settlement.companions, strict=True):
            _move_original(source, Path(target))
        _move_original(claim.path, Path(settlement.original))
        claim.release()
