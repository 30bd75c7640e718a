"""ocrd's Markdown scored by olmOCR-Bench's unit tests (the sample in ../shared/corpus).

    python benchmarks/olmocr_bench.py [--routes text_layer,pixels] [--failures]

Each PDF of the sample goes through ocrd's pipeline with the CPU engine (RapidOCR), once per
route: `text_layer` is the inbox setting `pdf_text: prefer` (what `auto` picks on the CPU:
a good text layer stands in for OCR, other pages are recognised), `pixels` is `pdf_text:
ocr` (every page recognised). Blank pages are marked as in the default inbox; with
`--strip-headers-footers` the inbox option of that name is on (for the text layer, the
layout model's page headers and footers are left out). Printed: the
pass rate per test type and route, pages per second of each route, and with `--failures`
each failed test. Scoring: benchmarks/olmocr_scorer.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from harness import CORPUS
from olmocr_scorer import check

from ocrd.config import DocumentOptions, PipelineConfig, RapidOcrConfig
from ocrd.documents.pipeline import DocumentContext, Pipeline
from ocrd.engines.rapidocr import RapidOcrEngine
from ocrd.output.write import render_markdown

BENCH = CORPUS / "olmocr-bench"
ROUTES = {"text_layer": "prefer", "pixels": "ocr"}


def load_tests() -> list[dict]:
    tests = []
    for name in ("dataset.jsonl", "blanks.jsonl"):
        for line in (BENCH / name).read_text().splitlines():
            if line.strip():
                tests.append(json.loads(line))
    return tests


async def convert_all(
    pdfs: list[str], pdf_text: str, strip: bool, scratch: Path
) -> tuple[dict, float, int]:
    """Markdown of each PDF through ocrd's pipeline; seconds, pages."""
    inbox = DocumentOptions(pdf_text=pdf_text, strip_headers_footers=strip)
    settings = inbox.for_engine("rapidocr")
    engine = RapidOcrEngine(RapidOcrConfig())
    await engine.start()
    pipeline = Pipeline.create(engine, PipelineConfig())
    markdown, pages = {}, 0
    started = time.monotonic()
    try:
        for pdf in pdfs:
            result = await pipeline.convert(
                DocumentContext.of(BENCH / "pdfs" / pdf, settings, scratch / pdf)
            )
            markdown[pdf] = render_markdown(result, settings, "assets")
            pages += len(result.pages)
    finally:
        pipeline.renderers.shutdown()
        await engine.stop()
    return markdown, time.monotonic() - started, pages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routes", default="text_layer,pixels")
    parser.add_argument("--failures", action="store_true", help="list each failed test")
    parser.add_argument(
        "--strip-headers-footers", action="store_true", help="the inbox option of that name"
    )
    args = parser.parse_args()
    routes = args.routes.split(",")
    tests = load_tests()
    pdfs = sorted({test["pdf"] for test in tests})
    totals: Counter[str] = Counter(test["type"] for test in tests)
    passed: dict[str, Counter[str]] = {}
    speed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="ocrd-olmocr-") as tmp:
        for route in routes:
            markdown, seconds, pages = asyncio.run(
                convert_all(pdfs, ROUTES[route], args.strip_headers_footers, Path(tmp) / route)
            )
            speed[route] = f"{pages / seconds:.2f} pages/s ({pages} pages, {seconds:.1f} s)"
            passed[route] = Counter()
            for test in tests:
                outcome = check(test, markdown[test["pdf"]])
                if outcome.passed:
                    passed[route][test["type"]] += 1
                elif args.failures:
                    print(f"{route}: {test['id']} ({test['pdf']}): {outcome.why}")
    print(
        f"olmOCR-Bench sample: {len(pdfs)} PDFs, {len(tests)} tests; CPU engine (RapidOCR); "
        f"strip_headers_footers: {str(args.strip_headers_footers).lower()}"
    )
    print("| test type | tests | " + " | ".join(routes) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in routes) + " |")
    for kind in sorted(totals):
        cells = [
            f"{passed[r][kind]}/{totals[kind]} ({passed[r][kind] / totals[kind]:.0%})"
            for r in routes
        ]
        print(f"| {kind} | {totals[kind]} | " + " | ".join(cells) + " |")
    overall = [sum(passed[r].values()) for r in routes]
    print(
        "| all | "
        + str(len(tests))
        + " | "
        + " | ".join(f"{n}/{len(tests)} ({n / len(tests):.0%})" for n in overall)
        + " |"
    )
    for route in routes:
        print(f"{route}: {speed[route]}")


if __name__ == "__main__":
    main()
