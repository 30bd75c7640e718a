"""Engines per OCR model: each model an inbox may choose is served by an engine of its own
(`engine.model` by the engine section's settings, each of `engine.models` by those settings
with its own laid over them), and the daemon sees them as one engine.

`ModelEngine` holds one engine to its model: a page is sent at the size the model's recipe
wants (ocrd/models/recipe.py, `ImageRule`), and its text is marked with the model's name, so
that the model's own parser reads it (ocrd/output/page.py) and the page's events, journal
and summary name the model. `ModelEngines` sends each page to the engine of the model its
inbox chose (`PageImage.model`); its health is its parts' worst (a dead part ends the
daemon, as a dead engine does), its capacity their sum, its replicas all of theirs, each
named with its model.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from ocrd.config import EngineConfig, PromptMode
from ocrd.domain import PageImage, PageText
from ocrd.engines.base import Engine, EngineHealth, EngineState, ReplicaFacts
from ocrd.models import Model
from ocrd.models import model as model_named

# Worst first: the state of several engines together is that of the worst of them.
SEVERITY = (
    EngineState.dead,
    EngineState.garbled,
    EngineState.unreachable,
    EngineState.loading,
    EngineState.ready,
)

Build = Callable[[EngineConfig, str, Model], Engine]


class ModelEngine:
    """One engine, serving one model."""

    def __init__(self, recipe: Model, engine: Engine) -> None:
        self.recipe = recipe
        self.engine = engine
        self.name = engine.name
        self.health = engine.health  # the engine's own, which it updates in place
        self.page_folder = engine.page_folder
        self.prefix = ""  # before its replicas' names, where several models' are shown

    @property
    def max_concurrency(self) -> int:
        return self.engine.max_concurrency

    @property
    def replicas(self) -> list[ReplicaFacts]:
        return [self._named(facts) for facts in self.engine.replicas]

    @property
    def summary(self) -> str:
        return self.engine.summary

    def _named(self, facts: ReplicaFacts) -> ReplicaFacts:
        name = self.prefix + facts.name
        return dataclasses.replace(facts, name=name, model=self.recipe.name)

    async def metrics_text(self) -> str:
        return await self.engine.metrics_text()

    def subscribe(self, callback: Callable[[ReplicaFacts], None]) -> None:
        self.engine.subscribe(lambda facts: callback(self._named(facts)))

    async def start(self) -> None:
        await self.engine.start()

    async def check_health(self) -> None:
        await self.engine.check_health()

    async def stop(self) -> None:
        await self.engine.stop()

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        return await self.engine.recognise(page, mode, priority)


class ModelEngines:
    """Several models' engines as one: each page to its model's engine."""

    page_folder: Path | None = None  # pages come as pixels: each engine writes its own files

    def __init__(self, engines: list[ModelEngine]) -> None:
        for engine in engines:
            engine.prefix = f"{engine.recipe.name}/"  # replica names unique across models
        self.engines = {engine.recipe.name: engine for engine in engines}
        self.default = engines[0]
        self.name = "+".join(dict.fromkeys(engine.name for engine in engines))

    def engine_for(self, model: str | None) -> ModelEngine:
        if model is None:
            return self.default
        if model not in self.engines:
            raise ValueError(f"no engine serves the model {model!r}")
        return self.engines[model]

    @property
    def health(self) -> EngineHealth:
        """The worst of the engines' states, its problem named by model; the others'
        troubles as `degraded`."""
        parts = sorted(self.engines.values(), key=lambda e: SEVERITY.index(e.health.state))
        worst = parts[0].health
        problem = f"{parts[0].recipe.name}: {worst.problem}" if worst.problem else None
        troubles = [
            f"{engine.recipe.name}: {engine.health.problem or engine.health.state.value}"
            for engine in parts[1:]
            if engine.health.state is not EngineState.ready
        ]
        troubles += [f"{e.recipe.name}: {e.health.degraded}" for e in parts if e.health.degraded]
        return EngineHealth(worst.state, worst.since, problem, "; ".join(troubles) or None)

    @property
    def max_concurrency(self) -> int:
        return sum(engine.max_concurrency for engine in self.engines.values())

    @property
    def replicas(self) -> list[ReplicaFacts]:
        return [facts for engine in self.engines.values() for facts in engine.replicas]

    @property
    def summary(self) -> str:
        return "; ".join(f"{name}: {e.summary}" for name, e in self.engines.items())

    async def metrics_text(self) -> str:
        texts = await asyncio.gather(*(e.metrics_text() for e in self.engines.values()))
        return "".join(texts)

    def subscribe(self, callback: Callable[[ReplicaFacts], None]) -> None:
        for engine in self.engines.values():
            engine.subscribe(callback)

    async def start(self) -> None:
        await asyncio.gather(*(engine.start() for engine in self.engines.values()))

    async def check_health(self) -> None:
        for engine in self.engines.values():
            await engine.check_health()

    async def recognise(self, page: PageImage, mode: PromptMode, priority: int = 0) -> PageText:
        engine = self.engine_for(page.model)
        return await engine.recognise(page, mode, priority)

    async def stop(self) -> None:
        await asyncio.gather(
            *(engine.stop() for engine in self.engines.values()), return_exceptions=True
        )


def served_config(config: EngineConfig, recipe: Model) -> EngineConfig:
    """A model's engine settings with the weights it serves named: its own (`vllm.model`,
    `openai.model`) where set, else the model's."""
    update: dict[str, Any] = {}
    if "model" not in config.vllm.model_fields_set:
        update["vllm"] = config.vllm.model_copy(update={"model": recipe.hf_id})
    if "model" not in config.openai.model_fields_set:
        update["openai"] = config.openai.model_copy(update={"model": recipe.hf_id})
    return config.model_copy(update=update)


