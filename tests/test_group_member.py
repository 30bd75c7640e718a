"""Hostile ground, round 2: a member of the shared inbox's group, and any HTTP client, try
to read or replace another person's upload, to steer ocrd's moves through its work area,
and to make it write through links in output folders people may write. ocrd runs as its
own user beside real users alice and bob (tests/users.py), under real ACLs (setfacl), with
real links, over real sockets.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import groups_of, user_group, wait_until, write_config
from helpers import make_pdf
from test_attacks import exchange
from test_http import base_url, metric
from test_shared_folder import make_text_pdf
from test_uploads import AUTH, TOKEN, WITH_TOKEN, answer_of
from users import SERVICE, SHARE, Runtime, give, shared_data

from ocrd.files import write_new_file
from ocrd.files.beneath import beneath
from ocrd.files.dropped import NotRegularFile

pytestmark = pytest.mark.slow


def share_everything(folder: Path) -> None:
    """The shipped inbox's rights, as an operator who "shares everything" also gives them
    to other folders: the group may write, and so may whatever is made inside."""
    os.chmod(folder, 0o2775)
    subprocess.run(
        [
            "setfacl",
            "-m",
            f"group:{SHARE}:rwx,default:group:{SHARE}:rwx,default:mask::rwx",
            str(folder),
        ],
        check=True,
    )


def as_user(person: str, code: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    """A Python snippet run as `person` (with their groups)."""
    return subprocess.run(
        ["python3", "-c", code, *arguments],
        user=person,
        group=user_group(person),
        extra_groups=groups_of(person),
        capture_output=True,
        text=True,
        timeout=60,
    )


TRY_EVERYTHING = r"""
import os, sys
uploads, folder, name = sys.argv[1:]
for what, action in (
    ("list uploads/", lambda: os.listdir(uploads)),
    ("list its folder", lambda: os.listdir(folder)),
    ("read it", lambda: open(os.path.join(folder, name), "rb").read()),
    ("overwrite it", lambda: open(os.path.join(folder, name), "r+b").write(b"mine")),
    ("drop a file beside it", lambda: open(os.path.join(folder, "mine.pdf"), "xb").close()),
    ("rename its folder", lambda: os.rename(folder, folder + "-x")),
):
    try:
        action()
        print(f"ALLOWED: {what}")
    except PermissionError:
        print(f"refused: {what}")
"""


def uploading_as_service(
    root: Path, runtime: Runtime, start_daemon: Any, **inbox: Any
) -> tuple[Any, str, Path]:
    data = shared_data(root)
    share_everything(data / "inbox")
    config = write_config(
        root, {"uploads": True, "pdf_text": "prefer", **inbox}, http={"listen": "127.0.0.1:0"}
    )
    daemon = start_daemon(config, env=WITH_TOKEN, runtime=runtime, user=SERVICE)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready", timeout=60)
    return daemon, url, data


@pytest.mark.users
def test_an_upload_is_the_uploaders_alone_until_claimed_whatever_the_inboxs_acl(
    shared_root: Path, runtime: Runtime, start_daemon: Any
) -> None:
    """The inbox hands rwx for its group down to everything made in it (default ACL). An
    upload waiting there must still be nobody else's: alice, in the group, can neither
    list the uploads, read or overwrite the file, drop one beside it, nor move its folder;
    and no ACL entry of the inbox's is left on its folders or its file."""
    daemon, url, data = uploading_as_service(shared_root, runtime, start_daemon, settle_seconds=600)
    pdf = make_text_pdf(shared_root / "payslip.pdf", "Salary of Bob")
    sent = httpx.post(
        f"{url}/api/documents",
        headers=AUTH,
        params={"filename": "payslip.pdf"},
        content=pdf.read_bytes(),
        timeout=30,
    )
    assert sent.status_code == 202, sent.text
    upload_id = sent.json()["id"]
    uploads = data / "inbox" / "uploads"
    folder = uploads / upload_id

    tried = as_user("alice", TRY_EVERYTHING, str(uploads), str(folder), "payslip.pdf")
    assert "ALLOWED" not in tried.stdout, tried.stdout + tried.stderr
    assert tried.stdout.count("refused") == 6, tried.stdout + tried.stderr
    for path, mode in ((uploads, 0o700), (folder, 0o700), (folder / "payslip.pdf", 0o600)):
        assert path.stat().st_mode & 0o7777 == mode, (path, oct(path.stat().st_mode))
        acl = subprocess.run(["getfacl", "-cp", str(path)], capture_output=True, text=True)
        assert f"group:{SHARE}" not in acl.stdout, acl.stdout
    record = json.loads((folder / ".upload.json").read_text())
    assert record["name"] == "payslip.pdf"
    assert record["inode"] == (folder / "payslip.pdf").stat().st_ino
    assert daemon.stop() == 0


