"""Real filesystems for storage-fault tests: a small tmpfs (full, read-only), an SMB-like
FUSE mount (refused names), and a FUSE mount that behaves like an NFS share (lost replies,
the server's clock, no inotify for other hosts' files). Mounting needs root, as CI has;
without it the tests fail with a message saying so rather than pass untested."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

SMBFS = Path(__file__).with_name("smbfs.py")
NETFS = Path(__file__).with_name("netfs.py")


def _mount(*arguments: str) -> None:
    result = subprocess.run(["mount", *arguments], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(
            f"mount {' '.join(arguments)} failed ({result.stderr.strip()}); these tests need "
            "root (CI runs as root), or leave them out with -m 'not mounts'"
        )


def _unmount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@contextmanager
def tmpfs(folder: Path, size: str = "4m") -> Iterator[Path]:
    """A tmpfs of `size` at `folder`: a disk that really fills up."""
    folder.mkdir(parents=True, exist_ok=True)
    _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
    try:
        yield folder
    finally:
        _unmount(folder)


def set_read_only(folder: Path, read_only: bool) -> None:
    _mount("-o", f"remount,{'ro' if read_only else 'rw'}", str(folder))


def fill(folder: Path) -> Path:
    """Write a file into `folder` until the filesystem is full; it is returned for removal."""
    filler = folder / "filler.bin"
    with filler.open("wb") as handle:
        try:
            while True:
                handle.write(b"\0" * 65536)
                handle.flush()
        except OSError:
            pass
    return filler


@contextmanager
def smb_like(folder: Path) -> Iterator[Path]:
    """`folder` as a FUSE mount that refuses names as SMB and FAT do (tests/smbfs.py)."""
    backing = folder.with_name(folder.name + ".backing")
    with _fuse([str(SMBFS), str(backing), str(folder)], backing, folder, "SMB-like"):
        yield folder


@contextmanager
def network_share(
    backing: Path,
    folder: Path,
    lost_replies: int = 0,
    clock_offset: float = 0.0,
    counts: Path | None = None,
) -> Iterator[Path]:
    """`backing` mounted at `folder` like an NFS share (tests/netfs.py): every
    `lost_replies`th rename or link answers as a retried request does, the server's clock
    is `clock_offset` seconds off, and what is written to `backing` directly (another host)
    raises no inotify event. Mount it more than once for several hosts."""
    arguments = [str(NETFS), str(backing), str(folder), f"--lost-replies={lost_replies}"]
    arguments.append(f"--clock-offset={clock_offset}")
    if counts is not None:
        arguments.append(f"--counts={counts}")
    with _fuse(arguments, backing, folder, "network-like"):
        yield folder


@contextmanager
def _fuse(arguments: list[str], backing: Path, folder: Path, kind: str) -> Iterator[None]:
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        pytest.fail(
            "FUSE is not installed: run scripts/install_test_packages.sh (Debian's fuse3), "
            "or leave these tests out with -m 'not mounts'"
        )
    backing.mkdir(parents=True, exist_ok=True)
    folder.mkdir(parents=True, exist_ok=True)
    process = subprocess.Popen([sys.executable, *arguments])
    deadline = time.monotonic() + 20
    while not os.path.ismount(folder):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the {kind} FUSE mount at {folder} did not come up (needs root)")
        time.sleep(0.05)
    failing = False
    try:
        yield
    except BaseException:
        failing = True
        raise
    finally:
        _unmount(folder)
        _ended(process, kind, folder, failing)


def _ended(process: subprocess.Popen[bytes], kind: str, folder: Path, failing: bool) -> None:
    """The FUSE process, ended: it exits once unmounted and no longer in use. One that does
    not (a daemon of a failing test still holds files there) is killed; that is a failure
    of its own only where the test passed, so it never hides the test's own failure."""
    try:
        process.wait(timeout=20)
        return
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    message = f"the {kind} FUSE process for {folder} did not exit within 20 s of unmounting"
    if failing:
        print(f"(after the failure above) {message}; killed", file=sys.stderr)
    else:
        pytest.fail(f"{message}; killed")
