"""Files beneath a root folder, never through a link: each folder on the way is opened
without following a symbolic link, and only regular files are opened, without waiting on a
FIFO. Everything under an inbox or an outbox may have been made by people on a share."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from ocrd.files.dropped import NotRegularFile, kind_of

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def not_followed(name: str) -> NotRegularFile:
    return NotRegularFile(errno.ELOOP, "a symbolic link; not followed", name)


def plain_part(part: str) -> bool:
    return part not in ("", ".", "..") and "/" not in part and "\0" not in part


@contextlib.contextmanager
def folder_beneath(root: Path, parts: Sequence[str]) -> Iterator[int]:
    """A descriptor of the folder `root/parts...`, each part opened without following a
    link (`root` itself is the configuration's). FileNotFoundError, NotADirectoryError or
    NotRegularFile (a link on the way) where there is no such folder."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            if not plain_part(part):
                raise FileNotFoundError(errno.ENOENT, "not a plain name", part)
            try:
                inner = os.open(part, DIRECTORY, dir_fd=fd)
            except OSError as error:
                if error.errno == errno.ELOOP:
                    raise not_followed(part) from None
                raise
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


def open_beneath(root: Path, parts: Sequence[str]) -> int:
    """A read-only descriptor of the regular file `root/parts...`: no link followed on the
    way or at the end, no FIFO waited on. Blocking; the caller closes it."""
    *folders, leaf = parts
    if not plain_part(leaf):
        raise FileNotFoundError(errno.ENOENT, "not a plain name", leaf)
    with folder_beneath(root, folders) as parent:
        try:
            fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=parent)  # fmt: skip
        except OSError as error:
            if error.errno == errno.ELOOP:
                raise not_followed(leaf) from None
            raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, f"{kind_of(mode)}, not a file", leaf)
    return fd


def entries_beneath(root: Path, parts: Sequence[str]) -> list[tuple[str, os.stat_result]]:
    """The entries of the folder `root/parts...` with what each is (not followed); [] where
    there is no such folder."""
    try:
        with folder_beneath(root, parts) as fd:
            found = []
            for name in os.listdir(fd):
                with contextlib.suppress(FileNotFoundError):
                    found.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
            return found
    except (FileNotFoundError, NotADirectoryError, NotRegularFile):
        return []


def visible_files(root: Path, parts: Sequence[str]) -> list[tuple[str, os.stat_result]]:
    return [
        (name, info)
        for name, info in entries_beneath(root, parts)
        if not name.startswith(".") and stat.S_ISREG(info.st_mode)
    ]


