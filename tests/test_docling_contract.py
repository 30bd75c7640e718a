"""ocrd keeps to docling-serve's own description of its API: Schemathesis reads the OpenAPI
description docling-serve 1.38.2 generates (tests/fixtures/docling-serve/, see its README)
and drives every route of it that ocrd serves with requests made from it, valid and
invalid. Each answer must be no server error, JSON, and where it is 200 it must keep to
docling-serve's schema of that answer (status, content type, body).

The daemon runs the simulated engine (ocrd's stand-in for a model) with an inbox that takes
uploads and reads PDFs' text layers; the requests name a converted task and a chunk task
first, so the result route answers them, not only 404. What is left out, as in
tests/test_api_contract.py: Schemathesis' `positive_data_acceptance` (ocrd refuses, with
422 naming it, every option it cannot honour, which docling-serve's schema allows), and the
schema of error bodies: docling-serve describes its 422 as FastAPI's list of validation
errors, yet answers its own refusals (such as the presigned-URL target its client tries) as
`{"detail": "..."}`, which is what its clients read and what ocrd answers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from conftest import DaemonProcess, write_config
from hypothesis import HealthCheck, Phase, example, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

pytestmark = pytest.mark.slow

FIXTURE = Path(__file__).parent / "fixtures" / "docling-serve" / "openapi.json"
TOKEN = "docling-contract-token"
KEY = {"X-Api-Key": TOKEN}
EXAMPLES = 10  # per operation and generation mode (valid, invalid)
DOCUMENT = "real/sample-files__google-doc-document.pdf"
# docling-serve's routes that ocrd serves; the rest (batch, capabilities, clear, memory,
# ready) are not, and say so in docs/http.md.
SERVED = [
    "GET /health",
    "GET /version",
    *(
        f"POST {base}/{kind}{suffix}"
        for base in ("/v1/convert", "/v1/chunk/hybrid", "/v1/chunk/hierarchical")
        for kind in ("file", "source")
        for suffix in ("", "/async")
    ),
    "GET /v1/status/poll/{task_id}",
    "GET /v1/result/{task_id}",
]


@dataclass(frozen=True)
class Served:
    url: str
    tasks: tuple[str, ...]  # a settled conversion task's id, a settled chunk task's


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("docling-contract")
    config = write_config(
        folder,
        {"uploads": True, "pdf_text": "prefer"},
        http={"trust_loopback": False, "docling": {"max_sync_wait_seconds": 30}},
    )
    daemon = DaemonProcess(config, env={"OCRD_HTTP_TOKEN": TOKEN})
    try:
        [listening] = daemon.wait_for("http.listening")
        daemon.wait_for("daemon.ready", timeout=120)
        url = f"http://{listening['address']}"
        pdf = (corpus / DOCUMENT).read_bytes()
        tasks = []
        for route, fields in (
            ("/v1/convert/file", {"to_formats": ["md", "json", "html", "text", "doctags"]}),
            ("/v1/chunk/hybrid/file", {"include_converted_doc": "true"}),
        ):
            answer = httpx.post(
                f"{url}{route}/async", headers=KEY, data=fields, files={"files": ("d.pdf", pdf)}
            )
            assert answer.status_code == 200, answer.text
            task = answer.json()["task_id"]
            polled = httpx.get(f"{url}/v1/status/poll/{task}?wait=60", headers=KEY, timeout=70)
            assert polled.json()["task_status"] == "success", polled.text
            tasks.append(task)
        yield Served(url, tuple(tasks))
        assert daemon.stop() == 0, daemon.output()
    finally:
        daemon.kill()


def checked(case: Any, response: Any) -> None:
    """docling-serve's schemas for a 200; a JSON reason for anything else."""
    if response.status_code == 200:
        case.validate_response(
            response,
            checks=[not_a_server_error, response_schema_conformance, content_type_conformance],
        )
        return
    assert response.status_code < 500 or response.status_code in (503, 504), response.text
    content_type = (response.headers.get("content-type") or [""])[0]
    assert content_type.startswith("application/json"), (response.status_code, response.text)
    assert json.loads(response.text).get("detail"), response.text


@pytest.mark.parametrize("label", SERVED)
def test_ocrd_answers_as_docling_serve_describes(served: Served, label: str) -> None:
    schema = schemathesis.openapi.from_path(FIXTURE)
    operation = schema.find_operation_by_label(label)
    assert operation is not None, f"{label} is not in docling-serve's description"
    cases = operation.as_strategy(generation_mode=GenerationMode.POSITIVE) | (
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE)
    )

    @given(case=cases)
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def answer(case: Any) -> None:
        checked(case, case.call(base_url=served.url, headers=KEY, timeout=60))

    if "{task_id}" in label:
        for task in served.tasks:
            answer = example(case=operation.Case(path_parameters={"task_id": task}))(answer)
    answer()


def test_the_served_routes_are_in_docling_serves_description() -> None:
    """The fixture is docling-serve's, and names each route this module drives."""
    description = json.loads(FIXTURE.read_text())
    assert description["info"] == {"title": "Docling Serve", "version": "1.38.2"}
    labels = {f"{m.upper()} {p}" for p, methods in description["paths"].items() for m in methods}
    assert set(SERVED) <= labels


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/version"),
        ("POST", "/v1/chunk/hybrid/file/async"),
        ("POST", "/v1/chunk/hierarchical/source"),
    ],
)
def test_the_new_routes_need_the_token(served: Served, method: str, path: str) -> None:
    """Where loopback is not trusted, `/version` and the chunk routes answer 401 in
    docling-serve's shape with a wrong key."""
    answer = httpx.request(method, f"{served.url}{path}", headers={"X-Api-Key": "wrong"})
    assert answer.status_code == 401, answer.text
    assert answer.json()["detail"]
