"""Hostile ground, round 3: docling-serve's tasks under attack. A member of the inbox's group
renames the uploads folder; an inbox splits a task's document into parts; pollers try to
take every connection; a large base64 source; malformed requests of every kind. `ocrd run`
over real sockets, real users (marker `users`), real PDFs."""

from __future__ import annotations

import base64
import json
import os
import threading
from pathlib import Path
from typing import Any

import httpx
import pymupdf
import pytest
from conftest import wait_until
from test_docling_api import KEY, convert, settled
from test_group_member import as_user, uploading_as_service
from test_http import base_url
from test_shared_folder import make_text_pdf
from test_uploads import AUTH, WITH_TOKEN, uploading_daemon
from users import SERVICE, Runtime

pytestmark = pytest.mark.slow

STEAL = r"""
import os, sys
inbox = sys.argv[1]
os.rename(os.path.join(inbox, "uploads"), os.path.join(inbox, "stolen"))
os.mkdir(os.path.join(inbox, "uploads"))
print("stolen")
"""


def submit(url: str, path: Path, **fields: Any) -> str:
    answer = convert(url, path, route="/v1/convert/file/async", **fields)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["task_id"])


@pytest.mark.users
def test_a_group_member_who_renames_the_uploads_folder_loses_no_task(
    shared_root: Path, runtime: Runtime, start_daemon: Any
) -> None:
    """alice (the inbox's group) renames `uploads` and puts a folder of her own in its
    place while three tasks wait: they stay pending (never 404), a new task is taken,
    ocrd renames its folder back and sets hers aside (both logged), and every task is
    converted as the upload it is, none as a file of `stolen/`."""
    daemon, url, data = uploading_as_service(shared_root, runtime, start_daemon, settle_seconds=8)
    inbox = data / "inbox"
    tasks = [
        submit(url, make_text_pdf(shared_root / f"letter{n}.pdf", f"Letter {n}")) for n in range(3)
    ]
    stolen = as_user("alice", STEAL, str(inbox))
    assert stolen.stdout.strip() == "stolen", stolen.stderr
    for task_id in tasks:
        answer = httpx.get(f"{url}/v1/status/poll/{task_id}", timeout=30)
        assert answer.status_code == 200, answer.text
        assert answer.json()["task_status"] in ("pending", "started", "success")
    late = submit(url, make_text_pdf(shared_root / "late.pdf", "Letter late"))
    [moved] = wait_until(lambda: daemon.find("uploads.moved_back"), 30, "the folder put back")
    assert moved["found_at"] == str(inbox / "stolen")
    [aside] = daemon.find("uploads.set_aside")
    assert Path(aside["now_at"]).parent == inbox and Path(aside["now_at"]).is_dir()
    assert os.stat(inbox / "uploads").st_uid != os.stat(aside["now_at"]).st_uid
    for n, task_id in enumerate([*tasks, late]):
        assert settled(url, task_id, timeout=120)["task_status"] == "success"
        result = httpx.get(f"{url}/v1/result/{task_id}", timeout=30).json()
        assert f"Letter {n if n < 3 else 'late'}" in result["document"]["md_content"]
    assert not (data / "outbox" / "stolen").exists()
    assert not [e for e in daemon.find("document.claimed") if "stolen" in str(e.get("path"))]
    assert httpx.get(f"{url}/readyz").status_code == 200
    assert daemon.stop() == 0


def three_pages_with_a_blank(path: Path) -> Path:
    """Text, a blank page, text: two documents in a scan batch split at blank pages."""
    doc = pymupdf.open()
    for text in ("Invoice from Alpha", None, "Invoice from Beta"):
        page = doc.new_page(width=420, height=595)
        for line in range(12) if text else ():
            page.insert_text((40, 80 + 20 * line), f"{text}: line {line} of the page")
    doc.save(path)
    doc.close()
    return path


