"""The shared folder as an attacker and a careless office use it, after the hardening of
tests/test_shared_folder.py: each test here is a way found to crash, stall, fool or leak
through ocrd. Where permissions matter ocrd runs as its own user beside real users alice
and bob (tests/users.py); an attacker keeps working in a folder after ocrd claimed it the
way any process does, through its working directory.
"""

from __future__ import annotations

import ctypes
import json
import os
import pty
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from conftest import claims_left, groups_of, user_group, wait_until, write_config
from fleet import free_port
from helpers import make_pdf
from mounts import tmpfs
from test_http import base_url, run_ocrd_status
from test_http_clients import answer
from test_shared_folder import make_text_pdf
from users import SERVICE, Runtime, give, shared_data

from ocrd.intake.claiming import Changed, WorkArea
from ocrd.intake.watch import look_at

pytestmark = pytest.mark.slow


def mkdir(path: Path, owner: str = "alice", mode: int = 0o2775) -> Path:
    path.mkdir()
    return give(path, owner, mode)


# A person's program working in its own folder (its working directory) after ocrd moved
# that folder into its work area: the moment ocrd has read a file there (inotify says so),
# it does what the person asks (argv[1:]: "swap NAME TARGET" puts a link to TARGET in
# place of the folder NAME; "chmod MODE" changes the folder's own mode; "add SOURCE NAME"
# writes a copy of SOURCE as NAME, as a scanner does with its next page). A path is not
# needed to reach a folder one is in: that is how any shell or scanning program works.
ATTACKER = r"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
action, *arguments = sys.argv[1:]
watched = arguments[0] if action == "swap" else "."
fd = libc.inotify_init()
if libc.inotify_add_watch(fd, watched.encode(), 0x10) < 0:  # IN_CLOSE_NOWRITE
    sys.exit(f"inotify: {os.strerror(ctypes.get_errno())}")
print("watching", flush=True)
while True:
    data, offset, names = os.read(fd, 65536), 0, []
    while offset < len(data):
        _, mask, _, length = struct.unpack_from("iIII", data, offset)
        names.append(data[offset + 16 : offset + 16 + length].rstrip(b"\0"))
        offset += 16 + length
    if any(name.endswith(b".pdf") for name in names):  # ocrd read a page file
        break
if action == "swap":
    os.rename(watched, watched + ".real")
    os.symlink(arguments[1], watched)
elif action == "add":
    with open(arguments[0], "rb") as source, open(arguments[1], "xb") as page:
        page.write(source.read())
else:
    os.chmod(".", int(arguments[0], 8))
