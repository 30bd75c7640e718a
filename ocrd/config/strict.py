"""StrictModes, as sshd's: the configuration file, and the hook programs and scripts it
names, must be writable only by ocrd's user and root.

Whoever may change the configuration decides which programs ocrd runs (hooks) and where it
moves files; whoever may change a hook program runs code as ocrd's user. So a file that
another user owns, that its group or everyone may write (by mode or ACL), or that lies in a
folder someone else may write (and so replace it), is refused: `ocrd run` and
`ocrd check-config` exit 78, a reload keeps the configuration in use, and a hook whose
program became writable by others since is not run.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from ocrd.config.loading import Config
from ocrd.files.permissions import may_be_replaced_by_others, user_name

# Programs whose first file argument is the code they run: `python3 /srv/hooks/notify.py`
# runs notify.py, which counts as the hook's program as much as python3 does.
INTERPRETER = re.compile(r"(?:ba|da|z|k)?sh|env|(?:python|perl|ruby|php|node|lua)[0-9.]*")


def strict_mode_problems(config_path: Path, config: Config) -> list[str]:
    """A line for the configuration file and for each hook file that others than ocrd's
    user and root may change, naming who and what to do."""
    problems = []
    why = _why_unsafe(config_path)
    if why is not None:
        problems.append(_refusal("configuration file", config_path, why))
    for number, inbox in enumerate(config.inboxes):
        for event in ("on_done", "on_failed"):
            hook = getattr(inbox.hooks, event)
            if hook is None or hook.command is None:
                continue
            for path in hook_files(hook.command):
                why = _why_unsafe(path)
                if why is not None:
                    what = f"hook program (inboxes[{number}].hooks.{event}.command)"
                    problems.append(_refusal(what, path, why))
    return problems


def hook_problem(command: tuple[str, ...]) -> str | None:
    """Why a hook command must not run now (a file of it others may change), or None."""
    for path in hook_files(command):
        why = _why_unsafe(path)
        if why is not None:
            return _refusal("hook program", path, why)
    return None


def hook_files(command: tuple[str, ...]) -> list[Path]:
    """The files a hook command runs: its program as PATH finds it, and for an interpreter
    (a shell, python, perl, ...) the files its arguments name. A program not found is left
    to fail when the hook runs, with its own error."""
    found = shutil.which(command[0])
    if found is None:
        return []
    files = [Path(os.path.abspath(found))]
    if INTERPRETER.fullmatch(Path(command[0]).name):
        for argument in command[1:]:
            if argument.startswith("-"):
                continue
            located = shutil.which(argument) if command[0].endswith("env") else None
            path = Path(located or argument)
            if path.is_file():
                files.append(Path(os.path.abspath(path)))
    return files


def _why_unsafe(path: Path) -> str | None:
    """Who else may change `path`: the file it finally names, and where it is a symbolic
    link (/usr/bin/python3), the folder holding the link, which decides where it points."""
    path = Path(os.path.abspath(path))
    target = Path(os.path.realpath(path))
    try:
        why = may_be_replaced_by_others(target, os.geteuid())
        if why is None and target != path:
            why = may_be_replaced_by_others(Path(os.path.realpath(path.parent)), os.geteuid())
        return why
    except OSError as error:
        return f"it cannot be looked at ({error.strerror})"


def _refusal(what: str, path: Path, why: str) -> str:
    user = user_name(os.geteuid())
    trusted = "root" if user == "root" else f"{user} and root"
    return (
        f"{what} {path} may be changed by others than {trusted} ({why}); ocrd "
        f"refuses it, as sshd's StrictModes does: make it and the folders above it writable "
        f"by {user} or root alone (chown {user} {path}; chmod go-w {path} and its folder; "
        f"setfacl -b for an ACL)"
    )
