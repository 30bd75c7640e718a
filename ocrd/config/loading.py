"""Configuration: the YAML file, validated into typed models.

Relative paths in the file are resolved against the folder that holds the file, so a
config can live beside its data folder and be started from anywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, model_validator

from ocrd.config.base import ConfigError, Strict
from ocrd.config.engine import (
    EngineConfig,
)
from ocrd.config.inboxes import (
    InboxConfig,
    InboxEntry,
)
from ocrd.config.service import (
    HttpConfig,
    InstancesConfig,
    PipelineConfig,
)


class ConfigFile(Strict):
    """The configuration file as written."""

    inboxes: Annotated[tuple[InboxEntry, ...], Field(min_length=1)] = ()
    engine: EngineConfig = EngineConfig()
    pipeline: PipelineConfig = PipelineConfig()
    http: HttpConfig = HttpConfig()
    instances: InstancesConfig = InstancesConfig()


class Config(ConfigFile):
    """The configuration as the daemon uses it: inboxes resolved against the file's folder."""

    inboxes: Annotated[tuple[InboxConfig, ...], Field(min_length=1)] = ()

    @model_validator(mode="after")
    def _distinct_work_folders(self) -> Config:
        seen: dict[Path, Path] = {}
        for inbox in self.inboxes:
            if inbox.work in seen:
                raise ValueError(
                    f"inboxes {seen[inbox.work]} and {inbox.path} share the work folder "
                    f"{inbox.work}; give each inbox its own 'work:' folder"
                )
            seen[inbox.work] = inbox.path
        return self


def _location(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def describe_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    problems = error.errors()
    inbox_problems = any(len(p["loc"]) > 1 and p["loc"][0] == "inboxes" for p in problems)
    for problem in problems:
        if inbox_problems and problem["type"] == "too_short" and problem["loc"] == ("inboxes",):
            continue  # an inbox with an error is left out of the count: nothing to add
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown key (check its spelling and where it is nested)"
        lines.append(f"  {_location(problem['loc'])}: {message}")
    return "\n".join(lines)


def parse_config(data: Any, base: Path, source: str = "config") -> Config:
    """Validate raw YAML data; relative paths are taken relative to `base`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    try:
        written = ConfigFile.model_validate(data)
        return Config(
            inboxes=tuple(entry.located(base) for entry in written.inboxes),
            engine=written.engine,
            pipeline=written.pipeline,
            http=written.http,
            instances=written.instances,
        )
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error, source)) from None


def load_config(path: Path) -> Config:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(
            f"{path}: cannot read the configuration file ({error.strerror})"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    return parse_config(data, path.resolve().parent, str(path))