@pytest.mark.users
def test_a_file_beside_an_upload_is_never_its_document(
    shared_root: Path, runtime: Runtime, start_daemon: Any
) -> None:
    """Something other than the upload turns up in its folder (only root or ocrd's own
    user can put it there now, as an inbox of an older ocrd let the group do): it is left
    out with a log line and stays where it is, and the upload's id answers with the
    uploaded file's text, never the other's."""
    daemon, url, data = uploading_as_service(shared_root, runtime, start_daemon, settle_seconds=3)
    pdf = make_text_pdf(shared_root / "letter.pdf", "Upload of Bob")
    sent = httpx.post(
        f"{url}/api/documents",
        headers=AUTH,
        params={"filename": "letter.pdf"},
        content=pdf.read_bytes(),
        timeout=30,
    )
    assert sent.status_code == 202, sent.text
    accepted = sent.json()
    folder = data / "inbox" / "uploads" / accepted["id"]
    stray = give(make_text_pdf(folder / "aaa.pdf", "Planted by Mallory"), SERVICE, 0o600)

    markdown = httpx.get(f"{accepted['markdown_url']}?wait=60", headers=AUTH, timeout=70)
    assert markdown.status_code == 200, markdown.text
    assert "Upload of Bob" in markdown.text and "Mallory" not in markdown.text
    status = httpx.get(accepted["status_url"], headers=AUTH).json()
    assert status["filename"] == "letter.pdf" and status["state"] == "done"
    [left_out] = wait_until(
        lambda: daemon.find("file.blocked", path=str(stray)), 20, "the stray named in the log"
    )
    assert "not that upload" in left_out["reason"]
    assert stray.is_file()
    assert not daemon.find("document.claimed", path=f"uploads/{accepted['id']}/aaa.pdf")
    assert daemon.stop() == 0


def test_upload_names_are_refused_as_the_readme_says_naming_the_given_name(
    tmp_path: Path, start_daemon: Any
) -> None:
    """A hidden name (`.x.tif`) gets 422 as the README says, not renamed `x.tif`; a name
    longer than the filesystem allows (a 300-byte extension) gets 422 naming it, not
    "503 retry later" naming a temporary file; neither leaves anything in the inbox."""
    config = write_config(tmp_path, {"uploads": True}, http={"listen": "127.0.0.1:0"})
    daemon = start_daemon(config, env=WITH_TOKEN)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready")
    body = make_pdf(tmp_path / "scan.pdf", 1).read_bytes()
    long_name = "scan." + "x" * 300
    for name in (".x.tif", "folder/.x.tif", long_name):
        answer = httpx.post(
            f"{url}/api/documents",
            params={"filename": name},
            content=body,
            headers=AUTH,
            timeout=30,
        )
        assert answer.status_code == 422, (name, answer.text)
        assert name.rsplit("/", 1)[-1][:60] in answer.json()["error"], answer.text
    assert daemon.stop() == 0
    uploads = tmp_path / "data" / "inbox" / "uploads"
    assert not uploads.exists() or os.listdir(uploads) == []


