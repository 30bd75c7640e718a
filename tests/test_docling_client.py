"""docling's own client (`docling-client` from PyPI, unchanged but for the URL and key)
calling every method of it that ocrd serves, against one `ocrd run`: `version`, `health`,
`convert`, `convert_all`, `submit` and its job, `chunk` with the hybrid and the
hierarchical chunker, and the async client's `version`, `health`, `submit` and
`submit_chunk`. The document is a born-digital PDF read from its text layer (no model);
the daemon's log must hold no warning for any of it (the client's try of a presigned-URL
target before every conversion is ordinary, as are its polls).

Also here: `to_formats` html and doctags (docling-core's exports), with docling-serve's
other document keys null."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import DaemonProcess, write_config
from docling.service_client import AsyncDoclingServiceClient, DoclingServiceClient
from docling.service_client.client import ChunkerKind
from docling_core.types.doc.document import DoclingDocument
from docling_core.types.doc.labels import DocItemLabel
from helpers import make_pdf
from test_uploads import TOKEN, WITH_TOKEN, base_url

pytestmark = pytest.mark.slow

DOCUMENT = "real/sample-files__google-doc-document.pdf"
HEADING = "Example document"
KEY = {"X-Api-Key": TOKEN}
NOT_ASKED = ("md_content", "json_content", "text_content", "doclang_content")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str]]:
    folder = tmp_path_factory.mktemp("client")
    config = write_config(folder, {"uploads": True, "pdf_text": "prefer"})
    daemon = DaemonProcess(config, env=WITH_TOKEN)
    try:
        url = base_url(daemon)
        daemon.wait_for("daemon.ready", timeout=120)
        yield daemon, url
    finally:
        daemon.kill()


def headings(document: DoclingDocument) -> list[str]:
    return [t.text for t in document.texts if t.label is DocItemLabel.SECTION_HEADER]


def warnings_in(daemon: DaemonProcess) -> list[dict[str, Any]]:
    return [e for e in daemon.events if e.get("level") in ("warning", "error", "critical")]


def test_every_method_of_docling_client_that_ocrd_serves(
    served: tuple[DaemonProcess, str], corpus: Path
) -> None:
    daemon, url = served
    pdf = corpus / DOCUMENT
    with DoclingServiceClient(url=url, api_key=TOKEN, job_timeout=120) as client:
        versions = client.version()
        health = client.health()
        converted = client.convert(pdf)
        both = list(client.convert_all([pdf, pdf]))
        submitted = client.submit(pdf).result(timeout=120)
        hybrid = client.chunk(pdf, ChunkerKind.HYBRID)
        hierarchical = client.chunk(pdf, ChunkerKind.HIERARCHICAL)

    assert set(versions) >= {"ocrd", "docling-core"}, versions
    assert health.status == "ok"
    for result in (converted, *both, submitted):
        assert result.status.value == "success"
        assert headings(result.document) == [HEADING]
    for answer in (hybrid, hierarchical):
        texts = [chunk.text for chunk in answer.chunks]
        assert texts and texts[0].startswith(HEADING), texts[:2]
        assert all(chunk.filename == pdf.name for chunk in answer.chunks)
        assert all(chunk.page_numbers == [1] for chunk in answer.chunks)
        assert answer.documents[0].status.value == "success"
    assert all(chunk.num_tokens for chunk in hybrid.chunks)
    assert all(chunk.num_tokens is None for chunk in hierarchical.chunks)
    assert len(hybrid.chunks) <= len(hierarchical.chunks)  # merged under the same headings
    assert warnings_in(daemon) == []
    assert daemon.find("task.presigned_declined")  # the client's try, logged as info


def test_the_async_client(served: tuple[DaemonProcess, str], corpus: Path) -> None:
    daemon, url = served
    pdf = corpus / DOCUMENT

    async def calls() -> tuple[Any, ...]:
        async with AsyncDoclingServiceClient(url=url, api_key=TOKEN, job_timeout=120) as client:
            versions = await client.version()
            health = await client.health()
            job = await client.submit(pdf)
            converted = await job.result(timeout=120)
            chunk_job = await client.submit_chunk(pdf, ChunkerKind.HIERARCHICAL)
            chunks = await chunk_job.result(timeout=120)
        return versions, health, converted, chunks

    versions, health, converted, chunks = asyncio.run(calls())
    assert versions["ocrd"] and health.status == "ok"
    assert headings(converted.document) == [HEADING]
    assert chunks.chunks[0].headings == [HEADING]
    assert warnings_in(daemon) == []


def test_html_and_doctags_with_docling_serves_keys(
    served: tuple[DaemonProcess, str], corpus: Path
) -> None:
    _, url = served
    pdf = corpus / DOCUMENT
    answer = httpx.post(
        f"{url}/v1/convert/file",
        headers=KEY,
        data={"to_formats": ["html", "doctags"]},
        files={"files": (pdf.name, pdf.read_bytes())},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    document = answer.json()["document"]
    assert f"<h2>{HEADING}</h2>" in document["html_content"]
    assert document["html_content"].lstrip().startswith("<!DOCTYPE html>")
    assert "<doctag>" in document["doctags_content"]
    assert HEADING in document["doctags_content"]
    assert {key: document[key] for key in NOT_ASKED} == dict.fromkeys(NOT_ASKED)


@pytest.mark.parametrize(
    ("path", "method"),
    [("/v1/nothing", "GET"), ("/v1/convert/file", "GET"), ("/version", "POST")],
)
def test_what_aiohttp_answers_itself_is_json_too(
    served: tuple[DaemonProcess, str], path: str, method: str
) -> None:
    _, url = served
    answer = httpx.request(method, f"{url}{path}", headers=KEY, timeout=30)
    assert answer.status_code in (404, 405)
    assert answer.headers["Content-Type"].startswith("application/json")
    assert answer.json()["detail"]


def test_chunking_options_are_honoured_or_refused_by_name(
    served: tuple[DaemonProcess, str], corpus: Path
) -> None:
    """A source chunked by the hybrid chunker within `max_tokens`, with its raw text and
    the converted document; a tokenizer ocrd would have to download, and an option the
    hierarchical chunker has not, refused with 422 naming them."""
    _, url = served
    pdf = corpus / DOCUMENT
    request = {
        "sources": [
            {
                "kind": "file",
                "filename": pdf.name,
                "base64_string": base64.b64encode(pdf.read_bytes()).decode(),
            }
        ],
        "chunking_options": {"max_tokens": 24, "include_raw_text": True},
        "include_converted_doc": True,
    }
    answer = httpx.post(f"{url}/v1/chunk/hybrid/source", headers=KEY, json=request, timeout=120)
    assert answer.status_code == 200, answer.text
    chunks = answer.json()["chunks"]
    assert len(chunks) > 3 and all(0 < chunk["num_tokens"] <= 24 for chunk in chunks)
    assert chunks[0]["headings"] == [HEADING]
    assert all(chunk["text"].endswith(chunk["raw_text"]) for chunk in chunks)  # no headings
    converted = answer.json()["documents"][0]["content"]["json_content"]
    assert headings(DoclingDocument.model_validate(converted)) == [HEADING]

    for route, field, value in (
        ("hybrid", "chunking_tokenizer", "Qwen/Qwen3-Embedding-0.6B"),
        ("hierarchical", "chunking_max_tokens", "100"),
    ):
        refused = httpx.post(
            f"{url}/v1/chunk/{route}/file/async",
            headers=KEY,
            data={field: value},
            files={"files": (pdf.name, pdf.read_bytes())},
            timeout=60,
        )
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"].startswith(f"chunking_options.{field[9:]}")


def test_markup_in_a_document_is_text_in_its_html(
    served: tuple[DaemonProcess, str], tmp_path: Path
) -> None:
    """A document's text is untrusted: markup in it comes back escaped in `html_content`
    (a client may show the HTML in a browser), never as elements."""
    _, url = served
    pdf = make_pdf(tmp_path / "markup.pdf", 1, label='<img src=x onerror="alert(1)">')
    answer = httpx.post(
        f"{url}/v1/convert/file",
        headers=KEY,
        data={"to_formats": "html"},
        files={"files": (pdf.name, pdf.read_bytes())},
        timeout=120,
    )
    assert answer.status_code == 200, answer.text
    html = answer.json()["document"]["html_content"]
    assert "&lt;img src=x onerror=" in html, html
    assert "<img src=x" not in html
