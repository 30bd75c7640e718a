"""A FUSE mount with the naming rules of an SMB share or a FAT volume, for tests.

    python tests/smbfs.py BACKING_FOLDER MOUNTPOINT     # runs until unmounted

This machine's kernel has no vfat, so tests that need a target refusing names mount this
instead: a passthrough to BACKING_FOLDER whose kernel mount answers EINVAL for names with
`< > : " \\ | ? *`, control characters or a trailing dot or space (what Windows, Samba and
vfat refuse), and EPERM for hard and symbolic links (FAT has none). Everything else is
passed through.
"""

from __future__ import annotations

import errno
import os
import re
import sys
from pathlib import Path

import mfusepy

_REFUSED = re.compile(r'[<>:"\\|?*\x00-\x1f]|[ .]$')


class SmbLikeFs(mfusepy.Operations):
    use_ns = True

    def __init__(self, backing: Path) -> None:
        self.backing = backing

    def _real(self, path: str) -> str:
        return str(self.backing / path.lstrip("/"))

    @staticmethod
    def _check_name(path: str) -> None:
        if any(_REFUSED.search(part) for part in path.split("/") if part):
            raise mfusepy.FuseOSError(errno.EINVAL)

    @staticmethod
    def _call(function, *args):
        try:
            return function(*args)
        except OSError as error:
            raise mfusepy.FuseOSError(error.errno or errno.EIO) from None

    def getattr(self, path: str, fh: int | None = None) -> dict:
        info = self._call(os.lstat, self._real(path))
        keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size", "st_ino")
        entry = {key: getattr(info, key) for key in keys}
        for key in ("st_atime", "st_mtime", "st_ctime"):
            entry[key] = getattr(info, key + "_ns")
        return entry

    def readdir(self, path: str, fh: int):
        return [".", "..", *self._call(os.listdir, self._real(path))]

    def access(self, path: str, amode: int) -> int:
        self._call(os.lstat, self._real(path))
        return 0

    def statfs(self, path: str) -> dict:
        info = os.statvfs(self._real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files")
        return {key: getattr(info, key) for key in (*keys, "f_flag", "f_frsize", "f_namemax")}

    def mkdir(self, path: str, mode: int) -> int:
        self._check_name(path)
        return self._call(os.mkdir, self._real(path), mode) or 0

    def rmdir(self, path: str) -> int:
        return self._call(os.rmdir, self._real(path)) or 0

    def create(self, path: str, mode: int, fi=None) -> int:
        self._check_name(path)
        return self._call(os.open, self._real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def open(self, path: str, flags: int) -> int:
        return self._call(os.open, self._real(path), flags)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return self._call(os.pread, fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return self._call(os.pwrite, fh, data, offset)

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        return self._call(os.truncate, self._real(path), length) or 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        return self._call(os.fsync, fh) or 0

    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        return 0

    def release(self, path: str, fh: int) -> int:
        return self._call(os.close, fh) or 0

    def unlink(self, path: str) -> int:
        return self._call(os.unlink, self._real(path)) or 0

    def rename(self, old: str, new: str) -> int:
        self._check_name(new)
        return self._call(os.rename, self._real(old), self._real(new)) or 0

    def link(self, target: str, source: str) -> int:
        raise mfusepy.FuseOSError(errno.EPERM)  # FAT has no hard links

    def symlink(self, target: str, source: str) -> int:
        raise mfusepy.FuseOSError(errno.EPERM)  # nor symbolic ones (vfat's answer)

    def chmod(self, path: str, mode: int) -> int:
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        return 0

    def utimens(self, path: str, times=None) -> int:
        if times is None:
            return self._call(os.utime, self._real(path)) or 0
        return self._call(lambda: os.utime(self._real(path), ns=times)) or 0


if __name__ == "__main__":
    backing, mountpoint = Path(sys.argv[1]), sys.argv[2]
    mfusepy.FUSE(SmbLikeFs(backing), mountpoint, foreground=True, nothreads=True)
