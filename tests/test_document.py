"""The document state machine by itself: a claim's way to done/ or failed/, with a stand-in
for the pipeline (scripted results, failures and engine deaths) and stand-ins for storage
faults, on a real work area, outbox and done/ folder. Milliseconds each."""

from __future__ import annotations

import asyncio
import errno
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import files_under

from ocrd.backoff import Backoff
from ocrd.config import DocumentOptions, InboxConfig, InboxEntry, PromptMode
from ocrd.documents import settling
from ocrd.documents.document import DocumentRunner
from ocrd.documents.route import Route
from ocrd.domain import (
    DocumentFailed,
    DocumentResult,
    DocumentSummary,
    InputFormat,
    Outcome,
    PageText,
    Stage,
)
from ocrd.engines import EngineDeadError
from ocrd.intake.claim import Claim, Naming, Settlement
from ocrd.intake.claiming import WorkArea
from ocrd.output.page import PageResult
from ocrd.output.settle import Settler
from ocrd.text.grounding import Block


class ScriptedPipeline:
    """Answers `convert` with the next of its scripted outcomes (a result or an error)."""

    def __init__(self, *outcomes: DocumentResult | BaseException) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    async def convert(self, *_: Any, **__: Any) -> DocumentResult:
        self.calls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome


def result(text: str = "# A") -> DocumentResult:
    page = PageResult(
        1, PageText(text, "stop"), PromptMode.text, (100, 100), (72, 72), [Block("text", (), text)]
    )
    return DocumentResult(InputFormat.pdf, [page], 0.1)


class Setup:
    def __init__(self, tmp_path: Path, *outcomes: DocumentResult | BaseException) -> None:
        self.inbox: InboxConfig = InboxEntry(path=tmp_path / "inbox").located(tmp_path)
        for folder in (self.inbox.path, self.inbox.outbox, self.inbox.done, self.inbox.failed):
            folder.mkdir(parents=True)
        self.work = WorkArea(self.inbox.path, self.inbox.work)
        self.route = Route(self.inbox, Settler(self.inbox, "simulated"), DocumentOptions())
        self.pipeline = ScriptedPipeline(*outcomes)
        self.runner = DocumentRunner(self.pipeline)  # type: ignore[arg-type]
        self.finished: list[DocumentSummary] = []
        self.runner.on_finished.append(lambda _, summary: self.finished.append(summary))

    def claim(self, name: str = "a.pdf") -> Claim:
        (self.inbox.path / name).write_bytes(b"%PDF-1.4 " + name.encode())
        claim = self.work.claim(self.inbox.path / name)
        assert claim is not None
        return claim

    def run(self, claim: Claim, **options: Any) -> None:
        asyncio.run(self.runner.run(self.route, claim, **options))


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settling, "STORAGE_RETRY", Backoff(first=0.001, cap=0.001))


def test_a_converted_document_lands_in_done_with_its_markdown(tmp_path: Path) -> None:
    setup = Setup(tmp_path, result("# Letter"))
    setup.run(setup.claim())
    assert (setup.inbox.outbox / "a.md").read_text() == "# Letter\n"
    assert files_under(setup.inbox.done) == ["a.pdf"]
    assert not any(setup.inbox.work.iterdir())
    [summary] = setup.finished
    assert summary.outcome == "done" and summary.markdown == str(setup.inbox.outbox / "a.md")


def test_a_document_the_pipeline_fails_lands_in_failed_with_its_reason(tmp_path: Path) -> None:
    setup = Setup(tmp_path, DocumentFailed(Stage.render, "the PDF is damaged beyond repair", 2))
    setup.run(setup.claim())
    report = json.loads((setup.inbox.failed / "a.error.json").read_text())
    assert (report["stage"], report["page"]) == ("render", 2)
    assert report["message"] == "the PDF is damaged beyond repair"
    assert files_under(setup.inbox.outbox) == []
    assert setup.finished[0].outcome == "failed"


def test_a_settlement_planned_before_a_crash_is_finished_without_converting(
    tmp_path: Path,
) -> None:
    setup = Setup(tmp_path)  # the pipeline has nothing to say: it must not be asked
    claim = setup.claim()
    markdown = setup.inbox.outbox / "a.md"
    markdown.write_text("# written before the crash\n")
    claim.plan(Settlement(Outcome.done, str(setup.inbox.done / "a.pdf"), markdown=str(markdown)))
    setup.run(claim)
    assert setup.pipeline.calls == 0
    assert files_under(setup.inbox.done) == ["a.pdf"]
    assert markdown.read_text() == "# written before the crash\n"


def test_a_full_disk_is_waited_out_with_the_original_kept(tmp_path: Path) -> None:
    setup = Setup(tmp_path, result())
    faults = flaky(setup.route.settler, "done", errno.ENOSPC, times=3)
    seen: list[str] = []
    setup.runner.on_storage_fault.append(seen.append)
    setup.run(setup.claim())
    assert faults() == 3 and len(seen) == 3 and "ENOSPC" in seen[0]
    assert files_under(setup.inbox.done) == ["a.pdf"]
    assert setup.runner.storage.fault is None  # recovered


