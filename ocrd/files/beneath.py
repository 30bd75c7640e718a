"""Files beneath a root folder, never through a link: each folder on the way is opened
without following a symbolic link, and only regular files are opened, without waiting on a
FIFO. Everything under an inbox or an outbox may have been made by people on a share."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from ocrd.files.dropped import NotRegularFile, kind_of

DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
OPEN_FOLDERS = Path("/proc/self/fd")  # a descriptor's path: the very folder it holds open


@functools.cache
def descriptors_named() -> bool:
    """Whether /proc names this process's open descriptors (not in a chroot without
    /proc): asked once, not at every write."""
    return OPEN_FOLDERS.is_dir()


def not_followed(name: str) -> NotRegularFile:
    return NotRegularFile(errno.ELOOP, "a symbolic link; not followed", name)


def plain_part(part: str) -> bool:
    return part not in ("", ".", "..") and "/" not in part and "\0" not in part


@contextlib.contextmanager
def folder_beneath(root: Path, parts: Sequence[str], make: bool = False) -> Iterator[int]:
    """A descriptor of the folder `root/parts...`, each part opened without following a
    link (`root` itself is the configuration's), and made where it is missing if `make`.
    FileNotFoundError, NotADirectoryError or NotRegularFile (a link on the way, naming the
    link) where there is no such folder."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, part in enumerate(parts):
            if not plain_part(part):
                raise FileNotFoundError(errno.ENOENT, "not a plain name", part)
            if make:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            try:
                inner = os.open(part, DIRECTORY, dir_fd=fd)
            except OSError as error:
                if error.errno == errno.ELOOP:
                    raise not_followed(str(root.joinpath(*parts[: depth + 1]))) from None
                raise
            os.close(fd)
            fd = inner
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def beneath(root: Path, path: Path, make: bool = True) -> Iterator[Path]:
    """`path` (below `root`) as a path whose folder is held open: its folders below `root`
    were opened without following a link (and made where missing, with `make`), so whatever is done
    through the path it yields happens in that very folder. An OSError raised inside names
    the folder as configured, not the descriptor. ValueError where `path` is not below
    `root`; NotRegularFile (ELOOP) where a link is on the way."""
    folder = path.parent
    parts = folder.relative_to(root).parts
    if not descriptors_named():  # no /proc (a chroot): the plain path, checked once
        with folder_beneath(root, parts, make):
            yield path
        return
    with folder_beneath(root, parts, make) as fd:
        here = OPEN_FOLDERS / str(fd)
        try:
            yield here / path.name
        except OSError as error:
            for attribute in ("filename", "filename2"):
                named = getattr(error, attribute)
                if isinstance(named, str) and named.startswith(str(here)):
                    setattr(error, attribute, str(folder) + named[len(str(here)) :])
            raise


@contextlib.contextmanager
def beneath_one_of(roots: Sequence[Path], path: Path, make: bool = True) -> Iterator[Path]:
    """`path` held as `beneath` does, below the one of `roots` it lies in (the deepest);
    `path` itself where it lies in none."""
    inside = [root for root in roots if path.parent.is_relative_to(root)]
    if not inside:
        yield path
        return
    with beneath(max(inside, key=lambda root: len(root.parts)), path, make) as held_path:
        yield held_path


@contextlib.contextmanager
def held_folder(folder: Path) -> Iterator[Path]:
    """The folder `folder` (one ocrd just made, where others may write) held open, never a
    link swapped in at its name: a path naming that very folder."""
    parent = os.open(folder.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fd = os.open(folder.name, DIRECTORY, dir_fd=parent)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise not_followed(str(folder)) from None
        raise
    finally:
        os.close(parent)
    try:
        yield held(fd, folder)
    finally:
        os.close(fd)


def held(fd: int, path: Path) -> Path:
    """A path naming the folder open as `fd` (found at `path`) itself; `path` where there
    is no /proc to name it by."""
    return OPEN_FOLDERS / str(fd) if descriptors_named() else path


def open_beneath(root: Path, parts: Sequence[str]) -> int:
    """A read-only descriptor of the regular file `root/parts...`: no link followed on the
    way or at the end, no FIFO waited on. Blocking; the caller closes it."""
    *folders, leaf = parts
    if not plain_part(leaf):
        raise FileNotFoundError(errno.ENOENT, "not a plain name", leaf)
    with folder_beneath(root, folders) as parent:
        try:
            fd = os.open(
                leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent
            )
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
