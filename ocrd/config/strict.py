"""StrictModes, as sshd's: the configuration file, and the hook programs and scripts it
names, must be writable only by ocrd's user and root; so must the folders it loads models
from (ocrd/config/strict_models.py).

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
import shlex
import shutil
from pathlib import Path

from ocrd.config.loading import Config
from ocrd.config.strict_models import model_folder_problems
from ocrd.files.permissions import user_name, why_others_may_change

# Programs whose first file argument is the code they run: `python3 /srv/hooks/notify.py`
# runs notify.py, which counts as the hook's program as much as python3 does.
INTERPRETER = re.compile(
    r"(?:ba|da|z|k|mk|a|c|tc)?sh|fish|env|(?:python|perl|ruby|php|node|lua)[0-9.]*"
)
# Programs that run another program named in their arguments, found on PATH as they do:
# `nice /srv/hooks/notify.sh`, `timeout 60 notify`, `env -S 'sh /srv/notify.sh'`.
RUNNER = re.compile(
    r"env|nice|nohup|timeout|setsid|stdbuf|ionice|chrt|taskset|time|flock|xargs|sudo|doas"
    r"|runuser|setpriv|unshare|chroot|systemd-run|busybox"
)
# Shells and env take code or a command line in one argument (`sh -c '. /srv/x.sh'`,
# `env -S 'python3 /srv/x.py'`): its words are looked at as arguments too.
SPLITS_ARGUMENTS = re.compile(r"(?:ba|da|z|k|mk|a|c|tc)?sh|fish|env|busybox")


def strict_mode_problems(
    config_path: Path, config: Config, engine_kind: str | None = None
) -> list[str]:
    """A line for the configuration file, each hook file and each model folder (of the
    engine kind `ocrd run --engine` chose, or the configuration's) that others than ocrd's
    user and root may change, naming who and what to do."""
    problems = []
    why = why_others_may_change(config_path, os.geteuid())
    if why is not None:
        problems.append(_refusal("configuration file", config_path, why))
    for number, inbox in enumerate(config.inboxes):
        for event in ("on_done", "on_failed"):
            hook = getattr(inbox.hooks, event)
            if hook is None or hook.command is None:
                continue
            for path in hook_files(hook.command):
                why = why_others_may_change(path, os.geteuid())
                if why is not None:
                    what = f"hook program (inboxes[{number}].hooks.{event}.command)"
                    problems.append(_refusal(what, path, why))
    return problems + model_folder_problems(config.engine, engine_kind)


def checked_command(command: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """The hook command with its program as PATH finds it now, and why it must not run
    (or None). The command is run as returned: the program judged is the one run, even if
    a file of its name appears in a folder earlier on PATH in between."""
    found = shutil.which(command[0])
    resolved = (os.path.abspath(found), *command[1:]) if found is not None else command
    return resolved, hook_problem(resolved)


def hook_problem(command: tuple[str, ...]) -> str | None:
    """Why a hook command must not run now (a file of it others may change), or None."""
    for path in hook_files(command):
        why = why_others_may_change(path, os.geteuid())
        if why is not None:
            return _refusal("hook program", path, why)
    return None


def hook_files(command: tuple[str, ...]) -> list[Path]:
    """The files a hook command runs: its program as PATH finds it, and for an interpreter
    (a shell, python, perl, ...) or a runner (env, nice, timeout, ...) the files and
    programs its arguments name, the words of a shell's or env's one-line code included.
    A program not found is left to fail when the hook runs, with its own error."""
    found = shutil.which(command[0])
    if found is None:
        return []
    files = [Path(os.path.abspath(found))]
    name = Path(command[0]).name
    runs_code = INTERPRETER.fullmatch(name) or RUNNER.fullmatch(name)
    if not runs_code:
        return files
    arguments = _words(command[1:]) if SPLITS_ARGUMENTS.fullmatch(name) else list(command[1:])
    for argument in arguments:
        if argument.startswith("-") or "=" in argument.split("/")[0]:
            continue  # an option, or env's NAME=value
        # Both where PATH finds it (a runner's program) and the file it names (a script):
        # which of them runs depends on the program, so both are looked at.
        located = shutil.which(argument) if "/" not in argument else None
        for path in {Path(located) if located else Path(argument), Path(argument)}:
            if path.is_file():
                files.append(Path(os.path.abspath(path)))
    return files


def _words(arguments: tuple[str, ...]) -> list[str]:
    """The arguments, and the words of each: a shell's `-c` code, env's `-S` line or an
    option's value (`--split-string=...`)."""
    words = []
    for argument in arguments:
        words.append(argument)
        code = argument
        if argument.startswith("--"):
            code = argument.partition("=")[2]
        elif argument.startswith("-"):
            code = argument.partition("S")[2]  # env's -S'line'; a shell's options hold none
        try:
            split = shlex.split(code, comments=True)
        except ValueError:  # unbalanced quotes: its plain words are still looked at
            split = code.split()
        words.extend(word for word in split if word != argument)
    return words


def _refusal(what: str, path: Path, why: str) -> str:
    user = user_name(os.geteuid())
    trusted = "root" if user == "root" else f"{user} and root"
    return (
        f"{what} {path} may be changed by others than {trusted} ({why}); ocrd "
        f"refuses it, as sshd's StrictModes does: make it and the folders above it writable "
        f"by {user} or root alone (chown {user} {path}; chmod go-w {path} and its folder; "
        f"setfacl -b for an ACL)"
    )
