"""OCR engines behind one interface, and the choice among them."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from ocrd.config import EngineConfig
from ocrd.engines.base import Engine, EngineDeadError, EngineError, EngineHealth, EngineState

__all__ = [
    "Engine",
    "EngineChoice",
    "EngineDeadError",
    "EngineError",
    "EngineHealth",
    "EngineState",
    "create_engine",
]


@dataclass(frozen=True)
class EngineChoice:
    kind: str
    reason: str


def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def choose_engine(config: EngineConfig) -> EngineChoice:
    """Resolve `auto`: vLLM where a CUDA GPU and vLLM are present, otherwise RapidOCR."""
    if config.kind != "auto":  # openai is never guessed: it needs a server's address
        return EngineChoice(config.kind, "set in the configuration")
    if importlib.util.find_spec("vllm") is None:
        return EngineChoice("rapidocr", "vLLM is not installed (pip install 'inbox-ocrd[vllm]')")
    if not cuda_available():
        return EngineChoice("rapidocr", "vLLM is installed but no CUDA GPU is visible")
    return EngineChoice("vllm", "vLLM is installed and a CUDA GPU is visible")


def create_engine(config: EngineConfig, kind: str) -> Engine:
    if kind == "vllm":
        from ocrd.engines.vllm import VllmEngine

        return VllmEngine(config.vllm, config.sampling)
    if kind == "openai":
        from ocrd.engines.openai import OpenAiEngine

        return OpenAiEngine(config.openai, config.sampling)
    if kind == "rapidocr":
        from ocrd.engines.rapidocr import RapidOcrEngine

        return RapidOcrEngine(config.rapidocr)
    if kind == "simulated":
        from ocrd.engines.simulated import SimulatedEngine

        return SimulatedEngine(config.simulated)
    raise ValueError(f"unknown engine {kind!r}")
