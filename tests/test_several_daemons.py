"""Several daemons on one shared inbox, each a separate `ocrd run` with its own
`OCRD_INSTANCE`: killed (and restarted or not), paused past their lease, started together,
stopped cleanly; on a local folder and on a FUSE mount that behaves like an NFS share.
Every document ends exactly once; nothing a daemon that took over wrote is touched by the
one it took over from."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import DaemonProcess, claims_left, markdown_under, wait_until, write_config
from helpers import make_pdf
from mounts import network_share
from test_http import base_url, metric

from ocrd.sharing.instances import TAKEOVER_GRACE_SECONDS
from ocrd.status import StatusReport
from ocrd.web.client import format_status

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from check_invariants import check
from kill_loop import shared_kill_loop

pytestmark = pytest.mark.slow

LEASE = 3.0  # seconds: a daemon that died is taken over within a few seconds
SETTLE = 0.2  # settle_seconds of the shared inbox
RESCAN = 1.0  # pipeline.rescan_interval_seconds
IN_FLIGHT = 4  # pipeline.max_documents_in_flight
# Every wait below is a step's time by the settings above, times this: CI ran these tests
# on 2 cores at a load of 9 to 13. A wait only bounds a failing test; passing ones go on
# the moment the event comes.
PATIENCE = 20
# What no setting bounds: an `ocrd run` starting (Python, its imports, the simulated
# engine) and taking its lease, on such a loaded machine.
STARTING = 120.0


def patient(seconds: float) -> float:
    """How long to wait for a step the settings say takes `seconds`."""
    return PATIENCE * seconds


def claiming(lease: float = LEASE) -> float:
    """From a file dropped (or a daemon ready) to its document started: settled, found by
    the watcher or at the latest by a rescan, claimed under a lease renewed in time."""
    return patient(SETTLE + RESCAN + lease)


def converting(documents: int, pages: int, seconds_per_page: float) -> float:
    """Every document of a batch settled, counted as if pages went one at a time."""
    return patient(documents * (pages * seconds_per_page + SETTLE) + RESCAN)


def taking_over(lease: float = LEASE) -> float:
    """A dead daemon's lease expired (a lease after its last renewal) and seen by another
    at its next renewal (a ninth of a lease later)."""
    return patient(lease + lease / 9)


def shared_config(
    folder: Path, seconds_per_page: float = 0.2, lease: float = LEASE, **inbox: Any
) -> Path:
    """One inbox for several daemons (the same file for all, as on several hosts)."""
    return write_config(
        folder,
        {"settle_seconds": SETTLE, **inbox},
        engine={"kind": "simulated", "simulated": {"seconds_per_page": seconds_per_page}},
        pipeline={"max_documents_in_flight": IN_FLIGHT, "rescan_interval_seconds": RESCAN},
        instances={"lease_seconds": lease},
    )


def drop(inbox: Path, inputs: Path, count: int, pages: int, prefix: str = "doc") -> list[str]:
    """`count` PDFs into the inbox (each also kept in `inputs`, for the invariants)."""
    inputs.mkdir(parents=True, exist_ok=True)
    names = []
    for index in range(count):
        name = f"{prefix}{index:03d}.pdf"
        make_pdf(inputs / name, pages, label=f"{prefix} {index}")
        shutil.copy(inputs / name, inbox / f".{name}.part")
        (inbox / f".{name}.part").rename(inbox / name)
        names.append(name)
    return names


def settled(data: Path) -> int:
    return sum(1 for _ in (data / "done").glob("*.pdf")) + sum(
        1 for _ in (data / "failed").glob("*.pdf")
    )


def assert_every_document_once(data: Path, inputs: Path) -> None:
    problems, summary = check(
        inputs, data / "inbox", data / "outbox", data / "done", data / "failed", data / "work"
    )
    assert problems == [], "\n".join(problems)
    assert summary["done"] == summary["inputs"] == summary["markdown"]
    assert claims_left(data / "work") == []


def snapshot(*folders: Path) -> dict[str, tuple[int, int, str]]:
    """Every file under the folders: inode, modification time and content digest."""
    found = {}
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                info = path.stat()
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                found[str(path)] = (info.st_ino, info.st_mtime_ns, digest)
    return found


def claims_holding_originals(folder: Path) -> set[str]:
    """The claims in an instance's folder that a restart recovers: those that hold their
    original. A daemon killed between making a claim folder and renaming the file into it
    leaves an empty folder, which its restart removes (the file is still in the inbox)."""
    return {
        claim.name
        for claim in folder.iterdir()
        if not claim.name.startswith(".")
        and any(
            not part.startswith(".")
            for path in claim.rglob("*")
            if path.is_file()
            for part in path.relative_to(claim).parts[:1]
        )
    }


def _instances(url: str) -> list[Any]:
    report = StatusReport.model_validate(httpx.get(f"{url}/api/status").json())
    return [row for row in report.inboxes[0].instances if row.alive] if report.inboxes else []


@pytest.fixture
def instance(start_daemon: Callable[..., DaemonProcess]) -> Callable[[Path, str], DaemonProcess]:
    def start(config: Path, name: str) -> DaemonProcess:
        return start_daemon(config, {"OCRD_INSTANCE": name})

    return start


@pytest.mark.parametrize(("daemons", "kills"), [(2, 10), (3, 14)])
def test_several_daemons_killed_at_random_convert_200_documents_exactly_once(
    tmp_path: Path, daemons: int, kills: int
) -> None:
    """Any of them SIGKILLed every 0.2 to 2 s, restarted at once, later or never; the last
    ones killed stay dead and are taken over."""
    result = shared_kill_loop(tmp_path, daemons, kills, 200, seed=daemons, lease_seconds=LEASE)
    print(json.dumps({k: v for k, v in result.items() if k != "problems"}))
    assert result["problems"] == [], "\n".join(result["problems"])  # type: ignore[arg-type]
    assert result["final_exit_codes"] and not any(result["final_exit_codes"])  # type: ignore[arg-type]
    late = 10 * daemons  # dropped before the last kills, so that the last victims hold claims
    assert result["inputs"] == result["expected_inputs"] == 205 + late
    assert result["done"] == result["markdown"] == 202 + late and result["failed"] == 3
    assert result["set_aside"] == 0  # a kill is no evidence against a document
    assert result["left_dead"] and result["takeovers"] >= len(result["left_dead"])  # type: ignore[arg-type]
    assert result["documents_taken_over"] >= 1  # the last ones killed held claims


def test_a_killed_daemons_documents_are_taken_over_and_its_peer_shows_it(
    tmp_path: Path, instance: Callable[[Path, str], DaemonProcess]
) -> None:
    config = shared_config(tmp_path)
    data, inputs = tmp_path / "data", tmp_path / "inputs"
    gpu1, gpu2 = instance(config, "gpu1"), instance(config, "gpu2")
    for daemon in (gpu1, gpu2):
        daemon.wait_for("daemon.ready", timeout=STARTING)
    url = base_url(gpu2)
    wait_until(lambda: len(_instances(url)) == 2, patient(LEASE), "each daemon seeing the other")
    time.sleep(LEASE)  # past gpu2's first seconds (a lease, here), when it takes nothing over
    drop(data / "inbox", inputs, 24, pages=6)
    gpu1.wait_for("document.started", count=3, timeout=claiming())
    gpu1.kill()
    killed_at = time.monotonic()
    held = sorted(os.listdir(data / "work" / "gpu1"))
    assert held
    [takeover] = gpu2.wait_for("instance.took_over", from_instance="gpu1", timeout=taking_over())
    took = time.monotonic() - killed_at
    # Not before a whole lease after its last renewal; soon after it (a look), also on a
    # loaded machine: far from the default lease of 90 s.
    assert LEASE - 1 < took < LEASE + 20
    assert sorted(takeover["claims"]) == held  # exactly what gpu1 held
    assert takeover["lease_age_seconds"] > LEASE  # the age the rule decided on
    taken = {e["doc"] for e in gpu2.find("document.taken_over", from_instance="gpu1")}
    assert taken and taken <= set(held)  # (a claim settled just before the kill has no doc)
    wait_until(lambda: settled(data) == 24, converting(24, 6, 0.2), "every document settled")
    assert all(e["alone"] is False for e in gpu2.find("document.started"))  # no blame for it

    report = StatusReport.model_validate(httpx.get(f"{url}/api/status").json())
    rows = {row.name: row for row in report.inboxes[0].instances}
    assert report.instance == "gpu2" and rows["gpu2"].this and rows["gpu2"].alive
    assert rows["gpu1"].taken_over == len(held) and not rows["gpu1"].alive
    text = format_status(report)  # what `ocrd status` prints
    assert f"daemon gpu1: gone, 0 claims, {len(held)} taken over by this one" in text
    page = httpx.get(url).text
    assert "Daemons on this inbox" in page and "gpu1" in page
    metrics = httpx.get(f"{url}/metrics").text
    inbox = str(data / "inbox")
    taken_metric = metric(
        metrics, "ocrd_claims_taken_over_total", inbox=inbox, from_instance="gpu1"
    )
    assert taken_metric == len(held)
    assert metric(metrics, "ocrd_instance_up", inbox=inbox, instance="gpu2") == 1
    assert gpu2.stop() == 0
    assert_every_document_once(data, inputs)


def test_a_daemon_paused_past_its_lease_writes_nothing_after_it_is_continued(
    tmp_path: Path, instance: Callable[[Path, str], DaemonProcess]
) -> None:
    """SIGSTOP at three moments while it converts, each time for two leases: the other
    daemon takes its documents over and finishes them; continued, the paused one gives them
    up without writing a byte, takes a new lease and works on."""
    config = shared_config(tmp_path, seconds_per_page=0.1)
    data, inputs = tmp_path / "data", tmp_path / "inputs"
    slow, other = instance(config, "slow"), instance(config, "other")
    for daemon in (slow, other):
        daemon.wait_for("daemon.ready", timeout=STARTING)
    time.sleep(LEASE)  # past the other's first seconds (a lease), when it takes nothing over
    total = 0
    for round_, delay in enumerate((0.2, 0.9, 1.7)):
        started = len(slow.find("document.started"))
        total += len(drop(data / "inbox", inputs, 12, pages=6, prefix=f"r{round_}-"))
        slow.wait_for("document.started", count=started + 1, timeout=claiming())
        time.sleep(delay)
        slow.process.send_signal(signal.SIGSTOP)
        try:
            other.wait_for("instance.took_over", count=round_ + 1, timeout=taking_over())
            wait_until(
                lambda expected=total: settled(data) == expected,  # type: ignore[misc]
                converting(12, 6, 0.1),
                "the round settled by the other",
            )
            time.sleep(LEASE / 6)  # for a write under way to end
            before = snapshot(data / "outbox", data / "done", data / "failed")
        finally:
            slow.process.send_signal(signal.SIGCONT)
        slow.wait_for("instance.lease_lost", count=round_ + 1, timeout=taking_over())
        slow.wait_for("instance.lease_acquired", count=round_ + 2, timeout=taking_over())
        time.sleep(LEASE / 3)  # three renewals: time for any late write
        after = snapshot(data / "outbox", data / "done", data / "failed")
        assert after == before, "the paused daemon wrote after it was continued"
    lost = slow.find("instance.lease_lost")
    assert any(e["documents_given_up"] for e in lost)  # it had documents in flight
    assert slow.find("document.given_up")
    assert len(markdown_under(data / "outbox")) == total

    drop(data / "inbox", inputs, 4, pages=2, prefix="after-")
    wait_until(
        lambda: settled(data) == total + 4,
        claiming() + converting(4, 2, 0.1),
        "new files after the pauses",
    )
    assert slow.stop() == 0 and other.stop() == 0
    assert_every_document_once(data, inputs)


def test_two_daemons_starting_together_take_back_only_their_own_claims(
    tmp_path: Path, instance: Callable[[Path, str], DaemonProcess]
) -> None:
    """Started at the same moment, each takes nothing over in its first seconds
    (`TAKEOVER_GRACE_SECONDS`, or a lease if that is shorter): the lease here is that long,
    so that one daemon starting late on a loaded machine still takes its own claims back
    before the other could take them over."""
    lease = TAKEOVER_GRACE_SECONDS
    config = shared_config(tmp_path, seconds_per_page=0.5, lease=lease)
    data, inputs = tmp_path / "data", tmp_path / "inputs"
    first = {name: instance(config, name) for name in ("a", "b")}
    for daemon in first.values():
        daemon.wait_for("daemon.ready", timeout=STARTING)
    drop(data / "inbox", inputs, 12, pages=8)
    for daemon in first.values():
        daemon.wait_for("document.started", count=2, timeout=claiming(lease))
    for daemon in first.values():
        daemon.kill()
    held = {name: claims_holding_originals(data / "work" / name) for name in first}
    assert all(held.values())
    time.sleep(lease + 1)  # both leases expired: either could take the other's claims

    again = {name: instance(config, name) for name in ("a", "b")}  # at the same moment
    for name, daemon in again.items():
        [acquired] = daemon.wait_for("instance.lease_acquired", timeout=STARTING)
        assert acquired["taken_back"] == 1
        recovered = daemon.wait_for("document.recovered", count=len(held[name]), timeout=STARTING)
        assert {e["doc"] for e in recovered} == held[name]
    wait_until(lambda: settled(data) == 12, converting(12, 8, 0.5), "every document settled")
    for daemon in again.values():
        assert not daemon.find("instance.took_over") and not daemon.find("document.taken_over")
        assert daemon.stop() == 0
    assert_every_document_once(data, inputs)


def test_a_daemon_stopped_cleanly_hands_its_unfinished_document_over_at_once(
    tmp_path: Path, instance: Callable[[Path, str], DaemonProcess]
) -> None:
    """With a 90 s lease: the other daemon takes the document over within seconds of the
    clean stop, and does not recognise again the pages already journaled."""
    config = write_config(
        tmp_path,
        {"settle_seconds": 0.2},
        engine={"kind": "simulated", "simulated": {"seconds_per_page": 0.4, "capacity": 1}},
        pipeline={"shutdown_grace_seconds": 0.5},
    )
    data = tmp_path / "data"
    leaving = instance(config, "leaving")
    leaving.wait_for("daemon.ready", timeout=STARTING)
    make_pdf(data / "inbox" / ".book.part", 60)
    (data / "inbox" / ".book.part").rename(data / "inbox" / "book.pdf")
    leaving.wait_for("document.started", timeout=claiming())
    staying = instance(config, "staying")
    staying.wait_for("daemon.ready", timeout=STARTING)
    time.sleep(TAKEOVER_GRACE_SECONDS + 1)  # past its first seconds: it takes nothing over
    stopped_at = time.monotonic()
    assert leaving.stop() == 0
    [released] = leaving.find("instance.lease_released")
    assert released["claims_left"] == 1
    [taken] = staying.wait_for("document.taken_over", timeout=taking_over())
    # at once on a clean stop, not after a lease (90 s here), also on a loaded machine
    assert time.monotonic() - stopped_at < 45 and taken["path"] == "book.pdf"
    [summary] = staying.wait_for("document.finished", timeout=converting(1, 60, 0.4))
    [opened] = staying.find("document.opened")
    recognised_before = len(leaving.find("page.recognised"))
    assert recognised_before > 10
    assert opened["resumed_pages"] >= recognised_before - 1  # one may be cut off unjournaled
    assert len(staying.find("page.recognised")) == 60 - opened["resumed_pages"]
    assert summary["outcome"] == "done" and summary["pages"] == 60
    assert staying.stop() == 0
    assert markdown_under(data / "outbox") == ["book.md"]


def test_a_second_daemon_under_the_same_instance_name_refuses_to_start(
    tmp_path: Path, instance: Callable[[Path, str], DaemonProcess]
) -> None:
    config = shared_config(tmp_path)
    first = instance(config, "twin")
    first.wait_for("daemon.ready", timeout=STARTING)
    second = instance(config, "twin")
    assert second.process.wait(timeout=STARTING) == 78
    [refused] = second.find("startup.refused")
    assert "another daemon holds the lease of instance twin" in refused["reason"]
    assert f"pid {first.process.pid}" in refused["reason"] and "OCRD_INSTANCE" in refused["reason"]
    make_pdf(tmp_path / "data" / "inbox" / "still.pdf", 1)
    first.wait_for(
        "document.finished", path="still.pdf", timeout=claiming() + converting(1, 1, 0.2)
    )
    assert not first.find("instance.lease_lost")
    assert first.stop() == 0


@pytest.mark.mounts
def test_two_daemons_on_a_network_like_share_with_lost_replies_and_a_skewed_clock(
    tmp_path: Path, instance: Callable[[Path, str], DaemonProcess]
) -> None:
    """Inbox, outputs and work area on a FUSE mount that behaves like NFS: every seventh
    rename or link answers "no such file" or "file exists" although it was done, the
    server's clock is two hours ahead of the hosts', and files written to the share by
    another host raise no inotify event. One daemon is killed half way."""
    backing, counts = tmp_path / "backing", tmp_path / "counts.json"
    with network_share(
        backing, tmp_path / "share", lost_replies=7, clock_offset=7200, counts=counts
    ) as share:
        config = shared_config(share, seconds_per_page=0.1, poll_interval_seconds=0.5)
        data, inputs = share / "data", tmp_path / "inputs"
        one, two = instance(config, "host1"), instance(config, "host2")
        for daemon in (one, two):
            daemon.wait_for("daemon.ready", timeout=STARTING)
            [watching] = daemon.find("inbox.watching")
            assert watching["polling"] is True and "fuse.netfs" in watching["reason"]
        # Another host drops the files: straight into the server's folder.
        drop(backing / "data" / "inbox", inputs, 30, pages=2)
        one.wait_for("document.finished", count=3, timeout=claiming() + converting(3, 2, 0.1))
        one.kill()
        [takeover] = two.wait_for(
            "instance.took_over", from_instance="host1", timeout=taking_over()
        )
        assert LEASE < takeover["lease_age_seconds"] < LEASE + 30  # not two hours
        wait_until(lambda: settled(data) == 30, converting(30, 2, 0.1), "every document settled")
        assert two.stop() == 0
        lost = json.loads(counts.read_text())
        assert lost["rename"] > 0 and lost["link"] > 0
        for daemon in (one, two):  # a retried request that was done is no failure
            for event in ("storage.fault", "file.claim_failed", "document.internal_error"):
                assert not daemon.find(event), daemon.find(event)
        assert_every_document_once(data, inputs)
