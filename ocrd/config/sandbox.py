"""Which configured folders a systemd unit's sandbox keeps ocrd from using.

The shipped unit makes the file system read-only (`ProtectSystem=strict`) and hides the
home folders (`ProtectHome=yes`) except the paths it lists; a folder outside them fails at
start with "Read-only file system" (and one under /tmp is, with PrivateTmp=yes, a private
folder nobody else sees). `ocrd check-config --unit` reads the unit and its
drop-ins, as `systemctl cat ocrd` prints them, and names each folder the unit cannot write
and the setting to change. Only what decides writability is read: ProtectSystem=,
ProtectHome=, PrivateTmp=, ReadWritePaths=, ReadOnlyPaths=, InaccessiblePaths=,
BindPaths= and the StateDirectory= family. The innermost listed path decides, as in
systemd.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ocrd.config import Config

HOMES = (Path("/home"), Path("/root"), Path("/run/user"))
PROTECT_SYSTEM = {
    "yes": (Path("/usr"), Path("/boot"), Path("/efi")),
    "full": (Path("/usr"), Path("/boot"), Path("/efi"), Path("/etc")),
    "strict": (Path("/"),),
}
# StateDirectory=ocrd is /var/lib/ocrd, and so on (for a system service).
MANAGED_DIRECTORIES = {
    "StateDirectory": Path("/var/lib"),
    "CacheDirectory": Path("/var/cache"),
    "LogsDirectory": Path("/var/log"),
    "RuntimeDirectory": Path("/run"),
}
WRITABLE_API = (Path("/dev"), Path("/proc"), Path("/sys"))
TRUE = ("yes", "true", "on", "1")


@dataclass
class Sandbox:
    """What a unit's [Service] settings make of paths: writable (None) or not (the setting
    that forbids it), each rule for the path and everything below it."""

    rules: dict[Path, str | None] = field(default_factory=dict)
    protect_home: str = "no"

    def blocker(self, folder: Path) -> str | None:
        """The setting that keeps `folder` from being written, or None if it may be."""
        folder = Path(os.path.normpath(folder))
        matches = [path for path in self.rules if folder == path or folder.is_relative_to(path)]
        if not matches:
            return None
        return self.rules[max(matches, key=lambda path: len(path.parts))]


def read_unit(text: str) -> Sandbox:
    """The sandbox of a unit file followed by its drop-ins (`systemctl cat` output)."""
    settings = _service_settings(text)
    sandbox = Sandbox()
    protect_system = _last(settings, "ProtectSystem", "no")
    protect_system = "yes" if protect_system in TRUE else protect_system
    for path in PROTECT_SYSTEM.get(protect_system, ()):
        sandbox.rules[path] = f"ProtectSystem={protect_system}"
    if protect_system == "strict":
        sandbox.rules.update(dict.fromkeys(WRITABLE_API))
    home = _last(settings, "ProtectHome", "no")
    sandbox.protect_home = "yes" if home in TRUE else home
    if sandbox.protect_home != "no":
        sandbox.rules.update(dict.fromkeys(HOMES, f"ProtectHome={sandbox.protect_home}"))
    if _last(settings, "PrivateTmp", "no") in TRUE:  # writable, but not the folder others see
        sandbox.rules.update(dict.fromkeys((Path("/tmp"), Path("/var/tmp")), "PrivateTmp=yes"))
    for name, parent in MANAGED_DIRECTORIES.items():
        for value in _list(settings, name):
            sandbox.rules[parent / value.split(":")[0]] = None
    # Under hidden homes a listed path is not there to be made writable: with
    # ProtectHome=yes not at all, with tmpfs only what BindPaths= brings in.
    for value in _list(settings, "ReadWritePaths"):
        path = Path(value.lstrip("-+"))
        if sandbox.protect_home in ("no", "read-only") or not _under(path, HOMES):
            sandbox.rules[path] = None
    for value in _list(settings, "BindPaths"):
        source, _, rest = value.lstrip("-").partition(":")
        target = Path(rest.split(":")[0] or source)
        if sandbox.protect_home != "yes" or not _under(target, HOMES):
            sandbox.rules[target] = None
    for name in ("ReadOnlyPaths", "InaccessiblePaths"):
        for value in _list(settings, name):
            sandbox.rules[Path(value.lstrip("-+"))] = f"{name}={value}"
    return sandbox


def unwritable_folders(config: Config, sandbox: Sandbox) -> list[str]:
    """A line for each configured folder the unit cannot write, with the setting to change."""
    lines = []
    for number, inbox in enumerate(config.inboxes):
        for role in ("path", "outbox", "done", "failed", "work"):
            folder: Path = getattr(inbox, role)
            blocker = sandbox.blocker(folder)
            if blocker is None:
                continue
            name = "inbox" if role == "path" else f"{role} folder"
            lines.append(
                f"{name} {folder} (inboxes[{number}].{role}): the unit cannot use it "
                f"({blocker}); {_remedy(folder, blocker)}"
            )
    return lines


def _remedy(folder: Path, blocker: str) -> str:
    if blocker.startswith("ProtectHome="):
        return (
            "put it under /srv/ocrd, or in a drop-in (systemctl edit ocrd) set ProtectHome=no, "
            f"or ProtectHome=tmpfs with BindPaths={folder.parent}"
        )
    if blocker == "PrivateTmp=yes":
        return "the unit has a /tmp of its own, empty and unseen by others: use /srv/ocrd"
    if blocker.startswith(("ReadOnlyPaths=", "InaccessiblePaths=")):
        return f"put it elsewhere, or remove {blocker} from the unit"
    return (
        "put it under /srv/ocrd (systemd/ocrd.yaml), or list its parent in a drop-in "
        f"(systemctl edit ocrd): [Service] ReadWritePaths={folder.parent}"
    )


def _service_settings(text: str) -> list[tuple[str, str]]:
    """(name, value) of every setting in every [Service] section, in order."""
    settings = []
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "Service" and "=" in line:
            name, _, value = line.partition("=")
            settings.append((name.strip(), value.strip()))
    return settings


def _last(settings: list[tuple[str, str]], name: str, default: str) -> str:
    values = [value for key, value in settings if key == name]
    return values[-1].lower() if values else default


def _list(settings: list[tuple[str, str]], name: str) -> list[str]:
    """A list setting's entries; an empty assignment resets the list, as in systemd."""
    entries: list[str] = []
    for key, value in settings:
        if key == name:
            entries = entries + value.split() if value else []
    return entries


def _under(path: Path, parents: tuple[Path, ...]) -> bool:
    return any(path == parent or path.is_relative_to(parent) for parent in parents)
