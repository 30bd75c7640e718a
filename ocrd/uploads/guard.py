"""Keeping `<inbox>/uploads` ocrd's: whoever may write the inbox (its group, where the inbox
is not sticky) may rename the uploads folder and put a folder of their own in its place.
Nothing in it can be read or changed that way (it is ocrd's alone), but the uploads in it
would be lost to their tasks, and a folder of someone else's would stop uploads.

So ocrd holds each uploads folder open while it runs, and before each upload and in each
tidying round looks whether `<inbox>/uploads` is still that folder. Where it is not:

- what lies there now (someone else's folder, a link, a file) is set aside under
  `uploads.set-aside-<time>` in the inbox, and logged (`uploads.set_aside`);
- the folder held open, wherever it was renamed to in the inbox, is renamed back and
  logged (`uploads.moved_back`): its uploads wait again where they belong;
- where ocrd held none yet (it was stopped meanwhile), a folder of ocrd's in the inbox
  holding its uploads (with ocrd's records) is renamed back;
- where there is none to rename back, a new one is made.

Uploads moved away meanwhile are never converted from where they lie
(`ocrd/intake/claiming.py` refuses any file beside an upload's record outside
`uploads/<id>/`), and a task is found by ocrd's own record of it in the work area
(`ocrd/uploads/tasks.py`), so it stays pending, and is converted once it is back.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from pathlib import Path

from ocrd.config import UPLOADS_FOLDER
from ocrd.files.beneath import DIRECTORY, OPEN_FOLDERS, descriptors_named
from ocrd.files.dropped import printable
from ocrd.log import get_logger
from ocrd.uploads.receiving import RECORD, UPLOAD_ID

SET_ASIDE = "uploads.set-aside-"


class UploadsGuard:
    """The uploads folder of each inbox, held open, and put back where it belongs."""

    def __init__(self) -> None:
        self._held: dict[str, int] = {}  # inbox -> descriptor of its uploads folder
        self._lock = threading.Lock()  # uploads are begun in threads
        self.log = get_logger()

    def keep(self, inbox: Path) -> None:
        """Make `<inbox>/uploads` the uploads folder ocrd holds (or a new one of ocrd's),
        setting aside whatever else lies there. OSError where the inbox cannot be changed.
        Blocking."""
        with self._lock:
            root = os.open(inbox, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                self._keep(inbox, root)
            finally:
                os.close(root)

    def close(self) -> None:
        with self._lock:
            for fd in self._held.values():
                os.close(fd)
            self._held.clear()

    def _keep(self, inbox: Path, root: int) -> None:
        key = str(inbox)
        held = self._held.get(key)
        here = _lstat(root)
        if held is not None:
            mine = os.fstat(held)
            if here is not None and _same(here, mine):
                return
            if mine.st_nlink == 0:  # removed (only an empty folder can be)
                self._forget(key)
            else:
                self._move_back(inbox, root, held, here)
                return
        if here is not None and not _ours(here):
            self._set_aside(inbox, root, "it is not a folder of ocrd's user")
            here = None
        renamed = _renamed_uploads(root) if here is None else None
        if renamed is not None:  # renamed while no ocrd held it (it was stopped)
            os.rename(renamed, UPLOADS_FOLDER, src_dir_fd=root, dst_dir_fd=root)
            os.fsync(root)
            self._moved_back(inbox, inbox / renamed)
        elif here is None:
            with contextlib.suppress(FileExistsError):
                os.mkdir(UPLOADS_FOLDER, 0o700, dir_fd=root)
        with contextlib.suppress(OSError):  # what lies there now is uploads_folder's to judge
            fd = os.open(UPLOADS_FOLDER, DIRECTORY, dir_fd=root)
            if _ours(os.fstat(fd)):
                self._held[key] = fd
            else:
                os.close(fd)

    def _move_back(self, inbox: Path, root: int, held: int, here: os.stat_result | None) -> None:
        where = _path_of(held)
        if where is None or where.parent != inbox:
            self.log.error(
                "uploads.moved_away",
                inbox=str(inbox),
                now_at=printable(str(where)) if where else "unknown",
                action=f"a new {UPLOADS_FOLDER} folder is made; move the old one back to "
                f"{inbox / UPLOADS_FOLDER} for its uploads to be converted",
            )
            self._forget(str(inbox))
            self._keep(inbox, root)
            return
        if here is not None:
            self._set_aside(inbox, root, "the uploads folder was renamed and this put there")
        os.rename(where.name, UPLOADS_FOLDER, src_dir_fd=root, dst_dir_fd=root)
        os.fsync(root)
        self._moved_back(inbox, where)

    def _moved_back(self, inbox: Path, where: Path) -> None:
        self.log.warning(
            "uploads.moved_back",
            inbox=str(inbox),
            found_at=printable(str(where)),
            reason="someone who may write the inbox renamed the uploads folder",
            action=f"renamed back to {inbox / UPLOADS_FOLDER}; its uploads wait there again",
        )

    def _set_aside(self, inbox: Path, root: int, why: str) -> None:
        name = f"{SET_ASIDE}{time.strftime('%Y%m%dT%H%M%S')}-{os.urandom(3).hex()}"
        os.rename(UPLOADS_FOLDER, name, src_dir_fd=root, dst_dir_fd=root)
        self.log.warning(
            "uploads.set_aside",
            inbox=str(inbox),
            now_at=str(inbox / name),
            reason=f"{inbox / UPLOADS_FOLDER} was set aside: {why}",
            action="ocrd keeps its uploads in a folder of its own; look at what was set "
            "aside and remove it",
        )

    def _forget(self, key: str) -> None:
        fd = self._held.pop(key, None)
        if fd is not None:
            os.close(fd)


def _renamed_uploads(root: int) -> str | None:
    """A folder of ocrd's in the inbox holding uploads (a folder named as an upload, with
    ocrd's record of it): the uploads folder, renamed."""
    for name in os.listdir(root):
        with contextlib.suppress(OSError):
            info = os.stat(name, dir_fd=root, follow_symlinks=False)
            private = _ours(info) and info.st_mode & 0o077 == 0
            if name != UPLOADS_FOLDER and private and _holds_uploads(root, name):
                return name
    return None


def _holds_uploads(root: int, name: str) -> bool:
    folder = os.open(name, DIRECTORY, dir_fd=root)
    try:
        for entry in os.listdir(folder):
            if UPLOAD_ID.match(entry):
                with contextlib.suppress(OSError):
                    info = os.stat(f"{entry}/{RECORD}", dir_fd=folder, follow_symlinks=False)
                    if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                        return True
        return False
    finally:
        os.close(folder)


def _lstat(root: int) -> os.stat_result | None:
    try:
        return os.stat(UPLOADS_FOLDER, dir_fd=root, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _same(one: os.stat_result, other: os.stat_result) -> bool:
    return (one.st_dev, one.st_ino) == (other.st_dev, other.st_ino)


def _ours(info: os.stat_result) -> bool:
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def _path_of(fd: int) -> Path | None:
    """Where the folder held open by `fd` is now (Linux names it in /proc)."""
    if not descriptors_named():
        return None
    with contextlib.suppress(OSError):
        where = os.readlink(OPEN_FOLDERS / str(fd))
        if where.startswith("/") and not where.endswith(" (deleted)"):
            return Path(where)
    return None
