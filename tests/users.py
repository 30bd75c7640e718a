"""Real users for tests of a shared inbox: ocrd's own service user, and people who drop files.

The daemon runs as the service user, as the shipped unit runs it, so the kernel's real
permission checks apply (folder modes, the sticky bit, fs.protected_hardlinks): root would
bypass all of them. The service user must be able to run Python and import ocrd, but this
checkout and its venv may lie under a folder only root may enter, and the venv's
interpreter may be one under /root; so the checkout is bind-mounted at a path anyone may
traverse, and Debian's own python3 of the same version runs it with the venv's packages on
its path. Creating users and mounting need root, as CI has.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parents[1]
SERVICE = "ocrdsvc"  # ocrd's user in these tests
SHARE = "ocrdshare"  # the group of the people who drop files, and of ocrd
PEOPLE = ("alice", "bob")


def _run(*command: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} failed ({result.stderr.strip()}); these tests need root "
            "(CI runs as root), or leave them out with -m 'not users'"
        )


def ensure_users() -> None:
    """The share group, ocrd's service user in it, and two people in it. A lock file keeps
    two test processes (pytest-xdist's workers) from both finding a user missing and both
    adding it, which fails the second."""
    with open(Path(tempfile.gettempdir(), "ocrd-tests-users.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _add_missing_users()


def _add_missing_users() -> None:
    try:
        grp.getgrnam(SHARE)
    except KeyError:
        _run("groupadd", SHARE)
    for name, system in ((SERVICE, True), *((person, False) for person in PEOPLE)):
        try:
            pwd.getpwnam(name)
        except KeyError:
            flags = ["--system", "--no-create-home"] if system else ["--no-create-home"]
            _run("useradd", *flags, "--shell", "/usr/sbin/nologin", "-G", SHARE, name)


def uid(name: str) -> int:
    return pwd.getpwnam(name).pw_uid


def gid(name: str = SHARE) -> int:
    return grp.getgrnam(name).gr_gid


def give(path: Path, owner: str, mode: int, group: str = SHARE) -> Path:
    """`path` owned by `owner` and `group` with `mode`, as that person would have made it."""
    os.chown(path, uid(owner), gid(group), follow_symlinks=False)
    if not path.is_symlink():
        os.chmod(path, mode)
    return path


@dataclass(frozen=True)
class Runtime:
    """How the service user runs ocrd: an interpreter and the paths it imports from."""

    python: str
    pythonpath: str

    def command(self, *arguments: str) -> list[str]:
        return [self.python, "-m", "ocrd", *arguments]

    def environment(self) -> dict[str, str]:
        return {"PYTHONPATH": self.pythonpath, "PYTHONDONTWRITEBYTECODE": "1"}

    def run_as_service(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        """`argv` run as the service user with this environment over the test's, its
        output captured."""
        return subprocess.run(
            argv,
            env={**os.environ, **self.environment()},
            user=SERVICE,
            capture_output=True,
            text=True,
            timeout=120,
        )


def _system_python() -> str:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.fail(f"no system {version} to run ocrd as another user (apt-get install python3)")


@contextmanager
def service_runtime() -> Iterator[Runtime]:
    """The checkout (and the venv's packages, where the venv lies elsewhere) bind-mounted
    where anyone may enter them, for the service user."""
    ensure_users()
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    packages = Path(sys.prefix, "lib", version, "site-packages")
    with ExitStack() as mounts:
        checkout = mounts.enter_context(_visible(CHECKOUT))
        if packages.is_relative_to(CHECKOUT):
            site = checkout / packages.relative_to(CHECKOUT)
        else:
            site = mounts.enter_context(_visible(packages))
        yield Runtime(_system_python(), f"{checkout}:{site}")


@contextmanager
def _visible(folder: Path) -> Iterator[Path]:
    """`folder` bind-mounted at a path every user may traverse."""
    mount = Path(tempfile.mkdtemp(prefix="ocrd-visible-"))
    os.chmod(mount, 0o755)
    _run("mount", "--bind", str(folder), str(mount))
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        with contextlib.suppress(OSError):
            mount.rmdir()  # never rmtree: if the unmount failed, that would empty `folder`


def shared_data(root: Path) -> Path:
    """`root/data` laid out as the shipped tmpfiles configuration does: an inbox the share
    group may write (setgid), and output folders that are ocrd's."""
    os.chmod(root, 0o755)
    data = root / "data"
    data.mkdir()
    give(data, SERVICE, 0o755)
    give(_mkdir(data / "inbox"), SERVICE, 0o2775)
    for name in ("outbox", "done", "failed"):
        give(_mkdir(data / name), SERVICE, 0o2755)
    give(_mkdir(data / "work"), SERVICE, 0o700)
    return data


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path
