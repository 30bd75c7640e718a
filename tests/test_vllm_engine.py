"""ocrd's vLLM engine in-process against real vLLM (CPU, random weights): one engine per module."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import repeated_ngrams
from PIL import Image
from tiny_model import vllm_engine_section

from ocrd.config import EngineConfig, PromptMode, RenderSettings
from ocrd.domain import PageImage
from ocrd.engines.deepseek import PROMPTS
from ocrd.engines.vllm import VllmEngine
from ocrd.render import RenderLimits, RenderPool, SourceFile, detect_format

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


class EngineRunner:
    """A started engine and the one event loop it lives on."""

    def __init__(self, engine: VllmEngine) -> None:
        self.engine = engine
        self.loop = asyncio.new_event_loop()

    def run(self, coroutine):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coroutine)


@pytest.fixture(scope="module")
def runner(tiny_model: Path) -> Iterator[EngineRunner]:
    config = EngineConfig.model_validate(vllm_engine_section(tiny_model, max_tokens=40))
    runner = EngineRunner(VllmEngine(config.vllm, config.sampling))
    runner.run(runner.engine.start())
    yield runner
    runner.run(runner.engine.stop())
    runner.loop.close()
    # vLLM's engine object lives on in reference cycles; collected now, while the modules
    # its finaliser calls are still there (at interpreter exit it prints a TypeError).
    gc.collect()


def small_page() -> Image.Image:
    return Image.new("RGB", (600, 400), "white")


def test_the_ngram_processor_is_active_on_every_request(runner: EngineRunner) -> None:
    engine = runner.engine
    prompt = PROMPTS[PromptMode.text]
    guarded = runner.run(
        engine.generate(small_page(), prompt, engine.sampling_params(ngram_size=3))
    )
    unguarded = runner.run(
        engine.generate(small_page(), prompt, engine.sampling_params(ngram_size=0))
    )
    assert len(unguarded.token_ids) == 40 and len(guarded.token_ids) >= 10
    assert repeated_ngrams(unguarded.token_ids, 3) > 0  # random weights loop at once
    assert repeated_ngrams(guarded.token_ids, 3) == 0
    # The configured default (ngram_size 30 over a 90-token window) is on for recognise().
    assert engine._params.extra_args["ngram_size"] == 30


def render_a4_page(folder: Path, settings: RenderSettings) -> Image.Image:
    import pymupdf

    path = folder / "a4.pdf"
    doc = pymupdf.open()
    page = doc.new_page(width=210 / 25.4 * 72, height=297 / 25.4 * 72)  # A4
    page.insert_text((72, 100), "An A4 page", fontsize=24)
    doc.save(path)

    async def render() -> Image.Image:
        pool = RenderPool(1, RenderLimits())
        document = SourceFile(path, detect_format(path), settings)
        try:
            await pool.open(document)
            return (await pool.render(document, 1)).image
        finally:
            pool.shutdown()

    return asyncio.run(render())


def test_resolution_is_controlled_by_the_image_size(
    runner: EngineRunner, tiny_model: Path, tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompt = PROMPTS[PromptMode.text]
    text_tokens = len(tokenizer.encode(prompt)) - 1  # the <image> token becomes the image's
    engine = runner.engine

    full = render_a4_page(tmp_path, RenderSettings(dpi=144, max_image_side=4000))
    small = render_a4_page(tmp_path, RenderSettings(dpi=144, max_image_side=768))
    assert full.size == (1191, 1684) and max(small.size) == 768
    params = engine.sampling_params()
    full_tokens = runner.run(engine.generate(full, prompt, params)).prompt_tokens - text_tokens
    small_tokens = runner.run(engine.generate(small, prompt, params)).prompt_tokens - text_tokens
    assert (full_tokens, small_tokens) == (1121, 257)


def test_recognise_keeps_finish_reason_tokens_and_engine_timings(runner: EngineRunner) -> None:
    page = PageImage(1, small_page(), 300, 200)
    result = runner.run(runner.engine.recognise(page, PromptMode.layout))
    assert result.finish_reason == "length"  # random weights never say end-of-sentence
    assert result.completion_tokens == 40 and not result.finished
    assert result.prompt_tokens > 257
    assert result.engine_interval is not None
    start, end = result.engine_interval
    assert 0 < start < end
