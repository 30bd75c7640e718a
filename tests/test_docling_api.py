"""docling-serve's API as its users call it: docling's own client (`docling-client` from
PyPI), httpx and curl against `ocrd run` over real sockets; results loaded as
DoclingDocuments; options honoured or refused; a task that outlives a SIGKILL; results
tidied after their time; URL sources only from listed hosts."""

from __future__ import annotations

import base64
import http.server
import json
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import files_under, wait_until
from docling.service_client import ConversionError, DoclingServiceClient
from docling_core.types.doc.document import DoclingDocument
from docling_core.types.doc.labels import DocItemLabel
from test_uploads import TOKEN, uploading_daemon

pytestmark = pytest.mark.slow

KEY = {"X-Api-Key": TOKEN}
SLOW_ENGINE = {"kind": "simulated", "simulated": {"seconds_per_page": 3}}


def convert(url: str, path: Path, route: str = "/v1/convert/file", **fields: Any) -> httpx.Response:
    with path.open("rb") as handle:
        return httpx.post(
            f"{url}{route}",
            headers=KEY,
            data=fields,
            files={"files": (path.name, handle)},
            timeout=300,
        )


def settled(url: str, task_id: str, timeout: float = 300) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = httpx.get(f"{url}/v1/status/poll/{task_id}", params={"wait": 5}, timeout=30)
        assert answer.status_code == 200, answer.text
        status = answer.json()
        if status["task_status"] not in ("pending", "started"):
            return status
    raise AssertionError(f"task {task_id} not settled in {timeout} s")


def test_docling_client_converts_a_scan_and_a_born_digital_pdf(
    tmp_path: Path, corpus: Path, start_daemon: Any
) -> None:
    """docling's client, unchanged but for the URL and key: `convert` (it submits a task
    and waits) and `submit` (a job), both loading the answer as a DoclingDocument; RapidOCR
    reads the scan, the PDF's text layer stands in for OCR."""
    inbox = {"pdf_text": "prefer"}
    _, url = uploading_daemon(tmp_path, start_daemon, inbox, engine={"kind": "rapidocr"})
    scan = corpus / "scans" / "phototest.tif"
    pdf = corpus / "real" / "sample-files__google-doc-document.pdf"
    with DoclingServiceClient(url=url, api_key=TOKEN, job_timeout=300) as client:
        converted = client.convert(scan)
        job = client.submit(pdf)
        submitted = job.result(timeout=300)

    assert converted.status.value == "success"
    document = converted.document
    assert isinstance(document, DoclingDocument)
    assert document.texts[0].text.startswith("This is a lot of 12 point text")
    assert document.texts[0].prov[0].page_no == 1
    assert submitted.status.value == "success"
    digital = submitted.document
    assert [t.text for t in digital.texts if t.label is DocItemLabel.SECTION_HEADER] == [
        "Example document"
    ]
    assert {"Jakarta", "Berlin"} <= {c.text for c in digital.tables[0].data.table_cells}


def test_the_synchronous_routes_answer_when_done_in_every_format(
    tmp_path: Path, corpus: Path, start_daemon: Any
) -> None:
    """/v1/convert/file (multipart) and /v1/convert/source (base64) answer with the
    document once converted: Markdown, DoclingDocument and text as to_formats asks."""
    _, url = uploading_daemon(tmp_path, start_daemon, engine={"kind": "rapidocr"})
    scan = corpus / "scans" / "phototest.tif"
    answer = convert(url, scan, to_formats=["md", "json", "text"])
    assert answer.status_code == 200, answer.text
    result = answer.json()
    assert result["status"] == "success" and result["errors"] == []
    assert result["processing_time"] > 0
    document = result["document"]
    assert document["filename"] == "phototest.tif"
    assert document["md_content"].startswith("This is a lot of 12 point text")
    assert document["text_content"].startswith("This is a lot of 12 point text")
    loaded = DoclingDocument.model_validate(document["json_content"])
    assert loaded.texts[0].text == document["text_content"].split("\n\n")[0]

    source = {
        "kind": "file",
        "filename": "scan.tif",
        "base64_string": base64.b64encode(scan.read_bytes()).decode(),
    }
    answer = httpx.post(
        f"{url}/v1/convert/source",
        headers=KEY,
        timeout=300,
        json={"sources": [source], "options": {"to_formats": ["text"]}},
    )
    assert answer.status_code == 200, answer.text
    document = answer.json()["document"]
    assert document["filename"] == "scan.tif" and document["md_content"] is None
    assert document["text_content"].startswith("This is a lot of 12 point text")