print("done", flush=True)
"""


def as_person(person: str, runtime: Runtime, cwd: Path, *arguments: str) -> subprocess.Popen[str]:
    """ATTACKER run by `person` in `cwd`; returns once it watches."""
    process = subprocess.Popen(
        [runtime.python, "-c", ATTACKER, *arguments],
        cwd=cwd,
        user=person,
        group=user_group(person),
        extra_groups=groups_of(person),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "watching", process.communicate()[0]
    return process


def deep_tree(top: Path, depth: int) -> Path:
    """`top/d/d/.../d`, `depth` folders deep (a careless unzip, or a malicious script)."""
    top.mkdir()
    path = top
    for _ in range(depth):
        path = path / "d"
        os.mkdir(path)
    return path


@pytest.mark.parametrize(
    "when",
    [
        "before_start",
        "before_start_polled",
        "moved_in_while_running",
        "as_a_job_folder",
        "in_failed_from_an_earlier_run",  # a deep job settled there; start-up sweeps failed/
    ],
)
def test_a_very_deep_folder_tree_does_not_stop_the_daemon(
    shared_root: Path, start_daemon, when: str
) -> None:
    """1,100 nested folders (2.2 KB of path, well under PATH_MAX: what a zip bomb of
    folders unpacks to), there when ocrd starts or moved in while it runs, plain or as a
    scan job: the daemon stays up and goes on converting the files beside it."""
    polling = {"polling": True, "poll_interval_seconds": 0.5} if "polled" in when else {}
    config = write_config(
        shared_root, {"job_folders": ["scan-*"], **polling}, pipeline={"rescan_interval_seconds": 1}
    )
    inbox = shared_root / "data" / "inbox"
    name = "scan-deep" if when == "as_a_job_folder" else "unzipped"
    staging = shared_root / "staging"
    staging.mkdir()
    deep_tree(staging / name, 1100)
    (staging / name / "d" / "page.pdf").write_bytes(make_pdf(shared_root / "p.pdf", 1).read_bytes())
    if when.startswith("before_start"):
        os.rename(staging / name, inbox / name)
    elif when == "in_failed_from_an_earlier_run":
        (shared_root / "data" / "failed").mkdir()
        os.rename(staging / name, shared_root / "data" / "failed" / name)
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready", timeout=30)
    if when in ("moved_in_while_running", "as_a_job_folder"):
        os.rename(staging / name, inbox / name)
    make_pdf(inbox / "letter.pdf", 1)
    [finished] = daemon.wait_for("document.finished", path="letter.pdf", timeout=60)
    assert finished["outcome"] == "done"
    make_pdf(inbox / "later.pdf", 1)  # after rescans (every second) walked the tree again
    daemon.wait_for("document.finished", path="later.pdf", timeout=60)
    assert daemon.stop() == 0


@pytest.mark.users
def test_a_job_folder_changed_after_its_claim_cannot_make_ocrd_read_a_private_file(
    shared_root: Path, runtime: Runtime, start_daemon
) -> None:
    """Alice's scan job holds `sub/p1.pdf`. Once ocrd has claimed the job and looked at the
    page, her program (still working in the job folder) puts a link to ocrd's private
    folder in place of `sub`. What ocrd converts is her page, never the file behind the
    link: its text must not reach the outbox, which alice may read."""
    data = shared_data(shared_root)
    private = mkdir(shared_root / "private", SERVICE, 0o700)
    give(make_text_pdf(private / "p1.pdf", "TOP SECRET salary list"), SERVICE, 0o600)
    job = mkdir(data / "inbox" / "job-1")
    give(make_text_pdf(mkdir(job / "sub") / "p1.pdf", "Public page one"), "alice", 0o664)
    alice = as_person("alice", runtime, job, "swap", "sub", str(private))
    config = write_config(
        shared_root, {"job_folders": ["job-*"], "pdf_text": "prefer", "settle_seconds": 1}
    )
    daemon = start_daemon(config, runtime=runtime, user=SERVICE)
    [summary] = daemon.wait_for("document.finished", path="job-1", timeout=60)
    assert alice.wait(timeout=60) == 0 and "done" in alice.communicate()[0]
    assert daemon.stop() == 0

    outputs = "".join(p.read_text() for p in (data / "outbox").rglob("*.md"))
    assert "TOP SECRET" not in outputs, f"ocrd read its private file for alice: {summary}"
    assert (private / "p1.pdf").is_file()


def exchange(first: Path, second: Path) -> None:
    """Swap two names in one atomic step (renameat2 RENAME_EXCHANGE, as `mv --exchange`)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(-100, os.fsencode(first), -100, os.fsencode(second), 2) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(first))


ROUNDS = 3000  # the race is won within a few hundred rounds on a loaded two-core machine


