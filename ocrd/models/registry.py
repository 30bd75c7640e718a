"""Every model ocrd knows, by name: built from the model modules on each call."""

from __future__ import annotations

from ocrd.models import deepseek_ocr2, glm_ocr, lightonocr2, olmocr2, paddleocr_vl
from ocrd.models.recipe import Model

DEFAULT = deepseek_ocr2.NAME


def models() -> dict[str, Model]:
    """The models by name, DeepSeek-OCR-2 (the default) first."""
    known = (
        deepseek_ocr2.model(),
        lightonocr2.model(),
        lightonocr2.bbox_model(),
        olmocr2.model(),
        glm_ocr.model(),
        paddleocr_vl.model(),
    )
    return {model.name: model for model in known}


def model(name: str) -> Model:
    """The model of that name; a KeyError that lists the names there are otherwise."""
    known = models()
    if name not in known:
        raise KeyError(f"no OCR model is called {name!r}; ocrd knows: {', '.join(known)}")
    return known[name]
