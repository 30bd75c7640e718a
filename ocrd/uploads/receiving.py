"""Receiving one upload: a hidden file in a folder of its own, made durable and named when
complete, with a small record saying which file it is.

    <inbox>/uploads/                    ocrd's alone (0700), whatever the inbox's ACLs
    <inbox>/uploads/<id>/               ocrd's alone (0700)
    <inbox>/uploads/<id>/.upload.part   the upload while it arrives (hidden: no candidate)
    <inbox>/uploads/<id>/.upload.json   its record, written at commit: name, inode, size
    <inbox>/uploads/<id>/<name>         the upload, once complete (0600)

The inbox is shared by people who may write it, and what lands in it by default inherits
its ACL (a group allowed to read and write): an upload is the uploader's alone until it is
claimed, so every folder and file of it is made ocrd's alone (`make_private`), and the
record names the one file that is the upload (`mismatch`), so nothing else that turns up in
its folder is ever taken for it.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Any

from ocrd.config import UPLOADS_FOLDER, InboxConfig
from ocrd.files import json_bytes, numbered
from ocrd.files.beneath import DIRECTORY, folder_beneath
from ocrd.files.dropped import printable
from ocrd.files.permissions import make_private, user_name

UPLOAD_ID = re.compile(r"^[a-z2-7]{26}$")  # 128 random bits in base32
PART = ".upload.part"  # the upload while it arrives: hidden, so never a candidate
RECORD = ".upload.json"  # which file is the upload
DEFAULT_NAME = "upload"
MAX_RECORD_BYTES = 64 * 1024
_REFUSED_CHARACTERS = re.compile(r'[<>:"|?*\x00-\x1f\x7f]')
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class UploadRefused(Exception):
    """An upload that is not taken: the HTTP status to answer, and why, in words."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def new_upload_id() -> str:
    return base64.b32encode(secrets.token_bytes(16)).decode().rstrip("=").lower()


def upload_of(relative: str) -> str | None:
    """The upload id in a relative path `uploads/<id>/<name>`, if it is one."""
    parts = PurePath(relative).parts
    if len(parts) == 3 and parts[0] == UPLOADS_FOLDER and UPLOAD_ID.match(parts[1]):
        return parts[1]
    return None