def test_a_subfolder_swapped_for_a_link_while_a_file_is_claimed_never_moves_a_file_outside(
    tmp_path: Path,
) -> None:
    """Someone swaps the subfolder a settled file lies in with a link to a folder ocrd may
    write (its own done/), and back, over and over, while ocrd claims the file: the file of
    the same name in done/ must stay where it is, untouched."""
    inbox, work, done = tmp_path / "inbox", tmp_path / "work", tmp_path / "done"
    for folder in (inbox, done):
        folder.mkdir()
    victim = make_pdf(done / "scan.pdf", 2)  # someone's converted original
    victim_bytes = victim.read_bytes()
    sub, link = inbox / "sub", inbox / ".sub-link"
    sub.mkdir()
    link.symlink_to(done)
    area = WorkArea(inbox, work)
    seen: dict[str, int] = {}
    for round_ in range(ROUNDS):
        target = sub / "scan.pdf"
        if not target.exists():
            make_pdf(target, 1)
        identity = look_at(target, inbox).identity
        stop = threading.Event()

        def swap(stop: threading.Event = stop) -> None:
            while not stop.is_set():  # twice each time: `sub` is the folder after it
                exchange(sub, link)
                exchange(sub, link)

        swapper = threading.Thread(target=swap)
        swapper.start()
        try:
            claim = area.claim(target, identity)
            outcome = "claimed" if claim else "gone"
        except Changed:
            outcome = "changed"
        except OSError as error:
            outcome = type(error).__name__
        finally:
            stop.set()
            swapper.join()
        seen[outcome] = seen.get(outcome, 0) + 1
        assert victim.is_file() and victim.read_bytes() == victim_bytes, (
            f"done/scan.pdf was moved out of done/ or deleted by a claim in the inbox, in "
            f"round {round_ + 1} ({seen})"
        )
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.users
def test_a_job_folder_its_owner_makes_read_only_after_the_claim_is_not_a_storage_fault(
    shared_root: Path, runtime: Runtime, start_daemon
) -> None:
    """Alice's program takes write permission off her job folder once ocrd is reading it
    (a folder can be moved to another folder only by someone who may write it). That is
    one person's folder, not ocrd's storage: ocrd stays ready, and the job ends in done/ or
    failed/, or is listed for people with the reason, never retried for ever unseen."""
    data = shared_data(shared_root)
    job = mkdir(data / "inbox" / "job-1")
    give(make_pdf(job / "p1.pdf", 1), "alice", 0o664)
    alice = as_person("alice", runtime, job, "chmod", "555")
    config = write_config(shared_root, {"job_folders": ["job-*"], "settle_seconds": 1})
    daemon = start_daemon(config, runtime=runtime, user=SERVICE)
    url = base_url(daemon)
    daemon.wait_for("document.claimed", path="job-1", timeout=60)
    assert alice.wait(timeout=30) == 0

    def settled_or_listed() -> bool:
        placed = any((data / folder / "job-1").exists() for folder in ("done", "failed"))
        attention = httpx.get(f"{url}/api/status").json()["attention"]
        return placed or any("job-1" in line for line in attention)

    wait_until(
        settled_or_listed, 30, lambda: f"job-1 settled or listed with its reason\n{daemon.output()}"
    )
    readiness = httpx.get(f"{url}/readyz")
    assert readiness.status_code == 200, readiness.text
    assert daemon.find("storage.fault") == [], "one person's folder is no fault of the storage"


@pytest.mark.users
def test_a_subfolder_of_a_job_ocrd_may_not_read_is_not_silently_left_out(
    shared_root: Path, runtime: Runtime, start_daemon
) -> None:
    """Alice's scanner writes page 2 of a job into a subfolder made private (0700). ocrd
    cannot see that page: the job must not become a one-page document that says nothing
    about it (its page 2 moved to done/ unread); either the job waits, listed with the
    reason, or the document names what it could not read."""
    data = shared_data(shared_root)
    job = mkdir(data / "inbox" / "job-1")
    give(make_pdf(job / "p1.pdf", 1), "alice", 0o664)
    give(make_pdf(mkdir(job / "more", "alice", 0o2700) / "p2.pdf", 1), "alice", 0o664)
    config = write_config(shared_root, {"job_folders": ["job-*"], "settle_seconds": 1})
    daemon = start_daemon(config, runtime=runtime, user=SERVICE)

    def outcome() -> list[dict[str, object]]:
        blocked = [e for e in daemon.find("file.blocked") if str(e["path"]).endswith("job-1")]
        return daemon.find("document.finished", path="job-1") + blocked

    [event] = wait_until(outcome, 60, lambda: f"job-1 settled or blocked\n{daemon.output()}")
    assert daemon.stop() == 0
    if event["event"] == "document.finished":
        skipped = [name for e in daemon.find("document.files_skipped") for name in e["files"]]
        told = any("more" in name for name in skipped) or "more" in str(event.get("reason"))
        assert event["pages"] == 2 or told, f"page 2 silently left out: {event}, {skipped}"


