"""Leases on a shared work area by themselves (`ocrd/sharing/leases.py`,
`ocrd/sharing/instances.py`): real files and folders, real processes racing; lease ages set
by giving a lease file an older modification time, which is all a lease's age is.
Milliseconds each, but for the FUSE share."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mounts import network_share

from ocrd.config import InboxEntry, parse_config
from ocrd.config.reload import plan_reload
from ocrd.files import rename_checked, rename_new
from ocrd.intake.claiming import WorkArea
from ocrd.intake.mounts import filesystem_of, is_network_filesystem, polling_of
from ocrd.intake.watch import scan
from ocrd.sharing import lease_folder
from ocrd.sharing.instances import InstanceNameError, Lease, instance_name
from ocrd.sharing.lease_folder import LeaseFolder
from ocrd.sharing.leases import (
    LEASES,
    Acquired,
    Holder,
    LeaseConflict,
    LeaseLost,
    Round,
    Waiting,
    takeable,
)
from ocrd.sharing.tenure import ClaimLost

LEASE = 30.0


def started(work: Path, name: str, lease: float = LEASE) -> tuple[LeaseFolder, Holder]:
    """Instance `name` holding its lease in `work`."""
    folder = LeaseFolder(work, name)
    holder = Holder.here(name, lease)
    assert isinstance(folder.acquire(holder, lease), Acquired)
    return folder, holder


def upkeep(
    folder: LeaseFolder, holder: Holder, first_seen: dict[str, float] | None = None
) -> Round:
    """One renewal round of `folder`'s instance, taking over what it may."""
    now = folder.renew(holder)
    return folder.look(now, LEASE, True, {} if first_seen is None else first_seen, {})


def claims(work: Path, name: str, count: int) -> list[str]:
    """`count` claim folders in `name`'s folder, each holding an original."""
    ids = []
    for index in range(count):
        claim = work / name / f"20261123T1200{index:02d}-{index:06x}"
        claim.mkdir(parents=True)
        (claim / ".claim.json").write_text("{}")
        (claim / f"doc{index}.pdf").write_bytes(b"%PDF-1.4")
        ids.append(claim.name)
    return ids


def age(folder: LeaseFolder, seconds: float) -> None:
    """Make the instance's lease `seconds` old (by its modification time)."""
    path = folder.folder / folder.me
    stamp = os.stat(path).st_mtime - seconds
    os.utime(path, (stamp, stamp))


def test_an_instance_is_named_after_its_host_unless_OCRD_INSTANCE_names_it() -> None:
    assert instance_name({"OCRD_INSTANCE": "gpu-2"}) == "gpu-2"
    assert instance_name({}) == os.uname().nodename
    for bad in ("a/b", ".hidden", "x~y", "a b"):
        with pytest.raises(InstanceNameError, match="OCRD_INSTANCE"):
            instance_name({"OCRD_INSTANCE": bad})


def test_a_fresh_lease_is_never_taken_over_and_an_expired_one_is(tmp_path: Path) -> None:
    owner, _ = started(tmp_path, "a")
    taker, taker_holder = started(tmp_path, "b")
    ids = claims(tmp_path, "a", 3)
    age(owner, LEASE - 5)
    round_ = upkeep(taker, taker_holder)
    assert round_.taken == [] and sorted(os.listdir(tmp_path / "a")) == ids
    age(owner, 10)  # now LEASE + 5 s old
    [taken] = upkeep(taker, taker_holder).taken
    assert taken.owner == "a" and taken.lease_age is not None and taken.lease_age > LEASE
    assert sorted(f.name for f in taken.folders) == ids == sorted(os.listdir(tmp_path / "b"))
    assert not (tmp_path / "a").exists()
    assert os.listdir(tmp_path / LEASES) == ["b"]  # the marker is gone once the claims moved
    with pytest.raises(LeaseLost):
        owner.renew(Holder.here("a", LEASE))


def test_a_lease_left_under_two_names_by_a_daemon_killed_while_renewing_is_taken_once(
    tmp_path: Path,
) -> None:
    """Where renaming without replacing is a link and an unlink (NFS), a daemon killed
    between the two leaves its lease under its name and its renewing name: both are taken
    in one round, and reported as one takeover."""
    owner, _ = started(tmp_path, "a")
    taker, taker_holder = started(tmp_path, "b")
    ids = claims(tmp_path, "a", 2)
    os.link(tmp_path / LEASES / "a", tmp_path / LEASES / "a~renew~0123abcd")
    age(owner, LEASE + 5)
    [taken] = upkeep(taker, taker_holder).taken
    assert taken.owner == "a" and taken.lease_age is not None and taken.lease_age > LEASE
    assert sorted(f.name for f in taken.folders) == ids == sorted(os.listdir(tmp_path / "b"))
    assert os.listdir(tmp_path / LEASES) == ["b"]


