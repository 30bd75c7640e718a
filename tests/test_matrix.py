"""Every feature with every other: input kinds x outputs x splitting x delivery.

Each cell either gives exactly the outputs the README promises, for every part, or is refused
by `ocrd check-config` with a reason. CI runs every pair of values (tests/pairwise.py);
`OCRD_MATRIX=full` runs every cell (`scripts/matrix.py` does, and prints the table). One
`ocrd run` serves them all: an inbox per configuration (outputs, splitting, delivery; a
collating one for the duplex pair), every input dropped or uploaded at once. The engine is
the simulated one (the daemon's logic is under test, not recognition): a scan's page says
"Simulated page N", a born-digital page gives its own text layer (`pdf_text: prefer`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import httpx
import pikepdf.pdfa
import pymupdf
import pytest
import yaml
from conftest import DaemonProcess
from helpers import pdf_problems
from matrix_inputs import (
    DELIVERIES,
    KINDS,
    OUTPUTS,
    SPLIT_BARCODE,
    SPLITS,
    Input,
    make_input,
    refusal,
)
from pairwise import pairwise
from test_hooks import WebhookReceiver
from test_http import base_url

TOKEN = "matrix-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FULL = os.environ.get("OCRD_MATRIX") == "full"
# The first cell's test starts the daemon and waits for every cell's document.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(7200 if FULL else 900)]


@dataclass(frozen=True)
class Cell:
    kind: str
    outputs: str
    split: str
    delivery: str

    @property
    def id(self) -> str:
        return f"{self.kind}|{self.outputs}|{self.split}|{self.delivery}"

    @property
    def inbox(self) -> str:
        """The folder of its inbox: one per configuration."""
        duplex = "-collating" if self.kind == "collated duplex" else ""
        return f"{self.outputs}-{self.split}-{self.delivery}{duplex}".replace("+", "-")

    @property
    def refused(self) -> str | None:
        return refusal(self.kind, self.split)


def cells(full: bool) -> list[Cell]:
    """Every cell, or every pair of values (each refused pair once, as its own cell)."""
    dimensions = {"kind": KINDS, "outputs": OUTPUTS, "split": SPLITS, "delivery": DELIVERIES}
    if full:
        return [Cell(*values) for values in product(*dimensions.values())]

    def allowed(row: dict[str, str]) -> bool:
        return refusal(row.get("kind", ""), row.get("split", "")) is None

    rows = [Cell(**row) for row in pairwise(dimensions, allowed)]
    refused = [
        Cell(kind, OUTPUTS[0], split, DELIVERIES[0])
        for kind, split in product(KINDS, SPLITS)
        if refusal(kind, split)
    ]
    return rows + refused


CELLS = cells(FULL)


def inbox_settings(cell: Cell, root: Path, receiver: str) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "path": str(root / cell.inbox / "inbox"),
        "settle_seconds": 0.5,
        "outputs": ["markdown"] if cell.outputs == "markdown" else ["markdown", "pdf"],
        "pdf_archive": cell.outputs.endswith("archive"),
        "pdf_text": "prefer",
        "job_folders": ["scan-*"],
    }
    if cell.split != "none":
        settings["split_on"] = [cell.split]
    if cell.split == "barcode":
        settings["split_barcode"] = SPLIT_BARCODE
    if cell.kind == "collated duplex":
        settings |= {"collate": True, "collate_window_seconds": 120}
    else:
        settings["uploads"] = True
    record = root / cell.inbox / "hook-record.jsonl"
    script = (
        "import json, os\n"
        "facts = {k: v for k, v in os.environ.items() if k.startswith('OCRD_')}\n"
        f"open({str(record)!r}, 'a').write(json.dumps(facts) + '\\n')\n"
    )
    if cell.delivery == "command":
        settings["hooks"] = {"on_done": {"command": [sys.executable, "-c", script]}}
    elif cell.delivery == "webhook":
        settings["hooks"] = {"on_done": {"webhook": {"url": receiver}}}
    return settings


def write_matrix_config(root: Path, runnable: list[Cell], receiver: str) -> Path:
    inboxes: dict[str, dict[str, Any]] = {}
    for cell in runnable:
        inboxes.setdefault(cell.inbox, inbox_settings(cell, root, receiver))
        Path(inboxes[cell.inbox]["path"]).mkdir(parents=True, exist_ok=True)
    config = {
        "inboxes": list(inboxes.values()),
        "engine": {"kind": "simulated", "simulated": {"seconds_per_page": 0.02}},
        "pipeline": {"rescan_interval_seconds": 2, "status_interval_seconds": 1},
        "http": {"listen": "127.0.0.1:0"},
    }
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def check_config(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocrd", "check-config", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@dataclass
class Run:
    """The daemon serving every runnable cell, and what each cell put in."""

    root: Path
    daemon: DaemonProcess
    url: str
    receiver: WebhookReceiver
    inputs: dict[Cell, Input] = field(default_factory=dict)
    uploads: dict[Cell, str] = field(default_factory=dict)  # an upload's id


def _hand_in(run: Run, cell: Cell) -> None:
    made = make_input(cell.kind, cell.split)
    run.inputs[cell] = made
    inbox = run.root / cell.inbox / "inbox"
    if cell.kind == "upload":
        staging = run.root / "staging" / cell.inbox
        staging.mkdir(parents=True)
        made.write(staging)
        with (staging / made.path).open("rb") as handle:
            answer = httpx.post(
                f"{run.url}/api/documents",
                headers=AUTH,
                timeout=60,
                params={"inbox": str(inbox)},
                files={"file": (made.path, handle, "application/pdf")},
            )
        assert answer.status_code == 202, answer.text
        run.uploads[cell] = answer.json()["id"]
        return
    made.write(inbox)
    if made.write_backs is not None:  # the backs follow once the fronts wait for them
        run.daemon.wait_for("collate.fronts_waiting", path=str(inbox / made.path), timeout=120)
        made.write_backs(inbox)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    root = tmp_path_factory.mktemp("matrix")
    runnable = [cell for cell in CELLS if not cell.refused]
    receiver = WebhookReceiver(failures=0)
    config = write_matrix_config(root, runnable, receiver.url)
    checked = check_config(config)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    daemon = DaemonProcess(config, env={"OCRD_HTTP_TOKEN": TOKEN})
    try:
        run = Run(root, daemon, base_url(daemon), receiver)
        daemon.wait_for("daemon.ready", timeout=120)
        for cell in sorted(runnable, key=lambda c: c.kind == "collated duplex"):
            _hand_in(run, cell)
        daemon.wait_for("document.finished", count=len(runnable), timeout=60 + 15 * len(runnable))
        told = sum(len(run.inputs[c].parts) for c in runnable if c.delivery != "api")
        with contextlib.suppress(AssertionError):  # a cell told too few times says so itself
            daemon.wait_for("hook.finished", count=told, timeout=120)
        yield run
        assert daemon.stop() == 0
    finally:
        daemon.kill()
        receiver.close()


# --- what a cell must give ------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """Where a cell's outputs are, and what each part's files are called."""

    outbox: Path  # the folder of its outputs
    names: list[str]  # each part's Markdown
    pdf: bool
    archive: bool


def finished_event(run: Run, cell: Cell, made: Input) -> dict[str, Any]:
    path = f"uploads/{run.uploads[cell]}/{made.path}" if cell in run.uploads else made.path
    inbox = str(run.root / cell.inbox)
    [event] = [
        e
        for e in run.daemon.find("document.finished", path=path)
        if str(e.get("original")).startswith(inbox + "/")
    ]
    return event


def expected(run: Run, cell: Cell, made: Input) -> Expected:
    outbox = run.root / cell.inbox / "outbox"
    if cell in run.uploads:
        outbox = outbox / "uploads" / run.uploads[cell]
    count = len(made.parts)
    names = (
        [f"{made.stem}-{k}.md" for k in range(1, count + 1)] if count > 1 else [f"{made.stem}.md"]
    )
    return Expected(outbox, names, cell.outputs != "markdown", cell.outputs.endswith("archive"))


def assert_outputs_exactly(made: Input, want: Expected) -> None:
    """The outbox holds each part's Markdown, its PDF where asked, its figures where the
    engine found some, and nothing else of this document."""
    pattern = re.compile(rf"^{re.escape(made.stem)}(-\d+)?\.(md|pdf|assets)$")
    found = sorted(p.name for p in want.outbox.iterdir() if pattern.match(p.name))
    wanted = []
    for name, pages in zip(want.names, made.parts, strict=True):
        stem = name.removesuffix(".md")
        wanted += [name] + ([f"{stem}.pdf"] if want.pdf else [])
        wanted += [f"{stem}.assets"] if any(page.engine for page in pages) else []
    assert found == sorted(wanted)


def assert_part(made: Input, want: Expected, index: int) -> None:
    """A part's Markdown holds its pages and no other's; its PDF is its pages, each where
    it belongs, opens cleanly, and is PDF/A-2b where asked."""
    pages = made.parts[index]
    markdown = (want.outbox / want.names[index]).read_text()
    assert markdown.count("<!-- page ") == len(pages) - 1
    for page in pages:
        assert page.found_in(markdown), (page, markdown[:400])
    engine_pages = [int(n) for n in re.findall(r"Simulated page (\d+)", markdown)]
    assert engine_pages == [page.number for page in pages if page.engine]
    if not want.pdf:
        return
    pdf = want.outbox / want.names[index].replace(".md", ".pdf")
    assert pdf_problems(pdf) == [], pdf.name
    with pymupdf.open(pdf) as doc:
        assert doc.page_count == len(pages)
    for number, page in enumerate(pages, start=1):
        text = subprocess.run(
            ["pdftotext", "-f", str(number), "-l", str(number), str(pdf), "-"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert page.found_in(text), (pdf.name, number, page, text[:300])
    if want.archive:
        report = pikepdf.pdfa.validate_written(pdf, "2b")
        assert report.passed, report.summary()


def assert_delivered(
    run: Run, cell: Cell, made: Input, want: Expected, event: dict[str, Any]
) -> None:
    """Each part told as a document of its own: by its hook command, its webhook, or the
    API's status and result routes."""
    count = len(made.parts)
    markdowns = [str(want.outbox / name) for name in want.names]
    pdfs = [m.replace(".md", ".pdf") if want.pdf else "" for m in markdowns]
    inbox = run.root / cell.inbox / "inbox"
    if cell.delivery == "command":
        record = run.root / cell.inbox / "hook-record.jsonl"
        runs = [
            facts
            for facts in map(json.loads, record.read_text().splitlines())
            if facts["OCRD_PATH"] == event["path"]
        ]
        runs.sort(key=lambda facts: facts["OCRD_PART"])
        assert [f["OCRD_PART"] for f in runs] == [f"{k}/{count}" for k in range(1, count + 1)]
        assert [f["OCRD_MARKDOWN"] for f in runs] == markdowns
        assert [f["OCRD_PDF"] for f in runs] == pdfs
    elif cell.delivery == "webhook":
        bodies = [
            body
            for _, body in run.receiver.received
            if body["inbox"] == str(inbox) and body["path"] == event["path"]
        ]
        bodies.sort(key=lambda body: body.get("part", {}).get("number", 1))
        assert [body["markdown"] for body in bodies] == markdowns
        assert [body.get("pdf") or "" for body in bodies] == pdfs
        if count > 1:
            assert [body["part"] for body in bodies] == [
                {"number": k, "of": count} for k in range(1, count + 1)
            ]
    else:
        assert_served(run, cell, want, event)


