"""Storage faults on real filesystems: a full disk and a read-only one are waited out with the
original safe in the work area; names an SMB or FAT target refuses get safe names instead of
stalling the daemon. Every run ends with the invariant check of scripts/check_invariants.py."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import files_under, markdown_under, wait_until, write_config
from helpers import make_pdf
from mounts import fill, set_read_only, smb_like, tmpfs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from check_invariants import check

pytestmark = [pytest.mark.slow, pytest.mark.mounts]


def drop(inbox: Path, inputs: Path, name: str, pages: int = 2) -> None:
    """Make a PDF in `inputs` (the record of what was dropped) and copy it into the inbox."""
    inputs.mkdir(exist_ok=True)
    make_pdf(inputs / name, pages, label=name)
    shutil.copy(inputs / name, inbox / ".incoming")
    (inbox / ".incoming").rename(inbox / name)


def assert_invariants(data: Path, inputs: Path) -> dict[str, int]:
    problems, summary = check(
        inputs, data / "inbox", data / "outbox", data / "done", data / "failed", data / "work"
    )
    assert problems == [], "\n".join(problems)
    return summary


def test_a_full_outbox_is_waited_out_and_every_file_ends_once(
    tmp_path: Path, start_daemon, notify_socket
) -> None:
    data, inputs = tmp_path / "data", tmp_path / "inputs"
    config = write_config(tmp_path)
    with tmpfs(data / "outbox", "4m") as outbox:
        filler = fill(outbox)
        daemon = start_daemon(config, env={"NOTIFY_SOCKET": str(notify_socket.path)})
        daemon.wait_for("daemon.ready")
        for index in range(4):
            drop(data / "inbox", inputs, f"doc{index}.pdf")
        [fault, *_] = daemon.wait_for("storage.fault", timeout=60)
        assert "ENOSPC" in fault["error"]
        wait_until(lambda: any("STORAGE FAULT" in m for m in notify_socket.messages), 60, "STATUS")
        assert len([p for p in files_under(data / "work") if p.endswith(".pdf")]) == 4
        assert files_under(data / "done") == []

        filler.unlink()  # an operator frees space: ocrd carries on by itself
        finished = daemon.wait_for("document.finished", timeout=120, count=4)
        assert daemon.find("storage.recovered")
        assert daemon.stop() == 0
        assert {event["outcome"] for event in finished} == {"done"}
        assert markdown_under(outbox) == [f"doc{index}.md" for index in range(4)]
        summary = assert_invariants(data, inputs)
    assert summary["done"] == 4


def test_a_read_only_outbox_is_waited_out(tmp_path: Path, start_daemon) -> None:
    data, inputs = tmp_path / "data", tmp_path / "inputs"
    config = write_config(tmp_path)
    with tmpfs(data / "outbox", "16m") as outbox:
        daemon = start_daemon(config)
        daemon.wait_for("daemon.ready")
        set_read_only(outbox, True)  # the share went read-only while ocrd ran
        drop(data / "inbox", inputs, "report.pdf", pages=3)
        [fault, *_] = daemon.wait_for("storage.fault", timeout=60)
        assert "EROFS" in fault["error"]
        set_read_only(outbox, False)
        [summary] = daemon.wait_for("document.finished", timeout=120)
        assert daemon.stop() == 0
        assert summary["outcome"] == "done"
        assert markdown_under(outbox) == ["report.md"]
        assert_invariants(data, inputs)


def test_names_an_smb_share_refuses_get_safe_names_and_nothing_stalls(
    tmp_path: Path, start_daemon
) -> None:
    """Outbox, done/ and failed/ on a share that refuses `:` and `?` (EINVAL): such files
    are stored under safe names, matching between done/ and the outbox, the summary and
    the log say so, and a corrupt file with such a name still reaches failed/."""
    data, inputs = tmp_path / "data", tmp_path / "inputs"
    with smb_like(tmp_path / "share") as share:
        folders = {role: str(share / role) for role in ("outbox", "done", "failed")}
        config = write_config(tmp_path, folders, pipeline={"max_documents_in_flight": 2})
        daemon = start_daemon(config)
        daemon.wait_for("daemon.ready")
        refused = ["invoice 3:4?.pdf", "a<b>.pdf", "what?.pdf"]
        for name in [*refused, "plain.pdf"]:
            drop(data / "inbox", inputs, name)
        (inputs / "broken:1.pdf").write_text("not a PDF at all")
        shutil.copy(inputs / "broken:1.pdf", data / "inbox" / "broken:1.pdf")
        finished = daemon.wait_for("document.finished", timeout=120, count=5)
        assert daemon.stop() == 0

        by_path = {event["path"]: event for event in finished}
        for name in refused:
            assert by_path[name]["outcome"] == "done" and by_path[name]["renamed"] == "safe"
        assert by_path["plain.pdf"]["outcome"] == "done" and "renamed" not in by_path["plain.pdf"]
        assert by_path["broken:1.pdf"]["outcome"] == "failed"
        assert by_path["broken:1.pdf"]["stage"] == "detect"
        assert daemon.find("storage.name_refused")

        done = files_under(share / "done")
        assert len(done) == 4 and "plain.pdf" in done
        assert all(":" not in name and "?" not in name and "<" not in name for name in done)
        stems = {Path(name).stem for name in done}
        assert {Path(name).stem for name in markdown_under(share / "outbox")} == stems
        [report] = (share / "failed").glob("*.error.json")
        assert "not a PDF" in json.loads(report.read_text())["message"]
        problems, _ = check(
            inputs,
            data / "inbox",
            share / "outbox",
            share / "done",
            share / "failed",
            data / "work",
        )
        assert problems == [], "\n".join(problems)
