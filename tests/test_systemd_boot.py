"""ocrd.service under a real systemd: booted as PID 1 in a systemd-nspawn container
(tests/nspawn.py), ocrd installed there the README's way ("Running as a systemd unit": the
venv with the system's Python under /opt, the shipped unit, sysusers.d and tmpfiles.d files),
and used as a user would: another user's file dropped into a subfolder they made, reload,
the watchdog, stop.

The guest's /etc/ocrd/config.yaml sets `engine: kind: simulated` (0.5 s a page, one page at
a time) to keep these tests fast: they test the unit and the daemon's own logic under
systemd, not recognition. Everything else is real: systemd 254, the hardened unit with its
sandbox, real users and groups, PyMuPDF renders in worker processes, signals.

Measured on 2 cores: 2 min 40 s from nothing (debootstrap from Debian's mirror, pip from
PyPI), 1 min 15 s to 2 min 25 s with the root file system cached (tests/nspawn.py,
cache_folder()), depending on pip's downloads. Needs root.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nspawn
import pytest
import yaml
from conftest import claimed_originals, files_under, wait_until
from nspawn import Guest

pytestmark = [pytest.mark.systemd_boot, pytest.mark.timeout(1200)]

CHECKOUT = Path(__file__).resolve().parents[1]
GUEST_CHECKOUT = "/usr/local/src/ocrd"
# Not under /tmp: systemd-nspawn mounts a tmpfs there, hiding what the host put in.
GUEST_FILES = "/usr/local/share/ocrd-test"
README_PACKAGE = "'/path/to/ocrd[vllm]'"  # [vllm] pulls CUDA torch: not in a GPU-less guest
TEST_WATCHDOG = "[Service]\nWatchdogSec=10s\nRestartSec=1s\n"
OCRD = "/opt/ocrd/.venv/bin/ocrd"


def readme_install_lines() -> list[str]:
    """The manual's install commands (docs/systemd.md), as root needs no sudo, up to
    `enable --now`."""
    readme = (CHECKOUT / "docs" / "systemd.md").read_text()
    section = readme[readme.index("## Running as a systemd unit") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "docs/systemd.md: no sh block in 'Running as a systemd unit'"
    lines: list[str] = []
    for line in block.group(1).splitlines():
        lines.append(line.replace("sudo -u ocrd ", "runuser -u ocrd -- ").replace("sudo ", ""))
        if "enable --now ocrd" in line:
            return lines
    raise AssertionError("docs/systemd.md: the install block has no `systemctl enable --now ocrd`")


def guest_config(*more_inboxes: str) -> str:
    """The shipped systemd/ocrd.yaml with the simulated engine, quicker settling and
    draining, and more inboxes if given."""
    config = yaml.safe_load((CHECKOUT / "systemd" / "ocrd.yaml").read_text())
    config["inboxes"] += [{"path": path} for path in more_inboxes]
    for inbox in config["inboxes"]:
        inbox["settle_seconds"] = 1
    config["engine"] = {"kind": "simulated", "simulated": {"seconds_per_page": 0.5, "capacity": 1}}
    config["pipeline"] = {"shutdown_grace_seconds": 2, "rescan_interval_seconds": 5}
    return yaml.safe_dump(config)


def copy_checkout(target: Path) -> None:
    """What `pip install /path/to/ocrd` needs, and the files the README installs."""
    target.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    shutil.copytree(CHECKOUT / "ocrd", target / "ocrd", ignore=ignore)
    shutil.copytree(CHECKOUT / "systemd", target / "systemd")
    for name in ("pyproject.toml", "README.md", "config.example.yaml"):
        shutil.copy2(CHECKOUT / name, target / name)


def install_ocrd(rootfs: Path, cache: Path, installed: Path) -> list[str]:
    """The README's venv line, run before booting (it downloads from PyPI; the booted guest
    has no network); returns the other lines, to run in the booted guest. The venv is the
    same for every guest (the same Debian, the same Python, /opt/ocrd): the first guest
    makes it and leaves it in `installed`, a tar file, for the others."""
    lines = readme_install_lines()
    venv_lines = [line for line in lines if " -m venv " in line]
    assert len(venv_lines) == 1 and README_PACKAGE in venv_lines[0], venv_lines
    if installed.exists():
        unpack = ["tar", "-C", str(rootfs), "-xf", str(installed)]
        nspawn.run_host(unpack, 300, f"unpacking {installed}")
        return [line for line in lines if line not in venv_lines]
    venv_line = venv_lines[0].replace(README_PACKAGE, GUEST_CHECKOUT)
    pip_cache = cache / "pip"
    pip_cache.mkdir(parents=True, exist_ok=True)
    nspawn.trust_host_cas(rootfs)
    nspawn.run_unbooted(
        rootfs,
        f"update-ca-certificates >/dev/null 2>&1; cd {GUEST_CHECKOUT} && {venv_line}",
        binds=[(pip_cache, "/root/.cache/pip")],
    )
    pack = ["tar", "-C", str(rootfs), "-cf", str(installed), "opt/ocrd"]
    nspawn.run_host(pack, 300, "packing /opt/ocrd")
    return [line for line in lines if line not in venv_lines]


@pytest.fixture(scope="session")
def installed_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the first guest leaves /opt/ocrd for the others (tar)."""
    return tmp_path_factory.mktemp("ocrd-venv") / "opt-ocrd.tar"