@pytest.mark.users
def test_a_subfolder_ocrd_may_not_read_is_listed_with_its_fix_once(
    shared_root: Path, runtime: Runtime, start_daemon
) -> None:
    """Alice makes her own subfolder in the inbox private (mkdir -m 700) and drops letters
    into it. ocrd cannot even see them: the folder is listed for people (API, status page)
    with the reason and the fix, like a file ocrd may not take, and logged once, not at
    every rescan."""
    data = shared_data(shared_root)
    private = mkdir(data / "inbox" / "alices-letters", "alice", 0o2700)
    give(make_pdf(private / "letter.pdf", 1), "alice", 0o664)
    config = write_config(
        shared_root, {"settle_seconds": 0.5}, pipeline={"rescan_interval_seconds": 1}
    )
    daemon = start_daemon(config, runtime=runtime, user=SERVICE)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready", timeout=60)

    def listed() -> list[dict[str, str]]:
        report = httpx.get(f"{url}/api/status").json()
        blocked = report["inboxes"][0]["blocked"]
        return [b for b in blocked if b["path"].startswith("alices-letters")]

    [entry] = wait_until(listed, 60, lambda: f"alices-letters listed\n{daemon.output()}")
    assert entry["reason"] and entry["fix"]
    assert "alices-letters" in httpx.get(f"{url}/").text
    give(make_pdf(data / "inbox" / "after.pdf", 1), "bob", 0o664)
    daemon.wait_for("document.finished", path="after.pdf", timeout=60)  # rescans went by
    assert len(daemon.find("inbox.scan_error")) <= 1
    assert daemon.stop() == 0


def test_two_failures_of_the_same_stem_at_once_keep_their_own_error_reports(
    tmp_path: Path, start_daemon
) -> None:
    """`invoice3.doc` and `invoice3.docx` dropped together (an office saving both) both
    fail, at the same moment: their originals keep their own names in failed/, and each
    must get its own `.error.json`, naming it, as its summary says. The originals' names
    are reserved, but the reports' shared name `invoice3.error.json` is not."""
    config = write_config(tmp_path)
    inbox, failed = tmp_path / "data" / "inbox", tmp_path / "data" / "failed"
    staging = tmp_path / "staging"
    staging.mkdir()
    for index in range(20):
        for suffix in ("doc", "docx"):
            (staging / f"invoice{index}.{suffix}").write_bytes(b"a Word file, not a PDF")
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready")
    for path in sorted(staging.iterdir()):
        os.rename(path, inbox / path.name)
    finished = daemon.wait_for("document.finished", count=40, timeout=120)
    assert daemon.stop() == 0

    assert {e["outcome"] for e in finished} == {"failed"}
    assert len({e["error_report"] for e in finished}) == 40, "two summaries share one report"
    for event in finished:
        report = json.loads(Path(event["error_report"]).read_text())
        assert report["relative_path"] == event["path"], (event, report)
    assert len(list(failed.glob("*.error.json"))) == 40


