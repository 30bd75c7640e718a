"""The shipped unit, sysusers.d and tmpfiles.d files, checked by systemd's own tools, and
`ocrd reload`, the unit's ExecReload=, against a real daemon."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import write_config

from ocrd.config import load_config, parse_config
from ocrd.config.sandbox import read_unit, unwritable_folders

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


def unit_settings(text: str) -> dict[str, list[str]]:
    """The [Service] section's settings, each with its values in order."""
    service = text[text.index("[Service]") : text.index("[Install]")]
    settings: dict[str, list[str]] = {}
    for line in service.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings.setdefault(key, []).append(value)
    return settings


def test_the_unit_verifies_cleanly_and_reloads_through_ocrd_reload(tmp_path: Path) -> None:
    """Type=notify with ExecReload= works on systemd 249 and newer (notify-reload needs
    253); tests/test_systemd_boot.py runs it under 252 and 254."""
    result = systemd_analyze("verify", str(unit_with_this_ocrd(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr
    settings = unit_settings((SYSTEMD / "ocrd.service").read_text())
    assert settings["Type"] == ["notify"]
    assert settings["ExecReload"] == ["/opt/ocrd/.venv/bin/ocrd reload --pid $MAINPID"]
    assert settings["RuntimeDirectory"] == ["ocrd"]


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


def ocrd_reload(pid: int, runtime: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`ocrd reload --pid PID` as the unit's ExecReload= runs it (systemd sets
    RUNTIME_DIRECTORY from RuntimeDirectory=)."""
    return subprocess.run(
        [sys.executable, "-m", "ocrd", "reload", "--pid", str(pid), *options],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RUNTIME_DIRECTORY": str(runtime)},
    )


@pytest.mark.slow
def test_ocrd_reload_returns_once_the_daemon_reloaded_and_fails_on_a_refused_file(
    tmp_path: Path, start_daemon
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir()
    config = write_config(tmp_path)
    daemon = start_daemon(config, env={"RUNTIME_DIRECTORY": str(runtime)})
    [listening] = daemon.wait_for("http.listening")
    daemon.wait_for("daemon.ready")
    pid = daemon.process.pid
    data = yaml.safe_load(config.read_text())
    (tmp_path / "scans" / "inbox").mkdir(parents=True)
    data["inboxes"].append({"path": "scans/inbox"})
    data["engine"]["simulated"]["seconds_per_page"] = 0.01  # needs a restart
    config.write_text(yaml.safe_dump(data))

    applied = ocrd_reload(pid, runtime)

    assert applied.returncode == 0, applied.stderr
    assert "reloaded its configuration" in applied.stdout
    assert "kept until a restart: engine" in applied.stderr
    # Done when it returns: the daemon already serves the new inbox.
    report = httpx.get(f"{listening['url']}api/status", timeout=10).json()
    assert [i["path"] for i in report["inboxes"]] == [
        str(tmp_path / "data" / "inbox"),
        str(tmp_path / "scans" / "inbox"),
    ]

    config.write_text(config.read_text().replace("settle_seconds", "settle_secs", 1))
    refused = ocrd_reload(pid, runtime)

    assert refused.returncode == 1
    assert "stays in effect" in refused.stderr and "settle_secs" in refused.stderr
    assert daemon.process.poll() is None

    daemon.process.send_signal(signal.SIGSTOP)  # a daemon that cannot answer
    try:
        frozen = ocrd_reload(pid, runtime, "--timeout", "2")
    finally:
        daemon.process.send_signal(signal.SIGCONT)
    assert frozen.returncode == 1 and "did not confirm the reload in 2 s" in frozen.stderr
    assert daemon.stop() == 0


def test_ocrd_reload_outside_systemd_says_how_to_reload() -> None:
    environment = {k: v for k, v in os.environ.items() if k != "RUNTIME_DIRECTORY"}
    result = subprocess.run(
        [sys.executable, "-m", "ocrd", "reload", "--pid", str(os.getpid())],
        capture_output=True,
        text=True,
        timeout=60,
        env=environment,
    )
    assert result.returncode == 2 and "kill -HUP" in result.stderr


def check_config_with_unit(config: Path, unit: str) -> subprocess.CompletedProcess[str]:
    """`systemctl cat ocrd | ocrd check-config --config FILE --unit -`."""
    return subprocess.run(
        [sys.executable, "-m", "ocrd", "check-config", "--config", str(config), "--unit", "-"],
        input=unit,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_shipped_configuration_uses_only_folders_the_unit_may_write() -> None:
    config = load_config(SYSTEMD / "ocrd.yaml")
    assert [str(inbox.path) for inbox in config.inboxes] == ["/srv/ocrd/inbox"]
    assert unwritable_folders(config, read_unit((SYSTEMD / "ocrd.service").read_text())) == []


def test_check_config_names_each_folder_the_unit_cannot_write_and_what_to_change(
    tmp_path: Path,
) -> None:
    """The README's example configuration installed as /etc/ocrd/config.yaml: its relative
    data folders land in /etc/ocrd/data, read-only under ProtectSystem=strict."""
    example = yaml.safe_load((Path(__file__).parents[1] / "config.example.yaml").read_text())
    example["inboxes"][0]["path"] = "/etc/ocrd/data/inbox"  # as data/inbox resolves there
    example["inboxes"][0]["outbox"] = "/srv/ocrd/outbox"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(example))
    unit = (SYSTEMD / "ocrd.service").read_text()

    result = check_config_with_unit(config, unit)

    assert result.returncode == 78  # EX_CONFIG, as `ocrd run` refuses
    lines = [line for line in result.stderr.splitlines() if "the unit cannot use it" in line]
    assert [line.split(": ", 2)[2].split(" (")[0] for line in lines] == [
        "inbox /etc/ocrd/data/inbox",
        "done folder /etc/ocrd/data/done",
        "failed folder /etc/ocrd/data/failed",
        "work folder /etc/ocrd/data/work",
    ]  # the outbox under /srv/ocrd is fine
    assert "(inboxes[0].path): the unit cannot use it (ProtectSystem=strict)" in lines[0]
    assert "ReadWritePaths=/etc/ocrd/data" in lines[0]

    # The README's drop-in for folders elsewhere (`systemctl cat ocrd` shows it last).
    drop_in = "\n# /etc/systemd/system/ocrd.service.d/override.conf\n[Service]\n"
    allowed = check_config_with_unit(config, unit + drop_in + "ReadWritePaths=/etc/ocrd/data\n")
    assert "the unit cannot use it" not in allowed.stderr, allowed.stderr


def test_folders_under_home_or_tmp_are_named_with_the_protect_home_or_private_tmp_fix() -> None:
    unit = (SYSTEMD / "ocrd.service").read_text()
    config = parse_config(
        {"inboxes": [{"path": "/home/scans/inbox"}, {"path": "/tmp/scans/inbox"}]}, Path("/")
    )
    lines = unwritable_folders(config, read_unit(unit))
    assert len(lines) == 10
    assert "(ProtectHome=yes)" in lines[0] and "ProtectHome=tmpfs with BindPaths=" in lines[0]
    assert "(PrivateTmp=yes)" in lines[5] and "a /tmp of its own" in lines[5]
    tmpfs = "[Service]\nProtectHome=tmpfs\nBindPaths=/home/scans\n"
    assert unwritable_folders(config, read_unit(unit + tmpfs))[0].startswith(
        "inbox /tmp/scans/inbox"
    )
