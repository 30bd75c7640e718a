"""An OCR model in-process through vLLM's async engine, with continuous batching.

Settings follow the model's recipe: no prefix caching and no multimodal processor cache
(every page is new), greedy decoding, special tokens kept (the grounding tags are output),
and the n-gram logits processor registered engine-wide and switched on per request to cut
repetition loops. Resolution is controlled only by the size of the image sent: processor
kwargs such as crop_mode make vLLM's placeholder count disagree and kill the engine.

Each page asks for its final output only (not a cumulative output per generated token into
the daemon's event loop), and carries its document's priority: the engine runs with
priority scheduling, so a short or long-waiting document's page goes before a book's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import time
from typing import Any

from PIL import Image

from ocrd.config import PromptMode, SamplingConfig, VllmConfig
from ocrd.domain import PageImage, PageText
from ocrd.engines.base import (
    EngineDeadError,
    EngineError,
    EngineHealth,
    EngineState,
    InProcess,
    SelfCheckResult,
)
from ocrd.engines.checkpage import draw_check_page
from ocrd.engines.recipes import (
    IMAGE_PLACEHOLDER,
    default_model,
    fit_page,
    ngram_args,
    prompt_for,
    sampling_for,
    stripped,
)
from ocrd.engines.replicas import (
    garbled_advice,
    installed_vllm_version,
    kv_cache_environment,
    log_vllm_version,
)
from ocrd.log import get_logger
from ocrd.models import Model


class VllmEngine(InProcess):
    name = "vllm"

    def __init__(
        self,
        config: VllmConfig,
        sampling: SamplingConfig,
        self_check: bool = False,
        recipe: Model | None = None,
    ) -> None:
        self.config = config
        self.recipe = recipe or default_model()
        self.sampling = sampling_for(self.recipe, sampling)
        self.self_check = self_check
        self.self_checks = self_check
        self.health = EngineHealth()
        self._engine: Any = None
        self._processor: Any = None  # the model's processor, for its chat template
        self._params: Any = None
        self._ids = itertools.count(1)
        self._dead_errors: tuple[type[BaseException], ...] = ()
        self._in_flight = self._done = self._failed = 0

    @property
    def max_concurrency(self) -> int:
        return self.config.max_num_seqs

    def engine_kwargs(self) -> dict[str, Any]:
        """vLLM engine arguments, the same for the async engine and the offline `LLM`."""
        config = self.config
        optional: dict[str, Any] = {}
        guard = self.recipe.sampling.ngram_guard
        if guard is not None and guard.processor:  # the model's repetition guard
            optional["logits_processors"] = [guard.processor]
        if config.kv_cache_memory_bytes is not None:
            optional["kv_cache_memory_bytes"] = config.kv_cache_memory_bytes
        return dict(
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
            limit_mm_per_prompt={"image": 1},
            scheduling_policy="priority",
            disable_log_stats=False,  # keeps the per-request engine timestamps
            trust_remote_code=config.trust_remote_code,
            **optional,
        )

    def sampling_params(self, ngram_size: int | None = None, max_tokens: int | None = None) -> Any:
        """The recipe's sampling settings (with the operator's laid over them);
        `ngram_size=0` switches the n-gram guard off."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        sampling = self.sampling
        if ngram_size is not None and sampling.ngram_guard is not None:
            guard = dataclasses.replace(sampling.ngram_guard, size=ngram_size)
            sampling = dataclasses.replace(sampling, ngram_guard=guard if ngram_size else None)
        optional = {
            name: getattr(sampling, name)
            for name in ("top_p", "top_k", "repetition_penalty")
            if getattr(sampling, name) is not None
        }
        return SamplingParams(
            temperature=sampling.temperature,
            max_tokens=max_tokens or sampling.max_tokens,
            skip_special_tokens=sampling.skip_special_tokens,
            stop=list(sampling.stop) or None,
            extra_args=ngram_args(sampling),
            output_kind=RequestOutputKind.FINAL_ONLY,
            **optional,
        )

    async def prompt_text(self, prompt: str) -> str:
        """The prompt as the model takes it: as written where it places the image itself,
        else the model's chat template (its processor's) around the image and the prompt."""
        if IMAGE_PLACEHOLDER in prompt:
            return prompt
        if self._processor is None:
            from transformers import AutoProcessor

            self._processor = await asyncio.to_thread(
                AutoProcessor.from_pretrained,
                self.config.tokenizer or self.config.model,
                trust_remote_code=self.config.trust_remote_code,
            )
        content: list[dict[str, str]] = [{"type": "image"}]
        if prompt:
            content.append({"type": "text", "text": prompt})
        messages = [{"role": "user", "content": content}]
        text = self._processor.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )
        return str(text)

    async def start(self) -> None:
        # Importing vLLM and loading the model take minutes and block: in a thread, so that
        # the event loop keeps answering /healthz and asking systemd for more time.
        version = installed_vllm_version()
        log_vllm_version(version)
        self._engine = await asyncio.to_thread(self._load)
        if self.self_check:
            await self._read_test_page(version)
        else:
            self.health.set(EngineState.ready)

    async def _read_test_page(self, version: str | None) -> None:
        """Ready if the engine reads ocrd's test page; garbled (pages wait) if it does not."""
        started = time.monotonic()
        check = self.recipe.self_check
        params = self.sampling_params(max_tokens=min(check.max_tokens, self.sampling.max_tokens))
        prompt = await self.prompt_text(self.recipe.prompt(check.task))
        page = draw_check_page(check.page, check.long_side)
        text = (await self.generate(page, prompt, params)).text
        score = self.recipe.judge(text)
        self.self_check_result = SelfCheckResult(
            passed=score.passed,
            words_found=score.found,
            words_expected=score.expected,
            seconds=time.monotonic() - started,
            at=time.time(),
            answer=" ".join(text.split())[:200],
            vllm_version=version,
        )
        log = get_logger(engine="vllm")
        if score.passed:
            log.info("engine.self_check_passed", words=f"{score.found}/{score.expected}")
            self.health.set(EngineState.ready)
            return
        problem = (
            f"the engine answers but its output is garbled: it read {score.found} of "
            f"{score.expected} words of ocrd's test page (vLLM {version}). "
            + garbled_advice(version)
        )
        log.error("engine.self_check_failed", error=problem, answer=text[:200])
        self.health.set(EngineState.garbled, problem)

    def _load(self) -> Any:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDeadError

        self._dead_errors = (VllmEngineDeadError,)
        self._params = self.sampling_params()
        os.environ.update(kv_cache_environment(self.config))  # read by its engine process
        return AsyncLLM.from_engine_args(AsyncEngineArgs(**self.engine_kwargs()))

    async def check_health(self) -> None:
        try:
            await self._engine.check_health()
        except self._dead_errors as error:
            self.health.set(EngineState.dead, str(error))
            raise EngineDeadError(f"the vLLM engine died: {error}") from error

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        self._in_flight += 1
        try:
            prompt = await self.prompt_text(prompt_for(self.recipe, mode, page.task))
            page = await asyncio.to_thread(fit_page, page, self.recipe)
            text = await self.generate(page.image, prompt, self._params, page.number, priority)
        except EngineError:
            self._failed += 1
            raise
        finally:
            self._in_flight -= 1
        self._done += 1
        return dataclasses.replace(text, model=self.recipe.name)  # its parser reads the text

    async def generate(
        self,
        image: Image.Image,
        prompt: str,
        params: Any,
        page: int | None = None,
        priority: int = 0,
    ) -> PageText:
        if self.health.state is EngineState.dead:
            raise EngineDeadError(f"the vLLM engine died: {self.health.problem}")
        request_id = f"page-{next(self._ids)}"
        request = {"prompt": prompt, "multi_modal_data": {"image": image}}
        started = time.monotonic()
        final = None
        try:
            async with asyncio.timeout(self.config.request_timeout_seconds):
                outputs = self._engine.generate(request, params, request_id, priority=priority)
                async for output in outputs:
                    final = output
        except TimeoutError:
            await self._engine.abort([request_id])
            raise EngineError(
                f"the engine took longer than {self.config.request_timeout_seconds:g} s", page
            ) from None
        except self._dead_errors as error:
            self.health.set(EngineState.dead, str(error))
            raise EngineDeadError(f"the vLLM engine died: {error}", page) from error
        if final is None or not final.outputs:
            raise EngineError("the engine returned no output", page)
        completion = final.outputs[0]
        return PageText(
            text=stripped(completion.text, self.sampling),
            finish_reason=str(completion.finish_reason or "abort"),
            prompt_tokens=len(final.prompt_token_ids or ()),
            completion_tokens=len(completion.token_ids),
            seconds=time.monotonic() - started,
            token_ids=tuple(completion.token_ids),
            engine_interval=_engine_interval(final),
        )

    async def stop(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None


def _engine_interval(output: Any) -> tuple[float, float] | None:
    stats = getattr(output, "metrics", None)
    scheduled = getattr(stats, "scheduled_ts", 0.0)
    last = getattr(stats, "last_token_ts", 0.0)
    return (scheduled, last) if scheduled and last else None
