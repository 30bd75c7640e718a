"""Pages per second: the bare engine on pre-rendered pages against ocrd from inbox to outbox.

    python benchmarks/throughput.py --engine vllm [--model FOLDER] [--pages 8] [--documents 4]
    python benchmarks/throughput.py --engine simulated --seconds-per-page 0.5 --capacity 64

(a) the baseline: every page rendered beforehand, then all given to the engine at once:
    vLLM's offline `LLM.generate` for `--engine vllm`, or the simulated engine's own
    `recognise` for `--engine simulated` (a stand-in for a GPU's speed and batch size).
(b) ocrd: the same pages as PDFs dropped into an inbox of `ocrd run` (engine loaded and
    ready before the clock starts), timed until the last Markdown is in the outbox and
    its original in done/. It pays for watching, settling, claiming, rendering, writing
    and settling; (b)/(a) near 1 means the daemon keeps the engine as busy as a batch job.

Both use the same engine settings. Without --model, `--engine vllm` builds the tests' tiny
DeepSeek-OCR-2 (random weights, CPU-sized language model, full-size vision towers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the tiny model and the PDF maker

from helpers import make_pdf  # noqa: E402

from ocrd.config import EngineConfig, PromptMode  # noqa: E402
from ocrd.domain import RenderSettings  # noqa: E402
from ocrd.render import Document, RenderLimits, RenderPool, detect_format  # noqa: E402


def engine_section(args: argparse.Namespace, folder: Path) -> dict:
    if args.engine == "simulated":
        simulated = {"seconds_per_page": args.seconds_per_page, "capacity": args.capacity}
        return {"kind": "simulated", "simulated": simulated}
    from tiny_model import build_model, vllm_engine_section

    model = Path(args.model) if args.model else build_model(folder / "tiny-model")
    section = vllm_engine_section(model, max_tokens=args.max_tokens, max_num_seqs=args.capacity)
    if args.model:  # a real model on a GPU: real weights, default memory settings
        for key in ("load_format", "enforce_eager", "kv_cache_memory_bytes", "max_model_len"):
            section["vllm"].pop(key)
        section["vllm"]["max_num_batched_tokens"] = 16384
    return section


def make_documents(folder: Path, pages: int, documents: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    sizes = [pages // documents + (1 if i < pages % documents else 0) for i in range(documents)]
    return [
        make_pdf(folder / f"doc{i + 1}.pdf", n, label=f"Doc {i + 1} page")
        for i, n in enumerate(sizes)
        if n
    ]


async def render_all(paths: list[Path], settings: RenderSettings) -> list:
    pool = RenderPool(1, RenderLimits())
    images = []
    try:
        for path in paths:
            document = Document(path, detect_format(path), settings)
            count = await pool.open(document)
            images += [await pool.render(document, n) for n in range(1, count + 1)]
    finally:
        pool.shutdown()
    return images


def baseline(args: argparse.Namespace, section: dict, pages: list) -> float:
    """Seconds for the bare engine to recognise every pre-rendered page."""
    config = EngineConfig.model_validate(section)
    if config.kind == "simulated":
        from ocrd.engines.simulated import SimulatedEngine

        async def run() -> float:
            engine = SimulatedEngine(config.simulated)
            started = time.monotonic()
            await asyncio.gather(*(engine.recognise(p, PromptMode.layout) for p in pages))
            return time.monotonic() - started

        return asyncio.run(run())

    from vllm import LLM

    from ocrd.engines.deepseek import PROMPTS
    from ocrd.engines.vllm import VllmEngine

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


def through_ocrd(
    args: argparse.Namespace, section: dict, documents: list[Path], folder: Path
) -> float:
    """Seconds from dropping the PDFs into a ready daemon's inbox to the last one settled."""
    inbox = folder / "data" / "inbox"
    inbox.mkdir(parents=True)
    config = folder / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "inboxes": [
                    {
                        "path": "data/inbox",
                        "settle_seconds": args.settle_seconds,
                        "max_image_side": args.max_image_side,
                    }
                ],
                "engine": section,
                "pipeline": {"max_pages_in_flight": max(64, 2 * args.capacity)},
            }
        )
    )
    daemon = subprocess.Popen(
        [sys.executable, "-m", "ocrd", "run", "--config", str(config), "--log-format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"},
    )
    assert daemon.stdout is not None
    started = 0.0
    finished = 0
    try:
        for line in daemon.stdout:
            event = json.loads(line).get("event") if line.startswith("{") else None
            if event == "daemon.ready":
                started = time.monotonic()
                for path in documents:  # rename: each file appears whole, as a copy would end
                    temporary = inbox / f".{path.name}"
                    temporary.write_bytes(path.read_bytes())
                    temporary.rename(inbox / path.name)
            elif event == "document.finished":
                finished += 1
                if finished == len(documents):
                    return time.monotonic() - started
            elif daemon.poll() is not None:
                break
        raise RuntimeError(f"ocrd stopped early (exit {daemon.poll()})")
    finally:
        daemon.terminate()
        daemon.wait(timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=["vllm", "simulated"], default="vllm")
    parser.add_argument("--model", help="model folder or hub name (default: the tiny test model)")
    parser.add_argument("--pages", type=int, default=8)
    parser.add_argument("--documents", type=int, default=4)
    parser.add_argument("--max-image-side", type=int, default=768)
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument(
        "--capacity", type=int, default=8, help="max_num_seqs, or simulated capacity"
    )
    parser.add_argument("--seconds-per-page", type=float, default=0.5, help="simulated engine")
    parser.add_argument("--settle-seconds", type=float, default=0.2)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ocrd-bench-") as tmp:
        folder = Path(tmp)
        section = engine_section(args, folder)
        documents = make_documents(folder / "pdfs", args.pages, args.documents)
        settings = RenderSettings(dpi=144, max_image_side=args.max_image_side)
        pages = asyncio.run(render_all(documents, settings))
        a = baseline(args, section, pages)
        b = through_ocrd(args, section, documents, folder / "ocrd")
    n = len(pages)
    print(
        f"engine {args.engine}: {n} pages in {len(documents)} documents, "
        f"image side <= {args.max_image_side} px, settle {args.settle_seconds} s"
    )
    print(f"(a) engine alone, pre-rendered pages: {a:8.2f} s  {n / a:8.3f} pages/s")
    print(f"(b) ocrd, inbox to outbox:            {b:8.2f} s  {n / b:8.3f} pages/s")
    print(f"ratio (b)/(a) in pages/s: {a / b:.3f}")


if __name__ == "__main__":
    main()
