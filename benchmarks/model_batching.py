"""Continuous batching per model: vLLM fed directly against ocrd's daemon, on the same pages
and the same engine settings, one model at a time, with tiny random weights on the CPU.

    PYTHONPATH=. .venv/bin/python benchmarks/model_batching.py [--models deepseek-ocr-2,...] \\
        [--pages 16] [--documents 4] [--max-tokens 64] [--max-num-seqs 8] [--rounds 2]

For each model:
(a) direct: vLLM's async engine (`AsyncLLM`, as the daemon runs it) built with the very
    arguments ocrd's vLLM engine gives it (`VllmEngine.engine_kwargs`, the same sampling
    parameters and the model's own prompt through its chat template); every page rendered
    beforehand as the daemon renders it (144 DPI, at most 768 px, fitted to the model's
    image rule) and all of them submitted at once, as a perfect client would. Timed from
    the submission to the last answer.
(b) daemon: `ocrd run` with that engine section and an inbox on that model, the same PDFs
    dropped at once into its inbox; timed from the drop to the last document settled
    (rendering, writing the Markdown and settling included).
Each side reads a warm-up document of `--max-num-seqs` pages first (an engine's first full
batch pays one-time costs: the first timed round after a single warm-up page was half again
as long as the second on both sides), then the same pages `--rounds` times; its engine is
shut down before the other side starts (2 cores, a few GiB each). (b)/(a) in pages/s, from
each side's best round (the one least disturbed by other work on a shared machine), is the
share of the engine's throughput the daemon delivers.

The pages are the throughput benchmark's A5 PDFs (tests/helpers.make_pdf). The models are
tests/tiny_model.py's DeepSeek-OCR-2 and tests/tiny_models.py's others: their text is noise
that never ends by itself, so each page costs exactly `--max-tokens` output tokens.

`--engine-cpus 0` gives vLLM's engine process core 0 (VLLM_CPU_OMP_THREADS_BIND) and everything
else, this script or the daemon with its render workers, the other cores, on both sides: as on
a GPU server, where the engine's device is its own and ocrd renders and writes on the CPU. On
a shared 2-core CPU without it, each page ocrd renders takes a core from one of the engine's
two OpenMP threads, and the other waits at the next barrier: the engine process then spends
more CPU on the same pages, which measures the CPU's sharing, not the daemon's batching.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from harness import REPO, DaemonRun
from throughput import make_documents, render_pages

from ocrd.config import EngineConfig, PromptMode
from ocrd.domain import PageImage
from ocrd.engines.recipes import fit_page, prompt_for
from ocrd.engines.replicas import kv_cache_environment
from ocrd.engines.vllm import VllmEngine
from ocrd.models import model as model_named

TINY = {  # ocrd's model name: the builder of its tiny folder in tests/tiny_models.py
    "olmocr-2": "qwen2_5_vl",
    "lightonocr-2": "lightonocr",
    "glm-ocr": "glm_ocr",
    "paddleocr-vl-1.5": "paddleocr_vl",
}
MODELS = ("deepseek-ocr-2", *TINY)
INBOX = {  # as the tests' vLLM inboxes: random weights never stop, so no second try
    "max_image_side": 768,
    "retry_unfinished": False,
    "pdf_text": "ocr",
}


def cpu_split(root: psutil.Process) -> tuple[float, float]:
    """CPU seconds so far of vLLM's engine process under `root`, and of `root` with its
    other descendants (the client: the daemon and its render workers, or this script)."""
    engine = rest = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            name = process.name()
        except psutil.NoSuchProcess:
            continue
        used = times.user + times.system
        if name.startswith("VLLM::Engine"):  # its process title
            engine += used
        else:
            rest += used
    return engine, rest


@dataclass(frozen=True)
class Round:
    seconds: float
    engine_cpu: float  # CPU seconds of vLLM's engine process in the round
    client_cpu: float  # of everything else: the daemon and its render workers, or this script
    prompt_tokens: int  # of all the round's pages: both sides must send the engine the same


@dataclass(frozen=True)
class Result:
    model: str
    pages: int
    direct: list[Round]
    daemon: list[Round]

    def cpu(self) -> str:
        def side(rounds: list[Round]) -> str:
            return "; ".join(f"{r.engine_cpu:.1f} / {r.client_cpu:.1f}" for r in rounds)

        def tokens(rounds: list[Round]) -> str:
            return ", ".join(str(r.prompt_tokens) for r in rounds)

        return (
            f"  CPU s a round, engine / the rest: (a) {side(self.direct)}; (b) {side(self.daemon)}"
            f"\n  prompt tokens a round: (a) {tokens(self.direct)}; (b) {tokens(self.daemon)}"
        )

    def row(self) -> str:
        """The best round of each side (the least disturbed by other work on the machine)."""
        best_direct = min(r.seconds for r in self.direct)
        best_daemon = min(r.seconds for r in self.daemon)
        direct, daemon = self.pages / best_direct, self.pages / best_daemon
        rounds = "; ".join(
            f"{a.seconds:.1f} / {b.seconds:.1f}"
            for a, b in zip(self.direct, self.daemon, strict=True)
        )
        return (
            f"| {self.model} | {self.pages} | {rounds} | {direct:.3f} | {daemon:.3f} | "
            f"**{daemon / direct:.3f}** |"
        )


def engine_section(name: str, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The engine section both sides use: the tests' settings for a 2-core CPU."""
    from tiny_model import build_model, vllm_engine_section

    vllm: dict[str, Any] = {"max_num_seqs": args.max_num_seqs}
    if name == "deepseek-ocr-2":
        path = build_model(folder / "deepseek-ocr-2-tiny")
    else:
        from tiny_models import BUILDERS

        tiny = BUILDERS[TINY[name]](folder / f"{TINY[name]}-tiny")
        path = tiny.folder
        # Their pages are 500 to 1,000 tokens (each model's own image rule), not 257.
        vllm |= {"max_model_len": 4096, "max_num_batched_tokens": 4096}
        vllm["trust_remote_code"] = tiny.trust_remote_code
    section = vllm_engine_section(path, max_tokens=args.max_tokens, **vllm)
    section["model"] = name
    return section