def test_options_are_honoured_or_refused_by_name(
    tmp_path: Path, corpus: Path, start_daemon: Any
) -> None:
    """page_range converts only its pages (keeping their numbers); image_export_mode
    decides how the figures come back; an option ocrd would not honour is answered 422
    naming it, and leaves nothing in the inbox."""
    engine = {"kind": "simulated", "simulated": {"seconds_per_page": 0.05}}
    _, url = uploading_daemon(tmp_path, start_daemon, engine=engine)
    scans = corpus / "scans" / "multipage-scan.tif"

    ranged = convert(
        url, scans, to_formats=["json", "md"], page_range=["2", "3"], image_export_mode="referenced"
    ).json()
    doc = DoclingDocument.model_validate(ranged["document"]["json_content"])
    assert sorted(doc.pages) == [2, 3]
    assert {p.prov[0].page_no for p in doc.pictures} == {2, 3}
    [link] = [
        line for line in ranged["document"]["md_content"].splitlines() if line.startswith("![")
    ][:1]
    figure = httpx.get(link[link.index("(") + 1 : -1], timeout=30)
    assert figure.status_code == 200 and figure.content.startswith(b"\x89PNG")

    embedded = convert(
        url,
        corpus / "scans" / "phototest.tif",
        to_formats=["json", "md"],
        image_export_mode="embedded",
    ).json()["document"]
    assert "](data:image/png;base64," in embedded["md_content"]
    picture = embedded["json_content"]["pictures"][0]
    assert picture["image"]["uri"].startswith("data:image/png;base64,")
    placeholder = convert(url, corpus / "scans" / "phototest.tif").json()["document"]
    assert "<!-- image -->" in placeholder["md_content"] and placeholder["json_content"] is None

    for field, value, named in (
        ("ocr_lang", "de", "ocr_lang"),
        ("to_formats", "vtt", "to_formats"),
        ("do_picture_description", "true", "do_picture_description"),
        ("table_mode", "fast", "table_mode"),
        ("no_such_option", "1", "no_such_option"),
    ):
        refused = convert(url, scans, route="/v1/convert/file/async", **{field: value})
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"].startswith(named)
    accepted = convert(
        url, scans, route="/v1/convert/file/async", table_mode="accurate", abort_on_error="true"
    )
    assert accepted.status_code == 200 and accepted.json()["task_status"] == "pending"
    inbox = tmp_path / "data" / "inbox"
    wait_until(
        lambda: not [p for p in files_under(inbox) if not Path(p).name.startswith(".")],
        60,
        "the accepted task claimed, nothing refused left",
    )


def test_a_task_accepted_before_a_sigkill_is_answered_after_the_restart(
    tmp_path: Path, corpus: Path, start_daemon: Any
) -> None:
    """The task's options travel with its upload: after a SIGKILL while it converts, the
    restarted daemon converts it with its page range, and the client polling the same task
    id gets its result."""
    daemon, url = uploading_daemon(tmp_path, start_daemon, engine=SLOW_ENGINE)
    accepted = convert(
        url,
        corpus / "scans" / "multipage-scan.tif",
        "/v1/convert/file/async",
        page_range=["2", "3"],
        to_formats=["json"],
    )
    assert accepted.status_code == 200, accepted.text
    task_id = accepted.json()["task_id"]
    daemon.wait_for("document.started", timeout=120)
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait()

    config = tmp_path / "config.yaml"
    again = start_daemon(config, env={"OCRD_HTTP_TOKEN": TOKEN})
    url = f"http://{again.wait_for('http.listening')[0]['address']}"
    status = settled(url, task_id)
    assert status["task_status"] == "success", status
    result = httpx.get(f"{url}/v1/result/{task_id}", timeout=60).json()
    doc = DoclingDocument.model_validate(result["document"]["json_content"])
    assert sorted(doc.pages) == [2, 3]
    [opened] = [e for e in again.find("document.opened") if e.get("page_range")]
    assert opened["page_range"] == [2, 3]


