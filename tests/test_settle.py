"""Claiming and settling: exactly once, also when the daemon dies half-way."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from conftest import files_under
from mounts import smb_like, tmpfs

from ocrd.config import DocumentOptions, InboxConfig, InboxEntry, PromptMode
from ocrd.domain import DocumentFailed, DocumentResult, InputFormat
from ocrd.engines.base import PageText
from ocrd.files import free_name, reservation_of
from ocrd.files.reservations import holds, release, reserve
from ocrd.intake.claim import Naming
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


def reservations(folder: Path, plan: Path) -> dict[str, str]:
    """The reservation markers in `folder`: name -> "the plan" (a hard link to `plan`) or
    "a file holding <its text>"."""
    found = {}
    for marker in folder.glob(".*.ocrd-reserved"):
        if plan.exists() and os.path.samefile(marker, plan):
            found[marker.name] = "the plan"
        else:
            found[marker.name] = f"a file holding {marker.read_text()}"
    return found


def saved_plan(folder: Path, claim_id: str) -> Path:
    """A claim's saved state, as `Claim.save` writes it (the file reservations link to)."""
    folder.mkdir(exist_ok=True)
    plan = folder / ".claim.json"
    plan.write_text(json.dumps({"id": claim_id, "attempts": 1}, indent=2))
    return plan


def test_a_name_is_held_by_one_planner_at_a_time_and_older_markers_count(tmp_path: Path) -> None:
    outbox, plan = tmp_path / "outbox", saved_plan(tmp_path / "claim", "claim-1")
    outbox.mkdir()
    target = outbox / "a.md"
    assert reserve(target, "claim-1", plan) and reserve(target, "claim-1", plan)  # still its own
    assert not reserve(target, "claim-2", saved_plan(tmp_path / "other", "claim-2"))
    assert reservations(outbox, plan) == {".a.md.ocrd-reserved": "the plan"}
    assert free_name(target) == outbox / "a-2.md"  # a name held is not free
    release(target, "claim-2")  # not its to give up
    assert holds(target, "claim-1") and not holds(target, "claim-2")
    release(target, "claim-1")
    assert reservations(outbox, plan) == {} and plan.exists()
    # A marker an older ocrd made (a file holding its claim's id) holds the name too.
    older = outbox / "b.md"
    (outbox / ".b.md.ocrd-reserved").write_text("claim-3")
    assert holds(older, "claim-3") and not reserve(older, "claim-4", plan)
    release(older, "claim-3")
    assert not (outbox / ".b.md.ocrd-reserved").exists()
    # A FIFO someone made under a marker's name holds nothing and keeps the name, at once.
    os.mkfifo(outbox / ".c.md.ocrd-reserved")
    assert not holds(outbox / "c.md", "claim-1") and not reserve(outbox / "c.md", "claim-1", plan)
    assert free_name(outbox / "c.md") == outbox / "c-2.md"


@pytest.mark.mounts
def test_where_no_link_can_be_made_a_name_is_held_by_a_file(tmp_path: Path) -> None:
    """Links refused (an SMB-like share), and the plan on another filesystem (a tmpfs)."""
    plan = saved_plan(tmp_path / "claim", "claim-1")
    by_file = {".a.md.ocrd-reserved": "a file holding claim-1"}
    with smb_like(tmp_path / "share") as share, tmpfs(tmp_path / "other", "1m") as other:
        for folder, its_plan in ((share, plan), (tmp_path, saved_plan(other, "claim-1"))):
            target = folder / "a.md"
            assert reserve(target, "claim-1", its_plan) and not reserve(target, "claim-2", plan)
            assert reservations(folder, its_plan) == by_file
            assert holds(target, "claim-1") and free_name(target) == folder / "a-2.md"
            release(target, "claim-1")
            assert reservations(folder, its_plan) == {}


def test_a_claims_state_and_the_names_it_reserves_are_readable_by_ocrd_alone(
    tmp_path: Path,
) -> None:
    inbox, work, settler = setup(tmp_path)
    (inbox.path / "a.pdf").write_bytes(b"pdf")
    claim = work.claim(inbox.path / "a.pdf")
    assert claim is not None and stat.S_IMODE(os.stat(claim.saved).st_mode) == 0o600
    plan = settler._plan_done(claim, Naming.original, 1)  # planned and reserved, not written
    for name in plan.names():
        marker = reservation_of(Path(name))
        assert os.path.samefile(marker, claim.saved) and holds(Path(name), claim.id)
        assert stat.S_IMODE(os.stat(marker).st_mode) == 0o600
