"""Temporary files: named after their writer (this instance), so that files left by a killed run
can be told apart from users' files and swept away by their own instance only."""

from __future__ import annotations

import functools
import os
import re
import secrets
import shutil
import socket
from pathlib import Path

# Short, recognisable temporary names: a long original name must not make them too long,
# and files left by a killed run can be told apart from users' files and swept away. They
# name their writer (its instance), since daemons on several hosts share the outbox and
# each may sweep only its own (and those of one whose claims it took over).
_LEGACY_TEMPORARY = re.compile(r"^\.ocrd-\d+-[0-9a-f]{8}\.tmp$")  # an older ocrd's


def writer() -> str:
    """Who writes this process's temporaries: its instance name (`OCRD_INSTANCE`, or the
    host name; see `ocrd/sharing/instances.py`), kept to safe characters."""
    return _safe_name(os.environ.get("OCRD_INSTANCE") or _host_name())


@functools.cache
def _host_name() -> str:  # asked once: every temporary file is named with it
    return socket.gethostname()


@functools.cache
def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name) or "ocrd"


def temporary_path(folder: Path) -> Path:
    return folder / f".ocrd-{writer()}-{os.getpid()}-{secrets.token_hex(4)}.tmp"


def _temporaries_of(name: str) -> re.Pattern[str]:
    return re.compile(rf"^\.ocrd-{re.escape(name)}-\d+-[0-9a-f]{{8}}\.tmp$")


def remove_stale_temporaries(root: Path, name: str) -> int:
    """Remove the temporary files and folders under `root` that instance `name` (no longer
    running: this daemon's earlier run, or one whose claims were taken over) left, and an
    older ocrd's."""
    own = _temporaries_of(name)

    def stale(entry: str) -> bool:
        return bool(own.match(entry) or _LEGACY_TEMPORARY.match(entry))

    removed = 0
    for folder, folders, files in os.walk(root):
        for entry in [*files, *folders]:
            if stale(entry):
                path = Path(folder) / entry
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
                removed += 1
        folders[:] = [entry for entry in folders if not stale(entry)]
    return removed