def test_a_client_that_goes_away_loses_nothing_and_results_are_tidied_in_time(
    tmp_path: Path, corpus: Path, start_daemon: Any
) -> None:
    """A synchronous client that gives up waiting leaves a task that is converted all the
    same; its result is there until results_keep_seconds after it settled, then its files
    are removed and the task is unknown."""
    http = {"docling": {"results_keep_seconds": 8}}
    daemon, url = uploading_daemon(tmp_path, start_daemon, engine=SLOW_ENGINE, http=http)
    with pytest.raises(httpx.ReadTimeout), (corpus / "scans" / "phototest.tif").open("rb") as f:
        httpx.post(
            f"{url}/v1/convert/file",
            headers=KEY,
            files={"files": ("scan.tif", f)},
            timeout=httpx.Timeout(60, read=1),
        )
    [accepted] = daemon.wait_for("task.accepted")
    task_id = accepted["id"]
    assert settled(url, task_id)["task_status"] == "success"
    result = httpx.get(f"{url}/v1/result/{task_id}", timeout=30)
    assert result.status_code == 200 and result.json()["document"]["md_content"]
    data = tmp_path / "data"
    assert files_under(data / "outbox" / "uploads" / task_id)
    daemon.wait_for("task.expired", timeout=60, id=task_id)
    gone = httpx.get(f"{url}/v1/status/poll/{task_id}", timeout=30)
    assert gone.status_code == 404 and gone.json() == {"detail": "Task not found."}
    for folder in ("outbox", "done", "inbox"):
        assert not (data / folder / "uploads" / task_id).exists()


def test_failure_and_the_answers_clients_rely_on(
    tmp_path: Path, corpus: Path, start_daemon: Any
) -> None:
    """A file that cannot be read fails its task with the reason (docling's client raises
    it); an unknown task is 404 in docling-serve's words; converting needs the key, from
    loopback too; a presigned target is refused in the words docling's client falls back on."""
    _, url = uploading_daemon(tmp_path, start_daemon, engine={"kind": "rapidocr"})
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\nnot a pdf at all\n")
    with (
        DoclingServiceClient(url=url, api_key=TOKEN, job_timeout=120) as client,
        pytest.raises(ConversionError),
    ):
        client.convert(broken)
    answer = convert(url, broken)
    assert answer.json()["status"] == "failure"
    assert answer.json()["errors"][0]["error_message"]
    assert httpx.get(f"{url}/v1/result/aaaaaaaaaaaaaaaaaaaaaaaaaa").json() == {
        "detail": "Task not found."
    }
    with broken.open("rb") as handle:
        keyless = httpx.post(f"{url}/v1/convert/file", files={"files": handle})
    assert keyless.status_code == 401
    presigned = convert(url, broken, target_type="presigned_url")
    assert presigned.status_code == 422
    assert "requires artifact storage to be configured" in presigned.json()["detail"]


@pytest.fixture
def file_server(corpus: Path) -> Iterator[str]:
    """A plain HTTP server on loopback serving the corpus' scans."""
    handler = lambda *a: http.server.SimpleHTTPRequestHandler(  # noqa: E731
        *a, directory=str(corpus / "scans")
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_url_sources_only_from_listed_hosts(
    tmp_path: Path, start_daemon: Any, file_server: str
) -> None:
    http = {"docling": {"url_hosts": ["127.0.0.1"]}}
    _, url = uploading_daemon(tmp_path, start_daemon, engine={"kind": "rapidocr"}, http=http)

    def source(address: str) -> httpx.Response:
        return httpx.post(
            f"{url}/v1/convert/source",
            headers=KEY,
            timeout=300,
            json={"sources": [{"kind": "http", "url": address}], "options": {"to_formats": ["md"]}},
        )

    fetched = source(f"{file_server}/phototest.tif")
    assert fetched.status_code == 200, fetched.text
    assert fetched.json()["document"]["md_content"].startswith("This is a lot of 12 point")
    unlisted = source("http://example.org/scan.pdf")
    assert unlisted.status_code == 422 and "url_hosts" in unlisted.json()["detail"]


def test_a_listed_name_that_resolves_to_an_internal_address_is_refused() -> None:
    """`localhost` listed, but not the loopback address it resolves to: no fetch."""
    import asyncio

    from ocrd.uploads.uploads import UploadRefused
    from ocrd.web.docling_sources import url_source

    with pytest.raises(UploadRefused, match=r"internal address 127\.0\.0\.1"):
        asyncio.run(url_source({"url": "http://localhost:9/x.pdf"}, ("localhost",), 1000, 5))


def test_a_url_source_is_fetched_from_the_address_that_was_checked(
    monkeypatch: pytest.MonkeyPatch, corpus: Path
) -> None:
    """DNS rebinding: a listed name resolving to one address at the check and another at
    the fetch. Here the check's lookup is made to answer a listed address (a stand-in for
    a resolver, named as such) for a name the system cannot resolve at all: the fetch
    reaches the server only if it connects to the address checked, with the name as Host,
    instead of looking the name up again."""
    import asyncio
    import http.server
    import threading

    from ocrd.web import docling_sources

    pdf = (corpus / "real" / "ocrmypdf__3small.pdf").read_bytes()
    seen: list[str] = []

    class Serve(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers["Host"])
            self.send_response(200)
            self.send_header("Content-Length", str(len(pdf)))
            self.end_headers()
            self.wfile.write(pdf)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Serve)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]

    async def checked_lookup(host: str, port: int) -> list[str]:
        return ["127.0.0.1"]

    monkeypatch.setattr(docling_sources, "resolve", checked_lookup)
    try:
        fetched = asyncio.run(
            docling_sources.url_source(
                {"url": f"http://rebinding.invalid:{port}/a.pdf"},
                ("rebinding.invalid", "127.0.0.1"),
                10_000_000,
                10,
            )
        )
    finally:
        server.shutdown()
    assert seen == [f"rebinding.invalid:{port}"]
    assert b"".join(fetched.pieces()) == pdf and fetched.name == "a.pdf"


