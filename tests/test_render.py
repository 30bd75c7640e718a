"""Rendering real files with PyMuPDF and Pillow in worker processes."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
from pathlib import Path

import pytest
from helpers import make_pdf
from PIL import Image

from ocrd.config import RenderSettings
from ocrd.domain import InputFormat
from ocrd.render import RenderError, RenderLimits, RenderPool, SourceFile, detect_format


def document(path: Path, settings: RenderSettings | None = None) -> SourceFile:
    return SourceFile(path, detect_format(path), settings or RenderSettings())


def render_all(path: Path, settings: RenderSettings | None = None):
    async def run():
        pool = RenderPool(1, RenderLimits())
        try:
            doc = document(path, settings)
            count = await pool.open(doc)
            return [await pool.render(doc, n) for n in range(1, count + 1)]
        finally:
            pool.shutdown()

    return asyncio.run(run())


def only_worker(pool: RenderPool):
    [worker] = pool._workers
    return worker


def test_inputs_are_recognised_by_content_not_name(corpus: Path, tmp_path: Path) -> None:
    disguised = tmp_path / "scan.jpg"
    shutil.copy(corpus / "real" / "ocrmypdf__linn.pdf", disguised)
    assert detect_format(disguised) is InputFormat.pdf
    assert detect_format(corpus / "scans" / "phototest.tif") is InputFormat.tiff
    text = tmp_path / "notes.pdf"
    text.write_text("just some text\n")
    with pytest.raises(RenderError, match="not a PDF, TIFF, PNG or JPEG"):
        detect_format(text)
    empty = tmp_path / "empty.pdf"
    empty.touch()
    with pytest.raises(RenderError, match="empty"):
        detect_format(empty)


def test_pdf_pages_are_rendered_at_the_configured_dpi_and_capped_side(corpus: Path) -> None:
    pdf = corpus / "real" / "ocrmypdf__linn.pdf"  # US Letter, 612 x 792 pt
    [page] = render_all(pdf, RenderSettings(dpi=144, max_image_side=4000))
    assert page.image.size == (1224, 1584)  # bigger than the shared buffer: sent by pipe
    assert (page.width_pt, page.height_pt) == (612, 792)
    [small] = render_all(pdf, RenderSettings(dpi=144, max_image_side=768))
    assert max(small.image.size) == 768
    assert small.image.mode == "RGB"


def test_pixels_through_the_shared_buffer_match_a_direct_render(corpus: Path) -> None:
    import pymupdf

    pdf = corpus / "real" / "ocrmypdf__linn.pdf"
    [page] = render_all(pdf, RenderSettings(dpi=72, max_image_side=2048))
    with pymupdf.open(pdf) as doc:
        pixmap = doc[0].get_pixmap(dpi=72, alpha=False)
        direct = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples)
    assert page.image.tobytes() == direct.tobytes()


@pytest.mark.parametrize("largest_side", [2048, 64], ids=["shared buffer", "in the reply"])
def test_pixels_handed_over_are_the_sources_own(corpus: Path, largest_side: int) -> None:
    """A page's pixels cross to the daemon four bytes a pixel, through the buffer it shares
    with the worker or, where they do not fit it, in the reply: what arrives is the page as
    PyMuPDF renders it, and a scan's own pixels."""
    import pymupdf

    pdf = corpus / "real" / "ocrmypdf__linn.pdf"
    scan = corpus / "scans" / "multipage-scan.tif"

    async def run():
        pool = RenderPool(1, RenderLimits(), largest_side=largest_side)
        try:
            pages = []
            for path in (pdf, scan):
                doc = document(path, RenderSettings(dpi=72, max_image_side=4000))
                await pool.open(doc)
                pages.append(await pool.render(doc, 1))
            return pages
        finally:
            pool.shutdown()

    rendered, scanned = asyncio.run(run())
    with pymupdf.open(pdf) as doc:
        pixmap = doc[0].get_pixmap(dpi=72, alpha=False)
        direct = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples)
    assert rendered.image.mode == "RGB"
    assert rendered.image.tobytes() == direct.tobytes()
    with Image.open(scan) as image:
        assert scanned.image.tobytes() == image.convert("RGB").tobytes()


def test_a_multi_page_tiff_gives_its_pages_in_order(corpus: Path) -> None:
    pages = render_all(corpus / "scans" / "multipage-scan.tif", RenderSettings(max_image_side=1000))
    assert [page.number for page in pages] == [1, 2, 3]
    assert all(max(page.image.size) <= 1000 for page in pages)
    assert len({page.image.tobytes() for page in pages}) == 3


