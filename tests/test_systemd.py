"""The shipped unit, sysusers.d and tmpfiles.d files, checked by systemd's own tools."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SYSTEMD = Path(__file__).resolve().parents[1] / "systemd"
MAX_EXPOSURE = 3.0


def systemd_analyze(*arguments: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: run scripts/install_test_packages.sh")
    return subprocess.run(
        ["systemd-analyze", *arguments], capture_output=True, text=True, timeout=120
    )


def unit_with_this_ocrd(tmp_path: Path) -> Path:
    """The unit as shipped, but starting the ocrd installed here (verify checks that the
    command exists)."""
    ocrd = Path(sys.executable).with_name("ocrd")
    text = (SYSTEMD / "ocrd.service").read_text()
    assert "/opt/ocrd/.venv/bin/ocrd" in text
    unit = tmp_path / "ocrd.service"
    unit.write_text(text.replace("/opt/ocrd/.venv/bin/ocrd", str(ocrd)))
    return unit


def test_the_unit_verifies_cleanly_and_uses_notify_reload(tmp_path: Path) -> None:
    version = int(systemd_analyze("--version").stdout.split()[1])
    assert version >= 253, "Type=notify-reload needs systemd 253 (scripts/install_test_packages.sh)"
    result = systemd_analyze("verify", str(unit_with_this_ocrd(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr
    assert "Type=notify-reload" in (SYSTEMD / "ocrd.service").read_text()


def test_the_unit_is_hardened(tmp_path: Path) -> None:
    result = systemd_analyze("security", "--offline=yes", str(unit_with_this_ocrd(tmp_path)))
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout)
    assert match, result.stdout[-2000:] + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE, result.stdout


def tmpfiles_in_an_offline_root(root: Path) -> subprocess.CompletedProcess[str]:
    """`systemd-tmpfiles --root --create` of the shipped file, in a private mount namespace
    where /etc/passwd and /etc/group are the root's: ACL entries name the group, and libacl
    resolves names through the system's user database, which --root does not redirect (on
    a real install sysusers has run first and the name resolves)."""
    if os.geteuid() != 0:
        pytest.fail("the tmpfiles test mounts over /etc/group in a private namespace: run as root")
    script = (
        f"mount --bind {root}/etc/group /etc/group && "
        f"mount --bind {root}/etc/passwd /etc/passwd && "
        f"exec systemd-tmpfiles --root={root} --create -"
    )
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        input=(SYSTEMD / "ocrd.tmpfiles").read_text(),
        capture_output=True,
        text=True,
    )


def effective_group_permissions(path: Path, gid: int) -> str:
    """What members of group `gid` may do with `path`: its named ACL entry, else the owning
    group's, limited by the mask (`getfacl`'s #effective)."""
    result = subprocess.run(["getfacl", "--numeric", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, f"getfacl failed (scripts/install_test_packages.sh): {result}"
    entries = dict(
        line.split("\t")[0].rsplit(":", 1)
        for line in result.stdout.splitlines()
        if line and not line.startswith("#")
    )
    owning = entries["group:"] if path.stat().st_gid == gid else "---"
    allowed = entries.get(f"group:{gid}", owning)
    mask = entries.get("mask:", "rwx")
    return "".join(a if a == m else "-" for a, m in zip(allowed, mask, strict=True))


def test_sysusers_and_tmpfiles_create_the_user_and_the_folders(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    result = subprocess.run(
        ["systemd-sysusers", f"--root={root}", "-"],
        input=(SYSTEMD / "ocrd.sysusers").read_text(),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    result = tmpfiles_in_an_offline_root(root)
    assert result.returncode == 0, result.stderr
    assert "Failed" not in result.stderr, result.stderr
    assert re.search(r"^ocrd:x:\d+:\d+:.*:/var/lib/ocrd:", (root / "etc/passwd").read_text(), re.M)
    inbox = root / "srv" / "ocrd" / "inbox"
    assert inbox.is_dir() and inbox.stat().st_mode & 0o7777 == 0o2775
    for folder in ("outbox", "done", "failed", "work"):
        assert (root / "srv" / "ocrd" / folder).is_dir()


def test_a_subfolder_someone_makes_in_the_inbox_stays_writable_by_ocrd(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    subprocess.run(
        ["systemd-sysusers", f"--root={root}", "-"],
        input=(SYSTEMD / "ocrd.sysusers").read_text(),
        check=True,
        capture_output=True,
        text=True,
    )
    assert tmpfiles_in_an_offline_root(root).returncode == 0
    gid = int(re.search(r"^ocrd:x:(\d+):", (root / "etc/group").read_text(), re.M).group(1))
    inbox = root / "srv" / "ocrd" / "inbox"
    subfolder, deeper = inbox / "alice", inbox / "alice" / "2026"
    previous = os.umask(0o022)  # a person's usual umask: new folders drwxr-xr-x
    try:
        subfolder.mkdir()
        deeper.mkdir()
    finally:
        os.umask(previous)
    assert effective_group_permissions(inbox, gid) == "rwx"
    for folder in (subfolder, deeper):
        assert effective_group_permissions(folder, gid) == "rwx", folder
        assert folder.stat().st_gid == gid and folder.stat().st_mode & 0o2000, folder