@pytest.fixture(scope="module", params=sorted(nspawn.SYSTEMDS))
def guest(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    corpus: Path,
    installed_venv: Path,
) -> Iterator[Guest]:
    """A booted guest with ocrd installed, enabled and started, the README's way: one for
    each systemd in nspawn.SYSTEMDS, every test of this module run on each in turn."""
    nspawn.require_host_tools()
    cache = nspawn.cache_folder()
    tarball = nspawn.rootfs_tarball(cache, request.param)
    folder = tmp_path_factory.mktemp(f"systemd-{request.param}")
    with nspawn.unpacked_rootfs(tarball, folder / "rootfs") as rootfs:
        copy_checkout(rootfs / GUEST_CHECKOUT.lstrip("/"))
        files = rootfs / GUEST_FILES.lstrip("/")
        files.mkdir(parents=True)
        shutil.copy2(corpus / "real" / "ocrmypdf__linn.pdf", files / "letter.pdf")
        shutil.copy2(corpus / "real" / "ocrmypdf__multipage.pdf", files / "six-pages.pdf")
        remaining = install_ocrd(rootfs, cache, installed_venv)
        with nspawn.booted(rootfs, folder / "console.log") as booted:
            for line in remaining:
                if "enable --now" in line:  # the shipped configuration, with the simulated engine
                    booted.path("/etc/ocrd/config.yaml").write_text(guest_config())
                booted.sh(f"cd {GUEST_CHECKOUT} && {line}")
            yield booted


def state(guest: Guest) -> dict[str, str]:
    return guest.unit(
        "ocrd",
        "ActiveState",
        "SubState",
        "Result",
        "MainPID",
        "NRestarts",
        "ExecMainCode",
        "ExecMainStatus",
    )


def ensure_running(guest: Guest) -> int:
    """Start the unit if an earlier test left it stopped; its main PID."""
    if state(guest)["ActiveState"] != "active":
        guest.run("systemctl", "start", "ocrd")
    current = state(guest)
    assert current["ActiveState"] == "active", f"{current}\n{guest.journal('ocrd')[-3000:]}"
    return int(current["MainPID"])


def ocrd_events(guest: Guest, event: str) -> list[dict[str, Any]]:
    found = []
    for line in guest.journal("ocrd").splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("event") == event:
                found.append(record)
    return found


def wait_for_file(guest: Guest, guest_path: str, timeout: float = 60) -> Path:
    path = guest.path(guest_path)
    wait_until(path.exists, timeout, lambda: f"{guest_path}\n{guest.journal('ocrd')[-4000:]}")
    return path


def test_the_unit_comes_up_active_with_the_readme_install(
    guest: Guest, request: pytest.FixtureRequest
) -> None:
    version = guest.sh("systemctl --version").split()[1]
    assert f"[{version}]" in request.node.name, version  # the systemd this run is about
    verified = guest.run("systemd-analyze", "verify", "/etc/systemd/system/ocrd.service")
    assert verified.stderr.strip() == "", verified.stderr
    assert guest.unit("ocrd", "Type")["Type"] == "notify"
    current = state(guest)
    assert current["ActiveState"] == "active" and current["SubState"] == "running", current
    assert guest.sh("systemctl is-enabled ocrd").strip() == "enabled"
    assert ocrd_events(guest, "daemon.ready"), guest.journal("ocrd")
    assert "status=203/EXEC" not in guest.journal("ocrd")


