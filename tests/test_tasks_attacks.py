"""Hostile ground, round 4: attacks on the tasks work (the uploads folder's guard, upload
records, docling-serve's JSON body, waiting clients), each kept as a test. A member of the
inbox's group (real users, marker `users`), HTTP clients with and without the token, over
real sockets against `ocrd run`."""

from __future__ import annotations

import base64
import json
import os
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import wait_until
from test_docling_api import KEY, convert
from test_group_member import as_user, share_everything, uploading_as_service
from test_shared_folder import make_text_pdf
from test_uploads import AUTH, uploading_daemon
from users import Runtime, give

pytestmark = pytest.mark.slow

LINK_AS_RECORD = r"""
import os, sys
source, target = sys.argv[1:]
os.link(source, target)
print("linked")
"""


@pytest.mark.users
def test_a_record_linked_from_ocrds_outputs_blocks_no_colleagues_file(
    shared_root: Path, runtime: Runtime, start_daemon: Any
) -> None:
    """The operator lets the group write failed/ (a default ACL), so ocrd's error reports
    there are the group's to read and write. alice hard-links one (a JSON object owned by
    ocrd's user) into the inbox as `.upload.json`, as if an upload's record lay there: bob's
    letter dropped beside it is still converted, never blocked as "moved out of the uploads
    folder"."""
    daemon, _, data = uploading_as_service(shared_root, runtime, start_daemon, settle_seconds=1)
    inbox = data / "inbox"
    share_everything(data / "failed")
    broken = inbox / "broken.pdf"
    broken.write_bytes(b"not a PDF at all")
    give(broken, "alice", 0o664)
    [failed] = daemon.wait_for("document.finished", timeout=60)
    report = Path(failed["error_report"])
    linked = as_user("alice", LINK_AS_RECORD, str(report), str(inbox / ".upload.json"))
    assert linked.stdout.strip() == "linked", linked.stderr
    letter = give(make_text_pdf(inbox / "letter.pdf", "Letter of Bob"), "bob", 0o664)
    wait_until(
        lambda: (
            daemon.find("document.finished", path="letter.pdf")
            or daemon.find("file.blocked", path=str(letter))
        ),
        60,
        "bob's letter converted or blocked",
    )
    assert not daemon.find("file.blocked", path=str(letter)), daemon.find("file.blocked")
    [done] = daemon.find("document.finished", path="letter.pdf")
    assert done["outcome"] == "done", done
    assert "Letter of Bob" in Path(done["markdown"]).read_text()
    assert daemon.stop() == 0


def test_synchronous_conversions_beyond_max_waiting_clients_are_refused_and_keep_nothing(
    tmp_path: Path, start_daemon: Any
) -> None:
    """A synchronous `/v1/convert/file` waits as a poller does, holding a connection: with
    `max_waiting_clients: 2`, two wait, a third is refused at once with 503, Retry-After
    and nothing kept (else enough of them take every connection uploads need), while an
    asynchronous task is taken meanwhile and the two waiting are answered in their time."""
    http = {"max_waiting_clients": 2, "docling": {"max_sync_wait_seconds": 15}}
    daemon, url = uploading_daemon(tmp_path, start_daemon, {"settle_seconds": 600}, http=http)
    pdf = make_text_pdf(tmp_path / "a.pdf", "Hello")
    answers: list[httpx.Response] = []
    waiters = [threading.Thread(target=lambda: answers.append(convert(url, pdf))) for _ in "ab"]
    for waiter in waiters:
        waiter.start()
    daemon.wait_for("task.accepted", count=2, timeout=30)
    third = convert(url, pdf)
    assert third.status_code == 503, third.text
    assert "max_waiting_clients" in third.json()["detail"]
    assert third.headers["Retry-After"]
    assert all(waiter.is_alive() for waiter in waiters), "answered before their wait was up"
    uploads = tmp_path / "data" / "inbox" / "uploads"
    assert len(list(uploads.glob("*/a.pdf"))) == 2, "the refused one was kept"
    taken = convert(url, pdf, route="/v1/convert/file/async")
    assert taken.status_code == 200, taken.text
    for waiter in waiters:
        waiter.join()
    assert [a.status_code for a in answers] == [504, 504], [a.text for a in answers]


SWAP_IN_A_LOOP = r"""
import os, sys, time
inbox, seconds = sys.argv[1], float(sys.argv[2])
uploads = os.path.join(inbox, "uploads")
end, swaps = time.monotonic() + seconds, 0
while time.monotonic() < end:
    try:
        os.rename(uploads, os.path.join(inbox, f"mine-{swaps}"))
        os.mkdir(uploads)
        swaps += 1
    except OSError:
        pass
print(swaps)
"""


