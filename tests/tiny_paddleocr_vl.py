"""A tiny PaddleOCR-VL model folder for real vLLM on a CPU (random weights).

The published model is remote code: its config.json names `configuration_paddleocr_vl`
and its processor files name their own processor and image processor (transformers 4.57
has no `paddleocr_vl`; transformers 5 has). vLLM 0.18.1 reads those through
`trust_remote_code`, so this folder carries small stand-ins of the same three classes,
written here: the same names, fields and outputs that vLLM's PaddleOCR-VL code reads
(a flat ERNIE-4.5 text config with a `vision_config`; an image processor with
`min_pixels`/`max_pixels` that cuts the resized page into 14 px patches and reports the
patch grid; a processor that repeats the image placeholder once per merged 2x2 patch).
"""

from __future__ import annotations

from pathlib import Path

from tiny_models_common import (
    TEXT_HIDDEN,
    TinyModel,
    build_tokenizer,
    resized_to_grid,
    vocab_size_for,
    write_json,
)

SPECIAL_TOKENS = [
    "<|begin_of_sentence|>",
    "<|end_of_sentence|>",
    "<unk>",
    "<|IMAGE_PLACEHOLDER|>",
    "<|video_pad|>",
    "<|IMAGE_START|>",
    "<|IMAGE_END|>",
]
IMAGE_MARKER = "<|IMAGE_START|><|IMAGE_PLACEHOLDER|><|IMAGE_END|>"
PROMPT = "<|begin_of_sentence|>User: {image}{instruction}\nAssistant: "
TEMPLATE = (
    "<|begin_of_sentence|>{% for message in messages %}"
    "{% if message['role'] == 'user' %}User: {% else %}Assistant: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' or item['type'] == 'image_url' %}"
    + IMAGE_MARKER
    + "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}Assistant: {% endif %}"
)
MIN_PIXELS = 147384
MAX_PIXELS = 2822400
PATCH = 14

CONFIGURATION_CODE = '''
from transformers import PretrainedConfig


class PaddleOCRVisionConfig(PretrainedConfig):
    model_type = "paddleocr_vl_vision"
    base_config_key = "vision_config"


class PaddleOCRVLConfig(PretrainedConfig):
    """ERNIE-4.5 text fields at the top level, the SigLIP-style tower under vision_config."""

    model_type = "paddleocr_vl"
    sub_configs = {"vision_config": PaddleOCRVisionConfig}

    def __init__(self, vision_config=None, **kwargs):
        if isinstance(vision_config, dict):
            vision_config = PaddleOCRVisionConfig(**vision_config)
        self.vision_config = vision_config or PaddleOCRVisionConfig()
        super().__init__(**kwargs)
'''

IMAGE_PROCESSING_CODE = '''
import math

import numpy as np
import torch
from PIL import Image
from transformers.feature_extraction_utils import BatchFeature
from transformers.image_processing_utils import BaseImageProcessor


def fit_to_grid(height, width, factor, min_pixels, max_pixels):
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


class SiglipImageProcessor(BaseImageProcessor):
    """Each page resized to multiples of patch x merge px, normalised, cut into patches:
    pixel_values (patches, 3, patch, patch) for all images, image_grid_thw (1, rows, cols)."""

    model_input_names = ["pixel_values", "image_grid_thw"]

    def __init__(self, min_pixels=147384, max_pixels=2822400, patch_size=14,
                 temporal_patch_size=1, merge_size=2, image_mean=None, image_std=None,
                 rescale_factor=1 / 255, **kwargs):
        super().__init__(**kwargs)
        self.min_pixels = min_pixels
        self.max_pixels = max_pixels
        self.size = {"min_pixels": min_pixels, "max_pixels": max_pixels}
        self.patch_size = patch_size
        self.temporal_patch_size = temporal_patch_size
        self.merge_size = merge_size
        self.image_mean = image_mean or [0.5, 0.5, 0.5]
        self.image_std = image_std or [0.5, 0.5, 0.5]
        self.rescale_factor = rescale_factor

    def _one(self, image):
        image = image.convert("RGB") if isinstance(image, Image.Image) else Image.fromarray(
            np.asarray(image, dtype=np.uint8)).convert("RGB")
        height, width = fit_to_grid(image.height, image.width,
                                    self.patch_size * self.merge_size,
                                    self.min_pixels, self.max_pixels)
        array = np.asarray(image.resize((width, height), Image.BICUBIC), dtype=np.float32)
        array = (array * self.rescale_factor - self.image_mean) / self.image_std
        rows, cols, p = height // self.patch_size, width // self.patch_size, self.patch_size
        patches = array.transpose(2, 0, 1).reshape(3, rows, p, cols, p)
        patches = patches.transpose(1, 3, 0, 2, 4).reshape(rows * cols, 3, p, p)
        return patches, [1, rows, cols]

    def preprocess(self, images, return_tensors=None, **kwargs):
        if not isinstance(images, (list, tuple)):
            images = [images]
        results = [self._one(image) for image in images]
        pixel_values = torch.from_numpy(np.concatenate([r[0] for r in results]))
        grid = torch.tensor([r[1] for r in results])
        return BatchFeature({"pixel_values": pixel_values, "image_grid_thw": grid})
'''

