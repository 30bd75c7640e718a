"""Moves that never replace: a rename refused where the target exists (renameat2's
RENAME_NOREPLACE, or a link and an unlink where that is missing), a second name for a
durable file, and a whole folder moved across filesystems."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import shutil
import stat
from pathlib import Path
from typing import Any

from ocrd.files.beneath import DIRECTORY, held
from ocrd.files.permissions import make_private
from ocrd.files.temporaries import temporary_path


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


RENAME_NOREPLACE = 1  # linux/fs.h


RENAME_NOREPLACE = 1  # linux/fs.h
AT_FDCWD = -100


@functools.cache
def _renameat2() -> Any:
    """glibc's renameat2, or None where the C library has none."""
    function = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if function is not None:
        function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
        function.argtypes += [ctypes.c_uint]
    return function


def identity(path: Path, folder: int | None = None) -> tuple[int, int] | None:
    """(device, inode) of what `path` (in the folder descriptor `folder`, if given) names,
    not following a link; None if nothing."""
    try:
        info = os.stat(path, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    return info.st_dev, info.st_ino


def _happened(before: tuple[int, int] | None, target: Path, folder: int | None = None) -> bool:
    """Whether `target` now names the file that was `before`: how a rename or link whose
    reply a network filesystem lost, and which its client sent again (answered "no such
    file" or "file exists" although it was done the first time), is told from one that
    did not happen."""
    return before is not None and identity(target, folder) == before


def rename_checked(source: Path, target: Path, target_dir: int | None = None) -> None:
    """`os.rename` (replacing `target`), recognising a rename that happened although its
    reply said "no such file" (see `_happened`)."""
    before = identity(source)
    try:
        os.rename(source, target, dst_dir_fd=target_dir)
    except FileNotFoundError:
        if not _happened(before, target, target_dir):
            raise


def _rename_noreplace(source: Path, target: Path, target_dir: int = AT_FDCWD) -> bool:
    """Rename without ever replacing (renameat2 RENAME_NOREPLACE); False where the
    filesystem or the C library cannot (NFS, some FUSE mounts), so the caller falls back."""
    function = _renameat2()
    if function is None:
        return False
    flags = RENAME_NOREPLACE
    result = function(AT_FDCWD, os.fsencode(source), target_dir, os.fsencode(target), flags)
    if result == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(source), None, str(target))


def rename_new(source: Path, target: Path, target_dir: int | None = None) -> None:
    """Give `source` the name `target` (in the folder descriptor `target_dir`, if given)
    only if `target` does not exist (never overwrites).

    An atomic rename that refuses to replace where the filesystem has one; otherwise a hard
    link and an unlink (atomic on NFS too); where links are refused as well (SMB and FAT
    mounts; another user's file under fs.protected_hardlinks on a filesystem without
    renameat2), check, then rename. A rename or link that happened although its reply said
    otherwise (a network filesystem's retried request) counts as done."""
    before = identity(source)
    try:
        if _rename_noreplace(source, target, AT_FDCWD if target_dir is None else target_dir):
            return
    except FileNotFoundError:
        if _happened(before, target, target_dir):
            return
        raise
    try:
        os.link(source, target, dst_dir_fd=target_dir, follow_symlinks=False)
    except FileExistsError:
        if not _happened(before, target, target_dir):
            raise
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        if os.path.lexists(target) if target_dir is None else _exists_in(target_dir, target):
            raise FileExistsError(errno.EEXIST, "file exists", str(target)) from None
        rename_checked(source, target, target_dir)
        return
    with contextlib.suppress(FileNotFoundError):  # a retried unlink that was done already
        os.unlink(source)


def _exists_in(folder: int, name: Path) -> bool:
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def link_or_copy(source: Path, target: Path) -> None:
    """Give a durable file (fsynced by whoever wrote it) a second name; a copy, fsynced,
    where the two folders are on different filesystems or links are refused. A link whose
    reply said "file exists" although it was made (a retried request) counts as done."""
    before = identity(source)
    try:
        os.link(source, target)
    except FileExistsError:
        if not _happened(before, target):
            raise
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        temporary = temporary_path(target.parent)
        try:
            with source.open("rb") as data, temporary.open("xb") as copy:
                shutil.copyfileobj(data, copy)
                copy.flush()
                os.fsync(copy.fileno())
            rename_new(temporary, target)  # never through a link planted at the name
        finally:
            temporary.unlink(missing_ok=True)


def _copy_folder_across(source: Path, target: Path) -> None:
    """A folder to another filesystem: copied whole under a temporary name and made
    durable, renamed into place, and only then removed at the source."""
    temporary = temporary_path(target.parent)
    os.mkdir(temporary, 0o700)
    try:
        # Copied into the folder held open, made ours alone, so nobody who may write the
        # target's folder can swap a link in on the way. Links arrive as the links they
        # are, never as what they point to; FIFOs, sockets and devices (left out of the
        # document) are not data and stay behind.
        fd = os.open(temporary, DIRECTORY)
        try:
            make_private(fd, 0o700)
            inside = held(fd, temporary)
            shutil.copytree(source, inside, symlinks=True, ignore=_not_data, dirs_exist_ok=True)
            _fsync_tree(inside)
        finally:
            os.close(fd)
        if target.exists():
            raise FileExistsError(errno.EEXIST, "file exists", str(target))
        rename_checked(temporary, target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    fsync_dir(target.parent)
    shutil.rmtree(source)
    fsync_dir(source.parent)


def _fsync_tree(top: Path) -> None:
    for root, _, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                with open(path, "rb") as handle:
                    os.fsync(handle.fileno())
        fsync_dir(Path(root))


def _not_data(folder: str, names: list[str]) -> set[str]:
    """The entries of `folder` that are neither files, folders nor links."""
    kept = (stat.S_ISREG, stat.S_ISDIR, stat.S_ISLNK)
    return {
        name
        for name in names
        if not any(kind(os.lstat(os.path.join(folder, name)).st_mode) for kind in kept)
    }


def move_new(source: Path, target: Path, sync_source: bool = True) -> None:
    """Move `source` (a file or a folder) to `target`, which must not exist; across
    filesystems too.

    Across filesystems the copy is made durable before the source is removed, so a crash
    leaves at worst two copies, never none. Without `sync_source` the source's folder is
    not synced: for a caller whose recovery removes a source found again at both places.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        rename_new(source, target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        if source.is_dir():
            _copy_folder_across(source, target)
            return
        temporary = temporary_path(target.parent)
        try:
            shutil.copy2(source, temporary)
            with temporary.open("rb") as handle:
                os.fsync(handle.fileno())
            rename_new(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
        fsync_dir(target.parent)
        source.unlink()
        if sync_source:
            fsync_dir(source.parent)
        return
    fsync_dir(target.parent)
    if sync_source:
        fsync_dir(source.parent)