def assert_served(run: Run, cell: Cell, want: Expected, event: dict[str, Any]) -> None:
    document = run.uploads.get(cell, event["doc"])
    status = httpx.get(f"{run.url}/api/documents/{document}", headers=AUTH, timeout=30).json()
    assert status["state"] == "done"
    links = status["links"]
    if len(want.names) > 1:
        assert [Path(part["markdown"]).name for part in links["parts"]] == want.names
    else:
        assert links["parts"] == []
    for name in want.names:
        assert name in links["files"]
        if want.pdf:
            assert name.replace(".md", ".pdf") in links["files"]
    for name, url in links["files"].items():
        answer = httpx.get(url, headers=AUTH, timeout=30)
        assert answer.status_code == 200 and answer.content == (want.outbox / name).read_bytes()
    whole = httpx.get(links["markdown"], headers=AUTH, timeout=30).text
    for name in want.names:
        assert (want.outbox / name).read_text() in whole


@pytest.mark.parametrize("cell", CELLS, ids=[cell.id for cell in CELLS])
def test_a_cell_gives_what_the_readme_promises_or_is_refused(
    matrix: Run, cell: Cell, tmp_path: Path
) -> None:
    if cell.refused:
        config = write_matrix_config(tmp_path, [cell], "http://127.0.0.1:9/hook")
        checked = check_config(config)
        assert checked.returncode != 0
        assert cell.refused in checked.stdout + checked.stderr
        return
    run = matrix
    made = run.inputs[cell]
    event = finished_event(run, cell, made)
    assert event["outcome"] == "done", event
    want = expected(run, cell, made)
    if len(made.parts) > 1:
        assert [part["pages"] for part in event["parts"]] == [
            [p.number for p in part] for part in made.parts
        ]
        assert [separator["page"] for separator in event["separators"]] == made.separators
    assert_outputs_exactly(made, want)
    for index in range(len(made.parts)):
        assert_part(made, want, index)
    assert event["original"] == str(run.root / cell.inbox / "done" / Path(event["path"]))
    assert Path(event["original"]).exists()
    assert not (run.root / cell.inbox / "failed").exists() or not any(
        (run.root / cell.inbox / "failed").rglob(f"{made.stem}*")
    )
    assert_delivered(run, cell, made, want, event)


def test_the_pairs_cover_every_allowed_pair_of_values() -> None:
    from pairwise import all_pairs

    dimensions = {"kind": KINDS, "outputs": OUTPUTS, "split": SPLITS, "delivery": DELIVERIES}

    def allowed(row: dict[str, str]) -> bool:
        return refusal(row.get("kind", ""), row.get("split", "")) is None

    rows = pairwise(dimensions, allowed)
    covered = {
        ((a, row[a]), (b, row[b]))
        for row in rows
        for a in row
        for b in row
        if list(dimensions).index(a) < list(dimensions).index(b)
    }
    assert all_pairs(dimensions, allowed) <= covered
    assert all(allowed(row) for row in rows)
    assert rows == pairwise(dimensions, allowed)  # the same rows every time
    assert len(rows) < len(KINDS) * len(SPLITS) + 10  # far fewer than the 360 cells
