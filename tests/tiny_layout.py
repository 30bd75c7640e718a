"""A tiny layout detector made at test time: a real RT-DETR checkpoint (transformers'
`RTDetrForObjectDetection`, as PP-DocLayout's detectors are RT-DETRs), with a few small
layers and random weights, saved with `save_pretrained` beside its image processor. It
carries the 25 labels of PP-DocLayoutV3 (the `id2label` of GLM-OCR's glmocr/config.yaml),
so that each model's mapping of labels to elements is what is exercised. Its boxes and
labels are random, but always the same for the same page (the weights come from a seed).
"""

from __future__ import annotations

from pathlib import Path

PP_DOCLAYOUT_V3_LABELS = (
    "abstract",
    "algorithm",
    "aside_text",
    "chart",
    "content",
    "display_formula",
    "doc_title",
    "figure_title",
    "footer",
    "footer_image",
    "footnote",
    "formula_number",
    "header",
    "header_image",
    "image",
    "inline_formula",
    "number",
    "paragraph_title",
    "reference",
    "reference_content",
    "seal",
    "table",
    "text",
    "vertical_text",
    "vision_footnote",
)


def build_tiny_detector(folder: Path, queries: int = 40, safetensors: bool = True) -> Path:
    """Write the checkpoint into `folder` (created) and return it."""
    import torch
    from transformers import (
        RTDetrConfig,
        RTDetrForObjectDetection,
        RTDetrImageProcessor,
        RTDetrResNetConfig,
    )

    torch.manual_seed(7)
    backbone = RTDetrResNetConfig(
        embedding_size=16,
        hidden_sizes=[16, 32, 64, 128],
        depths=[1, 1, 1, 1],
        layer_type="basic",
        out_features=["stage2", "stage3", "stage4"],
    )
    labels = dict(enumerate(PP_DOCLAYOUT_V3_LABELS))
    config = RTDetrConfig(
        backbone_config=backbone,
        use_pretrained_backbone=False,
        encoder_in_channels=[32, 64, 128],
        feat_strides=[8, 16, 32],
        num_feature_levels=3,
        d_model=32,
        encoder_hidden_dim=32,
        decoder_in_channels=[32, 32, 32],
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        num_queries=queries,
        num_denoising=0,
        id2label=labels,
        label2id={name: index for index, name in labels.items()},
    )
    folder.mkdir(parents=True, exist_ok=True)
    RTDetrForObjectDetection(config).eval().save_pretrained(folder, safe_serialization=safetensors)
    RTDetrImageProcessor(size={"height": 160, "width": 160}).save_pretrained(folder)
    return folder
