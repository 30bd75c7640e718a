"""Durable file operations: nothing half-written is ever visible, nothing is ever overwritten."""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

# Short, recognisable temporary names: a long original name must not make them too long,
# and files left by a killed run can be told apart from users' files and swept away.
_TEMPORARY = re.compile(r"^\.ocrd-\d+-[0-9a-f]{8}\.tmp$")


def temporary_path(folder: Path) -> Path:
    return folder / f".ocrd-{os.getpid()}-{secrets.token_hex(4)}.tmp"


def remove_stale_temporaries(root: Path) -> int:
    """Remove ocrd's temporary files and folders under `root` left by a killed run."""
    removed = 0
    for folder, folders, files in os.walk(root):
        for name in [*files, *folders]:
            if _TEMPORARY.match(name):
                path = Path(folder) / name
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
                removed += 1
        folders[:] = [name for name in folders if not _TEMPORARY.match(name)]
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
    encoded = stem.encode()
    if len(encoded) + len(tail) > MAX_STEM_BYTES:
        stem = encoded[: MAX_STEM_BYTES - len(tail)].decode(errors="ignore")
    return desired.with_name(f"{stem}{tail}{suffix}")


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
    """The first candidate that exists neither itself nor with any of the companion suffixes.

    Companions keep related files paired: a failed original `scan.pdf` and its report
    `scan.error.json` get the same number when either name is taken.
    """
    for candidate in candidate_names(desired):
        stem = _split_name(candidate.name)[0]
        related = [candidate.with_name(stem + suffix) for suffix in companions]
        if not candidate.exists() and not any(path.exists() for path in related):
            return candidate
    raise FileExistsError(f"no free name for {desired}")


def _link_new(source: Path, target: Path) -> None:
    """Give `source` the name `target` only if `target` does not exist (never overwrites)."""
    try:
        os.link(source, target)
    except OSError as error:
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        # Filesystems without hard links (some SMB and FAT mounts): check, then rename.
        if target.exists():
            raise FileExistsError(errno.EEXIST, "file exists", str(target)) from None
        os.rename(source, target)
        return
    os.unlink(source)


def _durable_temporary(folder: Path, data: bytes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(folder)
    try:
        with temporary.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        temporary.unlink(missing_ok=True)  # a full disk must not fill up further
        raise
    return temporary


def link_or_copy(source: Path, target: Path) -> None:
    """Give a durable file (fsynced by whoever wrote it) a second name; a copy, fsynced,
    where the two folders are on different filesystems or links are refused."""
    try:
        os.link(source, target)
    except OSError as error:
        if error.errno not in (errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
        shutil.copyfile(source, target)
        with target.open("rb") as handle:
            os.fsync(handle.fileno())


def write_new_file(target: Path, data: bytes) -> None:
    """Write `target` durably: temporary file, fsync, then link into place.

    A reader sees either no file or the whole file. Raises FileExistsError if `target` exists.
    """
    temporary = _durable_temporary(target.parent, data)
    try:
        _link_new(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)
    fsync_dir(target.parent)


def replace_file(target: Path, data: bytes) -> None:
    """Atomically replace `target` (for ocrd's own state files, which it may overwrite)."""
    os.replace(_durable_temporary(target.parent, data), target)
    fsync_dir(target.parent)


def _copy_folder_across(source: Path, target: Path) -> None:
    """A folder to another filesystem: copied whole under a temporary name and made
    durable, renamed into place, and only then removed at the source."""
    temporary = temporary_path(target.parent)
    try:
        shutil.copytree(source, temporary)
        for root, _, files in os.walk(temporary):
            for name in files:
                with open(os.path.join(root, name), "rb") as handle:
                    os.fsync(handle.fileno())
            fsync_dir(Path(root))
        if target.exists():
            raise FileExistsError(errno.EEXIST, "file exists", str(target))
        os.rename(temporary, target)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    fsync_dir(target.parent)
    shutil.rmtree(source)
    fsync_dir(source.parent)


def move_new(source: Path, target: Path) -> None:
    """Move `source` (a file or a folder) to `target`, which must not exist; across
    filesystems too.

    Across filesystems the copy is made durable before the source is removed, so a crash
    leaves at worst two copies, never none.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        _link_new(source, target)
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
            _link_new(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
        fsync_dir(target.parent)
        source.unlink()
        fsync_dir(source.parent)
        return
    fsync_dir(target.parent)
    fsync_dir(source.parent)
