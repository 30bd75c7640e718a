"""What docling-serve's API costs against dropping a file, and what a DoclingDocument costs
to build, a page.

    python benchmarks/docling_overhead.py [--rounds 20] [--pages 200]

One `ocrd run` (simulated engine at 0.05 s a page, settle time 0.2 s, an inbox with
`uploads: true`) takes a one-page PDF `--rounds` times each way, one at a time:

- dropped: renamed into the inbox; time to done is from the rename to `document.finished`;
- synchronous: `POST /v1/convert/file` (multipart, httpx, on loopback, `to_formats` md and
  json); time from the start of the POST to its answer (the result in the body);
- task: `POST /v1/convert/file/async`, then `GET /v1/status/poll/{id}?wait=60` and
  `GET /v1/result/{id}`; time from the start of the POST to the result.

Each way runs as a phase of its own, so the daemon's CPU seconds (main process and render
workers) over the phase, divided by the rounds, is its CPU a document.

Then, in this process, the DoclingDocument build of `--pages` pages of DeepSeek-OCR-2's
grounding (a title, paragraphs, a formula, a table, a figure with its caption) and of
RapidOCR's lines: CPU a page for the build, its JSON, and the chunks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from harness import DaemonRun, make_pdf, simulated_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOKEN = "benchmark-token"
KEY = {"X-Api-Key": TOKEN}
GROUNDED = """<|ref|>title<|/ref|><|det|>[[62, 38, 934, 71]]<|/det|>
# Quarterly Report

<|ref|>text<|/ref|><|det|>[[62, 90, 934, 160]]<|/det|>
Revenue grew by 12% in Q3. The board met on 3 October and approved the plan for the next
year, with investments in the northern and eastern regions.

<|ref|>sub_title<|/ref|><|det|>[[62, 165, 600, 180]]<|/det|>
## Results

<|ref|>equation<|/ref|><|det|>[[300, 190, 700, 210]]<|/det|>
\\[ E = mc^2 \\]

<|ref|>table_caption<|/ref|><|det|>[[62, 215, 500, 225]]<|/det|>
Table 1: Revenue by region.

<|ref|>table<|/ref|><|det|>[[62, 230, 934, 400]]<|/det|>
<table><tr><td>Region</td><td>Q2</td><td>Q3</td></tr><tr><td>North</td><td>1.1</td><td>1.2</td></tr>
<tr><td>East</td><td>0.9</td><td>1.0</td></tr><tr><td>South</td><td>0.7</td><td>0.8</td></tr></table>

<|ref|>image<|/ref|><|det|>[[100, 420, 500, 700]]<|/det|>


<|ref|>image_caption<|/ref|><|det|>[[100, 705, 500, 730]]<|/det|>
Figure 1: Sales by region.

<|ref|>text<|/ref|><|det|>[[62, 740, 934, 950]]<|/det|>
- Northern sales rose.
- Eastern sales held.
- Southern sales fell slightly, as expected after the summer.
"""


def post(url: str, route: str, pdf: Path, round_: int) -> httpx.Response:
    with pdf.open("rb") as handle:
        files = {"files": (f"api-{round_}.pdf", handle, "application/pdf")}
        return httpx.post(
            f"{url}{route}",
            headers=KEY,
            timeout=120,
            data={"to_formats": ["md", "json"]},
            files=files,
        )


def synchronous(url: str, pdf: Path, round_: int) -> float:
    started = time.monotonic()
    answer = post(url, "/v1/convert/file", pdf, round_)
    assert answer.status_code == 200 and answer.json()["status"] == "success", answer.text
    return time.monotonic() - started


def task(url: str, pdf: Path, round_: int) -> float:
    started = time.monotonic()
    task_id = post(url, "/v1/convert/file/async", pdf, round_).json()["task_id"]
    while True:
        status = httpx.get(
            f"{url}/v1/status/poll/{task_id}", params={"wait": 60}, timeout=70
        ).json()
        if status["task_status"] not in ("pending", "started"):
            break
    result = httpx.get(f"{url}/v1/result/{task_id}", timeout=60).json()
    assert result["status"] == "success", result
    return time.monotonic() - started


def phase(daemon: DaemonRun, rounds: int, one: object) -> tuple[list[float], float]:
    """Seconds of each round, and the daemon's CPU seconds a round."""
    before = sum(daemon.cpu_seconds())
    seconds = [one(r) for r in range(rounds)]  # type: ignore[operator]
    return seconds, (sum(daemon.cpu_seconds()) - before) / rounds


