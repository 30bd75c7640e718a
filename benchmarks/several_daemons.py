"""Several daemons on one inbox: two against one, and how long the documents of a daemon that
died wait before another takes them over.

    python benchmarks/several_daemons.py throughput [--documents 48] [--pages 20]
        [--capacity 8] [--seconds-per-page 1]
    python benchmarks/several_daemons.py takeover [--lease-seconds 90] [--repeat 3]

`throughput`: the same PDFs (A5, `--pages` each) dropped at once into the inbox of one
daemon, then into the inbox two daemons share (`OCRD_INSTANCE` a and b, one configuration
file), each with its own simulated engine standing in for its GPU (`--capacity` pages at
once, `--seconds-per-page`: 8 pages/s by default). From the first drop to the last
original settled in done/: pages/s together, and how the documents split between them.

`takeover`: two daemons share the inbox (default lease, or `--lease-seconds`); once one of
them has documents in flight it is SIGKILLed. From the kill: when the other logs
`instance.took_over` (the lease must be a whole lease old, then comes the next look, every
ninth of a lease), when it starts the first of the dead one's documents again, and when
the last of them is settled. Also the pages the dead one had recognised and the taker did
not recognise again (journaled in the claims it took over).

The simulated engine costs the daemons almost nothing, so both run on one machine here; on
hosts of their own each would also have its own CPUs for rendering.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import tempfile
import time
from pathlib import Path

from harness import DaemonRun, make_pdf, simulated_engine


def make_documents(folder: Path, count: int, pages: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    return [make_pdf(folder / f"doc{n:03d}.pdf", pages, label=f"Doc {n}") for n in range(count)]


def run_daemons(
    folder: Path, names: list[str], engine: dict, lease_seconds: float | None = None
) -> list[DaemonRun]:
    sections = {"instances": {"lease_seconds": lease_seconds}} if lease_seconds else None
    daemons = [
        DaemonRun(
            folder,
            engine,
            pipeline={"rescan_interval_seconds": 5},
            instance=name,
            sections=sections,
        )
        for name in names
    ]
    for daemon in daemons:
        daemon.wait_for("daemon.ready", timeout=600)
    if len(daemons) > 1:  # each has seen the others' leases (a renewal, a ninth of a lease)
        time.sleep((lease_seconds or 90) / 9 + 1)
    return daemons


def throughput(args: argparse.Namespace, root: Path) -> None:
    documents = make_documents(root / "pdfs", args.documents, args.pages)
    engine = simulated_engine(args.capacity, args.seconds_per_page)
    results = {}
    for names in (["a"], ["a", "b"]):
        folder = root / f"{len(names)}-daemons"
        daemons = run_daemons(folder, names, engine)
        try:
            started = time.monotonic()
            for path in documents:
                daemons[0].drop(path)

            _wait_for_all(daemons, len(documents))
            last = max(e.at for d in daemons for e in d.find("document.finished"))
            seconds = last - started
        finally:
            for daemon in daemons:
                daemon.stop()
        pages = len(documents) * args.pages
        split = {n: len(d.find("document.finished")) for n, d in zip(names, daemons, strict=True)}
        results[len(names)] = seconds
        print(
            json.dumps(
                {
                    "daemons": len(names),
                    "documents": len(documents),
                    "pages": pages,
                    "seconds": round(seconds, 1),
                    "pages_per_second": round(pages / seconds, 2),
                    "documents_by_daemon": split,
                    "engine_pages_per_second_each": args.capacity / args.seconds_per_page,
                }
            ),
            flush=True,
        )
    print(json.dumps({"speed_up": round(results[1] / results[2], 2)}))


def takeover_once(folder: Path, engine: dict, lease_seconds: float, pages: int) -> dict:
    documents = make_documents(folder / "pdfs", 8, pages)
    a, b = run_daemons(folder, ["a", "b"], engine, lease_seconds)
    try:
        grace = min(10.0, lease_seconds)
        time.sleep(grace + 1)  # past b's first seconds, in which it takes nothing over
        for path in documents:
            a.drop(path)
        a.wait_for("document.started", count=3, timeout=120)
        a.wait_for("page.recognised", count=3 * pages // 2, timeout=600)
        held = sorted(p.name for p in (folder / "data" / "work" / "a").iterdir())
        recognised_by_a = len(a.find("page.recognised"))
        a.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        a.process.wait()
        [took] = b.wait_for("instance.took_over", timeout=lease_seconds * 3 + 60)
        taken = set(took.fields["claims"])  # a claim's folder is named by its document's id

        def restarted() -> list:
            return [e for e in b.find("document.started") if e.fields["doc"] in taken]

        first = b.wait_until(restarted, timeout=600)[0]

        def settled() -> list | None:
            done = [e for e in b.find("document.finished") if e.fields["doc"] in taken]
            return done if len(done) == len(taken) else None

        finished = b.wait_until(settled, timeout=1200)
        b.wait_until(lambda: _done_by(b) == len(documents) - _done_by(a))
        resumed = sum(
            e.fields["resumed_pages"]
            for e in b.find("document.opened")
            if e.fields.get("doc") in taken
        )
        return {
            "lease_seconds": lease_seconds,
            "claims_held": len(held),
            "documents_taken_over": len(taken),
            "took_over_after": round(took.at - killed, 1),
            "lease_age_at_takeover": took.fields["lease_age_seconds"],
            "first_restarted_after": round(first.at - killed, 1),
            "all_settled_after": round(max(e.at for e in finished) - killed, 1),
            "pages_recognised_by_the_dead_one": recognised_by_a,
            "pages_resumed_from_its_journals": resumed,
        }
    finally:
        for daemon in (a, b):
            if daemon.process.poll() is None:
                daemon.stop()


def _finished(daemons: list[DaemonRun]) -> int:
    return sum(len(d.find("document.finished")) for d in daemons)


def _wait_for_all(daemons: list[DaemonRun], count: int) -> None:
    daemons[0].wait_until(lambda: _finished(daemons) >= count, timeout=7200)


def _done_by(daemon: DaemonRun) -> int:
    return len(daemon.find("document.finished"))


def takeover(args: argparse.Namespace, root: Path) -> None:
    engine = simulated_engine(args.capacity, args.seconds_per_page)
    runs = []
    for run in range(args.repeat):
        result = takeover_once(root / f"run{run}", engine, args.lease_seconds, args.pages)
        print(json.dumps(result), flush=True)
        runs.append(result)
    print(
        json.dumps(
            {
                "lease_seconds": args.lease_seconds,
                "took_over_after_median": statistics.median(r["took_over_after"] for r in runs),
                "took_over_after_max": max(r["took_over_after"] for r in runs),
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["throughput", "takeover"])
    parser.add_argument("--documents", type=int, default=48)
    parser.add_argument("--pages", type=int, default=20)
    parser.add_argument("--capacity", type=int, default=8)
    parser.add_argument("--seconds-per-page", type=float, default=1.0)
    parser.add_argument("--lease-seconds", type=float, default=90.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="ocrd-bench-"))
    try:
        (throughput if args.what == "throughput" else takeover)(args, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
