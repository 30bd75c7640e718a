"""Pick-up latency, and memory for long queues and long documents.

    python benchmarks/pickup_memory.py [--files 30] [--queued 10000] [--tree DIR]

Pick-up: single-page PDFs appear in the inbox one at a time, 1.5 s apart (each whole, by a
rename, as a finished copy appears); the pick-up latency of each is the time from its
appearance to its `document.claimed` event, minus the settle time (1 s). Measured with
inotify and with polling (`poll_interval_seconds` 1).

Memory: peak resident memory of the daemon and all its child processes (render workers),
sampled every 0.1 s, (1) with 10 and with `--queued` files waiting in the inbox behind an
engine that is busy (the simulated engine at 600 s a page, so nothing finishes), taken once
the status says every file is waiting; (2) while a 10-page and while a 1000-page document
go through the simulated engine at a GPU's pace (32 at once, 2 s a page).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness import REPO, DaemonRun, make_pdf, simulated_engine

SETTLE = 1.0
MB = 1024 * 1024


def pickup(folder: Path, source: Path, files: int, polling: bool, tree: Path) -> list[float]:
    inbox = {"settle_seconds": SETTLE, "polling": polling, "poll_interval_seconds": 1.0}
    daemon = DaemonRun(folder, simulated_engine(32, 0.05), inbox=inbox, tree=tree)
    try:
        daemon.wait_for("daemon.ready", timeout=300)
        time.sleep(1.0)
        latencies = []
        for index in range(files):
            name = f"scan{index:03d}.pdf"
            appeared = daemon.drop(source, name)
            [claimed] = daemon.wait_until(lambda n=name: daemon.find("document.claimed", path=n))
            latencies.append(claimed.at - appeared - SETTLE)
            time.sleep(1.5)
        return latencies
    finally:
        daemon.stop()


def queued_peak(folder: Path, source: Path, files: int, tree: Path) -> int:
    """Peak RSS while `files` single-page PDFs wait behind a busy engine."""
    daemon = DaemonRun(
        folder,
        simulated_engine(16, 600.0),
        pipeline={"shutdown_grace_seconds": 0, "status_interval_seconds": 0.5},
        tree=tree,
        log_level="debug",
    )
    try:
        daemon.wait_for("daemon.ready", timeout=300)
        daemon.sample_memory()
        for index in range(files):
            daemon.drop(source, f"queued{index:05d}.pdf")
        in_flight = 0

        def all_seen() -> bool:
            nonlocal in_flight
            status = daemon.find("daemon.status")
            if not status:
                return False
            last = status[-1].fields
            in_flight = last["documents_in_flight"]
            return last["waiting"] + in_flight >= files

        daemon.wait_until(all_seen, timeout=1200)
        time.sleep(5.0)  # the queue as it stands, for a while
        return daemon.peak_rss
    finally:
        daemon.stop()


def document_peak(folder: Path, document: Path, tree: Path) -> int:
    """Peak RSS while one document goes through the engine at a GPU's pace."""
    daemon = DaemonRun(folder, simulated_engine(32, 2.0), tree=tree)
    try:
        daemon.wait_for("daemon.ready", timeout=300)
        daemon.sample_memory()
        daemon.drop(document)
        daemon.wait_for("document.finished", timeout=3600)
        return daemon.peak_rss
    finally:
        daemon.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=30, help="files for the pick-up figure")
    parser.add_argument("--queued", type=int, default=10000)
    parser.add_argument("--tree", type=Path, default=REPO, help="checkout whose ocrd runs")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ocrd-pickup-") as tmp:
        folder = Path(tmp)
        scan = make_pdf(folder / "scan.pdf", 1, label="Scan")
        print(f"tree {args.tree}")
        for polling in (False, True):
            latencies = pickup(folder / f"pickup-{polling}", scan, args.files, polling, args.tree)
            print(
                f"pick-up beyond the {SETTLE:g} s settle time, "
                f"{'polling every 1 s' if polling else 'inotify'}: "
                f"median {statistics.median(latencies):.2f} s, max {max(latencies):.2f} s "
                f"({len(latencies)} files)"
            )
        small = queued_peak(folder / "queued-small", scan, 10, args.tree)
        large = queued_peak(folder / "queued-large", scan, args.queued, args.tree)
        print(
            f"peak RSS, daemon and render workers: 10 queued files {small / MB:.0f} MB, "
            f"{args.queued} queued files {large / MB:.0f} MB "
            f"(growth {(large - small) / MB:.0f} MB)"
        )
        short = document_peak(folder / "doc-10", make_pdf(folder / "d10.pdf", 10), args.tree)
        long = document_peak(folder / "doc-1000", make_pdf(folder / "d1000.pdf", 1000), args.tree)
        print(
            f"peak RSS, daemon and render workers: a 10-page document {short / MB:.0f} MB, "
            f"a 1000-page document {long / MB:.0f} MB (growth {(long - short) / MB:.0f} MB)"
        )


if __name__ == "__main__":
    main()