def test_a_file_another_user_drops_into_a_subfolder_they_made_is_converted(
    guest: Guest, corpus: Path
) -> None:
    ensure_running(guest)
    guest.run("useradd", "--create-home", "--groups", "ocrd", "alice")
    guest.run(
        "runuser",
        "-u",
        "alice",
        "--",
        "sh",
        "-c",
        f"umask 022 && mkdir /srv/ocrd/inbox/alice && "
        f"cp {GUEST_FILES}/letter.pdf /srv/ocrd/inbox/alice/letter.pdf",
    )
    markdown = wait_for_file(guest, "/srv/ocrd/outbox/alice/letter.md")
    assert markdown.read_text().strip()
    done = guest.path("/srv/ocrd/done/alice/letter.pdf")
    assert done.read_bytes() == (corpus / "real" / "ocrmypdf__linn.pdf").read_bytes()
    assert files_under(guest.path("/srv/ocrd/inbox")) == []
    assert files_under(guest.path("/srv/ocrd/failed")) == []
    # What made it possible: the folder alice made carries the inbox's default ACL.
    acl = guest.sh("getfacl -p /srv/ocrd/inbox/alice")
    assert re.search(r"^group:ocrd:rwx$", acl, re.M) and re.search(r"^mask::rwx$", acl, re.M), acl


def open_files_limits(guest: Guest, pid: int) -> tuple[int, int]:
    """A process's soft and hard limits on open files, from /proc/PID/limits."""
    limits = guest.sh(f"cat /proc/{pid}/limits")
    match = re.search(r"^Max open files\s+(\d+)\s+(\d+)\s", limits, re.M)
    assert match, limits
    return int(match.group(1)), int(match.group(2))


def test_the_daemon_may_open_65536_files_or_as_many_as_the_machine_allows(guest: Guest) -> None:
    pid = ensure_running(guest)
    assert guest.unit("ocrd", "LimitNOFILE")["LimitNOFILE"] == "65536"
    # systemd cannot raise a limit above its own hard limit without CAP_SYS_RESOURCE (which
    # some CI sandboxes withhold from the container); it then grants the closest it can.
    _soft, ceiling = open_files_limits(guest, 1)
    assert open_files_limits(guest, pid) == (min(65536, ceiling),) * 2


def ocrd_status(guest: Guest) -> subprocess.CompletedProcess[str]:
    return guest.run(OCRD, "status", "--config", "/etc/ocrd/config.yaml", check=False)


def test_systemctl_reload_returns_once_the_new_configuration_is_served(guest: Guest) -> None:
    pid = ensure_running(guest)
    # Laid out as ocrd.tmpfiles lays out /srv/ocrd: only the shared inbox is the group's
    # (a work area beneath a group-writable folder is refused).
    guest.run("install", "-d", "-o", "ocrd", "-g", "ocrd", "-m", "0755", "/srv/ocrd/reports")
    guest.run("install", "-d", "-o", "ocrd", "-g", "ocrd", "-m", "2775", "/srv/ocrd/reports/inbox")
    guest.path("/etc/ocrd/config.yaml").write_text(guest_config("/srv/ocrd/reports/inbox"))
    assert ocrd_status(guest).returncode == 3  # the file lists an inbox not served yet
    reloads_before = guest.journal("ocrd").count("Reloaded ocrd.service")

    guest.run("systemctl", "reload", "ocrd")

    served = ocrd_status(guest)  # at once: systemctl waited for the reload to be done
    assert served.returncode == 0, served.stdout + served.stderr
    served_inbox = "inbox /srv/ocrd/reports/inbox (model deepseek-ocr-2): 0 waiting"
    assert served_inbox in served.stdout, served.stdout
    current = state(guest)
    assert current["ActiveState"] == "active" and int(current["MainPID"]) == pid, current
    journal = guest.journal("ocrd")
    assert "Reloading ocrd.service" in journal, journal[-3000:]
    assert journal.count("Reloaded ocrd.service") == reloads_before + 1, journal[-3000:]
    guest.run("cp", f"{GUEST_FILES}/letter.pdf", "/srv/ocrd/reports/inbox/report.pdf")
    assert wait_for_file(guest, "/srv/ocrd/reports/outbox/report.md").read_text().strip()
    assert guest.path("/srv/ocrd/reports/done/report.pdf").exists()


def test_a_refused_configuration_fails_systemctl_reload_and_ocrd_serves_on(guest: Guest) -> None:
    pid = ensure_running(guest)
    config = guest.path("/etc/ocrd/config.yaml")
    good = config.read_text()
    config.write_text(good.replace("settle_seconds", "settle_secs", 1))
    try:
        refused = guest.run("systemctl", "reload", "ocrd", check=False)
    finally:
        config.write_text(good)
    assert refused.returncode != 0, refused
    current = state(guest)
    assert current["ActiveState"] == "active" and int(current["MainPID"]) == pid, current
    journal = guest.journal("ocrd")
    assert "the configuration in use stays in effect" in journal and "settle_secs" in journal
    assert ocrd_events(guest, "config.reload_failed"), journal[-3000:]


