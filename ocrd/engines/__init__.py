"""OCR engines behind one interface, and the choice among them."""

from __future__ import annotations

from ocrd.engines.base import (
    Engine,
    EngineDeadError,
    EngineError,
    EngineHealth,
    EngineStartError,
    EngineState,
    PageCrashedError,
    ReplicaFacts,
    ReplicaState,
    SelfCheckResult,
)
from ocrd.engines.choice import EngineChoice, choose_engine, create_engine

__all__ = [
    "Engine",
    "EngineChoice",
    "EngineDeadError",
    "EngineError",
    "EngineHealth",
    "EngineStartError",
    "EngineState",
    "PageCrashedError",
    "ReplicaFacts",
    "ReplicaState",
    "SelfCheckResult",
    "choose_engine",
    "create_engine",
]