def build_cost(pages: int) -> list[tuple[str, float, float, float]]:
    """CPU milliseconds a page: build, JSON, chunks; for grounding and RapidOCR pages."""
    from ocrd.config import PromptMode
    from ocrd.domain import PageInfo, PageText
    from ocrd.output.chunks import chunk_lines
    from ocrd.output.docling import build_document
    from ocrd.output.page import assemble_page
    from ocrd.text.grounding import Block, Box

    info = PageInfo(1, (1414, 2000), 595.0, 842.0)
    grounded = assemble_page(info, PageText(GROUNDED, "stop"), PromptMode.layout)
    lines = [f"Line {n} of the scanned letter, with some words on it." for n in range(40)]
    blocks = tuple(
        Block("text", (Box(50, 20 + 24 * n, 950, 40 + 24 * n),), line)
        for n, line in enumerate(lines)
    )
    markdown = "\n".join(lines[:20]) + "\n\n" + "\n".join(lines[20:])
    scanned = assemble_page(info, PageText(markdown, "stop", blocks=blocks), PromptMode.layout)
    build_document([grounded], "warm-up")
    found = []
    for label, page in (("DeepSeek-OCR-2 grounding", grounded), ("RapidOCR lines", scanned)):
        many = [page] * pages
        started = time.process_time()
        doc = build_document(many, "benchmark")
        built = time.process_time()
        json.dumps(doc.export_to_dict())
        dumped = time.process_time()
        chunk_lines(doc, "benchmark.pdf")
        chunked = time.process_time()
        found.append(
            (
                label,
                (built - started) / pages * 1000,
                (dumped - built) / pages * 1000,
                (chunked - dumped) / pages * 1000,
            )
        )
    return found


def summary(label: str, values: list[float], cpu: float) -> str:
    ordered = sorted(values)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return (
        f"| {label} | {statistics.median(values) * 1000:.0f} | {p90 * 1000:.0f} | "
        f"{statistics.mean(values) * 1000:.0f} | {cpu * 1000:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--pages", type=int, default=200)
    args = parser.parse_args()
    os.environ["OCRD_HTTP_TOKEN"] = TOKEN
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        pdf = make_pdf(folder / "one-page.pdf", 1)
        daemon = DaemonRun(
            folder / "run",
            simulated_engine(16, 0.05),
            inbox={"uploads": True},
            http={"listen": "127.0.0.1:0"},
        )
        try:
            [listening] = daemon.wait_for("http.listening", timeout=120)
            url = f"http://{listening.fields['address']}"
            daemon.wait_for("daemon.ready", timeout=300)
            synchronous(url, pdf, -1)  # the first task imports docling-core: not counted
            drops, drop_cpu = phase(
                daemon, args.rounds, lambda r: daemon.drop_to_finish(pdf, f"drop-{r}.pdf")
            )
            syncs, sync_cpu = phase(daemon, args.rounds, lambda r: synchronous(url, pdf, r))
            tasks, task_cpu = phase(daemon, args.rounds, lambda r: task(url, pdf, 1000 + r))
        finally:
            daemon.stop()
    print(f"one-page PDF, {args.rounds} rounds each way, one at a time (milliseconds)")
    print("| way in | median | p90 | mean | daemon CPU a document |")
    print("| --- | --- | --- | --- | --- |")
    print(summary("dropped: rename to `document.finished`", drops, drop_cpu))
    print(summary("`POST /v1/convert/file` to its answer", syncs, sync_cpu))
    print(summary("`/v1/convert/file/async`, poll, result", tasks, task_cpu))
    print(f"\nDoclingDocument of {args.pages} pages, CPU milliseconds a page")
    print("| pages | build | JSON | chunks |")
    print("| --- | --- | --- | --- |")
    for label, build, dump, chunk in build_cost(args.pages):
        print(f"| {label} | {build:.2f} | {dump:.2f} | {chunk:.2f} |")


if __name__ == "__main__":
    main()
