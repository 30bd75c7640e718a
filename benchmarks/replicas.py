"""Engine replicas: what the hand-over costs, how pages/s scales with replicas, what a killed
replica costs, and ocrd's vLLM replicas against vLLM's own offline batch.

    python benchmarks/replicas.py transport [--pages 40]
    python benchmarks/replicas.py scaling [--replicas 1,2,4,8] [--engine-seconds 60]
        [--capacity 4] [--seconds-per-page 1.6]
    python benchmarks/replicas.py kill [--replicas 4] [--engine-seconds 90]
    python benchmarks/replicas.py vllm [--model FOLDER] [--pages 8] [--max-tokens 24] [--rounds 2]

transport: CPU of the daemon's process per page for the ways a page can reach a server
    (PNG data URL, as a remote fleet needs; uncompressed PPM or BMP file in a tmpfs folder,
    as ocrd's own replicas read it), on real PDFs of the corpus rendered like an inbox does
    (144 DPI, longer side at most 2048 px); and per request for the HTTP clients (httpx,
    aiohttp) against a server on a Unix socket.
scaling: simulated replica processes (`engine.simulated.replicas: N`, each `--capacity`
    pages at once taking `--seconds-per-page`: asyncio sleepers, so 2 cores can stand in for
    8 GPUs), N = 1, 2, 4, 8, each given at least `--engine-seconds` of engine work.
    (a) the router alone: pre-rendered pages given to the engine at once;
    (b) ocrd run, inbox to outbox, default pipeline settings;
    both against N times one replica's rate (capacity / seconds per page), with the daemon's
    main-process CPU per page; and the in-process simulated engine of the same total
    capacity for comparison.
kill: `ocrd run` with 4 simulated replicas; one is SIGKILLed a third of the way in; pages/s
    in 5-second bins, restarts, and how many documents failed (none should).
vllm: real vLLM on the CPU (the tests' tiny DeepSeek-OCR-2 without --model): vLLM's offline
    `LLM.generate` on N pre-rendered pages, against ocrd's engine given the same N pages at
    once (one request each, no retries on either side): one `vllm serve` replica with both
    cores, two replicas with one core each, and the in-process engine.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
from harness import CORPUS, DaemonRun
from throughput import MAX_IMAGE_SIDE, make_documents, render_pages

from ocrd.config import EngineConfig, PromptMode
from ocrd.domain import PageImage


def cpu() -> float:
    return time.process_time()


# --- transport ----------------------------------------------------------------------------


def corpus_pages(limit: int) -> list[Any]:
    import pymupdf
    from PIL import Image

    images = []
    for path in sorted((CORPUS / "real").glob("*.pdf")):
        try:
            document = pymupdf.open(path)
            pixmap = document[0].get_pixmap(dpi=144)
        except Exception:
            continue
        image = Image.frombytes("RGB", (pixmap.width, pixmap.height), pixmap.samples)
        if max(image.size) > 2048:
            image.thumbnail((2048, 2048))
        images.append(image)
        if len(images) == limit:
            break
    return images


def transport(args: argparse.Namespace) -> None:
    from ocrd.engines.media import PageFiles, png_data_url

    images = corpus_pages(args.pages)
    megapixels = statistics.mean(i.size[0] * i.size[1] for i in images) / 1e6
    print(f"{len(images)} first pages of corpus/real PDFs at 144 DPI, {megapixels:.2f} MP mean")
    with tempfile.TemporaryDirectory(dir="/dev/shm") as folder:
        files = PageFiles(Path(folder))

        def ppm(image: Any) -> None:
            files.write(image).release()

        def bmp(image: Any) -> None:
            path = Path(folder) / "page.bmp"
            image.save(path, format="BMP")
            path.unlink()

        print("| hand-over | ms CPU a page (best of 3) |")
        print("| --- | --- |")
        for name, action in (
            ("PNG data URL (zlib level 1, base64)", png_data_url),
            ("PPM file in /dev/shm, then removed", ppm),
            ("BMP file in /dev/shm, then removed", bmp),
        ):
            best = min(_cpu_per_item(action, images) for _ in range(3))
            print(f"| {name} | {best * 1000:.2f} |", flush=True)
    http_clients(args)
    engine_cost(images)


def engine_cost(images: list[Any]) -> None:
    """The engine's own CPU in the daemon's process per page (hand-over, routing, HTTP),
    with simulated engines that answer after 20 ms."""
    from PIL import Image

    from ocrd.engines import create_engine

    requests = 400

    async def measure(section: dict[str, Any], from_files: bool) -> float:
        engine = create_engine(EngineConfig.model_validate(section), "simulated")
        await engine.start()
        try:
            folder = getattr(engine, "page_folder", None)
            pages = []
            for n in range(requests):
                image = images[n % len(images)]
                if from_files:  # as a render worker would write it where replicas read
                    path = folder / f"worker-{n}.ppm"
                    image.save(path, format="PPM")
                    image = Image.open(path)
                pages.append(PageImage(n + 1, image, 1, 1))
            started = cpu()
            await asyncio.gather(*(engine.recognise(p, PromptMode.layout) for p in pages))
            return (cpu() - started) / requests
        finally:
            await engine.stop()

    in_process = {"kind": "simulated", "simulated": {"capacity": 64, "seconds_per_page": 0.02}}
    replicas = {
        "kind": "simulated",
        "simulated": {"replicas": 2, "capacity": 32, "seconds_per_page": 0.02},
    }
    print(f"\nthe engine's CPU in the daemon's process, {requests} of those pages")
    print("| engine | ms CPU a page (best of 3) |")
    print("| --- | --- |")
    for name, section, from_files in (
        ("simulated, in the daemon's process", in_process, False),
        ("2 simulated replicas, page written as PPM by the engine", replicas, False),
        ("2 simulated replicas, page already a file in the page folder", replicas, True),
    ):
        best = min(asyncio.run(measure(section, from_files)) for _ in range(3))
        print(f"| {name} | {best * 1000:.2f} |", flush=True)


def _cpu_per_item(action: Any, items: list[Any]) -> float:
    started = cpu()
    for item in items:
        action(item)
    return (cpu() - started) / len(items)


def _answering_server(socket: str) -> None:
    from aiohttp import web

    async def chat(request: web.Request) -> web.Response:
        await request.json()
        await asyncio.sleep(0.02)
        return web.json_response(
            {
                "choices": [{"message": {"content": "x" * 2000}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 257, "completion_tokens": 400},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, path=socket, print=None, access_log=None)


def http_clients(args: argparse.Namespace) -> None:
    import httpx

    from ocrd.engines.link import ServerLink

    requests, concurrency = 3000, 64
    body = {
        "model": "m",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "file:///dev/shm/x/page-1.ppm"}},
                    {"type": "text", "text": "<|grounding|>Convert the document to markdown."},
                ],
            }
        ],
        "max_tokens": 8192,
        "vllm_xargs": {"ngram_size": 30, "window_size": 90, "whitelist_token_ids": [1, 2]},
    }
    with tempfile.TemporaryDirectory() as folder:
        socket = f"{folder}/server.sock"
        server = multiprocessing.Process(target=_answering_server, args=(socket,), daemon=True)
        server.start()
        while not os.path.exists(socket):
            time.sleep(0.05)

        async def with_httpx() -> float:
            transport = httpx.AsyncHTTPTransport(uds=socket)
            async with httpx.AsyncClient(transport=transport) as client:

                async def one() -> None:
                    answer = await client.post("http://x/v1/chat/completions", json=body)
                    answer.json()

                return await _timed(one, requests, concurrency)

        async def with_ocrd_link() -> float:
            link = ServerLink("http://localhost/v1", socket=Path(socket), connections=concurrency)

            async def one() -> None:
                await link.post("/chat/completions", body, 30)

            try:
                return await _timed(one, requests, concurrency)
            finally:
                await link.close()

        print(f"\n{requests} chat requests, {concurrency} at once, server on a Unix socket")
        print("| client | ms CPU a request (best of 3) |")
        print("| --- | --- |")
        for name, run in (("httpx", with_httpx), ("aiohttp (ocrd's ServerLink)", with_ocrd_link)):
            best = min(asyncio.run(run()) for _ in range(3))
            print(f"| {name} | {best * 1000:.3f} |", flush=True)
        server.terminate()


async def _timed(one: Any, requests: int, concurrency: int) -> float:
    slots = asyncio.Semaphore(concurrency)

    async def limited() -> None:
        async with slots:
            await one()

    started = cpu()
    await asyncio.gather(*(limited() for _ in range(requests)))
    return (cpu() - started) / requests


# --- scaling ------------------------------------------------------------------------------


def simulated_section(replicas: int, capacity: int, seconds: float) -> dict[str, Any]:
    return {
        "kind": "simulated",
        "simulated": {"replicas": replicas, "capacity": capacity, "seconds_per_page": seconds},
    }


def router_alone(section: dict[str, Any], pages: list[PageImage], total: int) -> float:
    """Seconds for the engine (started beforehand) to recognise `total` pages given at once."""
    from ocrd.engines import create_engine

    config = EngineConfig.model_validate(section)

    async def run() -> float:
        engine = create_engine(config, "simulated")
        await engine.start()
        try:
            started = time.monotonic()
            await asyncio.gather(
                *(engine.recognise(pages[n % len(pages)], PromptMode.layout) for n in range(total))
            )
            return time.monotonic() - started
        finally:
            await engine.stop()

    return asyncio.run(run())


def through_ocrd(
    section: dict[str, Any], documents: list[Path], folder: Path
) -> tuple[float, float, DaemonRun]:
    """Seconds from the first drop to the last settled document, the daemon's main-process
    CPU seconds meanwhile, and the run (stopped)."""
    daemon = DaemonRun(folder, section, inbox={"max_image_side": MAX_IMAGE_SIDE})
    try:
        daemon.wait_for("daemon.ready", timeout=600)
        cpu_before, _ = daemon.cpu_seconds()
        started = time.monotonic()
        for path in documents:
            daemon.drop(path)
        finished = daemon.wait_for("document.finished", count=len(documents), timeout=7200)
        cpu_after, _ = daemon.cpu_seconds()
        failed = [e for e in finished if e.fields.get("outcome") != "done"]
        if failed:
            raise SystemExit(f"{len(failed)} documents failed: {failed[0].fields}")
        return max(e.at for e in finished) - started, cpu_after - cpu_before, daemon
    finally:
        daemon.stop()


def scaling(args: argparse.Namespace, folder: Path) -> None:
    capacity, seconds = args.capacity, args.seconds_per_page
    one = capacity / seconds
    print(
        f"simulated replicas of capacity {capacity} at {seconds:g} s a page "
        f"({one:.2f} pages/s each); A5 PDF pages at most {MAX_IMAGE_SIDE} px, 50 a document"
    )
    print(
        "| engine | N x one replica, pages/s | pages | (a) router alone pages/s | (a)/ideal "
        "| (b) ocrd pages/s | (b)/ideal | daemon CPU ms a page |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for replicas in args.replicas:
        ideal = replicas * one
        rounds = math.ceil(args.engine_seconds / seconds)
        total = replicas * capacity * rounds
        documents = make_documents(folder / f"pdfs-{replicas}", total, 50)
        pages = asyncio.run(render_pages(documents, 2 * replicas * capacity))
        runs = [(f"{replicas} replica processes", simulated_section(replicas, capacity, seconds))]
        if replicas in args.in_process_for:
            section = simulated_section(0, replicas * capacity, seconds)
            runs.append((f"in-process, capacity {replicas * capacity}", section))
        for name, section in runs:
            a = router_alone(section, pages, total)
            b, daemon_cpu, _ = through_ocrd(section, documents, folder / f"ocrd-{name}")
            print(
                f"| {name} | {ideal:.2f} | {total} | {total / a:.2f} | {total / a / ideal:.3f} "
                f"| {total / b:.2f} | {total / b / ideal:.3f} | {daemon_cpu / total * 1000:.2f} |",
                flush=True,
            )


# --- kill ---------------------------------------------------------------------------------


def kill(args: argparse.Namespace, folder: Path) -> None:
    replicas, capacity, seconds = args.replicas[0], args.capacity, args.seconds_per_page
    total = replicas * capacity * math.ceil(args.engine_seconds / seconds)
    documents = make_documents(folder / "pdfs", total, 50)
    section = simulated_section(replicas, capacity, seconds)
    daemon = DaemonRun(folder / "ocrd", section, inbox={"max_image_side": MAX_IMAGE_SIDE})
    try:
        daemon.wait_for("daemon.ready", timeout=600)
        started = time.monotonic()
        for path in documents:
            daemon.drop(path)
        daemon.wait_until(lambda: time.monotonic() - started > args.engine_seconds / 3, 600)
        victim = next(p for p in daemon.processes() if "--replica 2" in " ".join(p.cmdline()))
        killed_at = time.monotonic() - started
        os.kill(victim.pid, signal.SIGKILL)
        finished = daemon.wait_for("document.finished", count=len(documents), timeout=7200)
        end = max(e.at for e in finished) - started
    finally:
        daemon.stop()
    outcomes = [e.fields.get("outcome") for e in finished]
    ready = daemon.find("engine.replica_ready")
    back = [e.at - started for e in ready if e.fields.get("replica") == "replica2"][-1]
    pages = [e.at - started for e in daemon.find("page.recognised")]
    print(
        f"{replicas} simulated replicas of capacity {capacity} at {seconds:g} s a page "
        f"({replicas * capacity / seconds:.2f} pages/s in all); {total} pages in "
        f"{len(documents)} documents; replica2 SIGKILLed at {killed_at:.1f} s, ready again "
        f"at {back:.1f} s; done {outcomes.count('done')}, failed {outcomes.count('failed')}; "
        f"{len(daemon.find('engine.page_in_crash'))} pages were in flight at the death; "
        f"{total / end:.2f} pages/s overall"
    )
    print("| seconds | pages/s |")
    print("| --- | --- |")
    width = 5.0
    for start in range(0, math.ceil(end / width)):
        low, high = start * width, (start + 1) * width
        count = sum(1 for t in pages if low <= t < high)
        mark = "  <- replica2 killed" if low <= killed_at < high else ""
        print(f"| {low:.0f}-{high:.0f} | {count / width:.2f}{mark} |")


# --- vllm ---------------------------------------------------------------------------------


def vllm_comparison(args: argparse.Namespace, folder: Path) -> None:
    from tiny_model import build_model, vllm_engine_section

    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    model = Path(args.model) if args.model else build_model(folder / "tiny-model")
    documents = make_documents(folder / "pdfs", args.pages, args.pages)
    pages = asyncio.run(render_pages(documents, args.pages))
    section = vllm_engine_section(model, max_tokens=args.max_tokens, max_num_seqs=8)
    n = len(pages)
    print(
        f"{n} pages (longer side {MAX_IMAGE_SIDE} px), max_tokens {args.max_tokens}, "
        f"max_num_seqs 8, one request a page on each side, no retries"
    )
    print(
        "| round | engine | seconds | pages/s | / LLM.generate of the round "
        "| daemon-process CPU ms a page | load average |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    engines: list[tuple[str, Any]] = [
        ("ocrd, one vllm serve replica (gpus [0])", [0]),
        ("ocrd, two vllm serve replicas, a core each (gpus [0, 1])", [0, 1]),
        ("ocrd, in-process AsyncLLM (gpus auto, no GPU)", "auto"),
    ]
    offline = "vLLM offline LLM.generate, both cores"
    for number in range(1, args.rounds + 1):  # odd rounds in this order, even ones reversed
        runs: list[tuple[str, Any]] = [(offline, None), *engines]
        if number % 2 == 0:
            runs.reverse()
        results: dict[str, tuple[float, float | None, float]] = {}
        for name, gpus in runs:
            if gpus is None:
                results[name] = (offline_generate(section, pages), None, os.getloadavg()[0])
                continue
            config = EngineConfig.model_validate(
                {**section, "vllm": {**section["vllm"], "gpus": gpus}}
            )
            seconds, process_cpu = ocrd_engine(config, pages)
            results[name] = (seconds, process_cpu, os.getloadavg()[0])
        baseline = results[offline][0]
        for name, (seconds, process_cpu, load) in results.items():
            process = "" if process_cpu is None else f"{process_cpu / n * 1000:.1f}"
            print(
                f"| {number} | {name} | {seconds:.2f} | {n / seconds:.3f} "
                f"| {baseline / seconds:.3f} | {process} | {load:.1f} |",
                flush=True,
            )


def offline_generate(section: dict[str, Any], pages: list[PageImage]) -> float:
    """In a child process (not a pool's: vLLM starts processes of its own), so that its
    memory is given back before ocrd's engines start."""
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(
        target=_offline_generate, args=(section, [p.image for p in pages], sender)
    )
    child.start()
    seconds = receiver.recv()
    child.join()
    return seconds


def _offline_generate(section: dict[str, Any], images: list[Any], answer: Any) -> None:
    from vllm import LLM

    from ocrd.engines.deepseek import PROMPTS
    from ocrd.engines.vllm import VllmEngine

    config = EngineConfig.model_validate(section)
    engine = VllmEngine(config.vllm, config.sampling)
    llm = LLM(**engine.engine_kwargs())
    prompt = PROMPTS[PromptMode.layout]
    requests = [{"prompt": prompt, "multi_modal_data": {"image": image}} for image in images]
    llm.generate(requests[:1], engine.sampling_params(), use_tqdm=False)  # warm up
    started = time.monotonic()
    outputs = llm.generate(requests, engine.sampling_params(), use_tqdm=False)
    seconds = time.monotonic() - started
    assert len(outputs) == len(images)
    answer.send(seconds)
    del llm


def ocrd_engine(config: EngineConfig, pages: list[PageImage]) -> tuple[float, float]:
    """Seconds for ocrd's engine to recognise `pages` given at once, and the CPU seconds this
    process (the daemon's, in ocrd) spent meanwhile: with the in-process engine that holds
    vLLM's tokenising and DeepSeek's image preprocessing."""
    from ocrd.engines import create_engine

    async def run() -> tuple[float, float]:
        engine = create_engine(config, "vllm")
        await engine.start()
        try:
            warm = pages[0]
            await asyncio.gather(  # warm up each replica, as the offline side is
                *(engine.recognise(warm, PromptMode.layout) for _ in engine.replicas)
            )
            started, cpu_started = time.monotonic(), cpu()
            texts = await asyncio.gather(
                *(engine.recognise(page, PromptMode.layout) for page in pages)
            )
            seconds, process_cpu = time.monotonic() - started, cpu() - cpu_started
            assert len(texts) == len(pages)
            return seconds, process_cpu
        finally:
            await engine.stop()

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["transport", "scaling", "kill", "vllm"])
    parser.add_argument("--pages", type=int, default=None)
    parser.add_argument("--replicas", default=None, help="comma-separated counts")
    parser.add_argument("--in-process-for", default="1,8", help="scaling: also in-process at")
    parser.add_argument("--engine-seconds", type=float, default=None)
    parser.add_argument("--capacity", type=int, default=4)
    parser.add_argument("--seconds-per-page", type=float, default=1.6)
    parser.add_argument("--model", help="vllm: model folder or hub name (default: tiny)")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=2, help="vllm: rounds, order reversed")
    args = parser.parse_args()
    defaults = {"transport": (40, "1"), "scaling": (0, "1,2,4,8"), "kill": (0, "4")}
    pages, replicas = defaults.get(args.what, (8, "1"))
    args.pages = args.pages or pages or 8
    args.replicas = [int(n) for n in (args.replicas or replicas).split(",")]
    args.in_process_for = [int(n) for n in args.in_process_for.split(",") if n]
    args.engine_seconds = args.engine_seconds or (90.0 if args.what == "kill" else 60.0)
    psutil.cpu_count()  # the harness needs psutil: fail early without it
    if args.what == "transport":
        transport(args)
        return
    with tempfile.TemporaryDirectory(prefix="ocrd-bench-") as tmp:
        {"scaling": scaling, "kill": kill, "vllm": vllm_comparison}[args.what](args, Path(tmp))


if __name__ == "__main__":
    main()