def model_engines(config: EngineConfig, kind: str, build: Build) -> Engine:
    """The engine of every served model (`build` makes one of a kind, for a model), as
    one; ValueError for a model ocrd does not know."""
    planned = []
    for name in config.served_models:
        try:
            recipe = model_named(name)
        except KeyError as error:
            where = "engine.model" if name == config.model else f"engine.models.{name}"
            raise ValueError(f"{where}: {error.args[0]}") from None
        settings = config.for_model(name)
        chosen = kind if settings.kind == config.kind else _kind_of(settings)
        planned.append((recipe, served_config(settings, recipe), chosen))
    check_gpu_shares([(r.name, settings) for r, settings, chosen in planned if chosen == "vllm"])
    engines = [
        ModelEngine(r, _with_layout(build(settings, chosen, r), r, settings))
        for r, settings, chosen in planned
    ]
    # ModelEngines' health is its parts', worked out when read: a property, not the
    # attribute the protocol names (nothing outside an engine sets it).
    return engines[0].engine if len(engines) == 1 else cast(Engine, ModelEngines(engines))


def check_gpu_shares(served: list[tuple[str, EngineConfig]]) -> None:
    """ValueError where the vLLM engines of several models would ask one GPU for more than
    all of its memory (`gpus: auto` shares every GPU; a KV cache given in bytes is not a
    share)."""
    shares = [
        (name, settings.vllm.gpus, settings.vllm.gpu_memory_utilization)
        for name, settings in served
        if settings.vllm.kv_cache_memory_bytes is None
    ]
    devices = {str(d) for _, gpus, _ in shares if gpus != "auto" for d in gpus} or {"auto"}
    for device in sorted(devices):
        on_it = [(n, s) for n, gpus, s in shares if gpus == "auto" or device in map(str, gpus)]
        if len(on_it) > 1 and sum(share for _, share in on_it) > 1.0:
            listed = ", ".join(f"{name} {share:g}" for name, share in on_it)
            where = "every GPU" if device == "auto" else f"GPU {device}"
            raise ValueError(
                f"the models' vLLM engines would take more than all of {where}'s memory "
                f"(vllm.gpu_memory_utilization: {listed}); give each model a share so "
                "that they add up to at most 1, or its own vllm.gpus"
            )


def _with_layout(engine: Engine, recipe: Model, settings: EngineConfig) -> Engine:
    """The engine, sent each page's regions where a layout detector is configured for its
    model (engines/layout.py); as it is otherwise (whole pages)."""
    if settings.layout.detector is None:
        return engine
    from ocrd.engines.layout import LayoutEngine

    return LayoutEngine(engine, recipe, settings.layout)


def _kind_of(settings: EngineConfig) -> str:
    from ocrd.engines.choice import choose_engine

    return choose_engine(settings).kind
