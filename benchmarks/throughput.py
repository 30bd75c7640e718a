"""Pages per second: the bare engine on pre-rendered pages against ocrd from inbox to outbox.

    python benchmarks/throughput.py --engine simulated --capacities 8,32,128,512 \\
        [--engine-seconds 60] [--pages-per-second 20] [--tree DIR]
    python benchmarks/throughput.py --engine vllm [--model FOLDER] [--pages 8] [--documents 4]

(a) the baseline: every page rendered beforehand, then all given to the engine at once:
    the simulated engine's own `recognise` for `--engine simulated` (a stand-in for a GPU's
    speed and batch size), or vLLM's offline `LLM.generate` for `--engine vllm`.
(b) ocrd: the same pages as PDFs dropped into the inbox of `ocrd run` with its **default
    pipeline settings** (engine loaded and ready before the clock starts), timed until the
    last original is settled in done/. It pays for watching, claiming, rendering, writing
    and settling; (b)/(a) near 1 means the daemon keeps the engine as busy as a batch job.

With `--capacities`, one run per engine capacity (pages the simulated engine works on at
once). Each engine's time a page is chosen so that it asks `--pages-per-second` of ocrd
(`capacity / pages-per-second`, at least 1 s), and it gets at least `--engine-seconds` of
work (whole rounds of its batch) in documents of 50 pages. Pages are A5 PDFs with the
longer side rendered at most 768 px. The bare engine is given `2 x capacity` distinct
pages over and over (it reads nothing on them) to keep the baseline's memory small.
Without --model, `--engine vllm` builds the tests' tiny DeepSeek-OCR-2 (random weights).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import tempfile
import time
from pathlib import Path

from harness import REPO, DaemonRun, make_pdf, simulated_engine

from ocrd.config import EngineConfig, PromptMode, RenderSettings
from ocrd.domain import PageImage
from ocrd.render import RenderLimits, RenderPool, SourceFile, detect_format

MAX_IMAGE_SIDE = 768


def make_documents(folder: Path, pages: int, per_document: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    documents = math.ceil(pages / per_document)
    sizes = [pages // documents + (1 if i < pages % documents else 0) for i in range(documents)]
    return [
        make_pdf(folder / f"doc{i + 1}.pdf", n, label=f"Doc {i + 1} page")
        for i, n in enumerate(sizes)
    ]


async def render_pages(paths: list[Path], limit: int) -> list[PageImage]:
    """Up to `limit` pages of `paths`, rendered as the daemon renders them."""
    pool = RenderPool(1, RenderLimits())
    settings = RenderSettings(dpi=144, max_image_side=MAX_IMAGE_SIDE)
    images: list[PageImage] = []
    try:
        for path in paths:
            document = SourceFile(path, detect_format(path), settings)
            count = await pool.open(document)
            for number in range(1, count + 1):
                if len(images) == limit:
                    return images
                images.append(await pool.render(document, number))
    finally:
        pool.shutdown()
    return images


def simulated_baseline(section: dict, pages: list[PageImage], total: int) -> float:
    """Seconds for the bare simulated engine to recognise `total` pages, all at once."""
    from ocrd.engines.simulated import SimulatedEngine

    config = EngineConfig.model_validate(section)

    async def run() -> float:
        engine = SimulatedEngine(config.simulated)
        started = time.monotonic()
        await asyncio.gather(
            *(engine.recognise(pages[n % len(pages)], PromptMode.layout) for n in range(total))
        )
        return time.monotonic() - started

    return asyncio.run(run())


def vllm_baseline(section: dict, pages: list[PageImage]) -> float:
    """Seconds for vLLM's offline `LLM.generate` to recognise every pre-rendered page."""
    from vllm import LLM

    from ocrd.engines.deepseek import PROMPTS
    from ocrd.engines.vllm import VllmEngine

    config = EngineConfig.model_validate(section)
    engine = VllmEngine(config.vllm, config.sampling)
    llm = LLM(**engine.engine_kwargs())
    requests = [
        {"prompt": PROMPTS[PromptMode.layout], "multi_modal_data": {"image": p.image}}
        for p in pages
    ]
    started = time.monotonic()
    outputs = llm.generate(requests, engine.sampling_params(), use_tqdm=False)
    seconds = time.monotonic() - started
    assert len(outputs) == len(pages)
    del llm
    return seconds


