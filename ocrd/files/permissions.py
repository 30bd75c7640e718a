"""Who else may write a folder or file: its mode bits and its POSIX ACLs, read as the kernel
applies them. ocrd's own places (the work area, its leases, an upload until it is claimed)
must be its user's alone, whatever a shared folder's default ACL hands down to what is made
in it; `make_private` takes such inherited rights away, and `others_may_write` tells where
someone else could still write.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

ACCESS_ACL = "system.posix_acl_access"
DEFAULT_ACL = "system.posix_acl_default"
# The kernel's xattr form of an ACL (linux/posix_acl_xattr.h): a version, then entries.
_HEADER = struct.Struct("<I")
_ENTRY = struct.Struct("<HHI")
USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
WRITE = 0o2
MAX_LINKS = 40  # symbolic links followed on the way to a file, as the kernel does (ELOOP)
# Filesystems without ACLs, and files without an ACL of the kind asked for.
_NO_ACL = frozenset({errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS})


@dataclass(frozen=True)
class AclEntry:
    tag: int
    permissions: int  # rwx as 4, 2, 1
    id: int  # the user or group of a named entry


def read_acl(where: int | Path, name: str = ACCESS_ACL) -> list[AclEntry]:
    """The entries of an ACL (the access ACL, or a folder's default ACL); [] where there is
    none (a plain mode) or the filesystem has none. `where` is a path (not followed) or an
    open descriptor."""
    try:
        if isinstance(where, int):
            data = os.getxattr(where, name)
        else:
            data = os.getxattr(where, name, follow_symlinks=False)
    except OSError as error:
        if error.errno in _NO_ACL:
            return []
        raise
    if len(data) < _HEADER.size:
        return []
    entries = data[_HEADER.size :]
    count = len(entries) // _ENTRY.size
    return [AclEntry(*_ENTRY.unpack_from(entries, i * _ENTRY.size)) for i in range(count)]


def make_private(fd: int, mode: int) -> None:
    """Give the file or folder open as `fd` (ocrd's own) exactly `mode`, with no ACL: what
    a shared parent's default ACL handed down (a group allowed to read and write) is gone."""
    for name in (ACCESS_ACL, DEFAULT_ACL):
        with contextlib.suppress(OSError):  # none there, or no ACLs on this filesystem
            os.removexattr(fd, name)
    os.fchmod(fd, mode)


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def others_may_write(path: Path, info: os.stat_result, uid: int) -> str | None:
    """Who other than user `uid` (and root) may write `path` (`info` its lstat), in words;
    None if nobody. A folder's default ACL counts too: what ocrd makes in it would be
    writable by those it names."""
    if info.st_uid not in (uid, 0):
        return f"it belongs to {user_name(info.st_uid)}"
    access = read_acl(path)
    if access:
        mask = next((e.permissions for e in access if e.tag == MASK), 0o7)
        for entry in access:
            if entry.tag == USER and entry.id != uid and entry.permissions & mask & WRITE:
                return f"its ACL lets user {user_name(entry.id)} write it"
            if entry.tag == GROUP_OBJ and _private_group(info.st_gid, uid):
                continue
            if entry.tag in (GROUP, GROUP_OBJ) and entry.permissions & mask & WRITE:
                return "its ACL lets a group write it"
    elif info.st_mode & stat.S_IWGRP and not _private_group(info.st_gid, uid):
        return "its group may write it"
    if info.st_mode & stat.S_IWOTH:
        return "everyone may write it"
    if stat.S_ISDIR(info.st_mode):
        for entry in read_acl(path, DEFAULT_ACL):
            named = entry.tag == GROUP or (entry.tag == USER and entry.id != uid)
            if named and entry.permissions & WRITE:
                return "its default ACL hands write permission down to what is made in it"
    return None


def may_be_replaced_by_others(path: Path, uid: int) -> str | None:
    """Why someone other than `uid` (and root) could write `path` or move it away, in words
    (the first folder on its way that allows it, as sshd's StrictModes judges a home
    folder); None if nobody could. A sticky folder's entries may be moved by their owner
    only, so a sticky folder owned by root or `uid` is safe to pass."""
    path = Path(os.path.realpath(path.parent), path.name)  # the folders it really lies in
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return f"{path} is a symbolic link"
    why = others_may_write(path, info, uid)
    if why is not None:
        return f"{path}: {why}"
    for folder in path.parents:
        above = os.stat(folder)
        why = others_may_write(folder, above, uid)
        sticky = above.st_mode & stat.S_ISVTX and above.st_uid in (uid, 0)
        if why is not None and not sticky:
            return f"{folder}, a folder on its way: {why} (and so move {path} away)"
    return None


def why_others_may_change(path: Path, uid: int) -> str | None:
    """Who other than user `uid` (and root) may change `path`, in words, or None: the file
    it finally names, and where symbolic links lead to it (/usr/bin/python3, a linked
    /etc/ocrd), each folder holding one of them, which decides where it points. A path
    that cannot be looked at (missing, a loop of links) is named so. A `..` is taken as the
    kernel takes it, after the link before it (never dropped with that link, as abspath
    would)."""
    path = Path(os.getcwd(), path)
    target = Path(os.path.realpath(path))
    try:
        why = may_be_replaced_by_others(target, uid)
        for folder in _folders_of_links(path):
            why = why or may_be_replaced_by_others(folder, uid)
        return why
    except OSError as error:
        return f"it cannot be looked at ({error.strerror})"


def _folders_of_links(path: Path) -> list[Path]:
    """The real folders that hold the symbolic links met on the way to `path`, each hop of
    a chain of them (a link in a folder others may write can be pointed elsewhere)."""
    folders: list[Path] = []
    current, parts = Path("/"), list(path.parts[1:])
    while parts:
        part = parts.pop(0)
        if part in (".", ""):
            continue
        if part == "..":
            current = current.parent
            continue
        step = current / part
        if not step.is_symlink():
            current = step
            continue
        if len(folders) >= MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
        folders.append(current)
        link = Path(os.readlink(step))
        parts = list(link.parts[1:] if link.is_absolute() else link.parts) + parts
        current = Path("/") if link.is_absolute() else current
    return folders


def _private_group(gid: int, uid: int) -> bool:
    """Whether group `gid` holds user `uid` alone (a user private group, as Debian and
    Ubuntu make one per user with umask 002): its write permission lets nobody else in,
    as Debian's sshd StrictModes also accepts. Never the root group, which is no one's
    private group."""
    if gid == 0:
        return False
    # Every line of /etc/group with this number counts: `groupadd -o` gives a second name
    # to the same group, and whoever is a member under that name is in it as well.
    named = [group for group in grp.getgrall() if group.gr_gid == gid]
    if not named:
        return False
    if any(name != user_name(uid) for group in named for name in group.gr_mem):
        return False
    return all(entry.pw_uid == uid for entry in pwd.getpwall() if entry.pw_gid == gid)
