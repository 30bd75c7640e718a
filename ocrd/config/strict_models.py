"""StrictModes for the folders ocrd loads models from: `vllm.model` and `vllm.tokenizer`
where an engine of kind vllm (or auto, which may choose it) serves the model, and
`layout.detector`, for `engine` and each of `engine.models`.

Whoever may change such a folder changes what ocrd is. With `vllm.trust_remote_code` its
Python files run as ocrd's user (in the `vllm serve` replicas, or in the daemon's own
process where the engine runs inside it); without it, its weights, tokenizer, chat template
and generation settings still decide what every page is read as, and a broken file stops
the engine. The layout detector is loaded from safetensors with no remote code, so it runs
nothing from its folder, but its weights and settings decide which regions of a page are
read at all. Both are refused alike when others than ocrd's user and root may change the
folder, a file or folder in it, a symbolic link on the way or a folder above it. A hub
name (no local folder) is fetched into ocrd's user's own cache and is not judged here.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ocrd.config.engine import PUBLISHED_DETECTOR, EngineConfig
from ocrd.files.permissions import others_may_write, user_name, why_others_may_change

# Entries looked at in one model folder at most: a model has tens of files; a setting that
# names a folder such as /srv or a home folder by mistake is refused, not walked for hours.
MAX_ENTRIES = 20000
CHOOSES_VLLM = ("vllm", "auto")  # engine kinds that load vllm.model and vllm.tokenizer


@dataclass(frozen=True)
class ModelFolder:
    """A local folder (or file) the configuration has ocrd load a model from."""

    setting: str  # where the configuration names it: engine.models.glm-ocr.vllm.model
    path: Path
    runs_code: bool  # whether ocrd runs Python files from it (vllm.trust_remote_code)
    detector: bool = False


def model_folder_problems(engine: EngineConfig, kind: str | None = None) -> list[str]:
    """A line for each model folder that others than ocrd's user and root may change, naming
    the setting, who and what to do. `kind`: the engine kind `ocrd run --engine` chose."""
    problems, judged = [], set()
    for folder in model_folders(engine, kind):
        if folder.path in judged:  # a folder several models share (inherited) is told once
            continue
        judged.add(folder.path)
        if not os.path.lexists(folder.path):
            problems.append(_missing(folder))
            continue
        why = why_folder_unsafe(folder.path, os.geteuid())
        if why is not None:
            problems.append(_refusal(folder, why))
    return problems


def model_folders(engine: EngineConfig, kind: str | None = None) -> list[ModelFolder]:
    """The local model folders the engines of `engine` would load, each with its setting.
    A model's kind is decided as the daemon decides it (ocrd/engines/models.py): the run's
    where the model's settings leave the section's kind as it is."""
    if kind is not None:
        engine = engine.model_copy(update={"kind": kind})
    folders = []
    for name in engine.served_models:
        settings = engine.for_model(name)
        chosen = engine.kind if settings.kind == engine.kind else settings.kind
        if chosen in CHOOSES_VLLM:
            folders += _vllm_folders(engine, name, settings)
        folders += _detector_folders(engine, name, settings)
    return folders


def _vllm_folders(engine: EngineConfig, name: str, settings: EngineConfig) -> list[ModelFolder]:
    vllm = settings.vllm
    folders = []
    for key in ("model", "tokenizer"):  # an unset model is the recipe's hub id
        value = getattr(vllm, key) if key in vllm.model_fields_set else None
        path = local_path(value)
        if path is not None:
            setting = _setting(engine, name, "vllm", key)
            folders.append(ModelFolder(setting, path, vllm.trust_remote_code))
    return folders


def _detector_folders(engine: EngineConfig, name: str, settings: EngineConfig) -> list[ModelFolder]:
    """The detector runs in ocrd's own processes before a model of any kind."""
    value = settings.layout.detector
    path = None if value == PUBLISHED_DETECTOR else local_path(value)
    if path is None:
        return []
    setting = _setting(engine, name, "layout", "detector")
    return [ModelFolder(setting, path, runs_code=False, detector=True)]