def test_the_api_page_and_its_description_are_served_without_a_cdn(
    tmp_path: Path, start_daemon: Any
) -> None:
    from openapi_spec_validator import validate

    _, url = uploading_daemon(tmp_path, start_daemon)
    page = httpx.get(f"{url}/docs")
    assert page.status_code == 200 and "/docs/static/swagger-ui-bundle.js" in page.text
    assert "http" not in page.text.replace('lang="en"', "")  # nothing from elsewhere
    bundle = httpx.get(f"{url}/docs/static/swagger-ui-bundle.js")
    assert bundle.status_code == 200 and len(bundle.content) > 100_000
    description = httpx.get(f"{url}/openapi.json").json()
    validate(description)
    assert "/v1/convert/file/async" in description["paths"]
    assert json.loads(httpx.get(f"{url}/health").text) == {"status": "ok"}


def readme_block(marker: str) -> str:
    """The code block after `marker` in the manual's HTTP page."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "http.md").read_text()
    after = text[text.index(marker) :]
    start = after.index("```sh\n") + len("```sh\n")
    return after[start : after.index("\n```", start)]


def test_the_readme_curl_examples_work_as_written(
    tmp_path: Path, corpus: Path, start_daemon: Any
) -> None:
    """The README's curl commands, run by bash as written (the token and the address
    given by the environment instead of their placeholder lines)."""
    import subprocess

    _, url = uploading_daemon(
        tmp_path, start_daemon, {"pdf_text": "prefer"}, engine={"kind": "rapidocr"}
    )
    script = "\n".join(
        line
        for line in readme_block("<!-- docling-curl-examples").splitlines()
        if not line.startswith(("export OCRD_HTTP_TOKEN=", "OCRD="))
    )
    work = tmp_path / "client"
    work.mkdir()
    (work / "scan.tif").write_bytes((corpus / "scans" / "phototest.tif").read_bytes())
    (work / "scan.pdf").write_bytes(
        (corpus / "real" / "sample-files__pdflatex-4-pages.pdf").read_bytes()
    )
    env = {"PATH": "/usr/bin:/bin", "OCRD_HTTP_TOKEN": TOKEN, "OCRD": url}
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=work,
        timeout=600,
        capture_output=True,
        text=True,
        env=env,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads((work / "result.json").read_text())
    assert result["document"]["md_content"].startswith("This is a lot of 12 point text")
    DoclingDocument.model_validate(result["document"]["json_content"])
    task = json.loads((work / "task.json").read_text())
    assert task["status"] == "success" and task["document"]["md_content"]
    assert "<!-- page 2 -->" in task["document"]["md_content"]
    assert "<!-- page 3 -->" not in task["document"]["md_content"]
    text = json.loads((work / "text.json").read_text())
    assert text["document"]["text_content"].startswith("This is a lot of 12 point text")
