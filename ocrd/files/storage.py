"""What a storage error means for a document: wait it out, try a safer name, or give up.

Disks fill up, shares go read-only or stale, and folders vanish; all of that clears by
itself or by an operator's hand, so the document waits in the work area and ocrd retries.
Some errors, though, are about one file and never clear: an SMB or FAT outbox refuses a
name with `:` or `?` in it (EINVAL), a path is too long (ENAMETOOLONG), a name is not in
the target's encoding (EILSEQ), a file is too large for the target (EFBIG). Retrying
those would hold the document forever.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import unicodedata
from collections.abc import Collection
from enum import Enum
from pathlib import Path, PurePath


class Fault(Enum):
    transient = "transient"  # retry with backoff until it clears
    name_refused = "name_refused"  # the target refuses this name: try a safe one
    file_refused = "file_refused"  # the target refuses this file whatever its name
    owner_refused = "owner_refused"  # its owner keeps ocrd from moving the original


class OwnerRefused(PermissionError):
    """A person's original cannot be moved because its owner took ocrd's permission away
    after it was claimed (a job folder made read-only): that one document's problem."""


# A name the target cannot have: refused characters, too long, not in its encoding, or
# one that a folder (or a file) of another document already has on the way, or a link
# someone put on the way in an outbox people may write (never followed: `beneath.py`).
NAME_REFUSED = frozenset(
    {
        errno.EINVAL,
        errno.ENAMETOOLONG,
        errno.EILSEQ,
        errno.EEXIST,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.ELOOP,
    }
)
FILE_REFUSED = frozenset({errno.EFBIG})


def classify(error: OSError, roots: Collection[Path] = ()) -> Fault:
    """Errors not known to be permanent for one file count as transient: retrying keeps the
    original safe, and the fault shows in the log and the systemd status meanwhile. A name
    refused at one of the output `roots` or above (a file where the outbox should be) is
    the operator's to fix, not the document's: transient too."""
    if isinstance(error, OwnerRefused):
        return Fault.owner_refused
    if error.errno in NAME_REFUSED and not _at_or_above(error.filename, roots):
        return Fault.name_refused
    if error.errno in FILE_REFUSED or error.errno is None:  # a copy that met what it cannot
        return Fault.file_refused
    return Fault.transient


def _at_or_above(filename: object, roots: Collection[Path]) -> bool:
    """Whether `filename` is one of `roots` or above one, or below one that is no folder."""
    if not isinstance(filename, str | os.PathLike):
        return False
    path = Path(os.path.abspath(filename))
    for root in (Path(os.path.abspath(root)) for root in roots):
        if root.is_relative_to(path) or (path.is_relative_to(root) and not root.is_dir()):
            return True
    return False


def describe(error: OSError) -> str:
    """`<strerror> (<ERRNO>): <path>`, for people."""
    code = errno.errorcode.get(error.errno or 0, str(error.errno))
    where = f": {error.filename}" if error.filename else ""
    return f"{error.strerror or error} ({code}){where}"


# Characters Windows, SMB and FAT refuse, and control characters.
_REFUSED_CHARACTERS = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')
SAFE_PART_BYTES = 80  # short enough for any filesystem, with room for "-2" and ".layout.json"


def safe_part(name: str) -> str:
    """One path component that any filesystem takes: ASCII letters, digits and simple
    punctuation; a short digest keeps different unsafe names apart."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    cleaned = _REFUSED_CHARACTERS.sub("_", ascii_name).strip(" .") or "file"
    if cleaned == name:
        return name
    digest = hashlib.sha1(name.encode("utf-8", "surrogateescape")).hexdigest()[:6]
    stem, dot, suffix = cleaned.rpartition(".")
    if not dot or len(suffix) > 8:
        stem, suffix = cleaned, ""
    stem = stem[: SAFE_PART_BYTES - len(suffix) - 8]
    return f"{stem}-{digest}.{suffix}" if suffix else f"{stem}-{digest}"


def safe_relative(relative: PurePath) -> PurePath:
    """The relative path with every component made safe (see `safe_part`)."""
    return PurePath(*(safe_part(part) for part in relative.parts))
