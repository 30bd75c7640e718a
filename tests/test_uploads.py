"""Files handed over by HTTP, as a workflow tool, a mail gateway or a scanner's "scan to
web" does it: `ocrd run` as a subprocess, uploads over real sockets (httpx, curl, and raw
sockets for clients that misbehave), results fetched back and compared with `ocrd convert`."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import (
    DaemonProcess,
    claims_left,
    files_under,
    markdown_under,
    wait_until,
    write_config,
)
from helpers import make_pdf
from mounts import tmpfs
from test_http import base_url

from ocrd.config import load_config
from ocrd.intake.claiming import WorkArea
from ocrd.web.documents import DocumentState, find_upload

pytestmark = pytest.mark.slow

TOKEN = "s3cret-upload-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WITH_TOKEN = {"OCRD_HTTP_TOKEN": TOKEN}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def uploading_daemon(
    tmp_path: Path, start_daemon: Any, inbox: dict[str, Any] | None = None, **sections: Any
) -> tuple[DaemonProcess, str]:
    """`ocrd run` with one inbox taking uploads and the token set; it and its URL."""
    http = {"listen": "127.0.0.1:0", **sections.pop("http", {})}
    config = write_config(tmp_path, {"uploads": True, **(inbox or {})}, http=http, **sections)
    daemon = start_daemon(config, env=WITH_TOKEN)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready", timeout=120)
    return daemon, url


def upload(url: str, path: Path, name: str | None = None, **options: Any) -> httpx.Response:
    with path.open("rb") as handle:
        return httpx.post(
            f"{url}/api/documents",
            headers=AUTH,
            files={"file": (name or path.name, handle, "application/octet-stream")},
            timeout=60,
            **options,
        )


def follow(status_url: str, timeout: float) -> list[dict[str, Any]]:
    """Every change of the document's state until it settles, as `GET` answered it."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = httpx.get(status_url, headers=AUTH, timeout=10)
        assert answer.status_code == 200, answer.text
        status = answer.json()
        if not seen or (status["state"], status["pages_done"]) != (
            seen[-1]["state"],
            seen[-1]["pages_done"],
        ):
            seen.append(status)
        if status["state"] in ("done", "failed"):
            return seen
        time.sleep(0.1)
    raise AssertionError(f"not settled within {timeout} s: {seen}")


def inbox_entries(inbox: Path) -> list[str]:
    """Everything under the inbox, hidden names and empty folders included."""
    return sorted(str(p.relative_to(inbox)) for p in inbox.rglob("*"))


def tidied(inbox: Path) -> bool:
    """Whether the inbox holds nothing but the bare `uploads/` folder once the folders
    emptied by claims have been tidied away (it waits for that)."""
    wait_until(
        lambda: inbox_entries(inbox) == ["uploads"],
        40,
        lambda: f"only uploads/ in the inbox, found {inbox_entries(inbox)}",
    )
    return True


