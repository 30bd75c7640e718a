"""What the tiny OCR model folders of tests/tiny_models.py share: the model handle a test
prompts, the byte-level BPE tokenizer with each model's special tokens, the engine settings
for a 2-core CPU, and the Qwen2-VL family's rule for an image's size in tokens."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TRAINING_TEXT = [
    "Convert the document to markdown.",
    "Free OCR. Text recognition:",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "# Title\n\n| a | b |\n|---|---|\n<table><tr><td>1</td></tr></table>",
]
TEXT_HIDDEN = 128  # the language model's width; its heads are 4 of 32
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]

CHATML_PROMPT = "<|im_start|>user\n{image}{instruction}<|im_end|>\n<|im_start|>assistant\n"
# ChatML, as the Qwen family writes it, with each model's image marker for image items.
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or item['type'] == 'image_url' %}IMAGE_MARKER"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyModel:
    """A model folder and what a test needs to prompt it."""

    folder: Path
    architecture: str
    image_token_id: int
    prompt_format: str  # one user turn with {image} and {instruction}, then the answer's start
    image_marker: str  # what the chat template writes for one image
    count_image_tokens: Callable[[int, int], int]  # (width, height) -> placeholder tokens
    trust_remote_code: bool = False  # the folder's own Python config and processor classes

    def image_tokens(self, width: int, height: int) -> int:
        """How many placeholder tokens the prompt holds for an image of this size."""
        return self.count_image_tokens(width, height)

    def prompt(self, instruction: str) -> str:
        """A one-image user turn in the model's own chat format, ready for generation."""
        return self.prompt_format.format(image=self.image_marker, instruction=instruction)


def engine_arguments(model: TinyModel, **overrides: object) -> dict[str, object]:
    """`vllm.LLM`/`AsyncEngineArgs` keywords that run a tiny model on a 2-core CPU in a few GB."""
    return {
        "model": str(model.folder),
        "load_format": "dummy",
        "dtype": "float32",  # bfloat16 is emulated (slow) on CPUs without AVX-512 BF16
        "enforce_eager": True,
        "max_model_len": 4096,
        "max_num_seqs": 2,
        "max_num_batched_tokens": 4096,
        "kv_cache_memory_bytes": 1 << 30,
        "limit_mm_per_prompt": {"image": 1},
        "mm_processor_cache_gb": 0,  # every request processes its image again
        "enable_prefix_caching": False,
        "trust_remote_code": model.trust_remote_code,
        **overrides,
    }


def resized_to_grid(
    width: int, height: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """The Qwen2-VL image processor's target size: each side a multiple of `factor` (its
    nearest), the area scaled into [min_pixels, max_pixels] keeping the aspect ratio."""
    new_w = max(factor, round(width / factor) * factor)
    new_h = max(factor, round(height / factor) * factor)
    if new_w * new_h > max_pixels:
        scale = math.sqrt(width * height / max_pixels)
        new_w = max(factor, math.floor(width / scale / factor) * factor)
        new_h = max(factor, math.floor(height / scale / factor) * factor)
    elif new_w * new_h < min_pixels:
        scale = math.sqrt(min_pixels / (width * height))
        new_w = math.ceil(width * scale / factor) * factor
        new_h = math.ceil(height * scale / factor) * factor
    return new_w, new_h


def qwen_vl_tokens(patch_size: int, min_pixels: int, max_pixels: int) -> Callable[[int, int], int]:
    """One token per merged 2x2 patch of the resized image."""
    factor = patch_size * 2

    def count(width: int, height: int) -> int:
        new_w, new_h = resized_to_grid(width, height, factor, min_pixels, max_pixels)
        return (new_w // factor) * (new_h // factor)

    return count


def chat_template(image_marker: str) -> str:
    return CHATML_TEMPLATE.replace("IMAGE_MARKER", image_marker)


def build_tokenizer(
    folder: Path, special_tokens: list[str], tokenizer_class: str, eos_token: str = "<|im_end|>"
) -> dict[str, int]:
    """A byte-level BPE with the model's special tokens after its few hundred trained ones
    (the real tokenizers have about 150,000 before them; config.json carries the ids this
    one gives them); returns token -> id."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(TRAINING_TEXT, trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in special_tokens])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=eos_token,
        pad_token="<|endoftext|>",
        additional_special_tokens=special_tokens,
    )
    fast.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = tokenizer_class
    config_path.write_text(json.dumps(config, indent=2))
    ids = {token: fast.convert_tokens_to_ids(token) for token in special_tokens}
    return ids


def write_json(folder: Path, name: str, content: dict[str, object]) -> None:
    (folder / name).write_text(json.dumps(content, indent=2))


def vocab_size_for(ids: dict[str, int]) -> int:
    """The embedding rows: past the last special token, rounded up as the real models do."""
    return (max(ids.values()) // 64 + 1) * 64