def status_in_a_terminal(config: Path) -> str:
    """What `ocrd status` writes to a terminal (a pseudo-terminal: click strips escapes
    only when its output is not one)."""
    controller, terminal = pty.openpty()
    with open(os.devnull) as nothing:
        process = subprocess.Popen(
            [sys.executable, "-m", "ocrd", "status", "--config", str(config)],
            stdin=nothing,
            stdout=terminal,
            stderr=terminal,
        )
    os.close(terminal)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    process.wait(timeout=60)
    return shown.decode(errors="replace").replace("\r\n", "\n")


def test_a_name_with_control_characters_cannot_forge_lines_in_ocrd_status(
    tmp_path: Path, start_daemon
) -> None:
    """A name holding a newline and terminal escapes (clear the screen, move the cursor)
    waits in the inbox. `ocrd status` in an operator's terminal shows it on its own line,
    escaped: it can neither add a line of its own nor drive the terminal."""
    config = write_config(
        tmp_path, {"settle_seconds": 300}, http={"listen": f"127.0.0.1:{free_port()}"}
    )
    forged = "x.pdf (1 s)\n  problem: none\x1b[2J\x1b[H\rocrd 0.1.0: READY; all is well.pdf"
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready")
    make_pdf(tmp_path / "data" / "inbox" / forged, 1)
    wait_until(
        lambda: "arriving" in run_ocrd_status(config).stdout, 20, "the file listed as arriving"
    )
    shown = status_in_a_terminal(config)
    assert daemon.stop() == 0

    controls = sorted({hex(ord(c)) for c in shown if (ord(c) < 0x20 and c != "\n") or c == "\x7f"})
    assert controls == [], f"raw control characters reach the terminal: {controls}\n{shown!r}"
    assert not any(line.startswith("  problem:") for line in shown.splitlines()), shown


SLOW_CLIENTS = {
    # a blank line first (which HTTP allows before a request) passes for the end of the
    # headers; the request then comes a byte now and then, or never
    "blank_line_first": b"\r\n\r\nGET /healthz HTTP/1.1\r\nHost: ocrd\r\n",
    # headers complete, announcing a body that never comes (slowloris after the headers)
    "body_never_sent": b"GET /healthz HTTP/1.1\r\nHost: ocrd\r\nContent-Length: 1000000\r\n\r\n",
    # a request for a page that does not exist: its 404 keeps the connection open for more
    # requests, the next of which has no time limit at all
    "unknown_page_first": b"GET /nope HTTP/1.1\r\nHost: ocrd\r\n\r\nGET /healthz HTTP/1.1\r\n",
}


@pytest.mark.parametrize("kind", sorted(SLOW_CLIENTS))
def test_slow_clients_cannot_hold_every_connection_past_the_time_limit(
    tmp_path: Path, start_daemon, kind: str
) -> None:
    """As many slow clients as `max_connections`: each is dropped within the time limit
    of 1 s, so a monitoring probe gets its answer from /healthz a moment later, instead of
    503 "too many connections" for as long as the attacker likes."""
    http = {"listen": "127.0.0.1:0", "max_connections": 4, "header_timeout_seconds": 1}
    config = write_config(tmp_path, http=http)
    daemon = start_daemon(config)
    url = base_url(daemon)
    port = int(url.rsplit(":", 1)[1])
    daemon.wait_for("daemon.ready")
    clients = []
    for _ in range(4):
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        client.sendall(SLOW_CLIENTS[kind])
        clients.append(client)
    try:
        healthy = wait_until(
            lambda: httpx.get(f"{url}/healthz").status_code == 200, 6, "/healthz to answer 200"
        )
    finally:
        for client in clients:
            client.close()
    assert healthy
    assert daemon.stop() == 0


