"""docling-serve's newer routes attacked as their users could: an HTTP client on another
host without the token, a client sending chunking options at and past their edges and
methods a route does not take, a document author putting markup into a Word file's text,
and one putting more paragraphs into a Markdown file than ocrd converts from a Word file.
One `ocrd run` (simulated engine, PDFs read from their text layer), real sockets, httpx."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docx
import httpx
import openpyxl
import pytest
from conftest import DaemonProcess, write_config
from test_http import outward_address
from test_uploads import TOKEN, WITH_TOKEN, base_url

from ocrd.domain import InputFormat
from ocrd.office.inspect import check_document
from ocrd.office.limits import OfficeLimits, OfficeRefused

pytestmark = pytest.mark.slow

KEY = {"X-Api-Key": TOKEN}
DOCUMENT = "real/sample-files__google-doc-document.pdf"
MARKUP = "</table><script>alert(1)</script> \"quoted' <doctag>x</doctag>"
CELL = "</td></tr></table><img src=x onerror=alert(1)>"
MAX_ELEMENTS = 100_000  # ocrd.office.limits.OfficeLimits.max_elements (a Word file's bound)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str]]:
    """`ocrd run` listening on every address (so that a request can come from a host that
    is not loopback), its loopback URL."""
    folder = tmp_path_factory.mktemp("attacks")
    config = write_config(
        folder, {"uploads": True, "pdf_text": "prefer"}, http={"listen": "0.0.0.0:0"}
    )
    daemon = DaemonProcess(config, env=WITH_TOKEN)
    try:
        port = base_url(daemon).rsplit(":", 1)[1].rstrip("/")
        daemon.wait_for("daemon.ready", timeout=120)
        yield daemon, f"http://127.0.0.1:{port}"
    finally:
        daemon.kill()


def still_serving(daemon: DaemonProcess, url: str) -> None:
    assert httpx.get(f"{url}/health", timeout=30).json() == {"status": "ok"}
    assert not daemon.find("http.failed")
    assert "Error handling request" not in daemon.output()  # aiohttp's words for a 500


def word_file(paragraph: str, cells: tuple[str, str]) -> bytes:
    document = docx.Document()
    document.add_heading("Heading <b>bold</b>", 1)
    document.add_paragraph(paragraph)
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = cells
    data = io.BytesIO()
    document.save(data)
    return data.getvalue()


def workbook(cells: list[list[str]]) -> bytes:
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    for row in cells:
        sheet.append(row)
    data = io.BytesIO()
    book.save(data)
    return data.getvalue()


def test_version_needs_the_token_from_another_host(served: tuple[DaemonProcess, str]) -> None:
    """`/version` names the server's versions: from another host only with the token
    (health stays open, as load balancers ask it)."""
    _, url = served
    outside = url.replace("127.0.0.1", outward_address())
    refused = httpx.get(f"{outside}/version", timeout=30)
    assert refused.status_code == 401 and "token" in refused.json()["detail"]
    wrong = httpx.get(f"{outside}/version", headers={"X-Api-Key": "wrong"}, timeout=30)
    assert wrong.status_code == 401 and "ocrd" not in wrong.json()
    allowed = httpx.get(f"{outside}/version", headers=KEY, timeout=30)
    assert allowed.status_code == 200 and set(allowed.json()) == {"ocrd", "docling-core", "python"}
    assert httpx.get(f"{outside}/health", timeout=30).status_code == 200


def test_chunking_options_past_their_edges_are_refused_by_name(
    served: tuple[DaemonProcess, str], corpus: Path
) -> None:
    """Every malformed chunking option is a 422 naming it, as JSON, before anything is
    kept; the smallest `max_tokens` is honoured (every chunk within one token)."""
    daemon, url = served
    pdf = (corpus / DOCUMENT).read_bytes()
    refused = {
        "max_tokens": [0, 1, 15, -5, 10**9, "abc", 2.5, [1], {"a": 1}],
        "image_placeholder": ["x" * 1001],
        "bogus": [1],
        "chunker": ["hierarchical"],
        "use_markdown_images": [True],
        "merge_peers": ["perhaps"],
    }
    for name, values in refused.items():
        for value in values:
            answer = httpx.post(
                f"{url}/v1/chunk/hybrid/file/async",
                headers=KEY,
                data={f"chunking_{name}": value if isinstance(value, str) else repr(value)},
                files={"files": ("edge.pdf", pdf)},
                timeout=60,
            )
            assert answer.status_code == 422, (name, value, answer.text)
            assert answer.json()["detail"].startswith(f"chunking_options.{name}"), answer.text
    for include in ("yes", "2", "[]"):
        answer = httpx.post(
            f"{url}/v1/chunk/hierarchical/file/async",
            headers=KEY,
            data={"include_converted_doc": include},
            files={"files": ("edge.pdf", pdf)},
            timeout=60,
        )
        assert answer.status_code == 422 and "include_converted_doc" in answer.json()["detail"]
    smallest = httpx.post(
        f"{url}/v1/chunk/hybrid/file",
        headers=KEY,
        data={"chunking_max_tokens": "16", "chunking_image_placeholder": "\x00\x1b[31m"},
        files={"files": ("edge.pdf", pdf)},
        timeout=120,
    )
    assert smallest.status_code == 200, smallest.text
    chunks = smallest.json()["chunks"]
    assert len(chunks) > 10 and all(chunk["num_tokens"] <= 16 for chunk in chunks)
    still_serving(daemon, url)


def test_wrong_methods_on_the_new_routes_are_answered_in_json(
    served: tuple[DaemonProcess, str],
) -> None:
    _, url = served
    routes = [f"/v1/chunk/{c}/{k}" for c in ("hybrid", "hierarchical") for k in ("file", "source")]
    for path in [*routes, *(f"{route}/async" for route in routes)]:
        for method in ("GET", "PUT", "DELETE", "PATCH"):
            answer = httpx.request(method, f"{url}{path}", headers=KEY, timeout=30)
            assert answer.status_code == 405, (method, path)
            assert answer.json() == {"detail": "Method Not Allowed"}
            assert "POST" in answer.headers["Allow"]
    for method in ("POST", "PUT", "DELETE"):
        answer = httpx.request(method, f"{url}/version", headers=KEY, timeout=30)
        assert answer.status_code == 405 and answer.json()["detail"]


def test_markup_in_office_text_is_escaped_in_html_and_chunked_as_text(
    served: tuple[DaemonProcess, str],
) -> None:
    """A Word file's text carrying a script, a table's end and quotes comes back as text in
    `html_content` (escaped, never elements); Word and Excel files are chunked."""
    daemon, url = served
    word = word_file(MARKUP, (CELL, '"><svg onload=alert(1)>'))
    answer = httpx.post(
        f"{url}/v1/convert/file",
        headers=KEY,
        data={"to_formats": ["html", "doctags"]},
        files={"files": ("markup.docx", word)},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    page = answer.json()["document"]["html_content"]
    body = page[page.index("<body>") :]
    assert "<script>" not in body and "<img" not in body and "<svg" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert body.count("</table>") == 1  # the document's own table only
    assert "&quot;&gt;&lt;svg onload=alert(1)&gt;" in body
    for route, name, data in (
        ("hybrid", "markup.docx", word),
        ("hierarchical", "markup.docx", word),
        ("hybrid", "sheet.xlsx", workbook([["name", "amount"], ["tea", "3"], [MARKUP, "4"]])),
    ):
        chunked = httpx.post(
            f"{url}/v1/chunk/{route}/file",
            headers=KEY,
            data={"chunking_use_markdown_tables": "true"},
            files={"files": (name, data)},
            timeout=120,
        )
        assert chunked.status_code == 200, chunked.text
        chunks = chunked.json()["chunks"]
        assert chunks and all(chunk["filename"] == name for chunk in chunks)
        assert "alert(1)" in " ".join(chunk["text"] for chunk in chunks)
    still_serving(daemon, url)


def settled(url: str, task_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        answer = httpx.get(f"{url}/v1/status/poll/{task_id}", params={"wait": 5}, timeout=30)
        assert answer.status_code == 200, answer.text
        if answer.json()["task_status"] not in ("pending", "started"):
            return dict(answer.json())
    raise AssertionError(f"task {task_id} not settled")


def test_a_chunk_task_of_a_damaged_file_fails_with_its_reason_and_no_chunks(
    served: tuple[DaemonProcess, str], tmp_path: Path
) -> None:
    """A chunk task is polled as any task (`task_type` `chunk`); one whose file cannot be
    read settles as `failure` with the reason, and its result holds no chunks."""
    daemon, url = served
    damaged = b"%PDF-1.7\n" + b"\x00garbage" * 100
    submitted = httpx.post(
        f"{url}/v1/chunk/hybrid/file/async",
        headers=KEY,
        data={"include_converted_doc": "true"},
        files={"files": ("damaged.pdf", damaged)},
        timeout=60,
    )
    assert submitted.status_code == 200, submitted.text
    assert submitted.json()["task_type"] == "chunk"
    status = settled(url, submitted.json()["task_id"])
    assert status["task_type"] == "chunk" and status["task_status"] == "failure"
    assert status["error_message"]
    result = httpx.get(f"{url}/v1/result/{submitted.json()['task_id']}", headers=KEY, timeout=60)
    assert result.status_code == 200, result.text
    assert result.json()["chunks"] == []
    assert result.json()["documents"][0]["status"] == "failure"
    still_serving(daemon, url)


def test_a_markdown_file_of_more_paragraphs_than_a_word_file_may_hold_is_refused(
    served: tuple[DaemonProcess, str],
) -> None:
    """A Word file of more than 100,000 paragraphs is refused before docling reads it; the
    same paragraphs as Markdown (700 KB) must be too, not held a worker (and about 1 GB of
    the daemon's memory) for a minute and answered with every one of them as a chunk."""
    daemon, url = served
    markdown = "\n\n".join(f"w{index}" for index in range(MAX_ELEMENTS + 1)).encode()
    submitted = httpx.post(
        f"{url}/v1/chunk/hierarchical/file/async",
        headers=KEY,
        files={"files": ("many.md", markdown)},
        timeout=60,
    )
    assert submitted.status_code == 200, submitted.text
    status = settled(url, submitted.json()["task_id"])
    assert status["task_status"] == "failure", status
    assert "paragraph" in status["error_message"], status
    still_serving(daemon, url)


def test_markdown_elements_are_counted_as_a_reader_starts_them() -> None:
    """Wrapped lines of one paragraph count once; each paragraph, item, quote, heading and
    table row once: the bound refuses a flood, not a long hard-wrapped text."""
    limits = OfficeLimits(max_elements=4)
    wrapped = b"# Title\n\n" + b"a long paragraph wrapped\n" * 1000 + b"\n- item\n> quote\n"
    check_document(wrapped, InputFormat.md, limits)
    for flood in (b"a\n\nb\n\nc\n\nd\n\ne\n", b"- a\n- b\n- c\n- d\n- e\n", b"|a|\n" * 5):
        with pytest.raises(OfficeRefused, match="more than 4 paragraphs"):
            check_document(flood, InputFormat.md, limits)
    check_document(
        b"<div><p>a<b>b</b><i>c</i><span>d</span></p><li>e</li></div>", InputFormat.html, limits
    )
    with pytest.raises(OfficeRefused, match="more than 4 paragraphs"):
        check_document(b"<P>a<p>b<H1>c</h1><li>d<TR><td>e", InputFormat.html, limits)


def test_a_web_page_of_more_paragraphs_than_a_word_file_may_hold_is_refused(
    served: tuple[DaemonProcess, str],
) -> None:
    """The same flood as a web page (1.3 MB of `<p>`) held a worker about two minutes and
    the daemon about 1 GB: it is refused for its paragraphs, naming them."""
    daemon, url = served
    page = "".join(f"<p>w{index}</p>" for index in range(MAX_ELEMENTS + 1))
    submitted = httpx.post(
        f"{url}/v1/chunk/hierarchical/file/async",
        headers=KEY,
        files={"files": ("many.html", f"<html><body>{page}</body></html>".encode())},
        timeout=60,
    )
    assert submitted.status_code == 200, submitted.text
    status = settled(url, submitted.json()["task_id"])
    assert status["task_status"] == "failure", status
    assert "paragraph" in status["error_message"], status
    still_serving(daemon, url)
