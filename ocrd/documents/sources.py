"""What a document's pages are made of: one file, a scan job's folder of files, or the fronts
and backs of a single-sided feeder collated into one.

A scan job is a folder whose files (images and PDFs, in subfolders too) are pages in
natural name order, so `p2` comes before `p10`. Files that are no pages (a scanner's XML or
thumbnails database) are left out and named in the log, as are entries that are no regular
files (symbolic links, FIFOs, sockets: never followed or opened); hidden and temporary
names are ignored as in an inbox. Duplex collating takes the fronts file as it is and the backs file
in reverse (a single-sided feeder scans the turned-over stack from its last page), and
interleaves them: front 1, back 1, front 2, back 2, ...
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from ocrd.config import DEFAULT_TEMPORARY_SUFFIXES, DocumentOptions
from ocrd.documents import failures
from ocrd.domain import OFFICE_FORMATS, InputFormat, PageResult
from ocrd.files.dropped import UNLISTABLE, printable, regular_files
from ocrd.output.page import PageJournal
from ocrd.render import RenderError, RenderFailure, SourceFile, detect_format


def natural_key(text: str) -> list[object]:
    """Sort key that orders numbers by value: `p2` before `p10`, `Scan 9` before `Scan 10`."""
    return [int(part) if part.isdigit() else part.casefold() for part in re.split(r"(\d+)", text)]


def _ignored(name: str) -> bool:
    return name.startswith((".", "~$")) or name.lower().endswith(DEFAULT_TEMPORARY_SUFFIXES)


def folder_files(folder: Path) -> tuple[list[Path], list[str], list[str]]:
    """The regular files of a job folder, in natural order of their paths within it; its
    other entries described (links, FIFOs: left alone); and its subfolders ocrd's user may
    not list. Blocking."""
    files, others = regular_files(folder)
    found = [path for path in files if not _ignored(path.name)]
    found.sort(key=lambda path: natural_key(path.relative_to(folder).as_posix()))
    skipped = [
        f"{printable(str(path.relative_to(folder)))}: {kind}, never followed or opened"
        for path, kind in others
        if not _ignored(path.name) and kind != UNLISTABLE
    ]
    unlistable = [
        printable(str(path.relative_to(folder))) for path, kind in others if kind == UNLISTABLE
    ]
    return found, skipped, unlistable


class SourceKind(StrEnum):
    file = "file"
    folder = "folder"  # a scan job
    duplex = "duplex"  # fronts, then backs


@dataclass(frozen=True)
class Sources:
    """The files a document is made of, in order, and how they make its pages."""

    files: tuple[Path, ...]
    kind: SourceKind = SourceKind.file
    skipped: tuple[str, ...] = ()  # a job folder's entries that are no files, described
    root: Path | None = None  # no link is followed below this folder (a claim's)
    unlistable: tuple[str, ...] = ()  # a job folder's subfolders ocrd's user may not list
    folder: Path | None = None  # a scan job's folder

    @classmethod
    def of(
        cls, original: Path, companions: tuple[Path, ...] = (), root: Path | None = None
    ) -> Sources:
        """A claimed original: a file, or a job folder; with a backs file, a duplex pair.
        Blocking (a folder is listed)."""
        if original.is_dir() and not original.is_symlink():
            files, skipped, unlistable = folder_files(original)
            return cls(
                tuple(files),
                SourceKind.folder,
                tuple(skipped),
                root,
                tuple(unlistable),
                original,
            )
        if companions:
            return cls((original, *companions), SourceKind.duplex, root=root)
        return cls((original,), root=root)

    def again(self) -> Sources:
        """A scan job listed anew (what a scanner still writing there added); blocking."""
        if self.folder is None:
            return self
        return Sources.of(self.folder, root=self.root)


def job_snapshot(sources: Sources) -> tuple[tuple[str, int, int], ...]:
    """What a scan job holds now: each file's path, size and mtime (a scanner that goes on
    writing into the folder it works in changes this). Blocking."""
    found = []
    for path in sources.files:
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        found.append((str(path), info.st_size, info.st_mtime_ns))
    return tuple(found)


@dataclass(frozen=True)
class PageRef:
    """Where one page of a document comes from: a page of one of its files."""

    source: SourceFile
    number: int  # 1-based, within that file


def page_order(counts: list[int], duplex: bool) -> list[tuple[int, int]]:
    """(file index, page within it) for every page of the document, in reading order."""
    if not duplex:
        return [(index, page) for index, count in enumerate(counts) for page in range(1, count + 1)]
    fronts, backs = counts[0], counts[1] if len(counts) > 1 else 0
    order: list[tuple[int, int]] = []
    for sheet in range(max(fronts, backs)):
        if sheet < fronts:
            order.append((0, sheet + 1))
        if sheet < backs:
            order.append((1, backs - sheet))  # the backs were scanned last page first
    return order


def page_files(sources: Sources) -> tuple[list[tuple[Path, InputFormat]], list[str]]:
    """Each file that holds pages, with its format, and the names of a job folder's files
    that hold none (for a single file or a duplex pair that is an error). Blocking."""
    if sources.unlistable:  # its pages there cannot be seen: never settle the job without them
        raise RenderError(
            f"ocrd's user may not list {', '.join(sources.unlistable)} in this scan job, so "
            "the pages in it cannot be seen; let ocrd's group read it (chmod -R g+rX), then "
            "drop the job into the inbox again",
            code=RenderFailure.unreadable,
        )
    readable, skipped = [], list(sources.skipped)
    for path in sources.files:
        try:
            fmt = detect_format(path, sources.root)
            if fmt in OFFICE_FORMATS and sources.kind is not SourceKind.file:
                raise RenderError(
                    f"a {fmt.value} document is converted on its own, never as pages of a "
                    "scan job or duplex pair; drop it into the inbox by itself",
                    code=RenderFailure.unsupported,
                )
            readable.append((path, fmt))
        except RenderError as error:
            if sources.kind is not SourceKind.folder:
                raise
            skipped.append(f"{printable(path.name)}: {error}")
    return readable, skipped


@dataclass
class Inputs:
    """What a conversion reads before its first page: the files holding pages, the names of
    a job's files that hold none, and the pages its journal kept."""

    files: list[tuple[Path, InputFormat]]
    skipped: list[str]
    journal: dict[int, PageResult]


def read_inputs(
    sources: Sources, journal: PageJournal | None, settings: DocumentOptions, scratch: Path
) -> Inputs:
    """The inputs of a conversion (blocking: one thread hop); DocumentFailed where the
    files cannot be told apart."""
    try:
        files, skipped = page_files(sources)
    except (RenderError, OSError) as error:
        raise failures.undetected(error) from None
    figures = scratch if settings.figures else None
    return Inputs(files, skipped, journal.load(figures) if journal and files else {})