def _race(work: str, name: str, start: float, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    folder = LeaseFolder(Path(work), name)
    folder.current = folder.folder / name
    holder = Holder.here(name, LEASE)
    while time.time() < start:
        pass
    taken = upkeep(folder, holder).taken
    results.put((name, [str(f.name) for t in taken for f in t.folders]))


def test_of_eight_daemons_taking_over_at_the_same_moment_exactly_one_takes_each_claim(
    tmp_path: Path,
) -> None:
    dead, _ = started(tmp_path, "dead")
    ids = claims(tmp_path, "dead", 40)
    takers = [f"t{n}" for n in range(8)]
    for name in takers:
        started(tmp_path, name)
    age(dead, LEASE + 60)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    start = time.time() + 0.5
    processes = [
        context.Process(target=_race, args=(str(tmp_path), name, start, results)) for name in takers
    ]
    for process in processes:
        process.start()
    moved = dict(results.get(timeout=30) for _ in processes)
    for process in processes:
        process.join(timeout=30)
    winners = [name for name, folders in moved.items() if folders]
    assert len(winners) == 1  # one rename of the lease succeeded
    assert sorted(moved[winners[0]]) == ids
    held = {name: sorted(os.listdir(tmp_path / name)) for name in takers}
    assert held[winners[0]] == ids and all(not held[n] for n in takers if n != winners[0])
    assert sorted(os.listdir(tmp_path / LEASES)) == sorted(takers)


def test_a_lease_renewed_between_a_takers_look_and_its_rename_is_given_back(
    tmp_path: Path,
) -> None:
    owner, owner_holder = started(tmp_path, "a")
    taker, _ = started(tmp_path, "b")
    claims(tmp_path, "a", 2)
    age(owner, LEASE + 10)
    survey = taker.survey(taker.server_time())
    [judged] = takeable(survey, "b", LEASE, {})
    owner.renew(owner_holder)  # the owner was only slow: it renews before the rename
    assert taker.take(judged) is None
    assert sorted(os.listdir(tmp_path / LEASES)) == ["a", "b"]
    owner.renew(owner_holder)  # still its own
    assert len(os.listdir(tmp_path / "a")) == 2


def test_a_lease_that_cannot_be_given_back_at_once_is_given_back_later_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    owner, owner_holder = started(tmp_path, "a")
    taker, taker_holder = started(tmp_path, "b")
    claims(tmp_path, "a", 2)
    age(owner, LEASE + 10)
    survey = taker.survey(taker.server_time())
    [judged] = takeable(survey, "b", LEASE, {})
    owner.renew(owner_holder)

    def failing(source: Path, target: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(lease_folder, "rename_new", failing)
    giving_back: dict[str, str] = {}
    assert taker.take(judged, giving_back=giving_back) is None
    assert list(giving_back.values()) == ["a"]
    monkeypatch.undo()
    now = taker.renew(taker_holder)
    round_ = taker.look(now, LEASE, True, {}, giving_back)  # given back, not completed
    assert round_.taken == [] and giving_back == {}
    assert len(os.listdir(tmp_path / "a")) == 2
    owner.renew(owner_holder)


def test_a_released_lease_is_taken_over_at_once_and_a_removed_one_leaves_nothing(
    tmp_path: Path,
) -> None:
    owner, owner_holder = started(tmp_path, "a")
    taker, taker_holder = started(tmp_path, "b")
    ids = claims(tmp_path, "a", 2)
    assert owner.release(owner_holder) == 2  # a clean stop with claims left
    [taken] = upkeep(taker, taker_holder).taken
    assert sorted(f.name for f in taken.folders) == ids
    assert taker.release(taker_holder) == 2  # b holds them now
    lone, lone_holder = started(tmp_path / "other", "c")
    assert lone.release(lone_holder) == 0
    assert os.listdir(tmp_path / "other" / LEASES) == [] and os.listdir(tmp_path / "other") == [
        LEASES
    ]


def test_a_restarted_instance_takes_its_claims_back_at_once_and_refuses_a_live_namesake(
    tmp_path: Path,
) -> None:
    started(tmp_path, "a")
    ids = claims(tmp_path, "a", 2)
    again = LeaseFolder(tmp_path, "a")  # the same instance after a SIGKILL: its pid is gone
    dead_pid = Holder("a", os.uname().nodename, Holder.here("a", LEASE).boot, 1, "0", "x", LEASE)
    (tmp_path / LEASES / "a").write_bytes(dead_pid.encode())
    result = again.acquire(Holder.here("a", LEASE), LEASE)
    assert isinstance(result, Acquired) and result.taken_back == 1
    assert sorted(os.listdir(tmp_path / "a")) == ids

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:  # a lease written by a process that still runs, on this host
        alive = Holder.here("a", LEASE)
        alive = Holder(**{**alive.__dict__, "pid": sleeper.pid})
        alive = Holder(**{**alive.__dict__, "process_start": _start_of(sleeper.pid)})
        (tmp_path / LEASES / "a").write_bytes(alive.encode())
        with pytest.raises(LeaseConflict, match=f"pid {sleeper.pid}.*OCRD_INSTANCE"):
            LeaseFolder(tmp_path, "a").acquire(Holder.here("a", LEASE), LEASE)
        elsewhere = Holder(**{**alive.__dict__, "host": "another-host"})
        (tmp_path / LEASES / "a").write_bytes(elsewhere.encode())
        with pytest.raises(LeaseConflict, match="another-host"):
            LeaseFolder(tmp_path, "a").acquire(Holder.here("a", LEASE), LEASE)
    finally:
        sleeper.kill()
        sleeper.wait()


def _start_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]


def test_an_instance_waits_while_another_takes_its_claims_and_finishes_a_dead_takers_work(
    tmp_path: Path,
) -> None:
    owner, _ = started(tmp_path, "a")
    claims(tmp_path, "a", 3)
    taker, _ = started(tmp_path, "b")
    age(owner, LEASE + 1)
    survey = taker.survey(taker.server_time())
    [judged] = takeable(survey, "b", LEASE, {})
    marker = taker.take(judged)  # b took the lease and has not moved the claims yet
    assert marker is not None
    waiting = LeaseFolder(tmp_path, "a").acquire(Holder.here("a", LEASE), LEASE)
    assert isinstance(waiting, Waiting) and "b is taking over" in waiting.reason

    age(taker, LEASE + 1)  # ... and b died there: a third one finishes b's takeover
    third, third_holder = started(tmp_path, "c")
    long_ago = {marker.name: third.server_time() - LEASE - 1}
    taken = upkeep(third, third_holder, long_ago).taken
    assert sorted(t.owner for t in taken) == ["a", "b"]
    assert len(os.listdir(tmp_path / "c")) == 3 and os.listdir(tmp_path / LEASES) == ["c"]


def test_a_marker_an_instance_holds_for_a_moment_at_start_is_not_taken(tmp_path: Path) -> None:
    """Taking its own lease back, an instance holds a marker before its new lease exists:
    another daemon must not see a takeover whose taker died."""
    owner, _ = started(tmp_path, "a")
    other, holder = started(tmp_path, "b")
    age(owner, 5)
    survey = owner.survey(owner.server_time())
    owner.take(survey.leases_of("a")[0], check_unchanged=False)  # a~to~a~token, no lease "a"
    assert upkeep(other, holder).taken == []


def test_a_lease_holds_for_half_a_lease_after_its_renewal_began() -> None:
    now = [100.0]
    lease = Lease(Path("/w"), 10.0, clock=lambda: now[0])
    assert not lease.holds()
    lease.renewed(100.0)
    now[0] = 104.9
    assert lease.holds()
    lease.check()
    now[0] = 105.0
    assert not lease.holds()
    with pytest.raises(ClaimLost, match="not renewed for 5 s"):
        lease.check()
    lease.renewed(105.0)
    lease.end("taken over by b")
    with pytest.raises(ClaimLost, match="taken over by b"):
        lease.check()


def test_a_work_area_without_its_lease_claims_nothing_and_saves_nothing(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.pdf").write_bytes(b"%PDF-1.4")
    (inbox / "b.pdf").write_bytes(b"%PDF-1.4")
    now = [0.0]
    lease = Lease(tmp_path / "work", 10.0, clock=lambda: now[0])
    lease.renewed(0.0)
    area = WorkArea(inbox, tmp_path / "work" / "me", lease)
    claim = area.claim(inbox / "a.pdf")
    assert claim is not None
    now[0] = 6.0
    with pytest.raises(ClaimLost):
        area.claim(inbox / "b.pdf")
    for _ in range(2):  # the first attempt, counted by the claim; then one of its own
        with pytest.raises(ClaimLost):
            claim.start_attempt()
    saved = json.loads((claim.folder / ".claim.json").read_text())
    assert (inbox / "b.pdf").exists() and saved["attempts"] == 1


def test_a_moved_claim_folder_is_never_made_again_by_its_former_holder(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "a.pdf").write_bytes(b"%PDF-1.4")
    area = WorkArea(inbox, tmp_path / "work" / "me")
    claim = area.claim(inbox / "a.pdf")
    assert claim is not None
    claim.folder.rename(tmp_path / "work" / "taken")
    with pytest.raises(FileNotFoundError):
        claim.save()
    assert not claim.folder.exists()


def test_nfs_silly_renamed_files_are_no_claims_leases_or_inbox_files(tmp_path: Path) -> None:
    folder, holder = started(tmp_path / "work", "a")
    ids = claims(tmp_path / "work", "a", 1)
    (tmp_path / "work" / "a" / ".nfs000000000001").write_text("deleted while open")
    (tmp_path / "work" / LEASES / ".nfs000000000002").write_text("deleted while open")
    assert folder.survey(folder.server_time()).claims == {"a": 1}
    folder.renew(holder)
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / ".nfs000000000003").write_text("deleted while open")
    (inbox / "real.pdf").write_bytes(b"%PDF-1.4")
    config = InboxEntry(path=inbox).located(tmp_path)
    assert scan(config)[0] == [inbox / "real.pdf"]
    recovered = WorkArea(inbox, tmp_path / "work" / "a").recover()
    assert [c.folder.name for c in recovered] == ids


def test_polling_is_chosen_where_the_inbox_is_on_a_network_filesystem() -> None:
    table = (
        "22 1 0:20 / / rw - ext4 /dev/vda1 rw\n"
        "40 22 0:50 / /srv/scans rw - nfs4 server:/scans rw\n"
        "41 22 0:51 / /mnt/my\\040share rw - cifs //nas/share rw\n"
        "42 22 0:52 / /mnt/ssh rw - fuse.sshfs me@host: rw\n"
        "43 22 8:17 / /mnt/usb rw - fuseblk /dev/sdb1 rw\n"
    )
    kinds = {
        path: filesystem_of(Path(path), table)
        for path in ("/srv/scans/inbox", "/mnt/my share/in", "/mnt/ssh/in", "/mnt/usb", "/srv")
    }
    assert kinds == {
        "/srv/scans/inbox": "nfs4",
        "/mnt/my share/in": "cifs",
        "/mnt/ssh/in": "fuse.sshfs",
        "/mnt/usb": "fuseblk",
        "/srv": "ext4",
    }
    network = {path for path, kind in kinds.items() if is_network_filesystem(kind)}
    assert network == {"/srv/scans/inbox", "/mnt/my share/in", "/mnt/ssh/in"}
    local = InboxEntry(path=Path("/tmp")).located(Path("/"))
    assert polling_of(local)[0] is False
    assert polling_of(local.model_copy(update={"polling": True})) == (True, "as configured")


@pytest.mark.mounts
def test_on_a_network_share_lost_replies_count_as_done_and_polling_is_chosen(
    tmp_path: Path,
) -> None:
    """Every second rename and link through the share answers as a retried request does
    (ENOENT, EEXIST although it was done); the server's clock is an hour ahead."""
    counts = tmp_path / "counts.json"
    with network_share(
        tmp_path / "backing", tmp_path / "share", lost_replies=2, clock_offset=3600, counts=counts
    ) as share:
        for index in range(6):
            (share / f"s{index}").write_text(str(index))
            rename_checked(share / f"s{index}", share / f"t{index}")
            (share / f"u{index}").write_text(str(index))
            rename_new(share / f"u{index}", share / f"v{index}")  # link and unlink here
        assert sorted(os.listdir(share)) == sorted(
            [*(f"t{i}" for i in range(6)), *(f"v{i}" for i in range(6))]
        )
        lost = json.loads(counts.read_text())
        assert lost["rename"] >= 3 and lost["link"] >= 3
        with pytest.raises(FileNotFoundError):
            rename_checked(share / "nothing", share / "t9")  # a rename that did not happen
        with pytest.raises(FileExistsError):
            rename_new(share / "t0", share / "t1")  # nor a link onto another file

        assert is_network_filesystem(filesystem_of(share))
        inbox = share / "inbox"
        inbox.mkdir()
        assert polling_of(InboxEntry(path=inbox).located(share))[0] is True

        work = share / "work"
        owner, _ = started(work, "a")
        taker, holder = started(work, "b")
        claims(work, "a", 2)
        round_ = upkeep(taker, holder)
        assert round_.taken == []  # an hour ahead on both sides: a few ms old
        assert 0 <= round_.survey.now - round_.survey.leases_of("a")[0].mtime < 5
        assert abs(round_.survey.now - time.time() - 3600) < 60
        age(owner, LEASE + 1)
        [taken] = upkeep(taker, holder).taken
        assert len(taken.folders) == 2


def test_a_reload_keeps_the_lease_settings_until_a_restart(tmp_path: Path) -> None:
    old = parse_config({"inboxes": [{"path": "in"}]}, tmp_path)
    new = parse_config({"inboxes": [{"path": "in"}], "instances": {"lease_seconds": 10}}, tmp_path)
    assert old.instances.lease_seconds == 90 and old.instances.renew_seconds == 10
    plan = plan_reload(old, new)
    assert plan.config.instances.lease_seconds == 90
    assert any(line.startswith("instances:") for line in plan.refused)
