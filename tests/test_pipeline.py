"""The pipeline's own logic, with the simulated engine standing in for the GPU."""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
from pathlib import Path

from helpers import make_pdf

from ocrd.config import DocumentOptions, PipelineConfig, PromptMode, SimulatedConfig
from ocrd.documents.pipeline import DocumentContext, Pipeline
from ocrd.domain import DocumentFailed, PageImage, PageText
from ocrd.engines.base import EngineError
from ocrd.engines.simulated import SimulatedEngine


class RecordingEngine(SimulatedEngine):
    """The simulated engine, with uneven page times (so pages finish out of order) and a
    record of how many pages it held at once and which documents they came from."""

    def __init__(
        self,
        capacity: int = 64,
        fail_page: int | None = None,
        failures: int = 1000,
        seconds: float | None = None,
    ) -> None:
        super().__init__(SimulatedConfig(seconds_per_page=0.0, capacity=capacity))
        self.active = 0
        self.peak = 0
        self.fail_page = fail_page
        self.failures = failures  # how often fail_page fails before it succeeds
        self.calls = 0
        self.seconds = seconds  # each page's time; None: uneven, by page number

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        self.calls += 1
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            uneven = 0.02 * ((page.number * 7) % 5)
            await asyncio.sleep(uneven if self.seconds is None else self.seconds)
            if page.number == self.fail_page and self.failures > 0:
                self.failures -= 1
                raise EngineError("simulated failure")
            return await super().recognise(page, mode, priority)
        finally:
            self.active -= 1


def run_pipeline(engine, paths, max_pages_in_flight=64, render_workers=2):
    scratch = Path(tempfile.mkdtemp(prefix="ocrd-test-"))

    async def run():
        config = PipelineConfig(
            max_pages_in_flight=max_pages_in_flight,
            render_workers=render_workers,
            page_retries=2,
            page_retry_backoff_seconds=0.01,
        )
        pipeline = Pipeline.create(engine, config)
        try:
            results = await asyncio.gather(
                *(
                    pipeline.convert(DocumentContext.of(p, DocumentOptions(), scratch / p.stem))
                    for p in paths
                ),
                return_exceptions=True,
            )
        finally:
            pipeline.renderers.shutdown()
        return results

    return asyncio.run(run())


def test_pages_come_back_in_order_although_they_finish_out_of_order(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "doc.pdf", 12)
    [result] = run_pipeline(RecordingEngine(), [pdf])
    numbers = [int(page.text.text.split("Simulated page ")[1].split()[0]) for page in result.pages]
    assert numbers == list(range(1, 13))
    assert result.finish_reasons() == {"stop": 12}


def test_pages_in_flight_never_exceed_the_budget(tmp_path: Path) -> None:
    pdfs = [make_pdf(tmp_path / f"doc{i}.pdf", 10) for i in range(4)]
    engine = RecordingEngine()
    results = run_pipeline(engine, pdfs, max_pages_in_flight=5, render_workers=2)
    assert all(len(r.pages) == 10 for r in results)
    assert engine.calls == 40
    assert 2 <= engine.peak <= 5


def test_pages_of_several_documents_are_in_the_engine_together(tmp_path: Path) -> None:
    pdfs = [make_pdf(tmp_path / f"doc{i}.pdf", 2) for i in range(4)]
    engine = RecordingEngine(seconds=1.0)  # slow enough that rendering never lags behind
    run_pipeline(engine, pdfs, max_pages_in_flight=64, render_workers=4)
    assert engine.peak >= 3  # pages from at least two documents at once


def test_a_failing_page_fails_its_document_only(tmp_path: Path) -> None:
    bad = make_pdf(tmp_path / "bad.pdf", 6)
    good = tmp_path / "good.pdf"
    make_pdf(good, 2)  # pages 1-2 only: never reaches the failing page number
    results = run_pipeline(RecordingEngine(fail_page=4), [bad, good])
    assert isinstance(results[0], DocumentFailed)
    assert (results[0].stage, results[0].page) == ("recognise", 4)
    assert "failed in the engine 3 times" in results[0].message
    assert len(results[1].pages) == 2


def test_a_page_that_fails_once_is_retried(tmp_path: Path) -> None:
    engine = RecordingEngine(fail_page=2, failures=2)
    [result] = run_pipeline(engine, [make_pdf(tmp_path / "flaky.pdf", 3)])
    assert [page.number for page in result.pages] == [1, 2, 3]
    assert engine.calls == 5