def test_an_odd_host_header_still_gets_the_upload_answered_once(
    tmp_path: Path, start_daemon: Any
) -> None:
    """A Host header that is no host (a raw client, a broken proxy) once made the answer
    fail with 500 after the file was committed, so a retry made a second document. The
    answer is made before the commit: 202 with links relative to the server, one upload."""
    config = write_config(
        tmp_path, {"uploads": True, "settle_seconds": 600}, http={"listen": "127.0.0.1:0"}
    )
    daemon = start_daemon(config, env=WITH_TOKEN)
    port = int(base_url(daemon).rsplit(":", 1)[1])
    daemon.wait_for("daemon.ready")
    body = make_pdf(tmp_path / "scan.pdf", 1).read_bytes()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(
            b"POST /api/documents?filename=scan.pdf HTTP/1.1\r\nHost: bad host[\r\n"
            + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        reply = answer_of(client)
    head, _, text = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 202"), reply[:500]
    accepted = json.loads(text)
    assert accepted["status_url"] == f"/api/documents/{accepted['id']}"
    uploads = tmp_path / "data" / "inbox" / "uploads"
    assert os.listdir(uploads) == [accepted["id"]]
    assert daemon.stop() == 0


UNUSABLE = {
    "a_link_to_nowhere": lambda path: path.symlink_to("/nonexistent"),
    "a_file": lambda path: path.write_bytes(b"not a folder"),
    "someone_elses_folder": lambda path: give(_mkdir(path), "alice", 0o2777),
}


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.users
@pytest.mark.parametrize("what", sorted(UNUSABLE))
def test_an_uploads_folder_ocrd_cannot_use_is_set_aside_and_uploads_go_on(
    shared_root: Path, runtime: Runtime, start_daemon: Any, what: str
) -> None:
    """`inbox/uploads` is something ocrd cannot keep uploads in (people may write the
    inbox): a link to nowhere, a file, or a folder someone else made before ocrd did (who
    could then read every upload). ocrd sets it aside, untouched, under a name that says
    so, logs where, and takes uploads in a folder of its own: nobody who may write the
    inbox can stop uploads (round 3; ocrd/uploads/guard.py)."""
    data = shared_data(shared_root)
    share_everything(data / "inbox")
    UNUSABLE[what](data / "inbox" / "uploads")
    config = write_config(shared_root, {"uploads": True}, http={"listen": "127.0.0.1:0"})
    daemon = start_daemon(config, env=WITH_TOKEN, runtime=runtime, user=SERVICE)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready", timeout=60)
    taken = httpx.post(
        f"{url}/api/documents",
        params={"filename": "a.pdf"},
        content=make_pdf(shared_root / "a.pdf", 1).read_bytes(),
        headers=AUTH,
        timeout=30,
    )
    assert taken.status_code == 202, taken.text
    [aside] = daemon.find("uploads.set_aside")
    kept = Path(aside["now_at"])
    assert kept.parent == data / "inbox" and kept.name.startswith("uploads.set-aside-")
    assert os.path.lexists(kept), "what was there is kept, untouched"
    uploads = os.lstat(data / "inbox" / "uploads")
    assert stat.S_ISDIR(uploads.st_mode) and uploads.st_mode & 0o777 == 0o700
    assert uploads.st_uid == os.stat(data / "work").st_uid, "ocrd's own"
    assert httpx.get(f"{url}/readyz").status_code == 200
    inbox = str(data / "inbox")
    assert metric(httpx.get(f"{url}/metrics").text, "ocrd_uploads_usable", inbox=inbox) == 1
    assert not daemon.find("uploads.unusable")
    assert daemon.stop() == 0


# --- the work area ----------------------------------------------------------------------

WEAK_WORK_AREAS = {
    "group_acl": lambda data: subprocess.run(
        ["setfacl", "-m", f"group:{SHARE}:rwx", str(data / "work")], check=True
    ),
    "group_mode": lambda data: os.chmod(data / "work", 0o770),
    "default_acl": lambda data: subprocess.run(
        ["setfacl", "-m", f"default:group:{SHARE}:rwx", str(data / "work")], check=True
    ),
    "parent_writable": lambda data: share_everything(data),
    "leases_writable": lambda data: give(_mkdir(data / "work" / ".leases"), SERVICE, 0o777),
    "someone_elses": lambda data: give(data / "work", "alice", 0o700),
}


@pytest.mark.users
@pytest.mark.parametrize("weakness", sorted(WEAK_WORK_AREAS))
def test_check_config_refuses_a_work_area_others_may_write(
    shared_root: Path, runtime: Runtime, weakness: str
) -> None:
    """A work area (or its leases' folder, or a folder on its way) that someone other than
    ocrd's user may write: `ocrd check-config`, run as ocrd's user, refuses it with exit
    status 78 and says how to fix it, as sshd's StrictModes refuses a home folder."""
    data = shared_data(shared_root)
    config = write_config(shared_root)
    checked = subprocess.run(
        runtime.command("check-config", "--config", str(config)),
        env=runtime.environment(),
        user=SERVICE,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
    WEAK_WORK_AREAS[weakness](data)
    checked = subprocess.run(
        runtime.command("check-config", "--config", str(config)),
        env=runtime.environment(),
        user=SERVICE,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 78, checked.stdout + checked.stderr
    assert f"work folder {data / 'work'} is not ocrd's alone" in checked.stderr
    assert "chmod 700" in checked.stderr, checked.stderr


@pytest.mark.users
def test_the_daemon_refuses_to_start_on_a_work_area_its_group_may_write(
    shared_root: Path, runtime: Runtime, start_daemon: Any
) -> None:
    data = shared_data(shared_root)
    share_everything(data / "work")
    config = write_config(shared_root)
    daemon = start_daemon(config, runtime=runtime, user=SERVICE)
    assert daemon.process.wait(timeout=60) == 78
    [refused] = daemon.find("startup.refused")
    assert "is not ocrd's alone" in refused["reason"] and "setfacl -R -b" in refused["reason"]


def forged_claim(folder: Path, relative: str, settlement: dict[str, Any] | None) -> Path:
    folder.mkdir(parents=True, mode=0o700)
    state = {
        "id": folder.name,
        "inbox": "anywhere",
        "relative_path": relative,
        "claimed_at": "2026-01-01T00:00:00.000+00:00",
        "attempts": 0,
        "engine_deaths": [],
        "companions": [],
        "settlement": settlement,
        "quarantine": None,
    }
    (folder / ".claim.json").write_text(json.dumps(state))
    return folder


def test_forged_claims_are_quarantined_and_steer_no_move(tmp_path: Path, start_daemon: Any) -> None:
    """Claims ocrd did not write (in a work area someone could write before it was made
    ocrd's alone), found at start and taken over from a "dead" daemon whose lease was
    forged too: one names `../../../private/secret.txt` as its original with a plan to
    fail it (moving the secret into failed/ and writing the forger's report), one plans a
    move out of done/. None is acted on: each is quarantined, named in the log and in
    `attention`; the secret stays where it is, and no report is written."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    secret = private / "secret.txt"
    secret.write_text("the salary list")
    config = write_config(tmp_path, instances={"lease_seconds": 3})
    data = tmp_path / "data"
    work = data / "work"
    failed = data / "failed"
    fail_plan = {
        "outcome": "failed",
        "original": str(failed / "secret.txt"),
        "error_report": str(failed / "secret.error.json"),
        "error": {"forged": True},
    }
    escape = forged_claim(
        work / "gpu1" / "20260101T000000-aaaaaa", "../../../private/secret.txt", fail_plan
    )
    away = forged_claim(
        work / "gpu1" / "20260101T000000-bbbbbb",
        "letter.pdf",
        {
            "outcome": "done",
            "original": str(private / "letter.pdf"),
            "markdown": str(data / "outbox" / "letter.md"),
        },
    )
    make_pdf(away / "letter.pdf", 1)
    ghost_claim = work / "ghost" / "20260101T000000-cccccc"
    ghost = forged_claim(ghost_claim, "../../../../private/secret.txt", fail_plan)
    (work / ".leases").mkdir(mode=0o700)
    lease = {
        "instance": "ghost",
        "host": "elsewhere",
        "boot": "",
        "pid": 1,
        "process_start": "",
        "incarnation": "f0rged",
        "lease_seconds": 3,
    }
    (work / ".leases" / "ghost").write_text(json.dumps(lease))

    daemon = start_daemon(config, env={"OCRD_INSTANCE": "gpu1"})
    url = base_url(daemon)
    quarantined = daemon.wait_for("claim.quarantined", count=3, timeout=60)
    attention = httpx.get(f"{url}/api/status").json()["attention"]
    make_pdf(data / "inbox" / "real.pdf", 1)
    daemon.wait_for("document.finished", path="real.pdf", timeout=60)
    assert daemon.stop() == 0

    folders = {Path(event["folder"]).name for event in quarantined}
    assert folders == {escape.name, away.name, ghost.name}, quarantined
    assert all("cannot be ocrd's own" in event["reason"] for event in quarantined)
    assert sum("quarantined claim" in line for line in attention) == 3, attention
    assert secret.read_text() == "the salary list"
    assert sorted(os.listdir(private)) == ["secret.txt"]
    assert not any(failed.rglob("secret*")), list(failed.rglob("*"))
    assert not daemon.find("document.claimed", doc=escape.name)


# --- writing the outputs ----------------------------------------------------------------


@pytest.mark.users
def test_links_planted_in_output_folders_people_may_write_are_never_written_through(
    shared_root: Path, runtime: Runtime, start_daemon: Any
) -> None:
    """The operator lets the group write the outbox, done/ and failed/ (as the inbox).
    Alice plants `sub` in each, a link to a folder only ocrd's user may write. Letters
    dropped into `inbox/sub/` convert (a good one) and fail (a broken one), and not one
    byte lands behind a link: the outputs go under a flat name where the link stands."""
    data = shared_data(shared_root)
    private = give(_mkdir(shared_root / "private"), SERVICE, 0o700)
    for name in ("inbox", "outbox", "done", "failed"):
        share_everything(data / name)
    for name in ("outbox", "done", "failed"):
        link = data / name / "sub"
        link.symlink_to(private)
        give(link, "alice", 0o777)  # a link's own mode is never used
    sub = give(_mkdir(data / "inbox" / "sub"), "alice", 0o2775)
    give(make_text_pdf(sub / "good.pdf", "A good letter"), "alice", 0o664)
    (sub / "broken.pdf").write_bytes(b"not a PDF at all")
    give(sub / "broken.pdf", "alice", 0o664)
    config = write_config(shared_root, {"pdf_text": "prefer", "settle_seconds": 1})
    daemon = start_daemon(config, runtime=runtime, user=SERVICE)
    finished = daemon.wait_for("document.finished", count=2, timeout=90)
    assert daemon.stop() == 0

    assert os.listdir(private) == [], f"written through a link: {os.listdir(private)}"
    outcomes = {event["path"]: event for event in finished}
    good, broken = outcomes["sub/good.pdf"], outcomes["sub/broken.pdf"]
    assert good["outcome"] == "done" and broken["outcome"] == "failed"
    assert Path(good["markdown"]).parent == data / "outbox", good["markdown"]
    assert "A good letter" in Path(good["markdown"]).read_text()
    assert Path(good["original"]).parent == data / "done"
    assert Path(broken["error_report"]).parent == data / "failed"
    assert daemon.find("storage.name_refused"), "the link was met and the name given up"
    assert daemon.find("storage.fault") == []


ROUNDS = 300


def test_a_folder_swapped_for_a_link_while_an_output_is_written_never_lets_it_through(
    tmp_path: Path,
) -> None:
    """Someone who may write the outbox swaps `sub` for a link to a private folder and
    back, over and over, while outputs are written into `outbox/sub/` (the Markdown, as
    every writer does it: a temporary, then linked into place). Not one file may land in
    the private folder: each write lands in the real `sub`, or is refused."""
    outbox, private = tmp_path / "outbox", tmp_path / "private"
    outbox.mkdir()
    private.mkdir()
    sub, link = outbox / "sub", outbox / ".sub-link"
    sub.mkdir()
    link.symlink_to(private)
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            exchange(sub, link)

    swapper = threading.Thread(target=swap)
    swapper.start()
    seen: dict[str, int] = {}
    try:
        for round_ in range(ROUNDS):
            try:
                with beneath(outbox, sub / f"x{round_}.md") as held:
                    write_new_file(held, b"text")
                outcome = "written"
            except NotRegularFile:
                outcome = "link refused"
            except OSError as error:
                outcome = type(error).__name__
            seen[outcome] = seen.get(outcome, 0) + 1
    finally:
        stop.set()
        swapper.join()
    assert os.listdir(private) == [], f"written through the link ({seen})"
    assert seen.get("written"), seen


# --- problems that must show ------------------------------------------------------------


def deeper_than_path_max(top: Path, page: bytes) -> None:
    """`top/ddd.../ddd.../page.pdf`, 20 folders of 250-byte names deep (5 KB of path, over
    PATH_MAX): made folder by folder through descriptors, as a script or an unzip can."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(20):
            os.mkdir("d" * 250, dir_fd=fd)
            inner = os.open("d" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        out = os.open("page.pdf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(out, page)
        os.close(out)
    finally:
        os.close(fd)


def test_a_job_folder_deeper_than_path_max_fails_with_its_reason(
    tmp_path: Path, start_daemon: Any
) -> None:
    """A scan job whose page lies deeper than a path can name cannot be read whole: it
    goes to failed/ with that reason, once, instead of waiting for ever or being skipped as
    "an empty job folder" and found again at every rescan; a letter beside it converts."""
    config = write_config(
        tmp_path, {"job_folders": ["scan-*"]}, pipeline={"rescan_interval_seconds": 1}
    )
    staging = tmp_path / "staging"
    staging.mkdir()
    deeper_than_path_max(staging / "scan-deep", make_pdf(tmp_path / "p.pdf", 1).read_bytes())
    inbox = tmp_path / "data" / "inbox"
    os.rename(staging / "scan-deep", inbox / "scan-deep")
    make_pdf(inbox / "letter.pdf", 1)
    daemon = start_daemon(config)
    [job] = daemon.wait_for("document.finished", path="scan-deep", timeout=60)
    daemon.wait_for("document.finished", path="letter.pdf", timeout=60)
    time.sleep(3)  # three rescans go by: the failed job is not found again
    assert daemon.stop() == 0

    assert job["outcome"] == "failed" and "cannot be read whole" in job["reason"], job
    assert (tmp_path / "data" / "failed" / "scan-deep").is_dir()
    assert Path(job["error_report"]).is_file()
    assert not daemon.find("file.skipped", path=str(inbox / "scan-deep"))
    assert len(daemon.find("document.claimed", path="scan-deep")) == 1
