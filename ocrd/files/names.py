"""Output names: a free name beside a taken one (`name-2.md`), cut to fit the filesystem's limit
without splitting a character, and the hidden marker that holds a name for a planned settlement."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path


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


RESERVED_SUFFIX = ".ocrd-reserved"


def reservation_of(target: Path) -> Path:
    """The hidden marker that holds the name `target` for a planned settlement."""
    return target.with_name(f".{target.name}{RESERVED_SUFFIX}")
