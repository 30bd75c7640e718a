"""Rendering real files with PyMuPDF and Pillow in worker processes."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from ocrd.render import (
    InputFormat,
    RenderError,
    RenderLimits,
    RenderSettings,
    RenderWorker,
    detect_format,
)


def render_all(path: Path, settings: RenderSettings | None = None):
    async def run():
        worker = RenderWorker(RenderLimits())
        try:
            count = await worker.open(path, detect_format(path), settings or RenderSettings())
            return [await worker.render(n) for n in range(1, count + 1)]
        finally:
            worker.shutdown()

    return asyncio.run(run())


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
    assert page.image.size == (1224, 1584)
    assert (page.width_pt, page.height_pt) == (612, 792)
    [small] = render_all(pdf, RenderSettings(dpi=144, max_image_side=768))
    assert max(small.image.size) == 768
    assert small.image.mode == "RGB"


def test_a_multi_page_tiff_gives_its_pages_in_order(corpus: Path) -> None:
    pages = render_all(corpus / "scans" / "multipage-scan.tif", RenderSettings(max_image_side=1000))
    assert [page.number for page in pages] == [1, 2, 3]
    assert all(max(page.image.size) <= 1000 for page in pages)
    assert len({page.image.tobytes() for page in pages}) == 3


def test_a_broken_pdf_fails_with_a_reason_and_the_worker_recovers(
    corpus: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.7\n" + b"\x00garbage" * 100)

    async def run():
        worker = RenderWorker(RenderLimits())
        try:
            with pytest.raises(RenderError):
                count = await worker.open(broken, InputFormat.pdf, RenderSettings())
                for n in range(1, count + 1):
                    await worker.render(n)
            good = corpus / "real" / "ocrmypdf__linn.pdf"
            assert await worker.open(good, InputFormat.pdf, RenderSettings()) == 1
        finally:
            worker.shutdown()

    asyncio.run(run())


def test_a_renderer_that_hangs_is_killed_after_the_page_timeout(corpus: Path) -> None:
    async def run():
        worker = RenderWorker(RenderLimits(page_timeout_seconds=0.5))
        try:
            await worker.open(
                corpus / "real" / "ocrmypdf__linn.pdf", InputFormat.pdf, RenderSettings()
            )
            process = worker._process
            assert process is not None
            import os
            import signal

            os.kill(process.pid, signal.SIGSTOP)  # a hung MuPDF looks like this from outside
            with pytest.raises(RenderError, match=r"took longer than 0\.5 s"):
                await worker.render(1)
            assert not process.is_alive()
        finally:
            worker.shutdown()

    asyncio.run(run())


def test_a_renderer_that_crashes_fails_the_page_with_a_reason(corpus: Path) -> None:
    async def run():
        worker = RenderWorker(RenderLimits())
        try:
            await worker.open(
                corpus / "real" / "ocrmypdf__linn.pdf", InputFormat.pdf, RenderSettings()
            )
            assert worker._process is not None
            worker._process.kill()
            worker._process.join()
            with pytest.raises(RenderError, match="crashed"):
                await worker.render(1)
        finally:
            worker.shutdown()

    asyncio.run(run())


def test_a_page_that_needs_too_much_memory_fails_and_the_worker_goes_on(tmp_path: Path) -> None:
    from helpers import make_pdf

    pdf = make_pdf(tmp_path / "big.pdf", 1)

    async def run() -> None:
        worker = RenderWorker(RenderLimits(memory_limit_mb=600, max_page_pixels=10**10))
        try:
            await worker.open(pdf, InputFormat.pdf, RenderSettings(dpi=600, max_image_side=10000))
            with pytest.raises(RenderError, match=r"page 1 needs more than the 600 MB"):
                await worker.render(1)
            await worker.open(pdf, InputFormat.pdf, RenderSettings(dpi=72))
            assert (await worker.render(1)).image.size == (420, 595)
        finally:
            worker.shutdown()

    asyncio.run(run())
