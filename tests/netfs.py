"""A FUSE mount that behaves like a network share (NFS) where ocrd must cope, for tests.

    python tests/netfs.py BACKING MOUNTPOINT [--lost-replies N] [--clock-offset SECONDS]
                          [--counts FILE]

The kernel here offers no NFS, so the tests of several daemons on one shared inbox mount
this instead: a passthrough to BACKING (hard links and inode numbers kept, as NFS keeps
them) that

- answers every Nth rename with "no such file" (ENOENT) after doing it, and every Nth hard
  link with "file exists" (EEXIST) after making it: what an NFS client reports when the
  server's reply to its first request was lost and it sent the request again;
- refuses renameat2's flags (EINVAL), as NFS does: no RENAME_NOREPLACE;
- keeps a file that is deleted while it is open as `.nfsXXXX` until it is closed (NFS's
  "silly rename");
- stamps file times by the server's clock, `--clock-offset` seconds away from the hosts';
- and, being a network filesystem to the kernel, tells inotify nothing of what is written
  to BACKING directly (by "another host").

`--counts FILE` receives, as JSON whenever they change, how many replies were "lost".
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import secrets
import threading
from pathlib import Path
from typing import Any

import mfusepy

NS = 1_000_000_000


class NetworkLikeFs(mfusepy.Operations):
    use_ns = True

    def __init__(self, backing: Path, lost_replies: int, clock_offset: float, counts: Path | None):
        self.backing = backing
        self.every = lost_replies
        self.offset_ns = round(clock_offset * NS)
        self.counts_file = counts
        self.mutex = threading.Lock()  # not `lock`: that is a FUSE operation's name
        self.renames = self.links = 0
        self.lost = {"rename": 0, "link": 0, "silly": 0}
        self.open_files: dict[int, tuple[int, int]] = {}  # fh -> (device, inode)
        self.silly: dict[tuple[int, int], str] = {}  # a deleted open file -> its .nfs name

    def _real(self, path: str) -> str:
        return str(self.backing / path.lstrip("/"))

    @staticmethod
    def _call(function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except OSError as error:
            raise mfusepy.FuseOSError(error.errno or errno.EIO) from None

    def _lose_reply(self, kind: str) -> bool:
        """Whether this request's reply is "lost" (the retry's answer is given instead)."""
        with self.mutex:
            if kind == "rename":
                self.renames += 1
                lose = self.every > 0 and self.renames % self.every == 0
            else:
                self.links += 1
                lose = self.every > 0 and self.links % self.every == 0
            if lose:
                self.lost[kind] += 1
                self._write_counts()
        return lose

    def _write_counts(self) -> None:
        if self.counts_file is not None:
            temporary = self.counts_file.with_suffix(".tmp")
            temporary.write_text(json.dumps(self.lost))
            os.replace(temporary, self.counts_file)

    # --- attributes: the server's clock ------------------------------------------------------

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        info = self._call(os.lstat, self._real(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino", "st_rdev")
        entry = {key: getattr(info, key) for key in keys}
        for key in ("st_atime", "st_mtime", "st_ctime"):
            entry[key] = getattr(info, key + "_ns") + self.offset_ns
        return entry

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:  # "now": the server's clock
            return self._call(os.utime, self._real(path)) or 0
        atime, mtime = (value - self.offset_ns for value in times)
        return self._call(lambda: os.utime(self._real(path), ns=(atime, mtime))) or 0

    # --- names ---------------------------------------------------------------------------

    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        """Names with their inode numbers (with use_ino an entry numbered 0 is skipped)."""

        def listed() -> list[tuple[str, dict[str, int], int]]:
            with os.scandir(self._real(path)) as entries:
                return [
                    (
                        e.name,
                        {"st_ino": e.inode(), "st_mode": e.stat(follow_symlinks=False).st_mode},
                        0,
                    )
                    for e in entries
                ]

        here = os.lstat(self._real(path))
        dots = [(name, {"st_ino": here.st_ino, "st_mode": here.st_mode}, 0) for name in (".", "..")]
        return dots + self._call(listed)

    def access(self, path: str, amode: int) -> int:
        self._call(os.lstat, self._real(path))
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        info = os.statvfs(self._real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files")
        return {key: getattr(info, key) for key in (*keys, "f_flag", "f_frsize", "f_namemax")}

    def mkdir(self, path: str, mode: int) -> int:
        return self._call(os.mkdir, self._real(path), mode) or 0

    def rmdir(self, path: str) -> int:
        return self._call(os.rmdir, self._real(path)) or 0

    def symlink(self, target: str, source: str) -> int:
        return self._call(os.symlink, source, self._real(target)) or 0

    def readlink(self, path: str) -> str:
        return str(self._call(os.readlink, self._real(path)))

    def rename(self, old: str, new: str) -> int:
        self._call(os.rename, self._real(old), self._real(new))
        if self._lose_reply("rename"):
            raise mfusepy.FuseOSError(errno.ENOENT)  # the retry found the source gone
        return 0

    def link(self, target: str, source: str) -> int:
        self._call(os.link, self._real(source), self._real(target))
        if self._lose_reply("link"):
            raise mfusepy.FuseOSError(errno.EEXIST)  # the retry found the link there
        return 0

    def unlink(self, path: str) -> int:
        real = self._real(path)
        info = self._call(os.lstat, real)
        key = (info.st_dev, info.st_ino)
        with self.mutex:
            still_open = key in self.open_files.values() and info.st_nlink == 1
            if still_open:  # as an NFS client does: keep it under a hidden name
                silly = os.path.join(os.path.dirname(real), f".nfs{secrets.token_hex(8)}")
                self.silly[key] = silly
                self.lost["silly"] += 1
                self._write_counts()
        if still_open:
            return self._call(os.rename, real, silly) or 0
        return self._call(os.unlink, real) or 0

    def chmod(self, path: str, mode: int) -> int:
        return self._call(os.chmod, self._real(path), mode) or 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        return self._call(os.lchown, self._real(path), uid, gid) or 0

    # --- contents ------------------------------------------------------------------------

    def _opened(self, fd: int) -> int:
        info = os.fstat(fd)
        with self.mutex:
            self.open_files[fd] = (info.st_dev, info.st_ino)
        return fd

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        fd = self._call(os.open, self._real(path), os.O_RDWR | os.O_CREAT, mode)
        return self._opened(fd)

    def open(self, path: str, flags: int) -> int:
        return self._opened(self._call(os.open, self._real(path), flags))

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return bytes(self._call(os.pread, fh, size, offset))

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return int(self._call(os.pwrite, fh, data, offset))

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        if fh is not None:
            return self._call(os.ftruncate, fh, length) or 0
        return self._call(os.truncate, self._real(path), length) or 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        return self._call(os.fsync, fh) or 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        with self.mutex:
            key = self.open_files.pop(fh, None)
            silly = None
            if key is not None and key not in self.open_files.values():
                silly = self.silly.pop(key, None)
        os.close(fh)
        if silly is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(silly)
        return 0


class NetworkFuse(mfusepy.FUSE):
    """mfusepy passes renameat2's flags nowhere (a RENAME_NOREPLACE would replace): refuse
    them as NFS does."""

    def rename_fuse_3(self, old: bytes, new: bytes, flags: int) -> int:
        if flags:
            raise mfusepy.FuseOSError(errno.EINVAL)
        return self.rename_fuse_2(old, new)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("backing", type=Path)
    parser.add_argument("mountpoint")
    parser.add_argument("--lost-replies", type=int, default=0, metavar="N")
    parser.add_argument("--clock-offset", type=float, default=0.0, metavar="SECONDS")
    parser.add_argument("--counts", type=Path)
    args = parser.parse_args()
    backing = args.backing.resolve()  # the mount may change its working folder
    operations = NetworkLikeFs(backing, args.lost_replies, args.clock_offset, args.counts)
    NetworkFuse(
        operations,
        args.mountpoint,
        foreground=True,
        use_ino=True,  # an NFS file keeps its identity (fileid) across renames
        hard_remove=True,  # deleting an open file is ours to handle (.nfsXXXX)
        entry_timeout=0,
        attr_timeout=0,
        negative_timeout=0,
        subtype="netfs",
    )


if __name__ == "__main__":
    main()