def test_a_task_in_an_inbox_that_splits_answers_every_part(
    tmp_path: Path, start_daemon: Any
) -> None:
    """An inbox that splits at blank pages: the task's Markdown, DoclingDocument and text
    hold both parts, in order, never part 1 alone."""
    inbox = {"pdf_text": "prefer", "split_on": ["blank"]}
    _, url = uploading_daemon(tmp_path, start_daemon, inbox)
    pdf = three_pages_with_a_blank(tmp_path / "batch.pdf")
    answer = convert(url, pdf, to_formats=["md", "json", "text"])
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["status"] == "success", result
    document = result["document"]
    for key in ("md_content", "text_content"):
        text = document[key]
        assert "Invoice from Alpha" in text and "Invoice from Beta" in text, key
        assert text.index("Invoice from Alpha") < text.index("Invoice from Beta"), key
    texts = [item["text"] for item in document["json_content"]["texts"]]
    assert any("Alpha" in t for t in texts) and any("Beta" in t for t in texts)
    assert list((tmp_path / "data" / "outbox").rglob("batch-2.md")), "the inbox did split"


def test_malformed_requests_are_refused_by_name_and_nothing_is_kept(
    tmp_path: Path, start_daemon: Any
) -> None:
    """Each malformed request is a 4xx naming what is wrong; none is a 500, none is
    accepted and then lost; the inbox holds no upload afterwards."""
    http = {"docling": {"url_hosts": ["h"]}}
    _, url = uploading_daemon(tmp_path, start_daemon, http=http)
    pdf = make_text_pdf(tmp_path / "a.pdf", "Hello")
    file = {
        "kind": "file",
        "filename": "a.pdf",
        "base64_string": base64.b64encode(b"%PDF-").decode(),
    }
    cases: list[tuple[bytes, str]] = [
        (
            json.dumps({"sources": [{"kind": "http", "url": "http://h:99999/a.pdf"}]}).encode(),
            "Port out of range",
        ),
        (json.dumps({"sources": [file], "target": "zip"}).encode(), "target must be an object"),
        (b'{"sources": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested deeper"),
        (
            json.dumps(
                {"sources": [file], "options": {"md_page_break_placeholder": "x" * 70_000}}
            ).encode(),
            "md_page_break_placeholder",
        ),
        (json.dumps({"sources": ["a.pdf"]}).encode(), "a source is an object"),
        (
            b'{"sources": [{"kind": "file", "filename": "a.pdf", "base64_string": "'
            + b"A" * 70_001
            + b'"}]}',
            "cut short",
        ),
        (b'{"sources": "', "ends inside a string"),
    ]
    for body, named in cases:
        answer = httpx.post(
            f"{url}/v1/convert/source/async",
            headers={**KEY, "Content-Type": "application/json"},
            content=body,
            timeout=60,
        )
        assert 400 <= answer.status_code < 500, (named, answer.status_code, answer.text)
        assert named in answer.json()["detail"], (named, answer.text)
    placeholder = convert(
        url, pdf, route="/v1/convert/file/async", md_page_break_placeholder="x" * 70_000
    )
    assert placeholder.status_code in (400, 422), placeholder.text
    assert "md_page_break_placeholder" in placeholder.json()["detail"]
    assert not [p for p in (tmp_path / "data" / "inbox").rglob("*") if p.is_file()]


def test_pollers_beyond_the_limit_are_answered_at_once_and_uploads_go_on(
    tmp_path: Path, start_daemon: Any
) -> None:
    """`max_waiting_clients` counts docling's pollers too: beyond it a poller is answered
    the task's status without waiting, while those within wait on; an upload is taken
    meanwhile."""
    http = {"max_waiting_clients": 2}
    _, url = uploading_daemon(tmp_path, start_daemon, {"settle_seconds": 60}, http=http)
    task_id = submit(url, make_text_pdf(tmp_path / "a.pdf", "Hello"))
    poll = f"{url}/v1/status/poll/{task_id}"
    answers: list[httpx.Response] = []
    waiters = [
        threading.Thread(
            target=lambda: answers.append(httpx.get(poll, params={"wait": 40}, timeout=60))
        )
        for _ in range(2)
    ]
    for waiter in waiters:
        waiter.start()
    wait_until(lambda: _waiting(url) == 2, 20, "two pollers waiting")
    beyond = httpx.get(poll, params={"wait": 40}, timeout=60)
    assert beyond.status_code == 200 and beyond.json()["task_status"] == "pending"
    assert all(waiter.is_alive() for waiter in waiters), "answered while the others wait"
    assert submit(url, make_text_pdf(tmp_path / "b.pdf", "Bye"))
    for waiter in waiters:
        waiter.join()
    assert [a.status_code for a in answers] == [200, 200]


def _waiting(url: str) -> int:
    """Clients waiting now, as the documents API's limit counts them: a third waiter of
    the documents API is refused while two wait."""
    answer = httpx.get(
        f"{url}/api/documents/aaaaaaaaaaaaaaaaaaaaaaaaaa", params={"wait": 1}, headers=AUTH
    )
    return 2 if answer.status_code == 503 else 0


def _rss_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def test_a_base64_source_is_decoded_as_it_arrives_within_half_its_size_again(
    tmp_path: Path, start_daemon: Any
) -> None:
    """A 19 MB file sent as base64: the daemon's resident memory peaks less than 1.5
    times the file's size above what it was, and the file arrives whole."""
    daemon, url = uploading_daemon(tmp_path, start_daemon, {"settle_seconds": 600})
    data = os.urandom(19 * 1024 * 1024)
    source = {
        "kind": "file",
        "filename": "big.pdf",
        "base64_string": base64.b64encode(data).decode(),
    }
    body = json.dumps({"sources": [source], "options": {"to_formats": ["md"]}}).encode()
    del source
    pid = daemon.process.pid
    small = {
        "kind": "file",
        "filename": "s.pdf",
        "base64_string": base64.b64encode(b"%PDF-1.4").decode(),
    }
    warm = httpx.post(f"{url}/v1/convert/source/async", headers=KEY, json={"sources": [small]})
    assert warm.status_code == 200, warm.text
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak starts again from now
    before = _rss_kib(pid, "VmRSS")
    answer = httpx.post(
        f"{url}/v1/convert/source/async",
        headers={**KEY, "Content-Type": "application/json"},
        content=body,
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    grown = (_rss_kib(pid, "VmHWM") - before) * 1024
    assert grown < 1.5 * len(data), f"grew {grown / 2**20:.0f} MiB for {len(data) / 2**20:.0f} MiB"
    [arrived] = (tmp_path / "data" / "inbox" / "uploads").glob("*/big.pdf")
    assert arrived.read_bytes() == data


@pytest.mark.users
def test_an_uploads_folder_renamed_while_ocrd_is_stopped_is_found_again(
    shared_root: Path, runtime: Runtime, start_daemon: Any
) -> None:
    """alice renames `uploads` (and makes her own) while ocrd is stopped with a task
    waiting: the next ocrd sets hers aside, renames its own back (by the records of ocrd's
    in it) and converts the task as the upload it is; its poll never says 404."""
    daemon, url, data = uploading_as_service(shared_root, runtime, start_daemon, settle_seconds=8)
    inbox = data / "inbox"
    task_id = submit(url, make_text_pdf(shared_root / "letter.pdf", "Letter waiting"))
    assert daemon.stop() == 0
    stolen = as_user("alice", STEAL, str(inbox))
    assert stolen.stdout.strip() == "stolen", stolen.stderr
    again = start_daemon(shared_root / "config.yaml", env=WITH_TOKEN, runtime=runtime, user=SERVICE)
    url = base_url(again)
    again.wait_for("daemon.ready", timeout=60)
    [moved] = wait_until(lambda: again.find("uploads.moved_back"), 30, "the folder put back")
    assert moved["found_at"] == str(inbox / "stolen")
    assert again.find("uploads.set_aside")
    assert settled(url, task_id, timeout=120)["task_status"] == "success"
    result = httpx.get(f"{url}/v1/result/{task_id}", timeout=30).json()
    assert "Letter waiting" in result["document"]["md_content"]
    assert not (data / "outbox" / "stolen").exists()
    assert again.stop() == 0
