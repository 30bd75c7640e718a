"""Where ocrd's own CPU goes: `ocrd run` under load, CPU time per page per process, py-spy.

    python benchmarks/profile_daemon.py --load stress [--tree DIR] [--top 15] [--no-profile]
    python benchmarks/profile_daemon.py --load real [--tree DIR]
    python benchmarks/profile_daemon.py --load stress --no-profile --lag [--tree DIR]
    python benchmarks/profile_daemon.py --load real --no-profile [--pin] [--copies 4] [--tree DIR]
                                        [--folder DIR]

`--load stress`: 256 A5 pages in 16 PDFs, simulated engine at 0.5 s a page and 128 at once,
256 pages and 64 documents in flight (set explicitly, so older checkouts run the same).
`--load real`: every PDF of ../shared/corpus/real and the olmOCR-Bench sample, at 144 DPI
(with `--copies N`, each N times: a longer run).

The engine is the simulated one (a GPU's stand-in, costing the daemon little beyond what
ocrd spends to hand it a page). Reported: pages per second from the first file dropped to
the last document settled; CPU milliseconds per page of the daemon's main process and of
its render workers (from /proc, just before the daemon stops); with `--baseline`, the CPU a
page of bare PyMuPDF `get_pixmap` in this process, and of ocrd's render pool alone rendering
the same pages and handing them over (the work the daemon cannot avoid), for comparison; unless
`--no-profile`, py-spy's top functions of the main process (attached once the daemon is
ready, with `--subprocesses`) by own and by total samples. `--lag` runs the daemon with the
probe of `benchmarks/lagprobe/` and reports how late its event loop answered while the
load ran (worst, 99th percentile): blocking work on the loop shows there. Take lag figures
with `--no-profile`, since py-spy pauses the process to sample it. `--pin` keeps the main
process (all its threads) on the first CPU and its render workers on the others once the
daemon is ready: the workers' rendering then never shares a core with the process measured
(on the shared 2-core machine it did not make the figure spread less). `--folder` makes the
run's folders inside the one given: on ext4 a new file's CPU depends on where its folder
lies (0.03 to 0.7 ms on the CI machine kind), and a new temporary folder of the system's may
lie anywhere, so runs to compare should share one. `--tree` runs another
checkout's `ocrd` (a worktree of an older commit with its own `.venv` holding an editable
install of it), so the same script measures before and after a change.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from harness import CORPUS, REPO, DaemonRun, make_pdf, simulated_engine


def stress_load(folder: Path) -> list[Path]:
    return [make_pdf(folder / f"doc{i}.pdf", 16, label=f"Doc {i} page") for i in range(16)]


def real_load(folder: Path, copies: int = 1) -> list[Path]:
    """The real PDFs, each `copies` times under names of its own (a longer run)."""
    sources = sorted((CORPUS / "real").glob("*.pdf")) + sorted(
        (CORPUS / "olmocr-bench" / "pdfs").glob("*.pdf")
    )
    paths = []
    for copy in range(1, copies + 1):
        for source in sources:
            name = source.name if copy == 1 else f"{source.stem}-copy{copy}{source.suffix}"
            shutil.copy(source, folder / name)
            paths.append(folder / name)
    return paths


def count_pages(paths: list[Path]) -> int:
    import pymupdf

    total = 0
    for path in paths:
        with pymupdf.open(path) as doc:
            total += doc.page_count
    return total


def bare_render_ms(paths: list[Path], dpi: int = 144, max_side: int = 2048) -> float:
    """CPU ms a page for PyMuPDF alone to render the same pages the daemon renders."""
    import pymupdf

    started = time.process_time()
    pages = 0
    for path in paths:
        with pymupdf.open(path) as doc:
            if doc.needs_pass:
                continue
            for page in doc:
                zoom = min(dpi / 72, max_side / max(page.rect.width, page.rect.height))
                page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), alpha=False)
                pages += 1
    return 1000 * (time.process_time() - started) / pages


def render_handoff_ms(paths: list[Path]) -> float:
    """CPU ms a page, this process and its render workers together, for ocrd's render pool
    alone to render the same pages (144 DPI, at most 2048 px) and hand them over."""
    import asyncio

    import psutil

    from ocrd.config import RenderSettings
    from ocrd.render import RenderLimits, RenderPool, SourceFile, detect_format

    def cpu() -> float:
        me = psutil.Process()
        times = [me.cpu_times(), *(c.cpu_times() for c in me.children(recursive=True))]
        return sum(t.user + t.system for t in times)

    async def render_all() -> tuple[int, float]:
        pool = RenderPool(2, RenderLimits())
        await pool.warm_up()
        before = cpu()
        pages = 0
        try:
            for path in paths:
                document = SourceFile(path, detect_format(path), RenderSettings())
                try:
                    count = await pool.open(document)
                except Exception:
                    continue  # the daemon fails such a file; no pages to compare
                await asyncio.gather(*(pool.render(document, n) for n in range(1, count + 1)))
                pages += count
            return pages, cpu() - before
        finally:
            pool.shutdown()

    pages, seconds = asyncio.run(render_all())
    return 1000 * seconds / pages


def summarise_profile(raw: Path, main_pid: int, top: int) -> list[str]:
    """Top functions of the main process by own samples and by total samples."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        frames = stack.split(";")
        if not frames or not frames[0].startswith(f"process {main_pid}:"):
            continue
        if any(f.startswith("process ") for f in frames[1:]):
            continue  # a child's stack, nested under the main process
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        count = int(count_text)
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            if "ocrd/" in frame:  # the daemon's own functions, not the frames around them
                total[frame] += count
    if not samples:
        return ["main process: no samples"]
    lines = [f"main process: {samples} samples on the CPU", "own:"]
    lines += [f"  {100 * n / samples:5.1f} %  {name}" for name, n in own.most_common(top)]
    lines.append("total, ocrd's own functions (including what they call):")
    lines += [f"  {100 * n / samples:5.1f} %  {name}" for name, n in total.most_common(top)]
    return lines


