"""The HTTP API keeps to its own description: Schemathesis reads the OpenAPI descriptions a
real daemon serves (`/api/openapi.json`, the documents API and the reports; `/openapi.json`,
docling-serve's routes) and sends every route requests made from them, valid and invalid,
with and without the token. No answer may be a server error (5xx) or fall outside the
description (status code, content type, body schema, headers), and a route that needs the
token must refuse a request without it.

The daemon runs the simulated engine (ocrd's stand-in for a model) with an inbox that takes
uploads, and `trust_loopback: false`, so that the token is checked from loopback as it is
from any other host. The examples are derandomised (the same requests every run) and
bounded, so the module takes a few minutes on a 2-core machine.

What is left out: Schemathesis' `positive_data_acceptance`, which expects every request the
schema allows to be accepted. A schema cannot say what ocrd must refuse for reasons beyond
a request's shape (a file that is no PDF or image still becomes a task and fails as a
document; an option value that contradicts the file's kind; a page range beyond the
document), so such refusals (400, 422, documented) are not faults.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import schemathesis
from conftest import DaemonProcess, write_config
from helpers import make_pdf
from hypothesis import HealthCheck, Phase, example, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

from ocrd.config import HttpConfig
from ocrd.web import apidocs
from ocrd.web.api import describe_api

pytestmark = pytest.mark.slow

TOKEN = "contract-token"
AUTHORISED = {"Authorization": f"Bearer {TOKEN}"}
EXAMPLES = 50  # per operation and generation mode (valid, invalid)

# Faults schemathesis found, fixed, and kept as tests: a part header with a control
# character (aiohttp's parser raised InvalidHeader), a JSON `target` that is not an object.
KNOWN_FAULTS: dict[str, str] = {}
CONTROL_CHARACTER_PART = (
    b'--XX\r\nContent-Disposition: form-data; name="\x05options"\r\n\r\n{}\r\n'
    b'--XX\r\nContent-Disposition: form-data; name="file"; filename="a.pdf"\r\n\r\n%PDF\r\n'
    b"--XX--\r\n"
)


def operations(description: dict[str, Any]) -> list[Any]:
    """Each route and method of a description, as a test parameter (marked where a known
    fault makes it fail)."""
    labels = [
        f"{method.upper()} {path}"
        for path, methods in description["paths"].items()
        for method in methods
    ]
    return [
        pytest.param(
            label,
            id=label,
            marks=[pytest.mark.xfail(strict=True, reason=KNOWN_FAULTS[label])]
            if label in KNOWN_FAULTS
            else [],
        )
        for label in labels
    ]


@dataclass(frozen=True)
class Served:
    """The daemon under test, and a document it converted (so that the routes that read a
    document answer 200 to some requests, not only 404)."""

    url: str
    document: str  # its id
    markdown: str  # its Markdown's name, as `/api/documents/{id}/{name}` serves it
    task: str  # a docling task's id


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("contract")
    config = write_config(
        folder,
        {"uploads": True, "recursive": True},
        http={"listen": "127.0.0.1:0", "trust_loopback": False},
    )
    daemon = DaemonProcess(config, env={"OCRD_HTTP_TOKEN": TOKEN})
    try:
        [listening] = daemon.wait_for("http.listening")
        daemon.wait_for("daemon.ready")
        url = f"http://{listening['address']}"
        pdf = make_pdf(folder / "letter.pdf", 1).read_bytes()
        upload = httpx.post(
            f"{url}/api/documents", headers=AUTHORISED, files={"file": ("letter.pdf", pdf)}
        )
        assert upload.status_code == 202, upload.text
        task = httpx.post(
            f"{url}/v1/convert/file/async", headers=AUTHORISED, files={"files": ("t.pdf", pdf)}
        )
        assert task.status_code == 200, task.text
        document = upload.json()["id"]
        done = httpx.get(f"{url}/api/documents/{document}?wait=60", headers=AUTHORISED, timeout=70)
        assert done.json()["state"] == "done", done.text
        yield Served(url, document, "letter.md", task.json()["task_id"])
        assert daemon.stop() == 0, daemon.output()
    finally:
        daemon.kill()


def known_paths(served: Served) -> list[dict[str, str]]:
    """Path parameters naming what the daemon has: its document, output and task."""
    return [
        {"id": served.document},
        {"id": served.document, "name": served.markdown},
        {"id": served.document, "folder": "letter.assets", "name": "none.png"},
        {"task_id": served.task},
    ]


def keeps_to_its_description(served: Served, description_path: str, label: str) -> None:
    """Schemathesis' checks on `label`'s operation, as the daemon describes it: requests
    drawn from the description, and first those naming what the daemon has."""
    base_url = served.url
    schema = schemathesis.openapi.from_url(f"{base_url}{description_path}", headers=AUTHORISED)
    operation = schema.find_operation_by_label(label)
    assert operation is not None, f"{label} is not in {description_path}"
    cases = operation.as_strategy(generation_mode=GenerationMode.POSITIVE) | (
        operation.as_strategy(generation_mode=GenerationMode.NEGATIVE)
    )
    names = {p["name"] for p in operation.definition.raw.get("parameters", []) if p["in"] == "path"}
    known = [
        operation.Case(path_parameters=parameters)
        for parameters in known_paths(served)
        if names and set(parameters) == names
    ]

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
        case.call_and_validate(
            base_url=base_url,
            headers=AUTHORISED,
            excluded_checks=[positive_data_acceptance],
            timeout=60,
        )

    for case in known:
        answer = example(case=case)(answer)
    answer()


@pytest.mark.parametrize("label", operations(describe_api(HttpConfig())))
def test_the_documents_api_keeps_to_its_description(served: Served, label: str) -> None:
    keeps_to_its_description(served, "/api/openapi.json", label)


@pytest.mark.parametrize("label", operations(apidocs.describe()))
def test_docling_serves_routes_keep_to_their_description(served: Served, label: str) -> None:
    keeps_to_its_description(served, "/openapi.json", label)


def test_the_described_routes_are_the_ones_tested(served: Served) -> None:
    """The descriptions the daemon serves are valid OpenAPI and list the routes this
    module's parameters name."""
    from openapi_spec_validator import validate

    for path, expected in (
        ("/api/openapi.json", describe_api(HttpConfig())),
        ("/openapi.json", apidocs.describe()),
    ):
        answer = httpx.get(f"{served.url}{path}", headers=AUTHORISED, timeout=30)
        assert answer.status_code == 200
        validate(answer.json())
        assert sorted(answer.json()["paths"]) == sorted(expected["paths"])


