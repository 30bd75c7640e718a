"""The OCR models ocrd can run: each one small module (its recipe, its answer's parser, its
self-check page); nothing else names a model."""

from ocrd.models.recipe import (
    ImageRule,
    ImageSize,
    Layout,
    Model,
    NgramGuard,
    Prompt,
    Reading,
    RegionKind,
    Sampling,
    SelfCheck,
)
from ocrd.models.registry import DEFAULT, model, models

__all__ = [
    "DEFAULT",
    "ImageRule",
    "ImageSize",
    "Layout",
    "Model",
    "NgramGuard",
    "Prompt",
    "Reading",
    "RegionKind",
    "Sampling",
    "SelfCheck",
    "model",
    "models",
]
