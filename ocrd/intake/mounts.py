"""Which filesystem an inbox lies on, and so whether it must be polled: on a network
filesystem inotify reports only what this machine did, never a file another machine (a
scanner, a person's PC, another ocrd) wrote to the share.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ocrd.config import InboxConfig

# Filesystems whose files other machines write: inotify on this one sees none of that.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs",
        "nfs4",
        "cifs",
        "smb3",
        "smbfs",
        "ceph",
        "glusterfs",
        "lustre",
        "gpfs",
        "beegfs",
        "9p",
        "afs",
        "ocfs2",
        "gfs2",
        "davfs",
        "fuse",
    }
)


def _unescape_mount_path(field: str) -> str:
    """A path field of /proc/self/mountinfo, whose spaces and such are octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def filesystem_of(path: Path, mountinfo: str | None = None) -> str | None:
    """The filesystem type `path` lies on (`nfs4`, `fuse.sshfs`, `ext4`), from the mount
    table; None where there is none to read."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) < 5 or not rest:
            continue
        point = _unescape_mount_path(parts[4])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, rest.split()[0]
    return kind


def is_network_filesystem(kind: str | None) -> bool:
    """Whether files on a filesystem of this type may be written by other machines: the
    network filesystems, and FUSE ones (sshfs, rclone, s3fs) other than a local disk's."""
    if kind is None:
        return False
    return kind in NETWORK_FILESYSTEMS or (kind.startswith("fuse.") and kind != "fuseblk")


def polling_of(inbox: InboxConfig) -> tuple[bool, str]:
    """Whether to poll `inbox`, and why."""
    if inbox.polling != "auto":
        return inbox.polling, "as configured"
    kind = filesystem_of(inbox.path)
    if is_network_filesystem(kind):
        return True, f"the inbox is on {kind}, where inotify does not see what other hosts write"
    return False, f"the inbox is on {kind or 'a local filesystem'}"
