"""What every part of the configuration shares: strict models, the error, and paths
resolved against the configuration file's folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict


class ConfigError(Exception):
    """The configuration cannot be used; the message says which key and what is expected."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Auto = Literal["auto"]  # a setting sized from the machine or the engine


def absolute_path(path: Path, base: Path) -> Path:
    path = Path(os.path.expanduser(path))
    return Path(os.path.normpath(path if path.is_absolute() else base / path))
