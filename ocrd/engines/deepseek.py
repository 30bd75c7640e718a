"""What every DeepSeek-OCR-2 engine shares: prompts, the end-of-sentence token, n-gram guard."""

from __future__ import annotations

from typing import Any

from ocrd.config import PromptMode, SamplingConfig

PROMPTS = {
    PromptMode.layout: "<image>\n<|grounding|>Convert the document to markdown.",
    PromptMode.text: "<image>\nFree OCR.",
}
END_OF_SENTENCE = "<｜end▁of▁sentence｜>"


def ngram_args(sampling: SamplingConfig, ngram_size: int | None = None) -> dict[str, Any] | None:
    """The per-request switch of the n-gram repetition guard; None leaves it off."""
    size = sampling.ngram_size if ngram_size is None else ngram_size
    if size <= 0:
        return None
    return {
        "ngram_size": size,
        "window_size": sampling.ngram_window,
        "whitelist_token_ids": list(sampling.ngram_whitelist_token_ids),
    }