async def direct_seconds(
    section: dict[str, Any], pages: list[PageImage], warm: list[PageImage], rounds: int
) -> list[Round]:
    """Seconds for vLLM's async engine to answer every page, all submitted at once, in
    each of `rounds` rounds."""
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    config = EngineConfig.model_validate(section)
    recipe = model_named(config.model)
    ocrd_engine = VllmEngine(config.vllm, config.sampling, recipe=recipe)
    prompt = await ocrd_engine.prompt_text(prompt_for(recipe, PromptMode.layout))
    params = ocrd_engine.sampling_params()
    images = [fit_page(page, recipe).image for page in pages]
    warm_images = [fit_page(page, recipe).image for page in warm]
    os.environ.update(kv_cache_environment(config.vllm))
    engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**ocrd_engine.engine_kwargs()))

    async def read(number: int, image: Any) -> tuple[int, int]:
        """The page's prompt and output tokens."""
        request = {"prompt": prompt, "multi_modal_data": {"image": image}}
        final = None
        async for output in engine.generate(request, params, f"page-{number}"):
            final = output
        assert final is not None and final.finished
        return len(final.prompt_token_ids or ()), len(final.outputs[0].token_ids)

    async def timed_round(first: int) -> Round:
        cpu_before = cpu_split(psutil.Process())
        started = time.monotonic()
        batch = enumerate(images, first)
        tokens = await asyncio.gather(*(read(n, image) for n, image in batch))
        seconds = time.monotonic() - started
        cpu_after = cpu_split(psutil.Process())
        assert len(tokens) == len(pages) and all(out for _, out in tokens), tokens
        prompt_tokens = sum(prompt for prompt, _ in tokens)
        engine_cpu, client_cpu = cpu_after[0] - cpu_before[0], cpu_after[1] - cpu_before[1]
        return Round(seconds, engine_cpu, client_cpu, prompt_tokens)

    try:
        await asyncio.gather(*(read(-n, image) for n, image in enumerate(warm_images, 1)))
        return [await timed_round(1 + r * len(pages)) for r in range(rounds)]
    finally:
        engine.shutdown()