PROCESSING_CODE = '''
from transformers.feature_extraction_utils import BatchFeature
from transformers.processing_utils import ProcessorMixin


class PaddleOCRVLProcessor(ProcessorMixin):
    """Repeats the image placeholder once per merged 2x2 patch of each image."""

    attributes = ["image_processor", "tokenizer"]
    image_processor_class = "AutoImageProcessor"
    tokenizer_class = "AutoTokenizer"

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        self.image_token = "<|IMAGE_PLACEHOLDER|>"
        super().__init__(image_processor, tokenizer, chat_template=chat_template)

    def __call__(self, images=None, text=None, **kwargs):
        kwargs.pop("images_kwargs", None)
        kwargs.pop("input_data_format", None)
        return_tensors = kwargs.pop("return_tensors", None)
        text = [text] if isinstance(text, str) else list(text or [])
        image_inputs = {}
        if images is not None:
            image_inputs = dict(self.image_processor(images))
            merge = self.image_processor.merge_size ** 2
            counts = iter((g.prod() // merge).item() for g in image_inputs["image_grid_thw"])
            marker = "<|placeholder|>"
            for i, prompt in enumerate(text):
                while self.image_token in prompt:
                    prompt = prompt.replace(self.image_token, marker * next(counts), 1)
                text[i] = prompt.replace(marker, self.image_token)
        text_inputs = self.tokenizer(text, return_tensors=return_tensors, **kwargs)
        return BatchFeature({**text_inputs, **image_inputs}, tensor_type=return_tensors)
'''


def paddle_tokens(width: int, height: int) -> int:
    factor = PATCH * 2
    new_w, new_h = resized_to_grid(width, height, factor, MIN_PIXELS, MAX_PIXELS)
    return (new_w // factor) * (new_h // factor)


def build_paddleocr_vl(folder: Path) -> TinyModel:
    """PaddleOCR-VL's architecture: NaViT-style SigLIP tower, ERNIE-4.5-0.3B decoder."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = build_tokenizer(folder, SPECIAL_TOKENS, "PreTrainedTokenizerFast", "<|end_of_sentence|>")
    (folder / "configuration_paddleocr_vl.py").write_text(CONFIGURATION_CODE)
    (folder / "image_processing_paddleocr_vl.py").write_text(IMAGE_PROCESSING_CODE)
    (folder / "processing_paddleocr_vl.py").write_text(PROCESSING_CODE)
    auto_processor = {
        "AutoProcessor": "processing_paddleocr_vl.PaddleOCRVLProcessor",
        "AutoImageProcessor": "image_processing_paddleocr_vl.SiglipImageProcessor",
    }
    write_json(
        folder,
        "preprocessor_config.json",
        {
            "image_processor_type": "SiglipImageProcessor",
            "processor_class": "PaddleOCRVLProcessor",
            "auto_map": auto_processor,
            "min_pixels": MIN_PIXELS,
            "max_pixels": MAX_PIXELS,
            "patch_size": PATCH,
            "temporal_patch_size": 1,
            "merge_size": 2,
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
        },
    )
    write_json(
        folder,
        "processor_config.json",
        {"processor_class": "PaddleOCRVLProcessor", "auto_map": auto_processor},
    )
    write_json(folder, "chat_template.json", {"chat_template": TEMPLATE})
    config = {
        "architectures": ["PaddleOCRVLForConditionalGeneration"],
        "model_type": "paddleocr_vl",
        "auto_map": {"AutoConfig": "configuration_paddleocr_vl.PaddleOCRVLConfig"},
        "torch_dtype": "bfloat16",
        "vocab_size": vocab_size_for(ids),
        "hidden_size": TEXT_HIDDEN,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "hidden_act": "silu",
        "max_position_embeddings": 131072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        # M-RoPE over the rotary half: 16 for head_dim 32 ([16, 24, 24] of 64 in the original)
        "rope_scaling": {"type": "default", "mrope_section": [4, 6, 6]},
        "use_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|begin_of_sentence|>"],
        "eos_token_id": ids["<|end_of_sentence|>"],
        "pad_token_id": ids["<unk>"],
        "image_token_id": ids["<|IMAGE_PLACEHOLDER|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|IMAGE_START|>"],
        "vision_config": {
            "model_type": "paddleocr_vl_vision",
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "hidden_act": "gelu_pytorch_tanh",
            "layer_norm_eps": 1e-6,
            "image_size": 384,
            "patch_size": PATCH,
            "num_channels": 3,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
            "tokens_per_second": 2,
        },
    }
    write_json(folder, "config.json", config)
    return TinyModel(
        folder,
        "PaddleOCRVLForConditionalGeneration",
        ids["<|IMAGE_PLACEHOLDER|>"],
        PROMPT,
        IMAGE_MARKER,
        paddle_tokens,
        trust_remote_code=True,
    )