@pytest.mark.users
def test_a_page_a_scanner_adds_to_a_claimed_job_is_not_silently_lost(
    shared_root: Path, runtime: Runtime, start_daemon
) -> None:
    """A scanner paused longer than `settle_seconds` (a paper jam), so ocrd claimed its job
    folder; the scanner, working in that folder, then writes page 2. The page must not
    travel to done/ unconverted without a word: the document has both pages, or says that
    p2 came too late."""
    data = shared_data(shared_root)
    job = mkdir(data / "inbox" / "job-1")
    give(make_pdf(job / "p1.pdf", 1, "Front"), "alice", 0o664)
    late = give(make_pdf(shared_root / "late.pdf", 1, "Back"), "alice", 0o644)
    scanner = as_person("alice", runtime, job, "add", str(late), "p2.pdf")
    config = write_config(shared_root, {"job_folders": ["job-*"], "settle_seconds": 1})
    daemon = start_daemon(config, runtime=runtime, user=SERVICE)
    [summary] = daemon.wait_for("document.finished", path="job-1", timeout=60)
    assert scanner.wait(timeout=60) == 0 and "done" in scanner.communicate()[0]
    assert (data / "done" / "job-1" / "p2.pdf").is_file() or summary["outcome"] != "done"

    skipped = [name for e in daemon.find("document.files_skipped") for name in e["files"]]
    told = any("p2" in name for name in skipped) or "p2" in str(summary.get("reason"))
    assert summary["pages"] == 2 or told, f"page 2 silently lost: {summary}"
    assert daemon.stop() == 0


@pytest.mark.mounts
def test_a_link_in_a_job_folder_is_not_copied_as_its_target_into_done_on_another_disk(
    tmp_path: Path, start_daemon
) -> None:
    """done/ on another filesystem than the inbox (a bigger disk): a job folder is copied
    there, not renamed. The links in it (to a private file, to a whole folder outside the
    inbox) must arrive as the links they are, never as copies of what they point to."""
    private = tmp_path / "private"
    private.mkdir()
    make_text_pdf(private / "secret.pdf", "TOP SECRET salary list")
    config = write_config(tmp_path, {"job_folders": ["job-*"], "settle_seconds": 0.5})
    job = tmp_path / "data" / "inbox" / "job-1"
    job.mkdir()
    make_pdf(job / "p1.pdf", 1)
    (job / "p2.pdf").symlink_to(private / "secret.pdf")
    (job / "more").symlink_to(private)
    with tmpfs(tmp_path / "data" / "done", "64m") as done:
        daemon = start_daemon(config)
        [summary] = daemon.wait_for("document.finished", path="job-1", timeout=60)
        assert daemon.stop() == 0
        assert summary["outcome"] == "done" and summary["pages"] == 1
        arrived = done / "job-1"
        assert (arrived / "p1.pdf").is_file()
        copied = [p.name for p in (arrived / "p2.pdf", arrived / "more") if not p.is_symlink()]
        assert copied == [], f"copied from outside the inbox into done/: {copied}"
    assert (private / "secret.pdf").is_file()


@pytest.mark.mounts
def test_a_fifo_in_a_job_folder_does_not_stall_its_move_to_done_on_another_disk(
    tmp_path: Path, start_daemon
) -> None:
    """A FIFO in a job folder is left out of the document (tests/test_shared_folder.py);
    with done/ on another filesystem the folder is copied there, and the FIFO must not turn
    that copy into a storage fault retried for ever: the job reaches done/, ocrd stays
    ready."""
    config = write_config(tmp_path, {"job_folders": ["job-*"], "settle_seconds": 0.5})
    job = tmp_path / "data" / "inbox" / "job-1"
    job.mkdir()
    make_pdf(job / "p1.pdf", 1)
    os.mkfifo(job / "p2.pdf")
    with tmpfs(tmp_path / "data" / "done", "64m") as done:
        daemon = start_daemon(config)
        url = base_url(daemon)
        [summary] = daemon.wait_for("document.finished", path="job-1", timeout=30)
        assert httpx.get(f"{url}/readyz").status_code == 200
        assert daemon.stop() == 0
        assert summary["outcome"] == "done" and (done / "job-1" / "p1.pdf").is_file()
        assert daemon.find("storage.fault") == []


