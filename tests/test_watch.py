"""Watching with real watchdog observers (inotify and polling) on a temporary inbox."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path, PurePath

import pytest
from structlog.testing import capture_logs

from ocrd.config import InboxConfig, InboxEntry
from ocrd.config.inboxes import is_candidate_name
from ocrd.intake.watch import InboxWatcher, QuietTracker, Ready, stat_all


def look(tracker: QuietTracker) -> list[Ready]:
    """One tick of the daemon: stat the candidates that are due, then settle them."""
    return tracker.ready(stat_all(tracker.due(), tracker.inbox.path))


def inbox_config(path: Path, **overrides: object) -> InboxConfig:
    return InboxEntry(
        path=path, settle_seconds=0.6, poll_interval_seconds=0.2, **overrides
    ).located(path)


@pytest.mark.parametrize(
    ("name", "taken"),
    [
        ("scan.pdf", True),
        ("sub/scan.PDF", True),
        ("no-extension", True),
        (".hidden.pdf", False),
        (".sync/scan.pdf", False),
        ("upload.pdf.part", False),
        ("upload.pdf.filepart", False),
        ("scan.tmp", False),
        ("download.pdf.crdownload", False),
        ("~$report.docx", False),
    ],
)
def test_candidate_names(tmp_path: Path, name: str, taken: bool) -> None:
    assert is_candidate_name(PurePath(name), inbox_config(tmp_path)) is taken


def test_include_ignore_and_recursion(tmp_path: Path) -> None:
    config = inbox_config(
        tmp_path, include=("*.pdf", "*.tif"), ignore=("drafts/*",), recursive=False
    )
    assert is_candidate_name(PurePath("a.pdf"), config)
    assert not is_candidate_name(PurePath("a.png"), config)
    assert not is_candidate_name(PurePath("sub/a.pdf"), config)  # not recursive
    config = inbox_config(tmp_path, ignore=("drafts/*",))
    assert not is_candidate_name(PurePath("drafts/a.pdf"), config)
    assert is_candidate_name(PurePath("final/a.pdf"), config)


async def collect_ready(config: InboxConfig, actions, seconds: float) -> list[Path]:
    """Run a real watcher and settle tracker while `actions` changes the inbox; what is
    ready is taken out of the inbox at once, as the daemon claims it (a later look at the
    inbox, say for a folder moved in, must not find it again)."""
    loop = asyncio.get_running_loop()
    tracker = QuietTracker(config)
    watcher = InboxWatcher(config, loop, tracker.observe)
    ready: list[Path] = []
    claimed = config.path.parent / "claimed"
    claimed.mkdir()
    await watcher.start()
    try:

        async def tick() -> None:
            while True:
                for found in look(tracker):
                    ready.append(found.path)
                    os.rename(found.path, claimed / str(len(ready)))
                await asyncio.sleep(0.1)

        ticker = asyncio.create_task(tick())
        await actions()
        await asyncio.sleep(seconds)
        ticker.cancel()
    finally:
        watcher.stop()
    return ready


@pytest.mark.parametrize("polling", [False, True], ids=["inotify", "polling"])
def test_new_files_and_moved_in_folders_become_ready_once(tmp_path: Path, polling: bool) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    (inbox / "present-at-start.pdf").write_bytes(b"%PDF-1.4 old")
    outside = tmp_path / "outside"
    (outside / "nested").mkdir(parents=True)
    (outside / "nested" / "deep.pdf").write_bytes(b"%PDF-1.4 deep")
    config = inbox_config(inbox, polling=polling)

    async def actions() -> None:
        await asyncio.sleep(0.3)
        (inbox / "new.pdf").write_bytes(b"%PDF-1.4 new")
        (inbox / "upload.pdf.part").write_bytes(b"partial")
        (inbox / ".hidden.pdf").write_bytes(b"hidden")
        os.rename(outside, inbox / "moved-in")

    ready = asyncio.run(collect_ready(config, actions, 2.5))
    assert sorted(str(p.relative_to(inbox)) for p in ready) == [
        "moved-in/nested/deep.pdf",
        "new.pdf",
        "present-at-start.pdf",
    ]


def test_a_file_written_slowly_is_ready_only_after_it_stops_changing(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    config = inbox_config(inbox)
    timeline: list[tuple[str, float]] = []

    async def actions() -> None:
        loop = asyncio.get_running_loop()
        timeline.append(("start", loop.time()))
        with (inbox / "slow.pdf").open("wb") as handle:
            for _ in range(8):  # 8 chunks 0.3 s apart: longer than the 0.6 s settle time in all
                handle.write(b"x" * 1000)
                handle.flush()
                await asyncio.sleep(0.3)
            timeline.append(("last write", loop.time() - 0.3))

    loop_ready: list[float] = []
    sizes: list[int] = []

    async def run() -> list[Path]:
        loop = asyncio.get_running_loop()
        tracker = QuietTracker(config)
        watcher = InboxWatcher(config, loop, tracker.observe)
        await watcher.start()
        ready: list[Path] = []
        writer = asyncio.create_task(actions())
        try:
            for _ in range(60):
                found = [r.path for r in look(tracker)]
                if found:
                    ready.extend(found)
                    loop_ready.append(loop.time())
                    sizes.extend(path.stat().st_size for path in found)
                await asyncio.sleep(0.1)
        finally:
            watcher.stop()
            await writer
        return ready

    ready = asyncio.run(run())
    assert [p.name for p in ready] == ["slow.pdf"]
    assert sizes == [8000]  # complete when taken
    assert loop_ready[0] >= timeline[-1][1] + 0.5  # and only after a quiet settle period


def test_symlinks_and_fifos_are_left_in_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    target = tmp_path / "elsewhere.pdf"
    target.write_bytes(b"%PDF-1.4")
    (inbox / "link.pdf").symlink_to(target)
    os.mkfifo(inbox / "pipe.pdf")
    config = inbox_config(inbox)

    async def actions() -> None:
        return None

    ready = asyncio.run(collect_ready(config, actions, 1.5))
    assert ready == []
    assert (inbox / "link.pdf").is_symlink() and (inbox / "pipe.pdf").exists()


def test_a_file_replaced_by_another_of_the_same_size_and_mtime_settles_again(
    tmp_path: Path,
) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    now = [0.0]
    tracker = QuietTracker(inbox_config(inbox), clock=lambda: now[0])
    path = inbox / "scan.pdf"
    path.write_bytes(b"%PDF-1.4 first ")
    stamp = path.stat().st_mtime_ns
    tracker.observe(path)
    assert look(tracker) == []
    now[0] = 0.5
    replacement = inbox / ".incoming"
    replacement.write_bytes(b"%PDF-1.4 other ")  # same size, and the same mtime below
    os.utime(replacement, ns=(stamp, stamp))
    os.replace(replacement, path)
    now[0] = 0.7  # past the 0.6 s settle time of the first file, not of its replacement
    assert look(tracker) == []
    now[0] = 1.4
    assert [r.path for r in look(tracker)] == [path]


def test_a_file_that_never_stops_growing_is_given_up_on(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    now = [0.0]
    tracker = QuietTracker(inbox_config(inbox, max_settle_wait_seconds=3), clock=lambda: now[0])
    path = inbox / "endless.pdf"
    tracker.observe(path)
    for step in range(1, 8):
        with path.open("ab") as handle:
            handle.write(b"more")
        now[0] = step * 0.5
        found = look(tracker)
        if found:
            break
    assert [(r.path, r.still_growing) for r in found] == [(path, True)]
    assert 3.0 <= now[0] <= 3.5  # the limit counts from when the file was first seen


def test_a_file_whose_stat_fails_is_skipped_and_looked_at_again(tmp_path: Path) -> None:
    """An EIO or ESTALE from a network share stalls nothing: that file is logged once and
    looked at again with backoff; the others settle meanwhile."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    now = [0.0]
    tracker = QuietTracker(inbox_config(inbox), clock=lambda: now[0])
    flaky, fine = inbox / "flaky.pdf", inbox / "fine.pdf"
    for path in (flaky, fine):
        path.write_bytes(b"%PDF-1.4")
        tracker.observe(path)
    eio = OSError(errno.EIO, "Input/output error", str(flaky))
    ready: list[Path] = []
    with capture_logs() as events:
        for step in range(40):
            now[0] = step * 0.25
            due = tracker.due()
            outcomes = stat_all(due, inbox)
            if flaky in outcomes and now[0] < 4.0:
                outcomes[flaky] = eio  # the share answers EIO for four seconds
            ready += [r.path for r in tracker.ready(outcomes)]
    assert ready[0] == fine and ready[1:] == [flaky]
    failed = [e for e in events if e["event"] == "file.stat_failed"]
    assert len(failed) == 1 and "EIO" in failed[0]["error"]
    assert [e["event"] for e in events if e["event"] == "file.stat_recovered"]