def test_unsupported_input_fails_at_detection(tmp_path: Path) -> None:
    text = tmp_path / "letter.pdf"
    text.write_text("Dear sir")
    [failure] = run_pipeline(RecordingEngine(), [text])
    assert isinstance(failure, DocumentFailed)
    assert failure.stage == "detect"
    assert "not a PDF" in failure.message


def test_every_hostile_pdf_fails_with_a_reason_or_converts(corpus: Path) -> None:
    paths = sorted((corpus / "hostile").glob("*.pdf"))
    assert len(paths) > 20
    results = run_pipeline(RecordingEngine(), paths, render_workers=2)
    for path, result in zip(paths, results, strict=True):
        if isinstance(result, DocumentFailed):
            assert result.message.strip(), path.name
        else:
            assert not isinstance(result, BaseException), f"{path.name}: {result!r}"
            assert len(result.pages) >= 1, path.name


class RefusingEngine(SimulatedEngine):
    """Refuses every page at once, as a server answering HTTP 400 does."""

    def __init__(self) -> None:
        super().__init__(SimulatedConfig(seconds_per_page=0.0, capacity=64))
        self.refusals = 0

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        self.refusals += 1
        raise EngineError("HTTP 400: the image is not valid", page.number, retryable=False)


@contextlib.asynccontextmanager
async def within(seconds: float, what: str):
    """Fail with a message instead of hanging: a leaked slot shows as documents that wait."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise AssertionError(f"timed out after {seconds} s: {what}") from None


def test_failing_pages_give_back_every_slot_and_renderer(tmp_path: Path) -> None:
    """100 documents whose pages all fail at once, through a budget of 4 page slots: each
    fails with the engine's reason, then a good document still converts, and the budget
    and the render workers are whole again."""
    pdfs = [make_pdf(tmp_path / f"doc{i}.pdf", 5) for i in range(100)]
    good = make_pdf(tmp_path / "good.pdf", 3)

    async def run():
        config = PipelineConfig(max_pages_in_flight=4, render_workers=2, page_retries=2)
        refusing = Pipeline.create(RefusingEngine(), config)
        try:
            async with within(120, "100 failing documents (page slots leaked?)"):
                results = await asyncio.gather(
                    *(
                        refusing.convert(
                            DocumentContext.of(p, DocumentOptions(), tmp_path / p.stem)
                        )
                        for p in pdfs
                    ),
                    return_exceptions=True,
                )
            assert refusing.budget.in_flight == 0 and refusing.budget.waiting == 0
            assert refusing.renderers.busy == 0
            refusing.engine = RecordingEngine()  # the engine is fixed; the same pipeline goes on
            async with within(60, "a good document after the failures"):
                result = await refusing.convert(
                    DocumentContext.of(good, DocumentOptions(), tmp_path / "good")
                )
            return results, result, refusing.budget.in_flight
        finally:
            refusing.renderers.shutdown()

    results, result, in_flight = asyncio.run(run())
    assert all(isinstance(r, DocumentFailed) for r in results)
    assert {(r.stage, r.page) for r in results} <= {("recognise", n) for n in range(1, 6)}
    assert all("HTTP 400: the image is not valid" in r.message for r in results)
    assert len(result.pages) == 3 and in_flight == 0


def test_documents_cancelled_at_any_moment_give_back_every_slot(tmp_path: Path) -> None:
    pdfs = [make_pdf(tmp_path / f"doc{i}.pdf", 8) for i in range(12)]
    rng = random.Random(11)

    async def run():
        config = PipelineConfig(max_pages_in_flight=6, render_workers=2)
        pipeline = Pipeline.create(RecordingEngine(), config)
        try:
            for _ in range(5):
                tasks = [
                    asyncio.create_task(
                        pipeline.convert(
                            DocumentContext.of(p, DocumentOptions(), tmp_path / f"{p.stem}-{i}")
                        )
                    )
                    for i, p in enumerate(pdfs)
                ]
                await asyncio.sleep(rng.uniform(0.05, 0.5))
                for task in rng.sample(tasks, 8):
                    task.cancel()
                async with within(60, "documents after cancellations (page slots leaked?)"):
                    await asyncio.gather(*tasks, return_exceptions=True)
                assert pipeline.budget.in_flight == 0, "page slots leaked"
                assert pipeline.renderers.busy == 0, "a renderer was lost"
            result = await pipeline.convert(
                DocumentContext.of(pdfs[0], DocumentOptions(), tmp_path / "last")
            )
            assert len(result.pages) == 8
        finally:
            pipeline.renderers.shutdown()

    asyncio.run(run())