def through_ocrd(section: dict, documents: list[Path], folder: Path, tree: Path) -> float:
    """Seconds from dropping the PDFs into a ready daemon's inbox to the last one settled."""
    daemon = DaemonRun(folder, section, inbox={"max_image_side": MAX_IMAGE_SIDE}, tree=tree)
    try:
        daemon.wait_for("daemon.ready", timeout=600)
        started = time.monotonic()
        for path in documents:
            daemon.drop(path)
        finished = daemon.wait_for("document.finished", count=len(documents), timeout=7200)
        return max(event.at for event in finished) - started
    finally:
        daemon.stop()


def simulated_sweep(args: argparse.Namespace, folder: Path) -> None:
    print(
        f"tree {args.tree}: simulated engine, default pipeline settings, A5 pages at most "
        f"{MAX_IMAGE_SIDE} px, settle 0.2 s"
    )
    print("| capacity | s a page | pages | documents | (a) pages/s | (b) pages/s | (b)/(a) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for capacity in args.capacities:
        seconds_per_page = max(1.0, capacity / args.pages_per_second)
        rounds = math.ceil(args.engine_seconds / seconds_per_page)
        total = capacity * rounds
        section = simulated_engine(capacity, seconds_per_page)
        documents = make_documents(folder / f"pdfs-{capacity}", total, 50)
        pages = asyncio.run(render_pages(documents, 2 * capacity))
        a = simulated_baseline(section, pages, total)
        b = through_ocrd(section, documents, folder / f"ocrd-{capacity}", args.tree)
        print(
            f"| {capacity} | {seconds_per_page:g} | {total} | {len(documents)} | "
            f"{total / a:.2f} | {total / b:.2f} | {a / b:.3f} |",
            flush=True,
        )


def vllm_run(args: argparse.Namespace, folder: Path) -> None:
    from tiny_model import build_model, vllm_engine_section

    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # both cores of a small CPU
    model = Path(args.model) if args.model else build_model(folder / "tiny-model")
    section = vllm_engine_section(model, max_tokens=args.max_tokens, max_num_seqs=8)
    if args.model:  # a real model on a GPU: real weights, default memory settings
        for key in ("load_format", "enforce_eager", "kv_cache_memory_bytes", "max_model_len"):
            section["vllm"].pop(key)
        section["vllm"]["max_num_batched_tokens"] = 16384
    documents = make_documents(folder / "pdfs", args.pages, math.ceil(args.pages / args.documents))
    pages = asyncio.run(render_pages(documents, args.pages))
    a = vllm_baseline(section, pages)
    b = through_ocrd(section, documents, folder / "ocrd", args.tree)
    n = len(pages)
    print(f"engine vllm: {n} pages in {len(documents)} documents, at most {MAX_IMAGE_SIDE} px")
    print(f"(a) engine alone, pre-rendered pages: {a:8.2f} s  {n / a:8.3f} pages/s")
    print(f"(b) ocrd, inbox to outbox:            {b:8.2f} s  {n / b:8.3f} pages/s")
    print(f"ratio (b)/(a) in pages/s: {a / b:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["vllm", "simulated"], default="simulated")
    parser.add_argument("--capacities", default="8,32,128,512")
    parser.add_argument("--engine-seconds", type=float, default=60.0)
    parser.add_argument("--pages-per-second", type=float, default=20.0)
    parser.add_argument("--model", help="model folder or hub name (default: the tiny test model)")
    parser.add_argument("--pages", type=int, default=8, help="vllm")
    parser.add_argument("--documents", type=int, default=4, help="vllm")
    parser.add_argument("--max-tokens", type=int, default=24, help="vllm")
    parser.add_argument("--tree", type=Path, default=REPO, help="checkout whose ocrd runs")
    args = parser.parse_args()
    args.capacities = [int(c) for c in args.capacities.split(",")]

    with tempfile.TemporaryDirectory(prefix="ocrd-bench-") as tmp:
        if args.engine == "simulated":
            simulated_sweep(args, Path(tmp))
        else:
            vllm_run(args, Path(tmp))


if __name__ == "__main__":
    main()
