"""Checking a configuration against the machine: folders that exist, are writable and do not
nest; settings that only make sense with something in the environment. `ocrd run` refuses
to start on any problem (exit status 78); `ocrd check-config` prints them.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from ocrd.config import Config, InboxConfig
from ocrd.files.permissions import (
    make_private,
    may_be_replaced_by_others,
    others_may_write,
    user_name,
)


def problems(config: Config, create: bool = True) -> list[str]:
    """Every reason not to start, each a line saying what and why."""
    return check_folders(config, create) + check_http(config) + check_models(config)


def check_models(config: Config) -> list[str]:
    """Inboxes that name a model no engine serves, each a line saying what to do."""
    served = config.engine.served_models
    return [
        f"inbox {inbox.path} names the model {inbox.model!r}, which no engine serves "
        f"(served: {', '.join(served)}); add it under engine.models, or name a served model"
        for inbox in config.inboxes
        if inbox.model not in served
    ]


def check_folders(config: Config, create: bool = True) -> list[str]:
    """Problems with the configured folders, each a line saying which folder and why."""
    problems: list[str] = []
    inboxes = [inbox.path for inbox in config.inboxes]
    for inbox in config.inboxes:
        if not inbox.path.is_dir():
            problems.append(f"inbox {inbox.path} does not exist or is not a folder; create it")
            continue
        if not os.access(inbox.path, os.W_OK | os.X_OK):
            problems.append(
                f"inbox {inbox.path} is not writable by this user (files are moved out of it)"
            )
        for role in ("outbox", "done", "failed", "work"):
            folder: Path = getattr(inbox, role)
            for watched in inboxes:
                if folder == watched or folder.is_relative_to(watched):
                    problems.append(
                        f"{role} folder {folder} lies inside the watched inbox {watched}; "
                        "move it out, or ocrd would read its own output"
                    )
            if not folder.exists() and create and folder.parent.is_dir():
                with contextlib.suppress(OSError):
                    _make(folder, private=role == "work")
            if not folder.is_dir():
                if create or not folder.parent.is_dir():
                    problems.append(f"{role} folder {folder} does not exist; create it")
            elif not os.access(folder, os.W_OK | os.X_OK):
                problems.append(f"{role} folder {folder} is not writable by this user")
        if inbox.work.is_dir() and inbox.work.stat().st_dev != inbox.path.stat().st_dev:
            problems.append(
                f"work folder {inbox.work} is on another filesystem than inbox {inbox.path}; "
                "claiming needs an atomic rename, so put it on the same filesystem"
            )
        problems += check_work_area(inbox)
    return problems


def _make(folder: Path, private: bool) -> None:
    folder.mkdir(mode=0o700 if private else 0o777)
    if private:  # whatever a default ACL of its parent hands down
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            make_private(fd, 0o700)
        finally:
            os.close(fd)


def check_work_area(inbox: InboxConfig) -> list[str]:
    """The work area must be ocrd's user's alone (as sshd's StrictModes wants a home
    folder): ocrd trusts the claims and leases in it as its own, so whoever else may write
    there, or move it away, could make ocrd move files where they choose. Its folders one
    level down (the leases' folder, each daemon's claims) count too."""
    work = inbox.work
    try:
        info = os.lstat(work)
    except FileNotFoundError:
        return []  # made at start, as ocrd's own
    except OSError as error:
        return [f"work folder {work} cannot be looked at ({error.strerror})"]
    uid = os.geteuid() or info.st_uid  # run as root: the work area is its owner's
    why = may_be_replaced_by_others(work, uid) or _inner_problem(work, uid)
    if why is None:
        return []
    return [
        f"work folder {work} is not ocrd's alone: {why}; make the work area its user's "
        f"alone (chown -R {user_name(uid)} {work}; chmod 700 {work}; setfacl -R -b {work}) "
        f"on a path only root or that user may change, or set inboxes[].work to such a folder"
    ]


def _inner_problem(work: Path, uid: int) -> str | None:
    """Who else may write one of the work area's own folders (or a link there)."""
    try:
        names = sorted(os.listdir(work))
    except OSError as error:
        return f"it cannot be listed ({error.strerror})"
    for name in names:
        path = work / name
        with contextlib.suppress(FileNotFoundError):
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                return f"{path} is a symbolic link"
            why = others_may_write(path, info, uid) if stat.S_ISDIR(info.st_mode) else None
            if why is not None:
                return f"{path}: {why}"
    return None


def check_http(config: Config) -> list[str]:
    """Problems with the HTTP settings that only show in the environment."""
    http = config.http
    if not http.enabled or os.environ.get(http.token_env):
        return []
    if not http.trust_loopback:
        return [
            f"http.trust_loopback is false but {http.token_env} is not set: every client "
            "would be refused; set the token in the environment (an EnvironmentFile=)"
        ]
    uploading = [str(inbox.path) for inbox in config.inboxes if inbox.uploads]
    if uploading:
        return [
            f"uploads: true (inbox {', '.join(uploading)}) but {http.token_env} is not set: "
            "uploads always need the bearer token; set it in the environment (an "
            "EnvironmentFile=) or switch uploads off"
        ]
    return []


def folder_warnings(config: Config) -> list[str]:
    """What will keep some dropped files from being taken, though ocrd can start."""
    warnings = []
    uid = os.geteuid()
    for inbox in config.inboxes:
        with contextlib.suppress(OSError):
            info = inbox.path.stat()
            if info.st_mode & 0o1000 and uid not in (0, info.st_uid):
                warnings.append(
                    f"inbox {inbox.path} has the sticky bit and is not ocrd's: files other "
                    "users drop there cannot be moved out (remove it: chmod o-t)"
                )
    return warnings
