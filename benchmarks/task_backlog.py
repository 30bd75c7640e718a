"""How fast docling-serve's poll route, `/healthz` and another inbox answer with a backlog
of pending tasks and clients long-polling them.

    python benchmarks/task_backlog.py [--tasks 1000] [--pollers 30] [--requests 20]
                                      [--tree /work/main]

One `ocrd run` (simulated engine) with two inboxes: one taking uploads, whose files never
settle (`settle_seconds: 3600`, so every task stays pending, its position counted), and
another. `--tasks` small PDFs are submitted (`/v1/convert/file/async`, 8 at a time); then
`--pollers` clients poll tasks with `?wait=60` (each poll waits, then polls again), and
meanwhile one client asks `/v1/status/poll/{id}` (no wait) and `/healthz` `--requests`
times each, one at a time, and a file dropped into the other inbox is timed from its
arrival to its document finished. Median and worst seconds are printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from harness import REPO, DaemonRun, make_pdf, simulated_engine

TOKEN = "benchmark-token"
KEY = {"X-Api-Key": TOKEN}


def submit(url: str, pdf: bytes, count: int) -> list[str]:
    def one(index: int) -> str:
        answer = httpx.post(
            f"{url}/v1/convert/file/async",
            headers=KEY,
            files={"files": (f"t{index:05d}.pdf", pdf)},
            timeout=120,
        )
        answer.raise_for_status()
        return str(answer.json()["task_id"])

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(count)))


def poll_forever(url: str, task_id: str, stop: threading.Event) -> None:
    with httpx.Client(timeout=120) as client, contextlib.suppress(httpx.HTTPError):
        while not stop.is_set():  # (until the daemon stops)
            client.get(f"{url}/v1/status/poll/{task_id}", params={"wait": 60})


def timed(url: str, path: str, requests: int) -> tuple[float, float]:
    seconds = []
    with httpx.Client(timeout=120) as client:
        for _ in range(requests):
            started = time.monotonic()
            answer = client.get(f"{url}{path}")
            seconds.append(time.monotonic() - started)
            assert answer.status_code == 200, answer.text[:300]
    return statistics.median(seconds), max(seconds)


def run(tasks: int, pollers: int, requests: int, tree: Path) -> None:
    os.environ["OCRD_HTTP_TOKEN"] = TOKEN
    with tempfile.TemporaryDirectory(prefix="ocrd-tasks-") as name:
        folder = Path(name)
        (folder / "data" / "other").mkdir(parents=True)
        inboxes = [
            {"path": "data/inbox", "uploads": True, "settle_seconds": 3600},
            {"path": "data/other", "settle_seconds": 0.2, "work": "data/work-other"},
        ]
        daemon = DaemonRun(
            folder,
            simulated_engine(1, 0.1),
            http={"listen": "127.0.0.1:0"},
            sections={"inboxes": inboxes},
            tree=tree,
        )
        [listening] = daemon.wait_for("http.listening", timeout=120)
        url = f"http://{listening.fields['address']}"
        daemon.wait_for("daemon.ready", timeout=300)
        pdf = make_pdf(folder / "page.pdf", 1)
        started = time.monotonic()
        ids = submit(url, pdf.read_bytes(), tasks)
        submitted = time.monotonic() - started
        stop = threading.Event()
        threads = [
            threading.Thread(target=poll_forever, args=(url, ids[i % len(ids)], stop), daemon=True)
            for i in range(pollers)
        ]
        for thread in threads:
            thread.start()
        time.sleep(2)  # the pollers are waiting
        poll = timed(url, f"/v1/status/poll/{ids[-1]}", requests)
        health = timed(url, "/healthz", requests)
        alone = daemon.inbox.parent / "other" / "alone.pdf"
        appeared = time.monotonic()
        make_pdf(folder / "alone.pdf", 1).rename(alone)
        [finished] = daemon.wait_until(lambda: daemon.find("document.finished", path="alone.pdf"))
        other = finished.at - appeared
        stop.set()
        daemon.stop()
        print(f"{tree}: {tasks} pending tasks (submitted in {submitted:.1f} s), {pollers} pollers:")
        print(f"  poll     median {poll[0]:.3f} s, worst {poll[1]:.3f} s")
        print(f"  /healthz median {health[0]:.3f} s, worst {health[1]:.3f} s")
        print(f"  another inbox's file: {other:.1f} s from arrival to finished")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--pollers", type=int, default=30)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--tree", type=Path, default=REPO, help="another checkout to measure")
    arguments = parser.parse_args()
    run(arguments.tasks, arguments.pollers, arguments.requests, arguments.tree)


if __name__ == "__main__":
    main()
