"""The shipped unit, sysusers.d and tmpfiles.d files, checked by systemd's own tools."""

from __future__ import annotations

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


def test_sysusers_and_tmpfiles_create_the_user_and_the_folders(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    for tool, name in (
        ("systemd-sysusers", "ocrd.sysusers"),
        ("systemd-tmpfiles", "ocrd.tmpfiles"),
    ):
        arguments = [tool, f"--root={root}", "-"]
        if tool == "systemd-tmpfiles":
            arguments.insert(1, "--create")
        result = subprocess.run(
            arguments, input=(SYSTEMD / name).read_text(), capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr
    assert re.search(r"^ocrd:x:\d+:\d+:.*:/var/lib/ocrd:", (root / "etc/passwd").read_text(), re.M)
    inbox = root / "srv" / "ocrd" / "inbox"
    assert inbox.is_dir() and inbox.stat().st_mode & 0o7777 == 0o2775
    for folder in ("outbox", "done", "failed", "work"):
        assert (root / "srv" / "ocrd" / folder).is_dir()