def restart_seconds() -> float:
    """The shipped unit's RestartSec=: how long systemd waits before a restart."""
    unit = (Path(__file__).resolve().parents[1] / "systemd" / "ocrd.service").read_text()
    [seconds] = re.findall(r"^RestartSec=(\d+)$", unit, flags=re.MULTILINE)
    return float(seconds)


def test_a_misspelt_key_stops_the_unit_instead_of_restarting_it(guest: Guest) -> None:
    """A configuration error exits 78, which the unit's RestartPreventExitStatus=78 names:
    the unit stays failed, saying why, rather than restarting every RestartSec forever."""
    ensure_running(guest)
    restarts = int(state(guest)["NRestarts"])
    config = guest.path("/etc/ocrd/config.yaml")
    good = config.read_text()
    config.write_text(good.replace("settle_seconds", "settle_secs", 1))
    try:
        guest.run("systemctl", "restart", "ocrd", check=False)
        wait_until(lambda: state(guest)["ActiveState"] == "failed", 120, lambda: str(state(guest)))
        # Three restart intervals: a unit that restarts would have been started again.
        deadline = time.monotonic() + 3 * restart_seconds()
        while time.monotonic() < deadline:
            stays = state(guest)
            assert stays["ActiveState"] == "failed", f"started again: {stays}"
            time.sleep(1)
    finally:
        config.write_text(good)
        guest.run("systemctl", "reset-failed", "ocrd", check=False)
        guest.run("systemctl", "start", "ocrd")
    assert stays["ActiveState"] == "failed" and stays["ExecMainStatus"] == "78", stays
    assert int(stays["NRestarts"]) == restarts, stays
    journal = guest.journal("ocrd")
    assert "settle_secs: unknown key" in journal, journal[-3000:]


def test_a_frozen_daemon_is_restarted_by_the_watchdog(guest: Guest) -> None:
    drop_in = guest.path("/etc/systemd/system/ocrd.service.d/test-watchdog.conf")
    drop_in.parent.mkdir(parents=True, exist_ok=True)
    drop_in.write_text(TEST_WATCHDOG)
    try:
        guest.run("systemctl", "daemon-reload")
        guest.run("systemctl", "restart", "ocrd")
        assert guest.unit("ocrd", "WatchdogUSec")["WatchdogUSec"] == "10s"
        frozen = ensure_running(guest)
        restarts = int(state(guest)["NRestarts"])

        guest.run("kill", "-STOP", str(frozen))

        def restarted() -> bool:
            current = state(guest)
            return current["ActiveState"] == "active" and int(current["MainPID"]) not in (
                0,
                frozen,
            )

        wait_until(restarted, 90, lambda: f"{state(guest)}\n{guest.journal('ocrd')[-3000:]}")
        assert int(state(guest)["NRestarts"]) == restarts + 1
        assert "Watchdog timeout" in guest.journal("ocrd")
    finally:
        drop_in.unlink(missing_ok=True)
        guest.run("systemctl", "daemon-reload")
        guest.run("systemctl", "restart", "ocrd")
    assert guest.unit("ocrd", "WatchdogUSec")["WatchdogUSec"] != "10s"


def test_systemctl_stop_drains_and_loses_no_document(guest: Guest) -> None:
    ensure_running(guest)
    work = guest.path("/srv/ocrd/work")
    guest.run("cp", f"{GUEST_FILES}/six-pages.pdf", "/srv/ocrd/inbox/six-pages.pdf")
    wait_until(
        lambda: "six-pages.pdf" in claimed_originals(work),
        60,
        lambda: f"six-pages.pdf claimed\n{guest.journal('ocrd')[-3000:]}",
    )

    guest.run("systemctl", "stop", "ocrd", timeout=180)

    current = state(guest)
    where = f"{files_under(guest.path('/srv/ocrd'))}\n{guest.journal('ocrd')[-4000:]}"
    assert current["ActiveState"] == "inactive", f"{current}\n{where}"
    assert current["Result"] == "success" and current["ExecMainStatus"] == "0", current
    if guest.path("/srv/ocrd/done/six-pages.pdf").exists():
        assert guest.path("/srv/ocrd/outbox/six-pages.md").exists(), where
    else:
        assert "six-pages.pdf" in claimed_originals(work), where
    assert "six-pages.pdf" not in files_under(guest.path("/srv/ocrd/inbox"))
    assert files_under(guest.path("/srv/ocrd/failed")) == []

    # A document left claimed is finished by the next start.
    guest.run("systemctl", "start", "ocrd")
    wait_for_file(guest, "/srv/ocrd/done/six-pages.pdf")
    assert guest.path("/srv/ocrd/outbox/six-pages.md").read_text().strip()
    assert "six-pages.pdf" not in claimed_originals(work)
