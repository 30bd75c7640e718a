"""How fast the status page, `/api/status`, `/metrics` and `/healthz` answer with a
backlog of files waiting, and how fast the daemon stops then.

    python benchmarks/status_backlog.py [--files 20000] [--requests 20]

One `ocrd run` (simulated engine) starts over an inbox already holding `--files` small
files, in one of two states:

- arriving: `settle_seconds: 3600`, so every file is a candidate still settling;
- queued: the files are ready, and the engine takes one document at a time and is slow
  (`max_documents_in_flight: 1`, 1,000 s a page), so all but one wait in the dispatcher's
  line;
- flowing: the files are no PDFs, so each fails the moment it is claimed, and claiming
  goes on as fast as it can (the default `max_documents_in_flight`).

Once `/api/status` counts every file (flowing: once 100 are claimed), each path is asked
`--requests` times, one request at a time (httpx, loopback); the median and the worst
seconds are printed. Then SIGTERM: the seconds from the signal to the exit, and the
documents claimed after `daemon.stopping` (`shutdown_grace_seconds` is 5).
"""

from __future__ import annotations

import argparse
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from harness import REPO, DaemonRun, make_pdf, simulated_engine

PATHS = ("/", "/api/status", "/metrics", "/healthz")
STATES = ("arriving", "queued", "flowing")


def fill(inbox: Path, files: int, junk: bool) -> None:
    """`files` copies of a one-page PDF (each waits for the engine), or of junk."""
    inbox.mkdir(parents=True)
    page = b"not a PDF" if junk else make_pdf(inbox.parent / "page.pdf", 1).read_bytes()
    for index in range(files):
        (inbox / f"f{index:05d}.pdf").write_bytes(page)


def timed(url: str, requests: int) -> dict[str, tuple[float, float]]:
    figures = {}
    with httpx.Client(timeout=60) as client:
        for path in PATHS:
            seconds = []
            for _ in range(requests):
                started = time.monotonic()
                answer = client.get(f"{url}{path}")
                seconds.append(time.monotonic() - started)
                assert answer.status_code in (200, 503), answer.text[:300]
            figures[path] = (statistics.median(seconds), max(seconds))
    return figures


def run(state: str, files: int, requests: int, tree: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="ocrd-backlog-") as folder:
        inbox: dict[str, Any] = {"settle_seconds": 3600 if state == "arriving" else 0.2}
        pipeline: dict[str, Any] = {"shutdown_grace_seconds": 5}
        if state != "flowing":
            pipeline["max_documents_in_flight"] = 1
        fill(Path(folder) / "data" / "inbox", files, junk=state == "flowing")
        daemon = DaemonRun(
            Path(folder),
            simulated_engine(1, 1000.0),
            inbox,
            pipeline,
            http={"listen": "127.0.0.1:0"},
            tree=tree,
        )
        [listening] = daemon.wait_for("http.listening", timeout=120)
        url = f"http://{listening.fields['address']}"
        daemon.wait_for("daemon.ready", timeout=300)

        def counted() -> bool:
            if state == "flowing":
                return len(daemon.find("document.claimed")) >= 100
            report = httpx.get(f"{url}/api/status", timeout=60).json()
            inbox_status = report["inboxes"][0]
            return inbox_status["waiting_count"] + report["documents_in_flight"] >= files

        daemon.wait_until(counted, 600)
        figures = timed(url, requests)
        stop_at = time.monotonic()
        daemon.process.send_signal(signal.SIGTERM)
        code = daemon.process.wait(timeout=600)
        exited = time.monotonic() - stop_at
        [stopping] = daemon.find("daemon.stopping")
        late = [e for e in daemon.find("document.claimed") if e.at > stopping.at]
        print(f"{state}, {files} files:")
        for path, (median, worst) in figures.items():
            print(f"  {path:12} median {median:.3f} s, worst {worst:.3f} s")
        print(f"  SIGTERM: exit {code} after {exited:.1f} s, {len(late)} claimed after stopping")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=20000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--state", choices=(*STATES, "all"), default="all")
    parser.add_argument("--tree", type=Path, default=REPO, help="another checkout to measure")
    arguments = parser.parse_args()
    for state in STATES if arguments.state == "all" else (arguments.state,):
        run(state, arguments.files, arguments.requests, arguments.tree)


if __name__ == "__main__":
    main()