def test_a_refused_name_falls_back_to_a_safe_then_a_flat_one(tmp_path: Path) -> None:
    setup = Setup(tmp_path, result())
    refusals = refuse_names(setup.route.settler, {Naming.original, Naming.safe})
    setup.run(setup.claim("a:b?.pdf"))
    assert refusals == [Naming.original, Naming.safe, Naming.flat]
    [summary] = setup.finished
    assert summary.outcome == "done" and summary.renamed == "flat"


def test_an_engine_death_with_a_page_in_it_is_recorded_and_a_second_sets_it_aside(
    tmp_path: Path,
) -> None:
    death = EngineDeadError("the engine died", page=3)
    setup = Setup(tmp_path, death, death)
    claim = setup.claim()
    for deaths in (1, 2):
        with pytest.raises(EngineDeadError):
            setup.run(claim, alone=deaths == 2)
        assert claim.state.engine_deaths == [3] * deaths
        assert files_under(setup.inbox.failed) == []  # kept in the work area meanwhile
    setup.run(claim)  # the next start: set aside without being converted again
    assert setup.pipeline.calls == 2
    report = json.loads((setup.inbox.failed / "a.error.json").read_text())
    assert report["message"].startswith("the engine crashed on page 3 twice")
    assert report["error_type"] == "PoisonDocument"


def test_a_death_after_the_engine_was_already_gone_is_no_evidence(tmp_path: Path) -> None:
    setup = Setup(tmp_path, EngineDeadError("the engine died"))  # no page was in it
    claim = setup.claim()
    with pytest.raises(EngineDeadError):
        setup.run(claim)
    assert claim.state.engine_deaths == []


def test_a_bug_while_settling_fails_only_that_document(tmp_path: Path) -> None:
    setup = Setup(tmp_path, result())

    def unforeseen(*_: Any, **__: Any) -> Settlement:
        raise UnicodeEncodeError("utf-8", "x\udcfc", 1, 2, "surrogates not allowed")

    setup.route.settler.done = unforeseen  # type: ignore[method-assign]
    setup.run(setup.claim())
    [summary] = setup.finished
    assert summary.outcome == "failed" and summary.stage == "write"
    assert "UnicodeEncodeError" in (summary.reason or "")
    assert files_under(setup.inbox.failed) == ["a.error.json", "a.pdf"]


def test_a_claim_that_cannot_even_fail_is_listed_and_nothing_raises(tmp_path: Path) -> None:
    setup = Setup(tmp_path, result())

    def broken(*_: Any, **__: Any) -> Settlement:
        raise RuntimeError("a bug in settling")

    setup.route.settler.done = broken  # type: ignore[method-assign]
    setup.route.settler.failed = broken  # type: ignore[method-assign]
    claim = setup.claim()
    setup.run(claim)  # no exception reaches the daemon
    assert claim.path.exists()  # the original waits in the work area
    [reason] = setup.runner.stuck.values()
    assert "a.pdf: cannot be settled" in reason and "a bug in settling" in reason


def test_a_document_interrupted_by_a_stop_stays_claimed(tmp_path: Path) -> None:
    setup = Setup(tmp_path)

    async def hang(*_: Any, **__: Any) -> DocumentResult:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    setup.pipeline.convert = hang  # type: ignore[method-assign]
    claim = setup.claim()

    async def scenario() -> None:
        task = asyncio.create_task(setup.runner.run(setup.route, claim))
        await asyncio.sleep(0.05)
        assert claim.id in setup.runner.in_flight
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert claim.path.exists() and setup.runner.in_flight == {}
    assert claim.state.attempts == 1 and claim.state.engine_deaths == []


def flaky(settler: Settler, method: str, code: int, times: int) -> Callable[[], int]:
    """Make `settler.<method>` raise OSError(code) its first `times` calls."""
    real = getattr(settler, method)
    count = [0]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if count[0] < times:
            count[0] += 1
            raise OSError(code, "injected", "/outbox/a.md")
        return real(*args, **kwargs)

    setattr(settler, method, wrapper)
    return lambda: count[0]


def refuse_names(settler: Settler, refused: set[Naming]) -> list[Naming]:
    """Make `settler.done` refuse (EINVAL) the given namings, as an SMB share would."""
    real = settler.done
    asked: list[Naming] = []

    def done(claim: Claim, result: DocumentResult, options: Any, naming: Naming) -> Settlement:
        asked.append(naming)
        if naming in refused:
            raise OSError(errno.EINVAL, "Invalid argument", "/outbox/a:b?.md")
        return real(claim, result, options, naming)

    settler.done = done  # type: ignore[method-assign]
    return asked
