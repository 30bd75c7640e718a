"""Settling: the original leaves the work area for done/ or failed/, exactly once.

Every settlement is planned (destinations chosen and saved in the claim) before anything
moves, and each step is durable before the next, so a restart after a crash at any point
finishes the same settlement instead of starting another: one Markdown file, one original.
"""

from __future__ import annotations

import filecmp
import json
import os
from pathlib import Path, PurePath
from typing import Any

from ocrd import __version__
from ocrd.claim import Claim, Settlement, now_iso
from ocrd.config import InboxConfig
from ocrd.files import free_name, move_new, numbered, write_new_file
from ocrd.pipeline import DocumentFailed, DocumentResult, DocumentSettings
from ocrd.write import discard_outputs, markdown_path, outputs_free, write_document

ERROR_SUFFIX = ".error.json"


def error_report(
    failure: DocumentFailed, claim: Claim | None, engine: str, path: Path
) -> dict[str, Any]:
    return {
        "file": path.name,
        "document_id": claim.id if claim else None,
        "inbox": claim.state.inbox if claim else None,
        "relative_path": claim.state.relative_path if claim else None,
        "stage": failure.stage,
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


def _move_original(claim: Claim, target: Path) -> None:
    source = claim.path
    if target.exists() and (os.path.samefile(source, target) or filecmp.cmp(source, target, False)):
        source.unlink()  # an earlier run put it there and died before removing the source
        return
    try:
        move_new(source, target)
    except FileExistsError:  # someone else's file took the name after it was planned
        move_new(source, free_name(target, ERROR_SUFFIX))


class Settler:
    def __init__(self, inbox: InboxConfig, engine: str) -> None:
        self.inbox = inbox
        self.engine = engine

    def done(self, claim: Claim, result: DocumentResult, settings: DocumentSettings) -> Settlement:
        settlement = claim.state.settlement
        if settlement is None or settlement.outcome != "done" or settlement.markdown is None:
            settlement = self._plan_done(claim.relative_path)
            claim.plan(settlement)
        # else: an earlier attempt planned these names and died (or hit a storage fault)
        # before finishing; reusing them overwrites what it left instead of adding a copy.
        if not Path(settlement.markdown).is_file():
            write_document(result, settings, Path(settlement.markdown), claim.relative_path.name)
        self._finish(claim, settlement)
        return settlement

    def _plan_done(self, relative: PurePath) -> Settlement:
        """The first number free for the original in done/ and its Markdown and companions
        in the outbox together, so that `done/x-2.pdf` goes with `outbox/x-2.md`."""
        number = 1
        while True:
            original = numbered(self.inbox.done / relative, number)
            markdown = markdown_path(self.inbox.outbox, relative, number)
            if not original.exists() and outputs_free(markdown):
                return Settlement("done", str(original), markdown=str(markdown))
            number += 1

    def failed(self, claim: Claim, failure: DocumentFailed) -> Settlement:
        settlement = claim.state.settlement
        if settlement is None or settlement.outcome != "failed":
            if settlement is not None and settlement.markdown is not None:
                discard_outputs(Path(settlement.markdown))  # left by a done attempt that died
            original = free_name(self.inbox.failed / claim.relative_path, ERROR_SUFFIX)
            settlement = Settlement(
                outcome="failed",
                original=str(original),
                error_report=str(report_path(original)),
                error=error_report(failure, claim, self.engine, claim.path),
            )
            claim.plan(settlement)
        return self._finish_failed(claim, settlement)

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
        if settlement.outcome == "failed":
            return self._finish_failed(claim, settlement)
        if settlement.markdown is None or not Path(settlement.markdown).is_file():
            return None  # died before the Markdown was in place: convert again
        self._finish(claim, settlement)
        return settlement

    def _finish(self, claim: Claim, settlement: Settlement) -> None:
        _move_original(claim, Path(settlement.original))
        claim.release()