def test_a_flood_of_junk_files_cannot_run_hooks_without_bound(tmp_path: Path, start_daemon) -> None:
    """Someone drops 100 junk files at once; each fails in a moment and its on_failed
    hook (a command taking 3 s, as a chat notifier or a copy to paperless does) starts.
    Hooks must not all run at once: under an open-file limit (64 here stands in for a
    bigger flood under the unit's 65,536) every document settles (none is stranded in the
    work area by a claim that ran out of descriptors after its rename), every hook runs
    and succeeds, every document fails for its own reason, and no claim folder is left."""
    hooks = {"on_failed": {"command": ["sleep", "3"], "timeout_seconds": 120}}
    config = write_config(tmp_path, {"hooks": hooks})
    data, staging = tmp_path / "data", tmp_path / "staging"
    staging.mkdir()
    for index in range(100):
        (staging / f"junk{index}.pdf").write_bytes(b"junk, not a PDF")
    daemon = start_daemon(config, open_files=64)
    daemon.wait_for("daemon.ready")
    for path in staging.iterdir():
        os.rename(path, data / "inbox" / path.name)

    def stranded() -> str:
        done = {e["path"] for e in daemon.find("document.finished")}
        lost = sorted({f"junk{index}.pdf" for index in range(100)} - done)
        left = [str(p.relative_to(data)) for p in (data / "work").rglob("junk*")]
        return f"documents never finished: {lost}; in the work area, untracked: {left}"

    wait_until(lambda: len(daemon.find("document.finished")) >= 100, 60, stranded)
    finished = daemon.find("document.finished")
    wait_until(
        lambda: daemon.find("hook.failed") or len(daemon.find("hook.finished")) >= 100,
        60,
        "every document's hook to succeed (or one to fail)",
    )
    hooks_failed = daemon.find("hook.failed")
    assert daemon.stop() == 0

    assert hooks_failed == [], f"{len(hooks_failed)} hooks not run: {hooks_failed[0]['error']}"
    reasons = {e["reason"].split(" (")[0] for e in finished}
    assert all(reason.startswith("not a PDF") for reason in reasons), reasons
    assert daemon.find("storage.fault") == []
    assert claims_left(data / "work") == []


@pytest.mark.users
def test_a_file_in_a_folder_made_unlistable_while_it_settles_is_never_deleted(
    shared_root: Path, runtime: Runtime, start_daemon
) -> None:
    """Alice's subfolder is a drop box: after ocrd saw her letter, she takes read permission
    off it (chmod g-r: people may drop files but not list them). ocrd may still move the
    letter out (that needs write and search permission only), but whatever it does, the
    letter must end in done/, failed/ or the inbox, never vanish."""
    data = shared_data(shared_root)
    drop_box = mkdir(data / "inbox" / "drop-box")
    give(make_pdf(drop_box / "letter.pdf", 1), "alice", 0o664)
    config = write_config(shared_root, {"settle_seconds": 3})
    daemon = start_daemon(config, runtime=runtime, user=SERVICE)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready", timeout=60)
    wait_until(
        lambda: httpx.get(f"{url}/api/status").json()["inboxes"][0]["waiting"],
        30,
        "the letter seen and waiting",
    )
    os.chmod(drop_box, 0o2730)  # alice (its owner) may do this at any time
    wait_until(
        lambda: (
            daemon.find("document.finished")
            or daemon.find("file.claim_failed")
            or daemon.find("file.blocked")
        ),
        30,
        "ocrd to take the letter or give up on it",
    )
    assert daemon.stop() == 0
    places = [data / "inbox" / "drop-box", data / "work", data / "done", data / "failed"]
    found = [p for folder in places for p in folder.rglob("letter*.pdf")]
    assert found, f"the letter is gone: {daemon.find('file.claim_failed')}"


