"""A shared inbox used by careless and malicious people: odd names, other users' files and
folders, links, FIFOs and sockets, and same-named files settling at once. The daemon stays
up, every file ends in done/, failed/ or visibly waiting with its reason, and nothing
outside the inbox is read or moved. Where permissions matter ocrd runs as its own user
(tests/users.py), since root would pass every check.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pymupdf
import pytest
import yaml
from conftest import claims_left, files_under, markdown_under, wait_until, write_config
from fleet import free_port
from helpers import make_pdf
from test_http import base_url, metric, run_ocrd_status
from users import SERVICE, give, shared_data, uid

from ocrd.intake.claiming import Changed, WorkArea
from ocrd.intake.watch import look_at

pytestmark = pytest.mark.slow

LATIN1 = os.fsdecode(b"Pr\xfcfbericht.pdf")  # "Prüfbericht" from an old Samba or FTP client
RESCAN_SECONDS = 1


def mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def make_text_pdf(path: Path, text: str) -> Path:
    """A one-page born-digital PDF saying `text` (read back with `pdf_text: prefer`)."""
    doc = pymupdf.open()
    page = doc.new_page(width=420, height=595)
    for line in range(12):  # enough text for the text layer to stand in for recognition
        page.insert_text((40, 80 + 20 * line), f"{text}: line {line} of this test page")
    doc.save(path)
    doc.close()
    return path


SETTLE = 0.5  # conftest.write_config's settle_seconds
RESCAN = 2.0  # and its rescan_interval_seconds, where a test keeps it
SECONDS_PER_PAGE = 0.05  # and its simulated engine's
# A wait is a step's time by those settings times this (CI ran on 2 cores at a load of 9
# to 13), plus what no setting bounds: the daemon starting.
PATIENCE = 20
STARTING = 120.0


def within(*seconds: float) -> float:
    """How long to wait for what the settings say takes `seconds` (in all), from a daemon
    that may be starting still."""
    return STARTING + PATIENCE * sum(seconds)


def let_rescans_pass(count: int) -> None:
    time.sleep(count * RESCAN_SECONDS + 0.5)


def test_a_name_that_is_not_utf8_converts_and_every_report_can_show_it(
    tmp_path: Path, start_daemon
) -> None:
    """Latin-1 bytes in a name: the status page and the API answer while it waits, it
    converts under its own bytes, and a bad file named so fails with a readable report."""
    config = write_config(tmp_path, {"settle_seconds": 3})
    data = tmp_path / "data"
    daemon = start_daemon(config)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready")
    os.rename(make_pdf(tmp_path / "made.pdf", 2), data / "inbox" / LATIN1)  # MuPDF wants UTF-8
    (data / "inbox" / os.fsdecode(b"kaputt-\xe9.pdf")).write_bytes(b"no PDF at all")

    def waiting() -> set[str]:
        report = httpx.get(f"{url}/api/status")
        assert report.status_code == 200, report.text
        return {w["path"] for w in report.json()["inboxes"][0]["waiting"]}

    assert "Pr\\xfcfbericht.pdf" in wait_until(
        waiting, within(RESCAN), "the file listed as waiting"
    )
    page = httpx.get(f"{url}/")
    assert page.status_code == 200 and "Pr\\xfcfbericht.pdf" in page.text
    finished = daemon.wait_for(
        "document.finished", count=2, timeout=within(3, RESCAN, 2 * 2 * SECONDS_PER_PAGE)
    )
    assert httpx.get(f"{url}/api/status").status_code == 200
    assert httpx.get(f"{url}/").status_code == 200
    assert daemon.stop() == 0

    assert {e["outcome"] for e in finished} == {"done", "failed"}
    assert os.listdir(os.fsencode(data / "done")) == [b"Pr\xfcfbericht.pdf"]
    markdown = (data / "outbox" / os.fsdecode(b"Pr\xfcfbericht.md")).read_text()
    assert "# Simulated page 2" in markdown
    assert "](Pr%FCfbericht.assets/page1-figure1.png)" in markdown  # the link finds the file
    assert (data / "outbox" / os.fsdecode(b"Pr\xfcfbericht.assets") / "page1-figure1.png").is_file()
    report = json.loads((data / "failed" / os.fsdecode(b"kaputt-\xe9.error.json")).read_text())
    assert report["file"] == "kaputt-\\xe9.pdf"
    assert report["message"].startswith("not a PDF")


@pytest.mark.users
def test_files_ocrd_may_not_move_wait_listed_with_the_fix_and_go_once_fixed(
    shared_root: Path, runtime, start_daemon
) -> None:
    """As ocrd's own user: a subfolder made with umask 022, a sticky folder, a file only
    its owner may read. None is touched or leaves an empty claim; each is listed once with
    its reason and fix (status page, API, metrics, `ocrd status`); fixed, each converts."""
    data = shared_data(shared_root)
    inbox = data / "inbox"
    folder = give(mkdir(inbox / "alices-folder"), "alice", 0o755)
    give(make_pdf(folder / "minutes.pdf", 1), "alice", 0o644)
    sticky = give(mkdir(inbox / "drop-here"), "alice", 0o1777)
    give(make_pdf(sticky / "bobs-scan.pdf", 1), "bob", 0o664)
    give(make_pdf(inbox / "private.pdf", 1), "alice", 0o600)
    give(make_pdf(inbox / "fine.pdf", 1), "bob", 0o664)
    config = write_config(
        shared_root,
        pipeline={"rescan_interval_seconds": RESCAN_SECONDS},
        http={"listen": f"127.0.0.1:{free_port()}"},  # known to `ocrd status`
    )

    daemon = start_daemon(config, runtime=runtime, user=SERVICE)
    url = base_url(daemon)
    one = (SETTLE, RESCAN_SECONDS, SECONDS_PER_PAGE)  # a one-page file found and converted
    daemon.wait_for("document.finished", path="fine.pdf", timeout=within(*one))
    blocked = daemon.wait_for("file.blocked", count=3, timeout=within(RESCAN_SECONDS))
    let_rescans_pass(3)
    assert len(daemon.find("file.blocked")) == 3  # once each, not at every rescan
    reasons = {Path(e["path"]).name: e["reason"] for e in blocked}
    assert "may not write alices-folder" in reasons["minutes.pdf"]
    assert "sticky bit" in reasons["bobs-scan.pdf"]
    assert "may not read the file" in reasons["private.pdf"]
    assert claims_left(data / "work") == []  # no empty claim folders

    report = httpx.get(f"{url}/api/status").json()
    listed = {b["path"]: b for b in report["inboxes"][0]["blocked"]}
    assert set(listed) == {"alices-folder/minutes.pdf", "drop-here/bobs-scan.pdf", "private.pdf"}
    assert all(b["fix"] for b in listed.values())
    assert report["ready"] and "cannot be taken" in report["attention"][0]
    page = httpx.get(f"{url}/").text
    assert "Cannot be taken" in page and "chmod o-t" in page
    assert metric(httpx.get(f"{url}/metrics").text, "ocrd_files_blocked", inbox=str(inbox)) == 3
    status = run_ocrd_status(config)
    assert "cannot take private.pdf: ocrd's user (ocrdsvc) may not read" in status.stdout
    assert "attention: 3 files" in status.stdout

    os.chmod(folder, 0o775)  # what the README's default ACLs give new folders
    os.chmod(sticky, 0o777)
    os.chmod(inbox / "private.pdf", 0o640)
    for path in ("alices-folder/minutes.pdf", "drop-here/bobs-scan.pdf", "private.pdf"):
        daemon.wait_for("document.finished", path=path, timeout=within(*one))
    assert len(daemon.wait_for("file.unblocked", count=3, timeout=within(*one))) == 3
    assert httpx.get(f"{url}/api/status").json()["attention"] == []
    assert daemon.stop() == 0
    assert sorted(p.name for p in (data / "done").rglob("*.pdf")) == [
        "bobs-scan.pdf",
        "fine.pdf",
        "minutes.pdf",
        "private.pdf",
    ]


@pytest.mark.users
def test_links_are_never_followed_into_what_only_ocrd_may_read(
    shared_root: Path, runtime, start_daemon
) -> None:
    """A job folder holding a link to ocrd's private file, and (polling) a link to a folder
    outside the inbox: neither target is read, moved or converted; the rest converts."""
    data = shared_data(shared_root)
    inbox = data / "inbox"
    private = give(mkdir(shared_root / "private"), SERVICE, 0o700)
    give(make_text_pdf(private / "secret.pdf", "TOP SECRET salary list"), SERVICE, 0o600)
    job = give(mkdir(inbox / "job-1"), "alice", 0o2775)
    give(make_text_pdf(job / "p1.pdf", "Public page one"), "alice", 0o664)
    (job / "p2.pdf").symlink_to(private / "secret.pdf")
    (inbox / "shortcut").symlink_to(private)  # a linked folder: walked by polling
    (inbox / "secret.pdf").symlink_to(private / "secret.pdf")
    config = write_config(
        shared_root,
        {
            "polling": True,
            "poll_interval_seconds": 0.5,
            "job_folders": ["job-*"],
            "pdf_text": "prefer",
        },
        pipeline={"rescan_interval_seconds": RESCAN_SECONDS},
    )
    daemon = start_daemon(config, runtime=runtime, user=SERVICE)
    [summary] = daemon.wait_for(
        "document.finished", path="job-1", timeout=within(SETTLE, RESCAN_SECONDS, SECONDS_PER_PAGE)
    )
    let_rescans_pass(3)
    assert daemon.stop() == 0

    assert summary["outcome"] == "done" and summary["pages"] == 1
    [skipped] = daemon.find("document.files_skipped")
    assert skipped["files"] == ["p2.pdf: a symbolic link, never followed or opened"]
    outputs = "".join(p.read_text() for p in (data / "outbox").rglob("*.md"))
    assert "Public page one" in outputs and "TOP SECRET" not in outputs
    assert (private / "secret.pdf").is_file() and files_under(data / "failed") == []
    skipped_paths = {str(Path(e["path"]).relative_to(inbox)) for e in daemon.find("file.skipped")}
    assert "secret.pdf" in skipped_paths <= {"secret.pdf", "shortcut/secret.pdf"}
    assert len(daemon.find("document.finished")) == 1  # nothing behind a link was taken


def test_a_fifo_and_a_socket_in_a_job_folder_are_left_out_and_never_block(
    tmp_path: Path, start_daemon
) -> None:
    config = write_config(tmp_path, {"job_folders": ["scan-*"]})
    data = tmp_path / "data"
    job = mkdir(data / "inbox" / "scan-7")
    make_pdf(job / "page1.pdf", 1)
    os.mkfifo(job / "page2.pdf")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(job / "page3.pdf"))
    os.mkfifo(data / "inbox" / "loose.pdf")
    try:
        daemon = start_daemon(config)
        [summary] = daemon.wait_for(
            "document.finished", path="scan-7", timeout=within(SETTLE, RESCAN, SECONDS_PER_PAGE)
        )
        make_pdf(data / "inbox" / "after.pdf", 1)
        daemon.wait_for(
            "document.finished", path="after.pdf", timeout=within(SETTLE, RESCAN, SECONDS_PER_PAGE)
        )
        assert daemon.stop(timeout=20) == 0  # SIGTERM ends it: nothing hangs on the FIFO
    finally:
        listener.close()
    assert summary["outcome"] == "done" and summary["pages"] == 1
    [skipped] = daemon.find("document.files_skipped")
    assert sorted(skipped["files"]) == [
        "page2.pdf: a FIFO (named pipe), never followed or opened",
        "page3.pdf: a socket, never followed or opened",
    ]
    assert (data / "inbox" / "loose.pdf").exists()  # a FIFO in the inbox is left in place
    assert {e["path"] for e in daemon.find("file.skipped")} == {str(data / "inbox/loose.pdf")}


def test_a_file_swapped_for_a_link_is_never_claimed_in_its_place(tmp_path: Path) -> None:
    """Another user swaps a settled file for a link to ocrd's private file, over and over,
    while ocrd claims: what lands in the work area is only ever the file that was checked;
    a link found at the path, before or just after the rename, goes back untouched."""
    inbox, work = mkdir(tmp_path / "inbox"), tmp_path / "work"
    secret = tmp_path / "secret.pdf"
    make_pdf(secret, 1)
    area = WorkArea(inbox, work)
    outcomes = {"claimed": 0, "changed": 0}
    for round_ in range(200):
        target = inbox / f"scan{round_}.pdf"
        make_pdf(target, 1)
        identity = look_at(target, inbox).identity
        stop = threading.Event()

        def swap(path: Path = target, stop: threading.Event = stop) -> None:
            spare = path.with_name(f".spare-{path.name}")
            while not stop.is_set():
                link = path.with_name(f".link-{path.name}")
                link.symlink_to(secret)
                try:  # the file aside, the link in its place, and back
                    os.rename(path, spare)
                    os.rename(link, path)
                    os.rename(path, link)
                    os.rename(spare, path)
                except FileNotFoundError:
                    pass
                link.unlink(missing_ok=True)

        swapper = threading.Thread(target=swap)
        swapper.start()
        try:
            claim = area.claim(target, identity)
        except Changed:
            outcomes["changed"] += 1
            claim = None
        finally:
            stop.set()
            swapper.join()
        if claim is not None:
            outcomes["claimed"] += 1
            assert claim.path.is_file() and not claim.path.is_symlink()
            assert (claim.path.stat().st_dev, claim.path.stat().st_ino) == (
                identity.device,
                identity.inode,
            )
    assert secret.is_file() and not any(p.is_symlink() for p in work.rglob("*"))
    assert outcomes["claimed"] > 0 and outcomes["changed"] > 0, outcomes


def test_same_named_documents_settling_at_once_keep_their_own_outputs(
    tmp_path: Path, start_daemon
) -> None:
    """Two inboxes share the outbox and done/; twenty pairs of same-named files arrive at
    the same moment. Every original gets its own Markdown, and each summary names its own."""
    shared = {"outbox": "data/outbox", "done": "data/done", "failed": "data/failed"}
    inboxes = []
    for side in ("a", "b"):
        mkdir_all(tmp_path / "data" / side / "inbox")
        inboxes.append(
            {
                "path": f"data/{side}/inbox",
                "work": f"data/{side}/work",
                "settle_seconds": 0.5,
                "pdf_text": "prefer",
                **shared,
            }
        )
    config = write_config(tmp_path)
    settings = yaml.safe_load(config.read_text())
    settings["inboxes"] = inboxes
    config.write_text(yaml.safe_dump(settings))
    data = tmp_path / "data"
    staging = mkdir(tmp_path / "staging")
    for side in ("a", "b"):
        for index in range(20):
            make_text_pdf(staging / f"{side}-{index}.pdf", f"Letter {side.upper()}{index}")
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready")
    for index in range(20):  # each pair renamed into place at the same moment
        for side in ("a", "b"):
            os.rename(staging / f"{side}-{index}.pdf", data / side / "inbox" / f"letter{index}.pdf")
    finished = daemon.wait_for(
        "document.finished", count=40, timeout=within(SETTLE, RESCAN, 40 * SECONDS_PER_PAGE)
    )
    assert daemon.stop() == 0

    assert {e["outcome"] for e in finished} == {"done"}
    assert len({e["markdown"] for e in finished}) == 40
    assert len({e["original"] for e in finished}) == 40
    assert len(markdown_under(data / "outbox")) == 40
    for event in finished:
        original = pymupdf.open(event["original"])[0].get_text().split(":")[0]
        assert original in Path(event["markdown"]).read_text()
    assert not [p for p in (data / "outbox").iterdir() if p.name.startswith(".")]


def mkdir_all(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.mark.users
def test_another_users_file_moves_into_done_without_ever_replacing_one(
    shared_root: Path, runtime
) -> None:
    """Under fs.protected_hardlinks ocrd's user may not link a file that another user
    owns and it may not write; the move is an atomic rename that never replaces a file."""
    assert Path("/proc/sys/fs/protected_hardlinks").read_text().strip() == "1"
    data = shared_data(shared_root)
    give(make_pdf(data / "inbox" / "a.pdf", 1), "alice", 0o644)
    give(make_pdf(data / "inbox" / "b.pdf", 2), "alice", 0o644)
    give(make_pdf(data / "done" / "b.pdf", 1), SERVICE, 0o644)  # someone's file: must stay
    before = (data / "done" / "b.pdf").read_bytes()
    script = (
        "import sys\nfrom pathlib import Path\nfrom ocrd.files import move_new\n"
        "inbox, done = Path(sys.argv[1]), Path(sys.argv[2])\n"
        "move_new(inbox / 'a.pdf', done / 'a.pdf')\n"
        "try:\n    move_new(inbox / 'b.pdf', done / 'b.pdf')\n"
        "except FileExistsError:\n    print('refused')\n"
    )
    result = subprocess.run(
        [runtime.python, "-c", script, str(data / "inbox"), str(data / "done")],
        capture_output=True,
        text=True,
        user=SERVICE,
        env=runtime.environment(),
        cwd=shared_root,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "refused"
    assert (data / "done" / "a.pdf").stat().st_uid == uid("alice")
    assert not (data / "inbox" / "a.pdf").exists()
    assert (data / "done" / "b.pdf").read_bytes() == before
    assert (data / "inbox" / "b.pdf").exists()