def daemon_seconds(
    section: dict[str, Any], documents: list[Path], warm: Path, folder: Path, rounds: int
) -> list[Round]:
    """Seconds from dropping the PDFs into a ready daemon's inbox to the last one settled,
    in each of `rounds` rounds (the same PDFs under new names)."""
    inbox = {**INBOX, "model": section["model"]}
    daemon = DaemonRun(folder, section, inbox=inbox)
    times = []
    try:
        daemon.wait_for("daemon.ready", timeout=900)
        daemon.drop(warm)
        daemon.wait_for("document.finished", timeout=900)
        root = psutil.Process(daemon.process.pid)
        for r in range(1, rounds + 1):
            cpu_before = cpu_split(root)
            started = time.monotonic()
            names = {f"r{r}-{path.name}" for path in documents}
            for path in documents:
                daemon.drop(path, f"r{r}-{path.name}")
            finished = daemon.wait_for(
                "document.finished", count=1 + r * len(documents), timeout=3600
            )
            this_round = [e for e in finished if e.fields["path"] in names]
            outcomes = {event.fields["outcome"] for event in this_round}
            assert outcomes == {"done"}, outcomes
            seconds = max(event.at for event in this_round) - started
            cpu_after = cpu_split(root)
            engine_cpu, client_cpu = cpu_after[0] - cpu_before[0], cpu_after[1] - cpu_before[1]
            pages = [e for e in daemon.find("page.recognised") if e.fields["path"] in names]
            prompt_tokens = sum(int(e.fields["prompt_tokens"]) for e in pages)
            times.append(Round(seconds, engine_cpu, client_cpu, prompt_tokens))
        return times
    finally:
        daemon.stop()


def measure(name: str, args: argparse.Namespace, folder: Path) -> Result:
    section = engine_section(name, folder, args)
    documents = make_documents(folder / "pdfs", args.pages, -(-args.pages // args.documents))
    [warm] = make_documents(folder / "warm", args.max_num_seqs, args.max_num_seqs)
    pages = asyncio.run(render_pages(documents, args.pages))
    warm_pages = asyncio.run(render_pages([warm], args.max_num_seqs))
    direct = asyncio.run(direct_seconds(section, pages, warm_pages, args.rounds))
    daemon = daemon_seconds(section, documents, warm, folder / "ocrd", args.rounds)
    return Result(name, len(pages), direct, daemon)


def load_average() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--pages", type=int, default=16)
    parser.add_argument("--documents", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds a side; best kept")
    parser.add_argument(
        "--engine-cpus",
        help="cores of the engine's process alone (VLLM_CPU_OMP_THREADS_BIND, e.g. 0); the "
        "client and the daemon get the others",
    )
    args = parser.parse_args()
    if args.engine_cpus and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
        engine = {int(cpu) for cpu in args.engine_cpus.split(",")}
        os.sched_setaffinity(0, os.sched_getaffinity(0) - engine)  # inherited by the daemon
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = args.engine_cpus
    # The environment vLLM's CPU backend needs on a small machine (as the tests set it),
    # for this process too: the direct client preprocesses the images here, as the daemon
    # does in its own process, so both run with the same allocator and OpenMP.
    from tiny_model import cpu_preload

    if os.environ.get("LD_PRELOAD") != cpu_preload():
        environment = {**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
        environment["LD_PRELOAD"] = cpu_preload()
        os.execve(sys.executable, [sys.executable, *sys.argv], environment)
    os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] = "0"
    print(
        f"tree {REPO}: {args.pages} pages in {args.documents} documents, at most 768 px, "
        f"{args.max_tokens} tokens a page, max_num_seqs {args.max_num_seqs}, engine on "
        f"cores {os.environ.get('VLLM_CPU_OMP_THREADS_BIND', 'all')}, the rest on "
        f"{sorted(os.sched_getaffinity(0))}"
    )
    print("| model | pages | s a round, (a) / (b) | (a) pages/s | (b) pages/s | (b)/(a) |")
    print("| --- | --- | --- | --- | --- | --- |", flush=True)
    for name in args.models.split(","):
        before = load_average()
        with tempfile.TemporaryDirectory(prefix="ocrd-batching-") as tmp:
            result = measure(name, args, Path(tmp))
        print(result.row(), flush=True)
        print(result.cpu(), flush=True)
        print(f"  load: before {before}; after {load_average()}", flush=True)


if __name__ == "__main__":
    main()
