"""What people dropped is untrusted: how ocrd looks at it, opens it and names it.

A shared inbox holds whatever its users and their clients made: names in any byte
encoding, symbolic links to files only ocrd may read, FIFOs and sockets, folders ocrd
cannot write. So every look and every open here is about the entry itself, never what it
points to: no symbolic link is followed (not even for a folder on the way to a file), only
regular files are opened, and opening never blocks (a FIFO opened for reading waits for a
writer forever). Names are shown with escapes where they are not valid UTF-8, so that a
report, a page or a log line can always be written.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO


class NotRegularFile(OSError):
    """The entry is a symbolic link, a folder, a FIFO, a socket or a device: ocrd reads only
    regular files."""


@dataclass(frozen=True)
class Identity:
    """Which file a path named when it was looked at: the same again means the same file."""

    device: int
    inode: int

    @classmethod
    def of(cls, info: os.stat_result) -> Identity:
        return cls(info.st_dev, info.st_ino)


# Characters a terminal or a text file would act on: C0 and C1 controls, DEL, and the
# bidirectional overrides that make a name read backwards.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """`text` as it can be shown anywhere: bytes that are not UTF-8 (decoded by Python as
    lone surrogates) written as `\\xNN`, and control characters (a newline, a terminal's
    escape sequences, direction overrides) as `\\xNN` or `\\uNNNN`, so a name can neither
    break JSON, HTML, the environment or a report, nor forge a line or drive a terminal."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _CONTROLS.sub(lambda match: match.group().encode("unicode_escape").decode(), text)


def kind_of(mode: int) -> str:
    """What an entry is, in words, for log lines and reasons."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "a regular file"


def link_on_the_way(root: Path, path: Path) -> Path | None:
    """The first folder between `root` and `path` that is a symbolic link (or no folder at
    all), if any: a path through one leads outside what was dropped. Blocking."""
    relative = path.relative_to(root)
    current = root
    for part in relative.parts[:-1]:
        current = current / part
        if not stat.S_ISDIR(os.lstat(current).st_mode):
            return current
    return None


def open_folder_beneath(root: Path, folder: Path) -> int:
    """A descriptor of `folder`, reached from `root` one folder at a time without following
    any link below `root` (ELOOP as NotRegularFile, or FileNotFoundError): a folder swapped
    for a link at any moment is never entered. `root` itself is trusted (the inbox, a claim
    folder). Blocking; the caller closes it."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in folder.relative_to(root).parts:
            try:
                inner = os.open(part, _FOLDER_FLAGS, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise NotRegularFile(
                        error.errno, "a link on the way; not followed", str(folder)
                    ) from None
                raise
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


_FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_beneath(root: Path, path: Path) -> int:
    """`open_regular` for a file below `root`, reached without following any link on the
    way (a job folder's subfolder swapped for a link after it was listed)."""
    parent = open_folder_beneath(root, path.parent)
    try:
        return open_regular(Path(path.name), parent)
    finally:
        os.close(parent)


def open_input(path: Path, root: Path | None) -> int:
    """An input file: below `root` without following links on the way where given (a claim
    folder, whose job folders a person may still be working in), else `open_regular`."""
    return open_beneath(root, path) if root is not None else open_regular(path)


def open_regular(path: Path, folder: int | None = None) -> int:
    """A read-only descriptor of the regular file at `path` (in the folder descriptor
    `folder`, if given); NotRegularFile for anything else. The last component is not
    followed if it is a symbolic link (ELOOP), and a FIFO does not block the open.
    Blocking; the caller closes the descriptor."""
    try:
        fd = os.open(
            path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder
        )
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise NotRegularFile(errno.ELOOP, "a symbolic link; not followed", str(path)) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, f"{kind_of(info.st_mode)}, not a file", str(path))
    return fd


@contextmanager
def opened(path: Path, root: Path | None = None) -> Iterator[BinaryIO]:
    """The regular file at `path`, open for reading (see `open_regular`; below `root`
    without following links on the way, where given)."""
    handle = os.fdopen(open_input(path, root), "rb")
    with handle:
        yield handle


UNLISTABLE = "a folder ocrd's user may not list"


def regular_files(folder: Path) -> tuple[list[Path], list[tuple[Path, str]]]:
    """The regular files under `folder` (hidden folders not entered), and every other entry
    met with what it is: links are neither followed nor taken. Blocking."""
    files: list[Path] = []
    others: list[tuple[Path, str]] = []

    def unlistable(error: OSError) -> None:
        others.append((Path(error.filename or folder), UNLISTABLE))

    for root, folders, names in os.walk(folder, onerror=unlistable):  # no linked folders
        base = Path(root)
        for name in list(folders):
            if os.path.islink(base / name):
                others.append((base / name, "a symbolic link"))
        folders[:] = [n for n in folders if not n.startswith(".") and not os.path.islink(base / n)]
        for name in names:
            try:
                mode = os.lstat(base / name).st_mode
            except FileNotFoundError:  # removed while the folder was listed
                continue
            if stat.S_ISREG(mode):
                files.append(base / name)
            else:
                others.append((base / name, kind_of(mode)))
    return files, others