def test_a_broken_pdf_fails_with_a_reason_and_the_worker_goes_on(
    corpus: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.7\n" + b"\x00garbage" * 100)

    async def run():
        pool = RenderPool(1, RenderLimits())
        try:
            with pytest.raises(RenderError):
                doc = document(broken)
                count = await pool.open(doc)
                for n in range(1, count + 1):
                    await pool.render(doc, n)
            assert await pool.open(document(corpus / "real" / "ocrmypdf__linn.pdf")) == 1
        finally:
            pool.shutdown()

    asyncio.run(run())


def test_a_renderer_that_hangs_is_killed_after_the_page_timeout(corpus: Path) -> None:
    async def run():
        pool = RenderPool(1, RenderLimits(page_timeout_seconds=0.5))
        try:
            doc = document(corpus / "real" / "ocrmypdf__linn.pdf")
            await pool.open(doc)
            process = only_worker(pool)._process
            os.kill(process.pid, signal.SIGSTOP)  # a hung MuPDF looks like this from outside
            with pytest.raises(RenderError, match=r"took longer than 0\.5 s"):
                await pool.render(doc, 1)
            process.join(timeout=5)
            assert not process.is_alive()
            assert (await pool.render(doc, 1)).number == 1  # a new renderer took over
        finally:
            pool.shutdown()

    asyncio.run(run())


def test_a_page_that_opens_its_document_gets_the_openings_time_too(corpus: Path) -> None:
    """A page sent to a renderer that does not have its document open opens it in the same
    request: the time limit is the page's and the opening's, and the message says so."""

    async def run():
        pool = RenderPool(1, RenderLimits(page_timeout_seconds=0.5))
        try:
            await pool.warm_up()
            doc = document(corpus / "real" / "ocrmypdf__linn.pdf")
            process = only_worker(pool)._process
            os.kill(process.pid, signal.SIGSTOP)
            expected = r"opening the document and page 1 took longer than 1 s"
            with pytest.raises(RenderError, match=expected):
                await pool.render(doc, 1)
            process.join(timeout=5)
            assert not process.is_alive()
            assert (await pool.render(doc, 1)).number == 1  # opened anew by the next renderer
            assert await pool.open(doc) == 1
        finally:
            pool.shutdown()

    asyncio.run(run())


def test_a_renderer_that_dies_during_a_page_fails_that_page_only(corpus: Path) -> None:
    async def run():
        pool = RenderPool(1, RenderLimits())
        try:
            doc = document(corpus / "real" / "ocrmypdf__linn.pdf")
            await pool.open(doc)
            process = only_worker(pool)._process
            os.kill(process.pid, signal.SIGSTOP)
            page = asyncio.create_task(pool.render(doc, 1))
            await asyncio.sleep(0.3)  # the request is in the pipe, the renderer stopped
            process.kill()
            with pytest.raises(RenderError, match="crashed on page 1"):
                await page
            assert (await pool.render(doc, 1)).number == 1
        finally:
            pool.shutdown()

    asyncio.run(run())


def test_a_renderer_killed_between_pages_is_replaced_without_failing_anything(
    corpus: Path,
) -> None:
    async def run():
        pool = RenderPool(1, RenderLimits())
        try:
            doc = document(corpus / "scans" / "multipage-scan.tif")
            await pool.open(doc)
            await pool.render(doc, 1)
            process = only_worker(pool)._process
            process.kill()  # the OOM killer, say
            process.join()
            assert (await pool.render(doc, 2)).number == 2  # reopened by a new renderer
        finally:
            pool.shutdown()

    asyncio.run(run())


def test_a_page_that_needs_too_much_memory_fails_and_the_worker_goes_on(tmp_path: Path) -> None:
    pdf = make_pdf(tmp_path / "big.pdf", 1)

    async def run() -> None:
        pool = RenderPool(1, RenderLimits(memory_limit_mb=600, max_page_pixels=10**10))
        try:
            huge = document(pdf, RenderSettings(dpi=600, max_image_side=10000))
            await pool.open(huge)
            with pytest.raises(RenderError, match=r"page 1 needs more than the 600 MB"):
                await pool.render(huge, 1)
            small = document(pdf, RenderSettings(dpi=72))
            assert (await pool.render(small, 1)).image.size == (420, 595)
        finally:
            pool.shutdown()

    asyncio.run(run())


def test_figures_are_cut_from_the_pdf_at_the_figure_resolution(
    corpus: Path, tmp_path: Path
) -> None:
    async def run():
        pool = RenderPool(1, RenderLimits())
        try:
            doc = document(corpus / "real" / "ocrmypdf__linn.pdf")  # 612 x 792 pt
            return await pool.figures(
                doc, 1, [(0.1, 0.2, 0.6, 0.5)], 300, tmp_path / "figures", ["a.png"]
            )
        finally:
            pool.shutdown()

    [figure] = asyncio.run(run())
    with Image.open(figure.path) as image:
        assert image.size == (figure.width, figure.height)
    # 0.5 x 612 pt and 0.3 x 792 pt at 300 DPI
    assert abs(figure.width - 0.5 * 612 * 300 / 72) <= 2
    assert abs(figure.height - 0.3 * 792 * 300 / 72) <= 2
    assert figure.source_dpi == 300


def test_the_pool_stays_whole_when_requests_are_cancelled_at_any_moment(
    tmp_path: Path,
) -> None:
    """Renders cancelled while waiting for a worker, while being handed one, and while it
    works: afterwards every worker is idle again and renders."""
    pdfs = [make_pdf(tmp_path / f"doc{i}.pdf", 6) for i in range(3)]
    rng = random.Random(7)

    async def run() -> None:
        pool = RenderPool(2, RenderLimits())
        try:
            await pool.warm_up()
            for _ in range(8):
                tasks = [
                    asyncio.create_task(pool.render(document(pdf), n))
                    for pdf in pdfs
                    for n in range(1, 7)
                ]
                await asyncio.sleep(rng.uniform(0, 0.05))
                for task in rng.sample(tasks, len(tasks) // 2):
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                assert pool.busy == 0
            pages = await asyncio.gather(*(pool.render(document(pdfs[0]), n) for n in (1, 2, 3)))
            assert [page.number for page in pages] == [1, 2, 3]
            assert pool.busy == 0 and len(pool._idle) == 2
        finally:
            pool.shutdown()

    asyncio.run(run())
