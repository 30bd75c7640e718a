"""StrictModes, as sshd's: a configuration file, or a hook program or script it names, that
others than ocrd's user and root may change is refused by `ocrd check-config` and `ocrd run`
(exit 78, naming the file, who may write it and what to do); a reload keeps the
configuration in use, and a hook made writable by others after the start is not run.
Real files, real modes, real users (tests/users.py) and a real daemon (simulated engine)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import write_config
from helpers import make_pdf
from users import PEOPLE, SERVICE, SHARE, ensure_users, give, uid

from ocrd.files.permissions import others_may_write

OUTSIDER = PEOPLE[0]


def ocrd(*args: str, **options: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocrd", *args],
        capture_output=True,
        text=True,
        timeout=120,
        **options,
    )


def hook_script(folder: Path, marker: Path) -> Path:
    script = folder / "hook.sh"
    script.write_text(f"#!/bin/sh\necho ran >> {marker}\n")
    script.chmod(0o755)
    return script


def config_with_hook(folder: Path, command: list[str]) -> Path:
    return write_config(folder, {"hooks": {"on_done": {"command": command}}})


def test_a_safe_configuration_and_hook_pass(tmp_path: Path) -> None:
    """The control: the same files, writable by root alone, are accepted."""
    config = config_with_hook(tmp_path, ["/bin/sh", str(hook_script(tmp_path, tmp_path / "m"))])
    checked = ocrd("check-config", "--config", str(config))
    assert checked.returncode == 0, checked.stderr


@pytest.mark.parametrize(
    ("make_unsafe", "who"),
    [
        (lambda config: config.chmod(0o664), "its group may write it"),
        (lambda config: config.chmod(0o646), "everyone may write it"),
        (lambda config: config.parent.chmod(0o757), "a folder on its way: everyone may write it"),
    ],
    ids=["group-writable", "world-writable", "in-a-world-writable-folder"],
)
def test_a_configuration_others_may_change_is_refused_by_check_config_and_run(
    tmp_path: Path, make_unsafe: Any, who: str
) -> None:
    folder = tmp_path / "etc"
    folder.mkdir()
    config = write_config(folder)
    make_unsafe(config)

    for command in (("check-config",), ("run", "--log-format", "json")):
        result = ocrd(*command, "--config", str(config))
        assert result.returncode == 78, (command, result.stderr)
        assert f"configuration file {config} may be changed by others" in result.stderr
        assert who in result.stderr and "chmod go-w" in result.stderr


@pytest.mark.users
def test_a_configuration_another_user_owns_is_refused(tmp_path: Path) -> None:
    ensure_users()
    config = write_config(tmp_path)
    give(config, OUTSIDER, 0o644)

    result = ocrd("check-config", "--config", str(config))

    assert result.returncode == 78, result.stderr
    assert f"it belongs to {OUTSIDER}" in result.stderr and f"chown root {config}" in (
        result.stderr
    )


@pytest.mark.parametrize("as_program", [False, True], ids=["script-of-sh", "program"])
def test_a_hook_others_may_change_is_refused(tmp_path: Path, as_program: bool) -> None:
    script = hook_script(tmp_path, tmp_path / "marker")
    script.chmod(0o757 if as_program else 0o775)
    command = [str(script)] if as_program else ["/bin/sh", str(script)]
    config = config_with_hook(tmp_path, command)

    for run in (("check-config",), ("run", "--log-format", "json")):
        result = ocrd(*run, "--config", str(config))
        assert result.returncode == 78, (run, result.stderr)
        assert f"hook program (inboxes[0].hooks.on_done.command) {script}" in result.stderr
        why = "everyone may write it" if as_program else "its group may write it"
        assert why in result.stderr
    assert not (tmp_path / "marker").exists()


def test_a_reload_refuses_an_unsafe_config_or_hook_and_keeps_the_old(
    tmp_path: Path, start_daemon: Any
) -> None:
    marker = tmp_path / "marker"
    config = config_with_hook(tmp_path, ["/bin/sh", str(hook_script(tmp_path, marker))])
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready")

    unsafe = tmp_path / "unsafe.sh"
    unsafe.write_text(f"#!/bin/sh\necho unsafe >> {marker}\n")
    unsafe.chmod(0o757)
    data = yaml.safe_load(config.read_text())
    data["inboxes"][0]["hooks"]["on_done"]["command"] = ["/bin/sh", str(unsafe)]
    config.write_text(yaml.safe_dump(data))
    daemon.process.send_signal(signal.SIGHUP)
    [failed] = daemon.wait_for("config.reload_failed")
    assert f"hook program (inboxes[0].hooks.on_done.command) {unsafe}" in failed["reason"]
    assert "everyone may write it" in failed["reason"]

    unsafe.chmod(0o755)  # the hook made safe, but now the file itself is not
    config.chmod(0o666)
    daemon.process.send_signal(signal.SIGHUP)
    [_, second] = daemon.wait_for("config.reload_failed", count=2)
    assert f"configuration file {config}" in second["reason"]

    make_pdf(tmp_path / "data" / "inbox" / "letter.pdf", 1)
    daemon.wait_for("hook.finished")
    assert marker.read_text() == "ran\n"  # the hook of the configuration in use
    assert daemon.stop() == 0


def test_a_hook_made_writable_by_others_after_the_start_is_not_run(
    tmp_path: Path, start_daemon: Any
) -> None:
    marker = tmp_path / "marker"
    script = hook_script(tmp_path, marker)
    daemon = start_daemon(config_with_hook(tmp_path, [str(script)]))
    daemon.wait_for("daemon.ready")
    script.chmod(0o757)

    make_pdf(tmp_path / "data" / "inbox" / "letter.pdf", 1)

    [failed] = daemon.wait_for("hook.failed")
    assert f"hook program {script}" in failed["error"] and "everyone may write" in failed["error"]
    assert (tmp_path / "data" / "done" / "letter.pdf").exists()
    assert not marker.exists()
    assert daemon.stop() == 0


@pytest.mark.users
def test_a_configuration_its_user_cannot_read_exits_78_naming_the_file(
    shared_root: Path,
) -> None:
    """ocrd's service user meets a configuration only root may read: a configuration error
    (78, which systemd does not restart), not a crash."""
    ensure_users()
    os.chmod(shared_root, 0o755)
    config = write_config(shared_root)
    config.chmod(0o600)
    from users import service_runtime

    with service_runtime() as runtime:
        result = runtime.run_as_service(runtime.command("check-config", "--config", str(config)))
    assert result.returncode == 78, result.stderr
    assert f"{config}: cannot read the configuration file (Permission denied)" in result.stderr


@pytest.mark.users
def test_a_configuration_writable_by_its_owners_private_group_is_accepted(
    tmp_path: Path,
) -> None:
    """A user private group (Debian's and Ubuntu's one group per user, files made with
    umask 002) lets nobody else write: the service user's configuration 0664 in its own
    group is accepted, as Debian's sshd accepts it, and refused once in the people's group."""

    ensure_users()
    config = tmp_path / "config.yaml"
    config.write_text("inboxes: []\n")
    give(config, SERVICE, 0o664, group=SERVICE)
    assert others_may_write(config, os.lstat(config), uid(SERVICE)) is None
    give(config, SERVICE, 0o664, group=SHARE)
    assert others_may_write(config, os.lstat(config), uid(SERVICE)) == "its group may write it"