def clean_filename(given: str | None) -> str:
    """The name an upload is given in the inbox: the last component of what the client
    said, without characters a share refuses or control characters, at most 200 bytes for
    its stem (the extension is kept). A hidden name stays hidden, and is refused."""
    name = (given or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = printable(name).replace("\\", "_")
    name = _REFUSED_CHARACTERS.sub("_", name).strip()
    if name in ("", ".", ".."):
        name = DEFAULT_NAME
    return numbered(Path(name), 1).name


def name_too_long(name: str, inbox: Path) -> bool:
    """Whether `name` is longer than the inbox's filesystem allows a name to be."""
    try:
        limit = os.pathconf(inbox, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    return len(os.fsencode(name)) > limit


class UploadsFolderUnusable(Exception):
    """`<inbox>/uploads` is something ocrd cannot keep uploads in: the reason, in words."""


@contextlib.contextmanager
def uploads_folder(inbox: Path, make: bool) -> Any:
    """A descriptor of `<inbox>/uploads`, made where missing (with `make`) and kept ocrd's
    alone; UploadsFolderUnusable where a link, a file or someone else's folder lies there
    (people may write the inbox), FileNotFoundError where there is none."""
    shown = inbox / UPLOADS_FOLDER
    with folder_beneath(inbox, ()) as root:
        if make:
            with contextlib.suppress(FileExistsError):
                os.mkdir(UPLOADS_FOLDER, 0o700, dir_fd=root)
        try:
            fd = os.open(UPLOADS_FOLDER, DIRECTORY, dir_fd=root)
        except OSError as error:
            if error.errno == errno.ENOENT:
                raise
            why = "a symbolic link" if error.errno == errno.ELOOP else error.strerror
            raise UploadsFolderUnusable(f"{shown} is not a folder ocrd can use ({why})") from None
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():
            raise UploadsFolderUnusable(
                f"{shown} belongs to {user_name(owner)}, not to ocrd's user: someone made it "
                "before ocrd did, and could read every upload"
            )
        make_private(fd, 0o700)  # also one an older ocrd made with the inbox's rights
        yield fd
    finally:
        os.close(fd)


def private_entries(folder: int) -> None:
    """Make an upload folder's own files ocrd's alone (those an older ocrd left with the
    inbox's rights)."""
    for name in os.listdir(folder):
        with contextlib.suppress(OSError):
            fd = os.open(
                name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder
            )
            try:
                info = os.fstat(fd)
                if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
                    make_private(fd, 0o600)
            finally:
                os.close(fd)


def read_record(folder: int) -> dict[str, Any] | None:
    """The record in an upload's folder (never through a link, only ocrd's own and private);
    None where there is none (an upload an older ocrd received). A file of ocrd's others
    may read and write (an output in a folder the group may write) is no record: a member of
    the group could hard-link it beside a colleague's files to block them."""
    try:
        fd = os.open(
            RECORD, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder
        )
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        private = info.st_uid == os.geteuid() and info.st_mode & 0o077 == 0
        if not stat.S_ISREG(info.st_mode) or not private:
            return {}
        data = os.read(fd, MAX_RECORD_BYTES)
    finally:
        os.close(fd)
    try:
        record = json.loads(data)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def mismatch(record: dict[str, Any] | None, name: str, info: os.stat_result) -> str | None:
    """Why the file `name` (`info` its stat) in an upload's folder is not the upload its
    record names; None where it is (or where there is no record: an older ocrd's upload)."""
    if record is None:
        return None
    if record.get("name") != name:
        return f"the upload there is {printable(str(record.get('name')))!r}"
    if (record.get("device"), record.get("inode")) != (info.st_dev, info.st_ino):
        return "another file took the upload's name"
    return None


@dataclass
class Receiving:
    """An upload arriving: a hidden file in a folder of its own, until it is complete.
    Its methods block: call them in a thread."""

    id: str
    inbox: InboxConfig
    name: str
    _uploads: int  # descriptor of <inbox>/uploads
    _folder: int  # descriptor of <inbox>/uploads/<id>
    _file: int
    size: int = 0

    @property
    def relative_path(self) -> str:
        return f"{UPLOADS_FOLDER}/{self.id}/{self.name}"

    @property
    def folder(self) -> int:
        """A descriptor of the upload's own folder, until it is committed or aborted: a
        record written there beside the file (`ocrd/uploads/tasks.py`) is in place before
        the file is."""
        return self._folder

    @classmethod
    def begin(
        cls, inbox: InboxConfig, upload_id: str, name: str, held: int | None = None
    ) -> Receiving:
        """A new upload folder in `inbox` with an empty hidden part in it, both ocrd's
        alone: in `held` (ocrd's uploads folder, a descriptor this takes over) where given,
        else in `<inbox>/uploads`. UploadsFolderUnusable where that is no folder of ocrd's."""
        if held is not None:
            uploads = held
        else:
            with uploads_folder(inbox.path, make=True) as shared:
                uploads = os.dup(shared)
        folder = part = -1
        try:
            if held is not None:
                make_private(uploads, 0o700)
            os.mkdir(upload_id, 0o700, dir_fd=uploads)
            folder = os.open(upload_id, DIRECTORY, dir_fd=uploads)
            make_private(folder, 0o700)
            part = os.open(PART, _NEW, 0o600, dir_fd=folder)
            make_private(part, 0o600)
        except BaseException:
            if part >= 0:
                os.close(part)
            if folder >= 0:
                with contextlib.suppress(OSError):
                    os.unlink(PART, dir_fd=folder)
                os.close(folder)
            with contextlib.suppress(OSError):
                os.rmdir(upload_id, dir_fd=uploads)
            os.close(uploads)
            raise
        return cls(upload_id, inbox, name, uploads, folder, part)

    def write(self, data: bytes | bytearray) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._file, view)
            view = view[written:]
        self.size += len(data)

    def commit(self) -> None:
        """Make the upload durable, record which file it is, and give it its name: from
        now on it is in the inbox."""
        os.fsync(self._file)
        info = os.fstat(self._file)
        os.close(self._file)
        self._file = -1
        self._write_record(info)
        try:
            os.link(PART, self.name, src_dir_fd=self._folder, dst_dir_fd=self._folder)
            os.unlink(PART, dir_fd=self._folder)
        except OSError as error:  # a share that refuses hard links: the folder is new
            if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            os.rename(PART, self.name, src_dir_fd=self._folder, dst_dir_fd=self._folder)
        os.fsync(self._folder)
        os.fsync(self._uploads)
        self._close_folders()

    def _write_record(self, info: os.stat_result) -> None:
        record = {
            "id": self.id,
            "name": self.name,
            "device": info.st_dev,
            "inode": info.st_ino,
            "size": info.st_size,
            "uploaded_at": time.time(),
        }
        fd = os.open(RECORD, _NEW, 0o600, dir_fd=self._folder)
        try:
            make_private(fd, 0o600)
            os.write(fd, json_bytes(record) + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    def abort(self) -> None:
        """Remove the part and the folder: an upload that did not complete leaves nothing."""
        if self._file >= 0:
            os.close(self._file)
            self._file = -1
        for name in (PART, RECORD):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self._folder)
        with contextlib.suppress(OSError):
            os.rmdir(self.id, dir_fd=self._uploads)
        self._close_folders()

    def _close_folders(self) -> None:
        for fd in (self._folder, self._uploads):
            if fd >= 0:
                os.close(fd)
        self._folder = self._uploads = -1