def start_profiler(pid: int, rate: int, output: Path, gil: bool = False) -> subprocess.Popen[bytes]:
    py_spy = Path(sys.executable).parent / "py-spy"
    command = [str(py_spy), "record", "--pid", str(pid), "--subprocesses"]
    command += ["--format", "raw", "--rate", str(rate), "-o", str(output)]
    if gil:  # only the thread holding the GIL: where Python itself spends the CPU
        command.append("--gil")
    profiler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the load starts
    return profiler


def pin(daemon: DaemonRun) -> None:
    """The main process (all its threads) on the first CPU, its children on the others."""
    main_process, *children = daemon.processes()
    cpus = main_process.cpu_affinity()
    if len(cpus) < 2:
        sys.exit("--pin needs at least two CPUs")
    for thread in main_process.threads():
        psutil.Process(thread.id).cpu_affinity(cpus[:1])
    for child in children:
        child.cpu_affinity(cpus[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", choices=["stress", "real"], default="stress")
    parser.add_argument("--tree", type=Path, default=REPO, help="checkout whose ocrd runs")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--lag", action="store_true", help="measure the event loop's lag")
    parser.add_argument("--baseline", action="store_true", help="also time bare get_pixmap")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--gil", action="store_true", help="py-spy: the GIL's holder only")
    parser.add_argument(
        "--pin", action="store_true", help="main process on CPU 0, render workers on the rest"
    )
    parser.add_argument(
        "--copies", type=int, default=1, help="--load real: every PDF this many times"
    )
    parser.add_argument(
        "--folder",
        type=Path,
        default=None,
        help="make the run's folders in this folder (default: the system's temporary one)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=0,
        help="the simulated engine as this many replica processes sharing the capacity of "
        "128 (0: in the daemon's process); their CPU counts with the workers'",
    )
    args = parser.parse_args()
    engine = simulated_engine(capacity=128 // max(1, args.replicas), seconds_per_page=0.5)
    if args.replicas:
        engine["simulated"]["replicas"] = args.replicas

    with tempfile.TemporaryDirectory(prefix="ocrd-profile-", dir=args.folder) as tmp:
        folder = Path(tmp)
        load = folder / "load"
        load.mkdir()
        paths = stress_load(load) if args.load == "stress" else real_load(load, args.copies)
        pages = count_pages(paths)
        daemon = DaemonRun(
            folder / "ocrd",
            engine,
            pipeline={"max_pages_in_flight": 256, "max_documents_in_flight": 64},
            tree=args.tree,
            lag_probe=args.lag,
        )
        daemon.wait_for("daemon.ready", timeout=300)
        if args.pin:
            pin(daemon)
        raw = folder / "profile.txt"
        profiler = (
            None
            if args.no_profile
            else start_profiler(daemon.process.pid, args.rate, raw, args.gil)
        )
        main_before, workers_before = daemon.cpu_seconds()
        started = time.monotonic()
        for path in paths:
            daemon.drop(path)
        daemon.wait_for("document.finished", count=len(paths), timeout=1800)
        finished = time.monotonic()
        main_after, workers_after = daemon.cpu_seconds()
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)
            profiler.wait(timeout=120)
        daemon.stop()

        seconds = finished - started
        pinned = ", pinned" if args.pin else ""
        print(f"tree {args.tree}: load {args.load}{pinned}, {len(paths)} documents, {pages} pages")
        print(f"{seconds:.2f} s, {pages / seconds:.1f} pages/s")
        main_ms = 1000 * (main_after - main_before) / pages
        workers_ms = 1000 * (workers_after - workers_before) / pages
        print(f"main process CPU: {main_ms:.1f} ms a page")
        print(f"render workers CPU: {workers_ms:.1f} ms a page")
        if args.baseline:
            print(f"bare get_pixmap (144 DPI, this process): {bare_render_ms(paths):.1f} ms a page")
            handoff = render_handoff_ms(paths)
            print(f"render and hand-off through ocrd's render pool: {handoff:.1f} ms a page")
            print(f"main process / (render and hand-off): {main_ms / handoff:.2f}")
        if args.lag:
            lag = daemon.lag(started, finished)
            print(
                "event loop lag while loaded: "
                + (f"worst {1000 * lag[0]:.1f} ms, p99 {1000 * lag[1]:.1f} ms" if lag else "none")
            )
        if profiler is not None and raw.exists():
            print("\n".join(summarise_profile(raw, daemon.process.pid, args.top)))


if __name__ == "__main__":
    main()
