"""Which engine serves: `auto` resolved against what the machine has, and the engine of
the kind chosen built from its settings."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from ocrd.config import EngineConfig
from ocrd.engines.base import Engine
from ocrd.engines.models import model_engines
from ocrd.log import get_logger
from ocrd.models import Model


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
    """The engine of every model an inbox may choose (engines/models.py), each of its
    kind: `kind` where its settings do not name another."""
    if kind == "rapidocr":  # reads text without any model's recipe
        return model_engine(config, kind, None)
    return model_engines(config, kind, model_engine)


def model_engine(config: EngineConfig, kind: str, recipe: Model | None) -> Engine:
    """The engine of `kind` for `recipe`'s model. vLLM: one `vllm serve` replica per GPU
    (or per listed device group), or, where `gpus: auto` finds no CUDA GPU, one engine in
    the daemon's process. Simulated: in the daemon's process, or `simulated.replicas`
    replica processes."""
    self_check = config.self_check_for(kind)
    if kind == "vllm":
        return _vllm_engine(config, self_check, recipe)
    if kind == "openai":
        from ocrd.engines.openai import OpenAiEngine

        return OpenAiEngine(config.openai, config.sampling, self_check, recipe)
    if kind == "rapidocr":
        from ocrd.engines.rapidocr import RapidOcrEngine

        return RapidOcrEngine(config.rapidocr)
    if kind == "simulated":
        if config.simulated.replicas > 0:
            from ocrd.engines.replicas import simulated_replicas

            return simulated_replicas(config, recipe)
        from ocrd.engines.simulated import SimulatedEngine

        return SimulatedEngine(config.simulated, recipe)
    raise ValueError(f"unknown engine {kind!r}")


def _vllm_engine(config: EngineConfig, self_check: bool, recipe: Model | None) -> Engine:
    from ocrd.engines.replicas import device_groups, visible_gpus, vllm_replicas

    visible = visible_gpus()
    if config.vllm.gpus == "auto" and not visible:
        from ocrd.engines.vllm import VllmEngine

        get_logger().info(
            "engine.vllm_in_process",
            reason="no CUDA GPU is visible: one engine inside the daemon's process "
            "(vLLM's CPU backend); list engine.vllm.gpus for replica processes",
        )
        return VllmEngine(config.vllm, config.sampling, self_check, recipe)
    groups = device_groups(config.vllm, visible)
    get_logger().info(
        "engine.vllm_replicas",
        replicas=[",".join(group) for group in groups],
        visible_gpus=visible,
        tensor_parallel_size=config.vllm.tensor_parallel_size,
    )
    return vllm_replicas(config, groups, not visible, recipe)