@pytest.mark.users
def test_a_member_swapping_the_uploads_folder_in_a_loop_makes_no_upload_fail(
    shared_root: Path, runtime: Runtime, start_daemon: Any
) -> None:
    """alice renames `uploads` and makes her own in its place as fast as she can, while a
    client hands files over: every upload is taken (202, never a 503 because her folder
    stood there at that instant), ocrd stays ready (its tidying round too works in the
    folder it holds, so it never finds hers "unusable"), and the uploads convert as the
    uploads they are."""
    daemon, url, data = uploading_as_service(shared_root, runtime, start_daemon, settle_seconds=1)
    inbox = data / "inbox"
    pdf = make_text_pdf(shared_root / "letter.pdf", "Letter in a storm").read_bytes()
    swapping = threading.Thread(
        target=lambda: swapped.append(as_user("alice", SWAP_IN_A_LOOP, str(inbox), "12"))
    )
    swapped: list[Any] = []
    swapping.start()
    answers, readiness = [], []
    while swapping.is_alive():
        if len(answers) < 40:
            answers.append(
                httpx.post(
                    f"{url}/api/documents",
                    headers=AUTH,
                    params={"filename": "letter.pdf"},
                    content=pdf,
                    timeout=30,
                )
            )
        readiness.append(httpx.get(f"{url}/readyz", timeout=30))
    swapping.join()
    not_ready = [r.text for r in readiness if r.status_code != 200]
    assert not not_ready, f"{len(not_ready)} of {len(readiness)} not ready: {not_ready[:2]}"
    assert int(swapped[0].stdout) > 0, swapped[0].stderr
    refused = [a.text for a in answers if a.status_code != 202]
    assert not refused, f"{len(refused)} of {len(answers)} refused: {refused[:3]}"
    for answer in answers:  # every upload converts as the upload it is
        markdown = httpx.get(f"{answer.json()['markdown_url']}?wait=120", headers=AUTH, timeout=130)
        assert markdown.status_code == 200 and "Letter in a storm" in markdown.text
    assert daemon.find("uploads.set_aside") and daemon.find("uploads.moved_back")
    assert daemon.stop() == 0, daemon.output()


def _mime_base64(data: bytes) -> str:
    """base64 in lines of 76 characters, as `base64` and MIME encoders write it."""
    return base64.encodebytes(data).decode()


def test_base64_sources_at_the_edges_are_taken_whole_or_refused_by_name(
    tmp_path: Path, start_daemon: Any
) -> None:
    """base64 with line breaks (as `base64` writes it) is taken the same, short or long
    (decoded as it arrives); a long string under a key given twice, an escape base64 has
    not, 64 KB of whitespace, two sources, a filename of 100 KB are refused naming what is
    wrong, and nothing of them is kept; a name of 60 KB is taken shortened."""
    _, url = uploading_daemon(tmp_path, start_daemon, {"settle_seconds": 600})
    uploads = tmp_path / "data" / "inbox" / "uploads"

    def post(body: bytes) -> httpx.Response:
        return httpx.post(
            f"{url}/v1/convert/source/async",
            headers={**KEY, "Content-Type": "application/json"},
            content=body,
            timeout=60,
        )

    def source(name: str, encoded: str) -> dict[str, str]:
        return {"kind": "file", "filename": name, "base64_string": encoded}

    for name, size in (("short.pdf", 3000), ("long.pdf", 200_000)):
        data = os.urandom(size)
        answer = post(json.dumps({"sources": [source(name, _mime_base64(data))]}).encode())
        assert answer.status_code == 200, (name, answer.text)
        [arrived] = uploads.glob(f"*/{name}")
        assert arrived.read_bytes() == data, name
    long = base64.b64encode(os.urandom(100_000)).decode()
    refused = {
        "given twice": b'{"sources": [{"kind": "file", "filename": "twice.pdf", '
        b'"base64_string": "' + long.encode() + b'", "base64_string": "QUFB"}]}',
        "escaped character": json.dumps({"sources": [source("u.pdf", long)]})
        .replace(long[:8], "\\u0041" + long[1:8])
        .encode(),
        "64 KB": b" " * 70_000 + json.dumps({"sources": [source("w.pdf", "QUFB")]}).encode(),
        "only the file's base64_string": json.dumps(
            {"sources": [source("1.pdf", long), source("2.pdf", long)]}
        ).encode(),
        "exactly one source": json.dumps(
            {"sources": [source("1.pdf", "QUFB"), source("2.pdf", "QUFB")]}
        ).encode(),
        "sources.0.filename": json.dumps({"sources": [source("n" * 100_000, "QUFB")]}).encode(),
    }
    for named, body in refused.items():
        answer = post(body)
        assert 400 <= answer.status_code < 500, (named, answer.text)
        assert named in answer.json()["detail"], (named, answer.text)
    named_long = post(json.dumps({"sources": [source("n" * 60_000 + ".pdf", "QUFB")]}).encode())
    assert named_long.status_code in (200, 422), named_long.text
    names = sorted(p.name for p in uploads.glob("*/*") if not p.name.startswith("."))
    assert {"long.pdf", "short.pdf"} <= set(names), names
    assert not {"twice.pdf", "u.pdf", "w.pdf", "1.pdf", "2.pdf"} & set(names), names
    assert all(len(os.fsencode(name)) <= 255 for name in names), names
