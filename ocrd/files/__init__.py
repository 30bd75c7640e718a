"""Durable file operations: nothing half-written is ever visible, nothing is ever overwritten.
`temporaries` names and sweeps temporary files, `names` finds free output names, `moves`
renames without replacing, `writes` writes durably; `beneath` opens paths without following
links, `dropped` looks at files people dropped, `permissions` and `reservations`."""

from ocrd.files.moves import (
    AT_FDCWD,
    RENAME_NOREPLACE,
    fsync_dir,
    identity,
    link_or_copy,
    move_new,
    rename_checked,
    rename_new,
)
from ocrd.files.names import (
    MAX_STEM_BYTES,
    RESERVED_SUFFIX,
    candidate_names,
    free_name,
    numbered,
    reservation_of,
)
from ocrd.files.temporaries import remove_stale_temporaries, temporary_path, writer
from ocrd.files.writes import json_bytes, replace_file, write_new_file

__all__ = [
    "AT_FDCWD",
    "MAX_STEM_BYTES",
    "RENAME_NOREPLACE",
    "RESERVED_SUFFIX",
    "candidate_names",
    "free_name",
    "fsync_dir",
    "identity",
    "json_bytes",
    "link_or_copy",
    "move_new",
    "numbered",
    "remove_stale_temporaries",
    "rename_checked",
    "rename_new",
    "replace_file",
    "reservation_of",
    "temporary_path",
    "write_new_file",
    "writer",
]
