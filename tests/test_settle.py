"""Claiming and settling: exactly once, also when the daemon dies half-way."""

from __future__ import annotations

import json
import os
from pathlib import Path

from conftest import files_under

from ocrd.config import DocumentOptions, InboxConfig, InboxEntry, PromptMode
from ocrd.domain import DocumentFailed, DocumentResult, InputFormat
from ocrd.engines.base import PageText
from ocrd.intake.claiming import WorkArea
from ocrd.output.page import PageResult
from ocrd.output.settle import Settler
from ocrd.text.grounding import Block


def setup(tmp_path: Path) -> tuple[InboxConfig, WorkArea, Settler]:
    inbox = InboxEntry(path=tmp_path / "inbox").located(tmp_path)
    for folder in (inbox.path, inbox.outbox, inbox.done, inbox.failed, inbox.work):
        folder.mkdir(parents=True)
    return inbox, WorkArea(inbox.path, inbox.work), Settler(inbox, "simulated")


def result(text: str) -> DocumentResult:
    """A converted one-page document whose page says `text`."""
    page = PageResult(
        1, PageText(text, "stop"), PromptMode.text, (100, 100), (72, 72), [Block("text", (), text)]
    )
    return DocumentResult(InputFormat.pdf, [page], 0.1)


def test_a_file_can_be_claimed_once(tmp_path: Path) -> None:
    inbox, work, _ = setup(tmp_path)
    (inbox.path / "sub").mkdir()
    (inbox.path / "sub" / "a.pdf").write_bytes(b"%PDF-1.4 a")
    claim = work.claim(inbox.path / "sub" / "a.pdf")
    assert claim is not None
    assert claim.path.read_bytes() == b"%PDF-1.4 a"
    assert str(claim.relative_path) == "sub/a.pdf"
    assert work.claim(inbox.path / "sub" / "a.pdf") is None  # a repeated event finds nothing
    assert files_under(inbox.path) == []
    [recovered] = work.recover()
    assert (recovered.id, recovered.state.relative_path) == (claim.id, "sub/a.pdf")


def test_done_writes_markdown_then_moves_the_original(tmp_path: Path) -> None:
    inbox, work, settler = setup(tmp_path)
    (inbox.path / "a.pdf").write_bytes(b"pdf")
    claim = work.claim(inbox.path / "a.pdf")
    settler.done(claim, result("# A"), DocumentOptions())
    assert (inbox.outbox / "a.md").read_text() == "# A\n"
    assert files_under(inbox.done) == ["a.pdf"]
    assert files_under(inbox.work) == [] and not any(inbox.work.iterdir())


def test_failed_names_stay_paired_when_taken(tmp_path: Path) -> None:
    inbox, work, settler = setup(tmp_path)
    (inbox.failed / "a.error.json").write_text("{}")  # from an earlier, different a.pdf
    (inbox.path / "a.pdf").write_bytes(b"pdf")
    settler.failed(work.claim(inbox.path / "a.pdf"), DocumentFailed("render", "broken", 3))
    assert files_under(inbox.failed) == ["a-2.error.json", "a-2.pdf", "a.error.json"]
    report = json.loads((inbox.failed / "a-2.error.json").read_text())
    assert (report["stage"], report["page"], report["message"]) == ("render", 3, "broken")


def test_restart_after_markdown_was_written_settles_without_a_second_copy(tmp_path: Path) -> None:
    inbox, work, settler = setup(tmp_path)
    (inbox.path / "a.pdf").write_bytes(b"pdf")
    claim = work.claim(inbox.path / "a.pdf")
    settler.done(claim, result("# A"), DocumentOptions())
    # Put the state back to "Markdown written, original not yet moved", as a kill would leave it.
    os.rename(inbox.done / "a.pdf", claim.path.parent.mkdir(parents=True) or claim.path)
    claim.save()

    [recovered] = work.recover()
    settlement = settler.resume(recovered)
    assert settlement is not None and settlement.outcome == "done"
    assert files_under(inbox.outbox) == ["a.md"]
    assert files_under(inbox.done) == ["a.pdf"]
    assert work.recover() == []


def test_restart_after_the_original_was_linked_but_not_unlinked(tmp_path: Path) -> None:
    inbox, work, settler = setup(tmp_path)
    (inbox.path / "a.pdf").write_bytes(b"pdf")
    claim = work.claim(inbox.path / "a.pdf")
    settler.done(claim, result("# A"), DocumentOptions())
    claim.path.parent.mkdir(parents=True, exist_ok=True)
    os.link(inbox.done / "a.pdf", claim.path)  # both names exist, as after a kill mid-move
    claim.save()

    [recovered] = work.recover()
    settler.resume(recovered)
    assert files_under(inbox.done) == ["a.pdf"]
    assert work.recover() == []


def test_restart_before_markdown_was_in_place_converts_again(tmp_path: Path) -> None:
    inbox, work, settler = setup(tmp_path)
    (inbox.path / "a.pdf").write_bytes(b"pdf")
    claim = work.claim(inbox.path / "a.pdf")
    settler.done(claim, result("# A"), DocumentOptions())
    (inbox.outbox / "a.md").unlink()
    claim.path.parent.mkdir(parents=True, exist_ok=True)
    os.rename(inbox.done / "a.pdf", claim.path)
    claim.save()

    [recovered] = work.recover()
    assert settler.resume(recovered) is None
