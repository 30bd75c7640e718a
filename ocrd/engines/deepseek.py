"""The default model's prompts and answer token, by the names older code and benchmarks
import them under; the recipe itself is ocrd/models/deepseek_ocr2.py."""

from __future__ import annotations

from typing import Any

from ocrd.config import PromptMode, SamplingConfig
from ocrd.engines.recipes import default_model, prompt_for, sampling_for
from ocrd.engines.recipes import ngram_args as recipe_ngram_args

PROMPTS = {mode: prompt_for(default_model(), mode) for mode in PromptMode}
END_OF_SENTENCE = "".join(default_model().sampling.strip)


def ngram_args(sampling: SamplingConfig, ngram_size: int | None = None) -> dict[str, Any] | None:
    """The per-request switch of the default model's n-gram guard; None leaves it off."""
    if ngram_size is not None:
        sampling = sampling.model_copy(update={"ngram_size": ngram_size})
        sampling.model_fields_set.add("ngram_size")
    return recipe_ngram_args(sampling_for(default_model(), sampling))