def ocrd_convert(config: Path, out: Path, *files: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ocrd",
            "convert",
            *map(str, files),
            "--out",
            str(out),
            "--config",
            str(config),
            "--log-format",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_an_uploaded_pdf_and_tiff_come_back_as_ocrd_convert_writes_them(
    tmp_path: Path, corpus: Path, start_daemon: Any
) -> None:
    """A scanned PDF sent as a form (httpx) and a TIFF as a raw body (the README's curl
    command) go through RapidOCR: their states are followed to done, their Markdown
    fetched by id and compared with `ocrd convert` of the same files, and the status page
    links the Markdown."""
    daemon, url = uploading_daemon(tmp_path, start_daemon, engine={"kind": "rapidocr"})
    pdf = corpus / "real" / "ocrmypdf__linn.pdf"
    tiff = corpus / "scans" / "phototest.tif"

    sent = upload(url, pdf)
    assert sent.status_code == 202, sent.text
    accepted = sent.json()
    assert accepted["state"] == "waiting" and accepted["filename"] == "ocrmypdf__linn.pdf"
    assert accepted["size"] == pdf.stat().st_size and len(accepted["id"]) == 26
    assert sent.headers["Location"] == accepted["status_url"]
    curl = subprocess.run(
        [
            "curl",
            "-sS",
            "--fail-with-body",
            "-H",
            f"Authorization: Bearer {TOKEN}",
            "--data-binary",
            f"@{tiff}",
            f"{url}/api/documents?filename=phototest.tif",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert curl.returncode == 0, curl.stdout + curl.stderr
    by_curl = json.loads(curl.stdout)
    assert by_curl["path"] == f"uploads/{by_curl['id']}/phototest.tif"

    pdf_states = follow(accepted["status_url"], 180)
    assert [s["state"] for s in pdf_states][-1] == "done"
    order = ["waiting", "converting", "done"]
    assert [s["state"] for s in pdf_states] == sorted(
        [s["state"] for s in pdf_states], key=order.index
    )
    done = pdf_states[-1]
    assert done["pages"] == 1 and done["reason"] is None
    assert done["uploaded_at"] <= done["started_at"] <= done["finished_at"]
    waited = httpx.get(f"{by_curl['status_url']}?wait=120", headers=AUTH, timeout=130).json()
    assert waited["state"] == "done"

    out = tmp_path / "convert"
    ocrd_convert(tmp_path / "config.yaml", out, pdf, tiff)
    for status, name in ((done, "ocrmypdf__linn"), (waited, "phototest")):
        markdown = httpx.get(status["links"]["markdown"], headers=AUTH)
        assert markdown.status_code == 200
        assert markdown.headers["Content-Type"].startswith("text/markdown")
        assert markdown.text == (out / f"{name}.md").read_text()
        assert markdown.text.strip()
        same_files = [f for f in files_under(out) if f.startswith(f"{name}.")]
        assert sorted(status["links"]["files"]) == same_files
    assert "LinnSequencer" in httpx.get(done["links"]["markdown"], headers=AUTH).text
    phototest = httpx.get(waited["links"]["markdown"], headers=AUTH).text
    assert "The quick brown dog jumped over the lazy fox." in phototest

    page = httpx.get(f"{url}/").text  # loopback: the status page needs no token
    [finished] = daemon.find("document.finished", path=done["path"])
    link = f'href="api/documents/{finished["doc"]}/markdown"'
    assert link in page
    assert (
        httpx.get(f"{url}/api/documents/{finished['doc']}/markdown").text
        == (out / "ocrmypdf__linn.md").read_text()
    )

    data = tmp_path / "data"
    assert files_under(data / "done") == sorted(
        [f"uploads/{accepted['id']}/ocrmypdf__linn.pdf", f"uploads/{by_curl['id']}/phototest.tif"]
    )
    assert (data / "done" / "uploads" / accepted["id"] / pdf.name).read_bytes() == (
        pdf.read_bytes()
    )
    assert tidied(data / "inbox") and claims_left(data / "work") == []
    received = daemon.find("upload.received")
    assert {e["id"] for e in received} == {accepted["id"], by_curl["id"]}
    assert daemon.stop() == 0


def two_inboxes(tmp_path: Path, **http: Any) -> Path:
    """A config whose first inbox takes uploads and whose second (`data/plain`) does not."""
    config = write_config(tmp_path, {"uploads": True}, http={"listen": "127.0.0.1:0", **http})
    data = yaml.safe_load(config.read_text())
    (tmp_path / "data" / "plain").mkdir()
    data["inboxes"].append({"path": "data/plain", "work": "data/plain-work"})
    config.write_text(yaml.safe_dump(data))
    return config


def answer_of(client: socket.socket, timeout: float = 30) -> bytes:
    """The first response the server wrote (its headers and its Content-Length of body)."""
    client.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data and (chunk := client.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length: *(\d+)", head)
    while length and len(body) < int(length.group(1)) and (chunk := client.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body


def test_refused_uploads_get_their_4xx_and_leave_the_inbox_clean(
    tmp_path: Path, start_daemon: Any
) -> None:
    config = two_inboxes(tmp_path, max_upload_mb=1)
    daemon = start_daemon(config, env=WITH_TOKEN)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready")
    pdf = make_pdf(tmp_path / "scan.pdf", 1)
    documents = f"{url}/api/documents"

    def post(**options: Any) -> httpx.Response:
        return httpx.post(documents, timeout=30, **options)

    form = {"file": ("scan.pdf", pdf.read_bytes(), "application/pdf")}
    assert httpx.get(f"{url}/api/status").status_code == 200  # loopback reads freely...
    no_token = post(files=form)
    assert no_token.status_code == 401 and "bearer token" in no_token.json()["error"]
    wrong = post(files=form, headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 401  # ...but uploads always need the token
    unknown = post(files=form, headers=AUTH, params={"inbox": "elsewhere"})
    assert unknown.status_code == 404 and "'elsewhere'" in unknown.json()["error"]
    plain = post(files=form, headers=AUTH, params={"inbox": "plain"})
    assert plain.status_code == 403 and "does not take uploads" in plain.json()["error"]
    empty = post(content=b"", headers=AUTH, params={"filename": "scan.pdf"})
    assert empty.status_code == 400 and "empty" in empty.json()["error"]
    empty_file = post(files={"file": ("scan.pdf", b"", "application/pdf")}, headers=AUTH)
    assert empty_file.status_code == 400 and "empty" in empty_file.json()["error"]
    no_file = post(files={"document": ("scan.pdf", pdf.read_bytes())}, headers=AUTH)
    assert no_file.status_code == 400 and "'file'" in no_file.json()["error"]
    big = os.urandom(1024 * 1024 + 1)
    too_large = post(content=big, headers=AUTH, params={"filename": "big.pdf"})
    assert too_large.status_code == 413 and "max_upload_mb: 1" in too_large.json()["error"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: found too large while streaming
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    streamed = post(content=chunks(), headers=AUTH, params={"filename": "big.pdf"})
    assert streamed.status_code == 413
    unfinished = post(content=pdf.read_bytes(), headers=AUTH, params={"filename": "x.pdf.part"})
    assert unfinished.status_code == 422 and "x.pdf.part" in unfinished.json()["error"]

    # A client that asks before sending its body hears the refusal without sending it.
    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as client:
        client.sendall(
            b"POST /api/documents?filename=big.pdf HTTP/1.1\r\nHost: ocrd\r\n"
            b"Authorization: Bearer wrong\r\nContent-Length: 50000000\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        refused = answer_of(client)
    assert refused.startswith(b"HTTP/1.1 401") and b"100 Continue" not in refused

    # The last refusal may be logged just after its answer went out.
    refusals = [e["status"] for e in daemon.wait_for("upload.refused", count=11)]
    assert sorted(refusals) == [400, 400, 400, 401, 401, 401, 403, 404, 413, 413, 422]
    assert not daemon.find("upload.received")
    inbox = tmp_path / "data" / "inbox"
    assert inbox_entries(inbox) in ([], ["uploads"])
    assert inbox_entries(tmp_path / "data" / "plain") == []
    assert daemon.stop() == 0


def test_uploads_are_off_unless_an_inbox_says_so_and_need_a_token_set(
    tmp_path: Path, start_daemon: Any
) -> None:
    config = write_config(tmp_path, http={"listen": "127.0.0.1:0"})
    daemon = start_daemon(config, env=WITH_TOKEN)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready")
    off = httpx.post(f"{url}/api/documents?filename=a.pdf", content=b"%PDF-", headers=AUTH)
    assert off.status_code == 403 and "uploads: true" in off.json()["error"]
    settings = yaml.safe_load(config.read_text())
    settings["inboxes"][0]["uploads"] = True
    config.write_text(yaml.safe_dump(settings))
    daemon.process.send_signal(signal.SIGHUP)  # `systemctl reload ocrd`
    daemon.wait_for("config.reloaded")
    on = httpx.post(f"{url}/api/documents?filename=a.pdf", content=b"%PDF-", headers=AUTH)
    assert on.status_code == 202, on.text
    assert daemon.stop() == 0

    config = write_config(tmp_path, {"uploads": True}, http={"listen": "127.0.0.1:0"})
    refused = start_daemon(config)  # uploads on, no token in the environment
    assert refused.process.wait(timeout=60) == 78
    [problem] = refused.find("startup.refused")
    assert "uploads always need the bearer token" in problem["reason"]


def test_an_upload_aborted_halfway_or_stalled_leaves_nothing_in_the_inbox(
    tmp_path: Path, start_daemon: Any
) -> None:
    daemon, url = uploading_daemon(tmp_path, start_daemon, http={"header_timeout_seconds": 2})
    port = int(url.rsplit(":", 1)[1])
    inbox = tmp_path / "data" / "inbox"
    body = os.urandom(2 * 1024 * 1024)
    head = (
        "POST /api/documents?filename=scan.pdf HTTP/1.1\r\nHost: ocrd\r\n"
        f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()

    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(head + body[: len(body) // 2])
        wait_until(
            lambda: any(".upload.part" in e for e in inbox_entries(inbox)),
            60,
            "the upload's hidden part in the inbox",
        )
    daemon.wait_for("upload.aborted")  # the client went away halfway
    assert inbox_entries(inbox) == ["uploads"]

    boundary = "ocrd-test-boundary"
    multipart = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
        f'filename="scan.pdf"\r\nContent-Type: application/pdf\r\n\r\n'
    ).encode() + body
    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(
            (
                "POST /api/documents HTTP/1.1\r\nHost: ocrd\r\n"
                f"Authorization: Bearer {TOKEN}\r\n"
                f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                f"Content-Length: {len(multipart) + 100}\r\n\r\n"
            ).encode()
            + multipart[: len(multipart) // 2]
        )
    daemon.wait_for("upload.aborted", count=2)
    assert inbox_entries(inbox) == ["uploads"]

    with socket.create_connection(("127.0.0.1", port)) as client:
        client.sendall(head + body[:100_000])  # then nothing: a stalled client
        answer = answer_of(client)
    assert answer.startswith(b"HTTP/1.1 408") and b"header_timeout_seconds" in answer
    assert inbox_entries(inbox) == ["uploads"]
    assert not daemon.find("upload.received") and not daemon.find("document.claimed")
    assert daemon.stop() == 0


def test_a_daemon_killed_while_an_upload_converts_answers_for_it_after_the_restart(
    tmp_path: Path, start_daemon: Any
) -> None:
    """SIGKILL while the uploaded document is half converted: the status URL answers again
    once ocrd is back, and the Markdown is fetched once done, the same as `ocrd convert`."""
    slow = {"kind": "simulated", "simulated": {"seconds_per_page": 1.0, "capacity": 1}}
    listen = f"127.0.0.1:{free_port()}"  # the same address after the restart
    config = write_config(tmp_path, {"uploads": True}, engine=slow, http={"listen": listen})
    daemon = start_daemon(config, env=WITH_TOKEN)
    daemon.wait_for("daemon.ready")
    pdf = make_pdf(tmp_path / "report.pdf", 6)
    accepted = upload(f"http://{listen}", pdf).json()
    status_url = accepted["status_url"]

    def converting() -> dict[str, Any] | None:
        status = httpx.get(status_url, headers=AUTH).json()
        return status if status["state"] == "converting" and status["pages_done"] else None

    halfway = wait_until(converting, 60, "the upload being converted")
    assert halfway["pages"] == 6 and 1 <= halfway["pages_done"] < 6
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait(timeout=30)
    with pytest.raises(httpx.ConnectError):
        httpx.get(status_url, headers=AUTH)

    again = start_daemon(config, env=WITH_TOKEN)
    again.wait_for("http.listening")
    after = wait_until(lambda: _answer(status_url), 60, "the status URL to answer again")
    assert after.status_code == 200 and after.json()["state"] in ("converting", "done")
    done = httpx.get(f"{status_url}?wait=120", headers=AUTH, timeout=130).json()
    assert done["state"] == "done" and done["pages"] == 6
    assert again.find("document.recovered", path=accepted["path"])
    markdown = httpx.get(done["links"]["markdown"], headers=AUTH).text

    out = tmp_path / "convert"
    ocrd_convert(config, out, pdf)
    assert markdown == (out / "report.md").read_text() and "<!-- page 6 -->" in markdown
    data = tmp_path / "data"
    assert markdown_under(data / "outbox") == [f"uploads/{accepted['id']}/report.md"]
    assert claims_left(data / "work") == [] and tidied(data / "inbox")
    assert again.stop() == 0


def _answer(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, headers=AUTH, timeout=10)
    except httpx.TransportError:
        return None


def test_waiting_for_a_document_holds_no_thread_and_blocks_nothing(
    tmp_path: Path, start_daemon: Any
) -> None:
    """Forty clients wait (`?wait=`) on one upload: the daemon gains no thread per waiter,
    /healthz answers meanwhile, and every waiter hears of the settlement."""
    slow = {"kind": "simulated", "simulated": {"seconds_per_page": 1.0, "capacity": 1}}
    http = {"max_waiting_clients": 40}  # beyond it a waiter is told 503 (tests/test_load.py)
    daemon, url = uploading_daemon(tmp_path, start_daemon, engine=slow, http=http)
    accepted = upload(url, make_pdf(tmp_path / "long.pdf", 8)).json()
    threads_before = len(os.listdir(f"/proc/{daemon.process.pid}/task"))
    answers: list[dict[str, Any]] = []

    def wait() -> None:
        answer = httpx.get(f"{accepted['status_url']}?wait=120", headers=AUTH, timeout=130)
        answers.append(answer.json())

    waiters = [threading.Thread(target=wait) for _ in range(40)]
    for waiter in waiters:
        waiter.start()
    time.sleep(2)
    threads_during = len(os.listdir(f"/proc/{daemon.process.pid}/task"))
    health = httpx.get(f"{url}/healthz", timeout=5)
    for waiter in waiters:
        waiter.join(timeout=150)
    assert health.status_code == 200
    assert threads_during - threads_before < 10, (threads_before, threads_during)
    assert len(answers) == 40 and {a["state"] for a in answers} == {"done"}
    assert daemon.stop() == 0


def test_outputs_are_served_only_from_the_documents_own_files_never_through_a_link(
    tmp_path: Path, start_daemon: Any
) -> None:
    daemon, url = uploading_daemon(tmp_path, start_daemon, inbox={"layout_file": True})
    accepted = upload(url, make_pdf(tmp_path / "scan.pdf", 1)).json()
    done = httpx.get(f"{accepted['status_url']}?wait=60", headers=AUTH, timeout=70).json()
    assert sorted(done["links"]["files"]) == [
        "scan.assets/page1-figure1.png",
        "scan.layout.json",
        "scan.md",
    ]
    base = accepted["status_url"]
    layout = httpx.get(f"{base}/scan.layout.json", headers=AUTH)
    assert layout.status_code == 200 and layout.json()["pages"][0]["page"] == 1
    figure = httpx.get(f"{base}/scan.assets/page1-figure1.png", headers=AUTH)
    assert figure.status_code == 200 and figure.content.startswith(b"\x89PNG")
    assert figure.headers["Content-Type"] == "image/png"

    folder = tmp_path / "data" / "outbox" / "uploads" / accepted["id"]
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the web")
    (folder / "scan.layout.json").unlink()
    (folder / "scan.layout.json").symlink_to(secret)  # someone with the share's access
    (folder / "scan.assets" / "page1-figure1.png").unlink()
    (folder / "scan.assets" / "page1-figure1.png").symlink_to(secret)
    (folder / "other.md").write_text("another file in the folder")
    for path in (
        "scan.layout.json",
        "scan.assets/page1-figure1.png",
        "other.md",
        "..%2F..%2Fsecret.txt",
        "%2E%2E/secret.txt",
        "scan.assets/..%2Fscan.md",
    ):
        answer = httpx.get(f"{base}/{path}", headers=AUTH)
        assert answer.status_code == 404, (path, answer.text)
        assert "not for the web" not in answer.text
    assert httpx.get(f"{base}/markdown", headers=AUTH).status_code == 200

    elsewhere = tmp_path / "elsewhere"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere)  # the document's own folder replaced by a link
    assert httpx.get(f"{base}/markdown", headers=AUTH).status_code in (404, 409)
    unknown = httpx.get(f"{url}/api/documents/{'a' * 26}", headers=AUTH)
    assert unknown.status_code == 404
    assert httpx.get(f"{url}/api/documents/..%2F..%2Fetc", headers=AUTH).status_code == 404
    assert daemon.stop() == 0


def test_an_upload_that_fails_says_why_and_has_no_markdown(
    tmp_path: Path, start_daemon: Any
) -> None:
    daemon, url = uploading_daemon(tmp_path, start_daemon)
    broken = tmp_path / "contract.pdf"
    broken.write_bytes(b"%PDF-1.7\n1 0 obj\n<< /Type /Cat")
    accepted = upload(url, broken).json()
    failed = httpx.get(f"{accepted['status_url']}?wait=60", headers=AUTH, timeout=70).json()
    assert failed["state"] == "failed" and failed["stage"] == "render"
    assert "damaged" in failed["reason"] and failed["finished_at"]
    assert failed["links"]["markdown"] is None and failed["links"]["files"] == {}
    markdown = httpx.get(accepted["markdown_url"], headers=AUTH)
    assert markdown.status_code == 409
    assert markdown.json()["state"] == "failed" and "damaged" in markdown.json()["error"]
    folder = f"uploads/{accepted['id']}"
    failed_folder = tmp_path / "data" / "failed"
    assert files_under(failed_folder) == [f"{folder}/contract.error.json", f"{folder}/contract.pdf"]
    report = json.loads((failed_folder / folder / "contract.error.json").read_text())
    assert report["message"] == failed["reason"]
    assert daemon.stop() == 0


@pytest.mark.mounts
def test_an_upload_into_a_full_disk_is_answered_503_and_leaves_nothing(
    tmp_path: Path, start_daemon: Any
) -> None:
    with tmpfs(tmp_path / "data", "4m"):
        daemon, url = uploading_daemon(tmp_path, start_daemon)
        too_much = httpx.post(
            f"{url}/api/documents",
            params={"filename": "huge.pdf"},
            headers=AUTH,
            content=os.urandom(6 * 1024 * 1024),
            timeout=60,
        )
        assert too_much.status_code == 503
        assert "No space left on device" in too_much.json()["error"]
        [failed] = daemon.wait_for("upload.failed")
        assert "ENOSPC" in failed["error"]
        assert inbox_entries(tmp_path / "data" / "inbox") == ["uploads"]
        fits = upload(url, make_pdf(tmp_path / "small.pdf", 1))  # the space is free again
        assert fits.status_code == 202
        done = httpx.get(f"{fits.json()['status_url']}?wait=60", headers=AUTH, timeout=70)
        assert done.json()["state"] == "done"
        assert daemon.stop() == 0


def test_the_openapi_description_is_valid_and_names_every_route(
    tmp_path: Path, start_daemon: Any
) -> None:
    from openapi_spec_validator import validate

    daemon, url = uploading_daemon(tmp_path, start_daemon)
    description = httpx.get(f"{url}/api/openapi.json").json()
    validate(description)
    assert {
        "/api/documents",
        "/api/documents/{id}",
        "/api/documents/{id}/markdown",
        "/api/documents/{id}/{name}",
        "/api/documents/{id}/{folder}/{name}",
    } <= set(description["paths"])
    states = description["components"]["schemas"]["DocumentState"]["enum"]
    assert states == ["waiting", "converting", "done", "failed"]
    assert daemon.stop() == 0


def test_an_upload_claimed_by_another_daemon_on_the_inbox_is_found_converting(
    tmp_path: Path,
) -> None:
    """Daemons sharing an inbox keep their claims in folders of their own (`work/<instance>/`):
    whichever daemon is asked finds the upload there, in its claim."""
    config = load_config(write_config(tmp_path, {"uploads": True}))
    inbox = config.inboxes[0]
    upload = inbox.path / "uploads" / "0123456789abcdef" / "report.pdf"
    upload.parent.mkdir(parents=True)
    make_pdf(upload, 1)
    claim = WorkArea(inbox.path, inbox.work / "gpu2").claim(upload)
    assert claim is not None

    found = find_upload(inbox, "0123456789abcdef")

    assert found is not None and found.state == DocumentState.converting
    assert found.claim == claim.id and found.path == "uploads/0123456789abcdef/report.pdf"