def test_a_link_to_the_root_folder_in_a_polled_inbox_does_not_hang_the_daemon(
    tmp_path: Path, start_daemon
) -> None:
    """An inbox on a network share is polled. Someone puts a link to `/` in it: polling
    must not walk the whole machine through that link (/proc never ends), on the event
    loop or anywhere: ocrd becomes ready, /healthz answers, and a letter converts."""
    config = write_config(
        tmp_path,
        {"polling": True, "poll_interval_seconds": 0.5},
        pipeline={"rescan_interval_seconds": 1},
    )
    inbox = tmp_path / "data" / "inbox"
    (inbox / "everything").symlink_to("/")
    daemon = start_daemon(config)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready", timeout=30)
    assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    make_pdf(inbox / "letter.pdf", 1)
    daemon.wait_for("document.finished", path="letter.pdf", timeout=30)
    assert daemon.stop() == 0


def test_malformed_requests_are_refused_without_flooding_the_log(
    tmp_path: Path, start_daemon
) -> None:
    """Anyone who reaches the port may send garbage: a bad request line, bare newlines, a
    token that is not UTF-8. Each gets a 4xx and its connection closed; the log stays one
    JSON event per line (a traceback per garbage request would let anyone flood journald,
    whose rate limit then drops ocrd's own events)."""
    http = {"listen": "127.0.0.1:0", "trust_loopback": False}
    config = write_config(tmp_path, http=http)
    daemon = start_daemon(config, env={"OCRD_HTTP_TOKEN": "sekrit"})
    port = int(base_url(daemon).rsplit(":", 1)[1])
    daemon.wait_for("daemon.ready")
    garbage = [
        b"\x00\x01\r\n\r\n",
        b"GET /healthz HTTP/1.1\n\n",
        b"GET /api/status HTTP/1.1\r\nHost: ocrd\r\nAuthorization: Bearer \xff\xfe\r\n\r\n",
    ]
    answers = []
    for request in garbage * 20:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(request)
            answers.append(answer(client))
    assert daemon.stop() == 0

    statuses = {reply.split(b"\r\n", 1)[0].split(b" ")[1] for reply in answers}
    assert statuses <= {b"400", b"401"}, statuses
    plain = [line for line in daemon.raw if not line.startswith("{")]
    tracebacks = [line for line in plain if line.startswith("Traceback")]
    assert tracebacks == [], f"{len(tracebacks)} tracebacks in the log:\n{''.join(plain[:12])}"


def test_a_subfolder_named_like_a_converted_files_markdown_is_no_storage_fault(
    tmp_path: Path, start_daemon
) -> None:
    """`letter.pdf` converted to outbox/letter.md; then someone drops `x.pdf` into a new
    subfolder named `letter.md`, whose outbox folder would be that Markdown file. Any
    name is valid: x.pdf converts under another name (or fails with its reason), and ocrd
    stays ready, instead of retrying a "storage fault" for ever."""
    config = write_config(tmp_path)
    inbox = tmp_path / "data" / "inbox"
    daemon = start_daemon(config)
    url = base_url(daemon)
    make_pdf(inbox / "letter.pdf", 1)
    daemon.wait_for("document.finished", path="letter.pdf", timeout=60)
    (inbox / "letter.md").mkdir()
    make_pdf(inbox / "letter.md" / "x.pdf", 1)
    wait_until(
        lambda: (
            daemon.find("document.finished", path="letter.md/x.pdf") or daemon.find("storage.fault")
        ),
        30,
        "x.pdf to settle",
    )
    readiness = httpx.get(f"{url}/readyz")
    assert daemon.stop() == 0
    assert daemon.find("storage.fault") == [], daemon.find("storage.fault")[0]["error"]
    assert readiness.status_code == 200, readiness.text
    assert (tmp_path / "data" / "outbox" / "letter.md").is_file()  # the first one's, intact
