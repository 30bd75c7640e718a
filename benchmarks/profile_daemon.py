"""Where ocrd's own CPU goes: `ocrd run` under py-spy, with CPU time per page per process.

    python benchmarks/profile_daemon.py --load stress [--tree DIR] [--top 15] [--no-profile]
    python benchmarks/profile_daemon.py --load real [--tree DIR]

`--load stress`: 256 A5 pages in 16 PDFs, simulated engine at 0.5 s a page and 128 at once.
`--load real`: every PDF of ../shared/corpus/real and the olmOCR-Bench sample, at 144 DPI.

The daemon's engine is the simulated one (a GPU's stand-in: it costs no CPU of its own
beyond what ocrd spends to hand it a page). Reported: pages per second from the first file
dropped to the last document settled; CPU milliseconds per page of the daemon's main
process and of its render workers (from /proc, taken just before the daemon stops); and,
unless --no-profile, py-spy's top functions of the main process by own and total samples.
`--tree` runs another checkout's `ocrd` (e.g. a worktree of an older commit), so the same
script measures before and after a change.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"
sys.path.insert(0, str(REPO / "tests"))

from helpers import make_pdf  # noqa: E402


def stress_load(folder: Path) -> list[Path]:
    return [make_pdf(folder / f"doc{i}.pdf", 16, label=f"Doc {i} page") for i in range(16)]


def real_load(folder: Path) -> list[Path]:
    sources = sorted((CORPUS / "real").glob("*.pdf")) + sorted(
        (CORPUS / "olmocr-bench" / "pdfs").glob("*.pdf")
    )
    paths = []
    for source in sources:
        target = folder / source.name
        shutil.copy(source, target)
        paths.append(target)
    return paths


def count_pages(paths: list[Path]) -> int:
    import pymupdf

    total = 0
    for path in paths:
        with pymupdf.open(path) as doc:
            total += doc.page_count
    return total


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def write_config(folder: Path, load: str) -> Path:
    (folder / "data" / "inbox").mkdir(parents=True)
    engine = {"kind": "simulated", "simulated": {"seconds_per_page": 0.5, "capacity": 128}}
    config = {
        "inboxes": [{"path": "data/inbox", "settle_seconds": 0.2}],
        "engine": engine,
        "pipeline": {"max_pages_in_flight": 256, "max_documents_in_flight": 64},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def summarise_profile(raw: Path, main_pid: int, top: int) -> list[str]:
    """Top functions of the main process by own samples and by total samples."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        # Children nest under their parent: "process A;process B;frame;..." is B's stack.
        processes = [f for f in stack.split(";") if f.startswith("process ")]
        if [p.split(":")[0] for p in processes] != [f"process {main_pid}"]:
            continue
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        count = int(count_text)
        samples += count
        own[frames[-1]] += count
        for frame in set(frames):
            if "ocrd/" in frame:  # the daemon's own functions, not the frames around them
                total[frame] += count
    lines = [f"main process: {samples} samples on the CPU", "own:"]
    lines += [f"  {100 * n / samples:5.1f} %  {name}" for name, n in own.most_common(top)]
    lines.append("total, ocrd's own functions (including what they call):")
    lines += [f"  {100 * n / samples:5.1f} %  {name}" for name, n in total.most_common(top)]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--load", choices=["stress", "real"], default="stress")
    parser.add_argument("--tree", type=Path, default=REPO, help="checkout whose ocrd runs")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ocrd-profile-") as tmp:
        folder = Path(tmp)
        load = folder / "load"
        load.mkdir()
        paths = stress_load(load) if args.load == "stress" else real_load(load)
        pages = count_pages(paths)
        config = write_config(folder, args.load)
        raw = folder / "profile.txt"
        command = [sys.executable, "-m", "ocrd", "run", "--config", str(config)]
        command += ["--log-format", "json"]
        if not args.no_profile:
            command = [
                str(Path(sys.executable).parent / "py-spy"), "record", "--subprocesses",
                "--format", "raw", "--rate", str(args.rate), "-o", str(raw), "--",
                *command,
            ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(args.tree.resolve())}
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        assert process.stdout is not None
        daemon: psutil.Process | None = None
        started = finished_at = 0.0
        finished = 0
        main_cpu = workers_cpu = 0.0
        for line in process.stdout:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            if event.get("event") == "daemon.ready":
                launcher = psutil.Process(process.pid)
                daemon = launcher if args.no_profile else launcher.children()[0]
                main_before = cpu_seconds(daemon)
                workers_before = sum(cpu_seconds(c) for c in daemon.children(recursive=True))
                started = time.monotonic()
                inbox = folder / "data" / "inbox"
                for path in paths:
                    path.rename(inbox / path.name)
            elif event.get("event") == "document.finished":
                finished += 1
                if finished == len(paths):
                    finished_at = time.monotonic()
                    assert daemon is not None
                    main_cpu = cpu_seconds(daemon) - main_before
                    children = daemon.children(recursive=True)
                    workers_cpu = sum(cpu_seconds(c) for c in children) - workers_before
                    daemon.send_signal(signal.SIGTERM)
        process.wait(timeout=120)
        seconds = finished_at - started
        print(f"tree {args.tree}: load {args.load}, {len(paths)} documents, {pages} pages")
        print(f"{seconds:.2f} s, {pages / seconds:.1f} pages/s")
        print(f"main process CPU: {1000 * main_cpu / pages:.1f} ms a page")
        print(f"render workers CPU: {1000 * workers_cpu / pages:.1f} ms a page")
        if not args.no_profile and daemon is not None:
            print("\n".join(summarise_profile(raw, daemon.pid, args.top)))


if __name__ == "__main__":
    main()
