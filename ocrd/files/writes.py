"""Durable writes: a temporary file fsynced, then renamed into place, so that a reader sees no
file or the whole file."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from ocrd.files.moves import fsync_dir, rename_checked, rename_new
from ocrd.files.temporaries import temporary_path


def _durable_temporary(
    folder: Path, data: bytes, make_folder: bool = True, mode: int = 0o666
) -> Path:
    if make_folder:
        folder.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(folder)
    # O_EXCL: never through a link planted at its name.
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
    except BaseException:
        temporary.unlink(missing_ok=True)  # a full disk must not fill up further
        raise
    finally:
        os.close(fd)
    return temporary


def write_scratch_file(path: Path, write: Callable[[BinaryIO], None]) -> bool:
    """`path` made new, readable by ocrd alone (never through a link planted at its name),
    and filled by `write`; False, with nothing left behind, where that failed (a full
    tmpfs): the caller keeps the data in memory instead."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        with open(fd, "wb") as out:
            write(out)
    except OSError:
        path.unlink(missing_ok=True)
        return False
    return True


def write_new_file(target: Path, data: bytes) -> None:
    """Write `target` durably: temporary file, fsync, then link into place.

    A reader sees either no file or the whole file. Raises FileExistsError if `target` exists.
    """
    temporary = _durable_temporary(target.parent, data)
    try:
        rename_new(temporary, target)  # which leaves no temporary where it succeeds
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)


def json_bytes(value: Any, indent: int | None = None) -> bytes:
    """JSON as UTF-8, readable letters kept; the bytes of a name that are not UTF-8 written
    as `\\udcNN` escapes (valid JSON that reads back to the same name)."""
    text = json.dumps(value, indent=indent, ensure_ascii=False)
    return text.encode("utf-8", "backslashreplace")


def replace_file(
    target: Path,
    data: bytes,
    make_folder: bool = True,
    sync_folder: bool = True,
    mode: int = 0o666,
) -> None:
    """Atomically replace `target` (for ocrd's own state files, which it may overwrite).
    Without `make_folder` a folder that is gone stays gone (FileNotFoundError): a claim's
    state is never written into a claim folder that has been moved away. Without
    `sync_folder` the new content is durable but its name may not be yet: after a power
    cut the file may be the one it replaced, for the caller to accept or to make durable
    by a folder sync of its own that follows. `mode`: as for `os.open` (the umask applies)."""
    temporary = _durable_temporary(target.parent, data, make_folder, mode)
    try:
        rename_checked(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)  # a full disk must not fill up further
        raise
    if sync_folder:
        fsync_dir(target.parent)
