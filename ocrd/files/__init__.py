"""Durable file operations: nothing half-written is ever visible, nothing is ever overwritten."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ocrd.files.beneath import DIRECTORY, held
from ocrd.files.permissions import make_private

# Short, recognisable temporary names: a long original name must not make them too long,
# and files left by a killed run can be told apart from users' files and swept away. They
# name their writer (its instance), since daemons on several hosts share the outbox and
# each may sweep only its own (and those of one whose claims it took over).
_LEGACY_TEMPORARY = re.compile(r"^\.ocrd-\d+-[0-9a-f]{8}\.tmp$")  # an older ocrd's


def writer() -> str:
    """Who writes this process's temporaries: its instance name (`OCRD_INSTANCE`, or the
    host name; see `ocrd/intake/instances.py`), kept to safe characters."""
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


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def numbered(desired: Path, number: int) -> Path:
    """`name.ext` for 1, `name-2.ext` for 2, ...; a very long stem is shortened (the same way
    for every extension, so an original and its Markdown keep matching names)."""
    stem, suffix = _split_name(desired.name)
    tail = "" if number == 1 else f"-{number}"
    encoded = os.fsencode(stem)  # the name's own bytes, valid UTF-8 or not
    if len(encoded) + len(tail) > MAX_STEM_BYTES:
        stem = os.fsdecode(_cut_bytes(encoded, MAX_STEM_BYTES - len(tail)))
    return desired.with_name(f"{stem}{tail}{suffix}")


def _cut_bytes(encoded: bytes, limit: int) -> bytes:
    """At most `limit` bytes of a name, not ending inside a UTF-8 character."""
    cut = encoded[:limit]
    for back in range(min(3, len(cut))):
        lead = cut[len(cut) - 1 - back]
        if lead < 0x80:
            break
        if lead >= 0xC0:  # the start of a character: keep it only if it is whole
            width = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            if back + 1 < width:
                cut = cut[: len(cut) - 1 - back]
            break
    return cut


def candidate_names(desired: Path) -> Iterator[Path]:
    """`name.ext`, then `name-2.ext`, `name-3.ext`, ... for a name that is free."""
    for number in range(1, 1_000_000):
        yield numbered(desired, number)


MAX_STEM_BYTES = 200  # leaves room under NAME_MAX (255) for any extension or companion


def _split_name(name: str) -> tuple[str, str]:
    for compound in (".error.json",):
        if name.endswith(compound) and len(name) > len(compound):
            return name[: -len(compound)], compound
    stem, dot, suffix = name.rpartition(".")
    return (stem, dot + suffix) if stem else (name, "")


def free_name(desired: Path, *companions: str) -> Path:
    """The first candidate that exists neither itself nor with any of the companion suffixes,
    and that no planner holds (see `reserve`).

    Companions keep related files paired: a failed original `scan.pdf` and its report
    `scan.error.json` get the same number when either name is taken.
    """
    for candidate in candidate_names(desired):
        stem = _split_name(candidate.name)[0]
        related = [candidate.with_name(stem + suffix) for suffix in companions]
        taken = candidate.exists() or reservation_of(candidate).exists()
        if not taken and not any(path.exists() for path in related):
            return candidate
    raise FileExistsError(f"no free name for {desired}")


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


RESERVED_SUFFIX = ".ocrd-reserved"


def reservation_of(target: Path) -> Path:
    """The hidden marker that holds the name `target` for a planned settlement."""
    return target.with_name(f".{target.name}{RESERVED_SUFFIX}")


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
        name for name in names
        if not any(kind(os.lstat(os.path.join(folder, name)).st_mode) for kind in kept)
    }  # fmt: skip


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
