"""A model's recipe as an engine applies it: the prompt for a page, the decoding settings
(the model's own, with what the operator set in `engine.sampling` laid over them), the
n-gram guard where the model has one, and the tokens stripped from its answer.

Every engine (in-process vLLM, ocrd's replicas, a remote fleet, the simulated one) takes
these from its model's module (ocrd/models/); none names a model itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from ocrd.config import PromptMode, SamplingConfig
from ocrd.domain import PageImage
from ocrd.models import DEFAULT, Model, NgramGuard, Sampling
from ocrd.models import model as model_named

IMAGE_PLACEHOLDER = "<image>"  # where a prompt places the image (the server places it)


def default_model() -> Model:
    return model_named(DEFAULT)


def prompt_for(model: Model, mode: PromptMode, task: str | None = None) -> str:
    """The prompt for a page read in `mode`: the model's prompt of that task where it has
    one (layout, text), else its first (a model with one way of reading a page); for one
    region of a page (`task`, ocrd/engines/layout.py), the model's prompt of that task."""
    if task is not None:
        return model.prompt(task)
    for prompt in model.prompts:
        if prompt.task == mode.value:
            return prompt.text
    return model.prompts[0].text


def chat_text(prompt: str) -> str:
    """A prompt as the text beside the image in a chat message."""
    return prompt.removeprefix(IMAGE_PLACEHOLDER).lstrip("\n")


def sampling_for(model: Model, config: SamplingConfig) -> Sampling:
    """The model's decoding settings, with those the operator set in `engine.sampling`
    laid over them (the n-gram guard only where the model has one: it is a logits
    processor of that model's vLLM code; size 0 turns it off)."""
    chosen = config.model_fields_set
    sampling = model.sampling
    if "max_tokens" in chosen:
        sampling = dataclasses.replace(sampling, max_tokens=config.max_tokens)
    guard = sampling.ngram_guard
    if guard is not None:
        guard = NgramGuard(
            size=config.ngram_size if "ngram_size" in chosen else guard.size,
            window=config.ngram_window if "ngram_window" in chosen else guard.window,
            whitelist_token_ids=tuple(config.ngram_whitelist_token_ids)
            if "ngram_whitelist_token_ids" in chosen
            else guard.whitelist_token_ids,
        )
        sampling = dataclasses.replace(sampling, ngram_guard=guard if guard.size > 0 else None)
    return sampling


def ngram_args(sampling: Sampling) -> dict[str, Any] | None:
    """The per-request switch of the n-gram repetition guard; None where it is off."""
    guard = sampling.ngram_guard
    if guard is None:
        return None
    return {
        "ngram_size": guard.size,
        "window_size": guard.window,
        "whitelist_token_ids": list(guard.whitelist_token_ids),
    }


def request_options(sampling: Sampling) -> dict[str, Any]:
    """The decoding settings of an OpenAI-compatible chat completion (vLLM's extras
    included)."""
    options: dict[str, Any] = {
        "temperature": sampling.temperature,
        "max_tokens": sampling.max_tokens,
        "skip_special_tokens": sampling.skip_special_tokens,
    }
    for name in ("top_p", "top_k", "repetition_penalty"):
        value = getattr(sampling, name)
        if value is not None:
            options[name] = value
    if sampling.stop:
        options["stop"] = list(sampling.stop)
    xargs = ngram_args(sampling)
    if xargs:
        options["vllm_xargs"] = xargs
    return options


def stripped(text: str, sampling: Sampling) -> str:
    """The answer without the tokens the recipe says are no text."""
    for token in sampling.strip:
        text = text.replace(token, "")
    return text


def fit_page(page: PageImage, model: Model, page_folder: Path | None = None) -> PageImage:
    """The page at the size the model's recipe sends it at (blocking: call it in a thread).
    A page file written for the engine into `page_folder` is replaced by the resized pixels
    and removed."""
    width, height = page.image.size
    size = model.image.fitted(width, height)
    if size == (width, height):
        return page
    filename = getattr(page.image, "filename", "")
    resized = page.image.convert("RGB").resize(size)
    if filename and page_folder is not None and Path(filename).parent == page_folder:
        page.image.close()
        with contextlib.suppress(FileNotFoundError):
            Path(filename).unlink()
    return dataclasses.replace(page, image=resized)
