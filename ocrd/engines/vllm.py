"""DeepSeek-OCR-2 in-process through vLLM's async engine, with continuous batching.

Settings follow the model's recipe: no prefix caching and no multimodal processor cache
(every page is new), greedy decoding, special tokens kept (the grounding tags are output),
and the n-gram logits processor registered engine-wide and switched on per request to cut
repetition loops. Resolution is controlled only by the size of the image sent: processor
kwargs such as crop_mode make vLLM's placeholder count disagree and kill the engine.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

from ocrd.config import PromptMode, VllmConfig
from ocrd.engines.base import EngineDeadError, EngineError, PageText
from ocrd.render import PageImage

PROMPTS = {
    PromptMode.layout: "<image>\n<|grounding|>Convert the document to markdown.",
    PromptMode.text: "<image>\nFree OCR.",
}
END_OF_SENTENCE = "<｜end▁of▁sentence｜>"


def sampling_extra_args(config: VllmConfig) -> dict[str, Any] | None:
    """The n-gram repetition guard's per-request switch (None leaves it off)."""
    if config.ngram_size <= 0:
        return None
    return {
        "ngram_size": config.ngram_size,
        "window_size": config.ngram_window,
        "whitelist_token_ids": set(config.ngram_whitelist_token_ids),
    }


class VllmEngine:
    name = "vllm"

    def __init__(self, config: VllmConfig) -> None:
        self.config = config
        self._engine: Any = None
        self._params: Any = None
        self._ids = itertools.count(1)
        self._dead_error: type[BaseException] = RuntimeError

    @property
    def max_concurrency(self) -> int:
        return self.config.max_num_seqs

    def _engine_args(self) -> Any:
        from vllm import AsyncEngineArgs
        from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor

        config = self.config
        extra: dict[str, Any] = {}
        if config.kv_cache_memory_bytes is not None:
            extra["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes
        return AsyncEngineArgs(
            model=config.model,
            tokenizer=config.tokenizer,
            dtype=config.dtype,
            enforce_eager=config.enforce_eager,
            load_format=config.load_format,
            max_model_len=config.max_model_len,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            gpu_memory_utilization=config.gpu_memory_utilization,
            tensor_parallel_size=config.tensor_parallel_size,
            enable_prefix_caching=False,
            mm_processor_cache_gb=0,
            logits_processors=[NGramPerReqLogitsProcessor],
            limit_mm_per_prompt={"image": 1},
            disable_log_stats=True,
            **extra,
        )

    async def start(self) -> None:
        from vllm import SamplingParams
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError

        self._dead_error = VllmEngineDeadError
        self._params = SamplingParams(
            temperature=0.0,
            max_tokens=self.config.max_tokens,
            skip_special_tokens=False,
            extra_args=sampling_extra_args(self.config),
        )
        self._engine = AsyncLLM.from_engine_args(self._engine_args())

    async def recognise(self, page: PageImage, mode: PromptMode) -> PageText:
        request_id = f"page-{next(self._ids)}"
        request = {"prompt": PROMPTS[mode], "multi_modal_data": {"image": page.image}}
        started = time.monotonic()
        final = None
        try:
            async with asyncio.timeout(self.config.request_timeout_seconds):
                async for output in self._engine.generate(request, self._params, request_id):
                    final = output
        except TimeoutError:
            await self._engine.abort([request_id])
            raise EngineError(
                f"page {page.number} took longer than "
                f"{self.config.request_timeout_seconds:g} s in the engine"
            ) from None
        except self._dead_error as error:
            raise EngineDeadError(f"the vLLM engine died: {error}") from error
        if final is None or not final.outputs:
            raise EngineError(f"the engine returned nothing for page {page.number}")
        completion = final.outputs[0]
        return PageText(
            text=completion.text.replace(END_OF_SENTENCE, ""),
            finish_reason=str(completion.finish_reason or "abort"),
            prompt_tokens=len(final.prompt_token_ids or ()),
            completion_tokens=len(completion.token_ids),
            seconds=time.monotonic() - started,
        )

    async def stop(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
