"""A document's route: what it takes from its inbox when it starts."""

from __future__ import annotations

from dataclasses import dataclass

from ocrd.config import DocumentOptions, InboxConfig
from ocrd.output.settle import Settler
from ocrd.uploads.tasks import TaskOptions


@dataclass(frozen=True)
class Route:
    """What a document takes from its inbox when it starts: where it goes, and how it is
    recognised and written (a reload changes the route of documents not yet started)."""

    config: InboxConfig
    settler: Settler
    options: DocumentOptions  # `auto` resolved for the engine in use
    pages: tuple[int, int] | None = None  # a task's page range: only these pages

    @classmethod
    def of(cls, config: InboxConfig, engine: str, task: TaskOptions | None = None) -> Route:
        """The inbox's route; for a task of the docling-serve API, with its options."""
        if task is not None:
            config = task.inbox_settings(config)
        pages = task.pages if task is not None else None
        return cls(config, Settler(config, engine), config.for_engine(engine), pages)