MULTIPART = {"Content-Type": "multipart/form-data; boundary=XX"}
TARGET_NOT_AN_OBJECT = (
    b'{"sources": [{"kind": "file", "filename": "a.pdf", "base64_string": "JVBERg=="}], '
    b'"target": 42}'
)


@pytest.mark.parametrize(
    ("path", "headers", "body"),
    [
        pytest.param(
            path,
            MULTIPART,
            CONTROL_CHARACTER_PART,
            id=f"{path}-control-character-in-a-part-header",
        )
        for path in ("/api/documents", "/v1/convert/file", "/v1/convert/file/async")
    ]
    + [
        pytest.param(
            path,
            {"Content-Type": "application/json"},
            TARGET_NOT_AN_OBJECT,
            id=f"{path}-target-not-an-object",
        )
        for path in ("/v1/convert/source", "/v1/convert/source/async")
    ],
)
def test_malformed_requests_schemathesis_found_are_refused_with_a_reason(
    served: Served, path: str, headers: dict[str, str], body: bytes
) -> None:
    """The requests behind the faults found (so their fix is checked whatever examples
    the fuzzing draws): a client error that says what is wrong, never a 500."""

    answer = httpx.post(
        f"{served.url}{path}", headers={**AUTHORISED, **headers}, content=body, timeout=60
    )
    assert 400 <= answer.status_code < 500, answer.text
    reason = answer.json()
    assert reason.get("detail") or reason.get("error"), reason


@pytest.mark.parametrize(
    "headers",
    [
        {**AUTHORISED, "X-Api-Key": "wrong"},
        {"Authorization": "Bearer wrong", "X-Api-Key": TOKEN},
    ],
    ids=["good-bearer-wrong-api-key", "wrong-bearer-good-api-key"],
)
def test_a_request_carrying_a_wrong_token_beside_the_right_one_is_refused(
    served: Served, headers: dict[str, str]
) -> None:
    """Schemathesis found a wrong X-Api-Key accepted beside a right bearer token: every
    token a request carries must be the right one."""
    answer = httpx.get(f"{served.url}/api/documents/{served.document}", headers=headers)
    assert answer.status_code == 401, answer.text