def local_path(value: str | None) -> Path | None:
    """The local folder or file a model setting names, as vLLM and transformers take it (an
    absolute path, or one that exists from the working folder); None for a hub name. A `..`
    is kept: after a link it leads where the link leads, not where abspath would say."""
    if not value:
        return None
    if os.path.isabs(value) or os.path.exists(value):
        return Path(os.getcwd(), value)
    return None


def _setting(engine: EngineConfig, name: str, part: str, key: str) -> str:
    """Where the configuration names a model's setting: its own entry in `engine.models`,
    or the engine section's, which it inherits."""
    serving = engine.models.get(name)
    if serving is not None and key in getattr(serving, part):
        return f"engine.models.{name}.{part}.{key}"
    return f"engine.{part}.{key}"


def why_folder_unsafe(path: Path, uid: int) -> str | None:
    """Who other than user `uid` (and root) may change the model at `path`, in words, or
    None: the folder, the links and folders on its way, and everything in it."""
    why = why_others_may_change(path, uid)
    real = Path(os.path.realpath(path))
    if why is not None or not real.is_dir():
        return why
    try:
        return _Walk(uid).problem_inside(real)
    except OSError as error:
        return f"{error.filename or real} cannot be looked at ({error.strerror})"


class _Walk:
    """One look through a model folder: each entry judged in a folder already judged safe,
    links followed (to where they lead, judged in full), each real folder once."""

    def __init__(self, uid: int) -> None:
        self.uid = uid
        self.seen: set[Path] = set()
        self.left = MAX_ENTRIES

    def problem_inside(self, folder: Path) -> str | None:
        self.seen.add(folder)
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
        for entry in entries:
            self.left -= 1
            if self.left < 0:
                return f"it holds more than {MAX_ENTRIES} entries; name the model's own folder"
            why = self._problem_of(Path(entry.path), entry.stat(follow_symlinks=False))
            if why is not None:
                return why
        return None

    def _problem_of(self, path: Path, info: os.stat_result) -> str | None:
        if stat.S_ISLNK(info.st_mode):
            # an HF cache snapshot links each file into blobs/: the target, its folders and
            # the link's own folder are judged, as for a hook program
            why = why_others_may_change(path, self.uid)
            real = Path(os.path.realpath(path))
            if why is None and real.is_dir() and real not in self.seen:
                return self.problem_inside(real)
            return why
        why = others_may_write(path, info, self.uid)
        if why is not None:
            return f"{path}: {why}"
        if stat.S_ISDIR(info.st_mode) and path not in self.seen:
            return self.problem_inside(path)
        return None


def _refusal(folder: ModelFolder, why: str) -> str:
    user = user_name(os.geteuid())
    trusted = "root" if user == "root" else f"{user} and root"
    path = folder.path
    return (
        f"model folder ({folder.setting}) {path} may be changed by others than {trusted} "
        f"({why}); {_stake(folder, user)}, so ocrd refuses it, as sshd's StrictModes does: "
        f"make it, everything in it and the folders above it writable by "
        f"{trusted.replace(' and ', ' or ')} alone (chown -R {user} {path}; "
        f"chmod -R go-w {path} and chmod go-w its folders; setfacl -R -b {path} for an "
        "ACL), or copy it to a folder that is"
    )


def _missing(folder: ModelFolder) -> str:
    return (
        f"model folder ({folder.setting}) {folder.path} does not exist; create it, or name "
        "an existing folder or a model on the hub"
    )


def _stake(folder: ModelFolder, user: str) -> str:
    """What whoever may change the folder could do."""
    if folder.runs_code:
        return f"with vllm.trust_remote_code its Python files run as {user}"
    if folder.detector:
        return "its weights decide which regions of every page are read"
    return "its weights, tokenizer and chat template decide what every page is read as"
