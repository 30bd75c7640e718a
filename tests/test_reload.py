"""SIGHUP re-reads the configuration without reloading the engine, as `systemctl reload`
does with Type=notify-reload: inboxes come and go, engine changes are refused, an invalid
file keeps the old configuration, and systemd hears RELOADING=1 then READY=1."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import yaml
from conftest import files_under, wait_until, write_config
from helpers import make_pdf

from ocrd.config import Config, InboxConfig, parse_config
from ocrd.config.reload import plan_reload

pytestmark = pytest.mark.slow


def reload(daemon, count: int) -> None:  # type: ignore[no-untyped-def]
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_for("config.reloaded", timeout=30, count=count)


def test_reload_adds_and_removes_inboxes_and_refuses_engine_changes(
    tmp_path: Path, start_daemon, notify_socket
) -> None:
    config = write_config(tmp_path)
    data = yaml.safe_load(config.read_text())
    daemon = start_daemon(config, env={"NOTIFY_SOCKET": str(notify_socket.path)})
    daemon.wait_for("daemon.ready")
    make_pdf(tmp_path / "data" / "inbox" / "first.pdf", 1)
    daemon.wait_for("document.finished", path="first.pdf")

    # A second inbox with its own folders, and an engine change that needs a restart.
    (tmp_path / "scans" / "inbox").mkdir(parents=True)
    data["inboxes"].append({"path": "scans/inbox", "settle_seconds": 0.5, "layout_file": True})
    data["engine"]["simulated"]["seconds_per_page"] = 0.01
    config.write_text(yaml.safe_dump(data))
    messages_before = len(notify_socket.messages)
    reload(daemon, 1)
    [reloaded] = daemon.find("config.reloaded")
    assert reloaded["added"] == [str(tmp_path / "scans" / "inbox")]
    [refused] = daemon.find("config.reload_refused")
    assert refused["reason"].startswith("engine:") and "restart" in refused["reason"]
    make_pdf(tmp_path / "scans" / "inbox" / "second.pdf", 2)
    daemon.wait_for("document.finished", path="second.pdf")
    assert (tmp_path / "scans" / "outbox" / "second.layout.json").is_file()
    wait_until(
        lambda: any(m.startswith("READY=1") for m in notify_socket.messages[messages_before:]),
        10,
        "READY=1 after the reload",
    )
    after = notify_socket.messages[messages_before:]
    reloading = next(i for i, m in enumerate(after) if m.startswith("RELOADING=1"))
    ready = next(i for i, m in enumerate(after) if m.startswith("READY=1"))
    assert reloading < ready and "MONOTONIC_USEC=" in after[reloading]

    # An invalid file changes nothing: the reason is logged and both inboxes keep working.
    config.write_text(config.read_text().replace("settle_seconds", "settle_secs", 1))
    daemon.process.send_signal(signal.SIGHUP)
    [failed] = daemon.wait_for("config.reload_failed", timeout=30)
    assert "settle_secs" in failed["reason"] and "unknown key" in failed["reason"]
    make_pdf(tmp_path / "data" / "inbox" / "third.pdf", 1)
    daemon.wait_for("document.finished", path="third.pdf")

    # Removing the first inbox: it is no longer watched; files dropped there stay there.
    data["inboxes"] = data["inboxes"][1:]
    config.write_text(yaml.safe_dump(data))
    reload(daemon, 2)
    assert daemon.find("config.reloaded")[-1]["removed"] == [str(tmp_path / "data" / "inbox")]
    make_pdf(tmp_path / "data" / "inbox" / "ignored.pdf", 1)
    make_pdf(tmp_path / "scans" / "inbox" / "fourth.pdf", 1)
    daemon.wait_for("document.finished", path="fourth.pdf")
    assert daemon.stop() == 0
    assert files_under(tmp_path / "data" / "inbox") == ["ignored.pdf"]
    assert sorted(files_under(tmp_path / "data" / "done")) == ["first.pdf", "third.pdf"]
    assert sorted(files_under(tmp_path / "scans" / "done")) == ["fourth.pdf", "second.pdf"]


def config_of(**changes: object) -> Config:
    data = {
        "inboxes": [{"path": "/srv/a/inbox"}, {"path": "/srv/b/inbox"}],
        "pipeline": {"max_pages_in_flight": 64},
    }
    data.update(changes)
    return parse_config(data, Path("/"))


def test_a_reload_plan_applies_what_can_change_and_keeps_what_needs_a_restart() -> None:
    old = config_of()
    new = config_of(
        inboxes=[{"path": "/srv/b/inbox", "dpi": 200}, {"path": "/srv/c/inbox"}],
        pipeline={"max_pages_in_flight": 128, "page_retries": 5},
        engine={"kind": "rapidocr"},
        http={"listen": "127.0.0.1:9999"},
    )
    plan = plan_reload(old, new)
    assert [i.path for i in plan.added] == [Path("/srv/c/inbox")]
    assert plan.removed == [Path("/srv/a/inbox")]
    assert [i.path for i in plan.changed] == [Path("/srv/b/inbox")]
    assert isinstance(plan.changed[0], InboxConfig) and plan.changed[0].dpi == 200
    assert plan.http_changed
    assert plan.config.engine == old.engine  # refused: needs a restart
    assert plan.config.pipeline.max_pages_in_flight == 64  # refused
    assert plan.config.pipeline.page_retries == 5  # applied
    assert sorted(line.split(":")[0] for line in plan.refused) == [
        "engine",
        "pipeline.max_pages_in_flight",
    ]
