"""What handing a file over by HTTP costs against dropping it into the inbox.

    python benchmarks/upload_overhead.py [--rounds 20] [--large-mb 150]

One `ocrd run` (simulated engine at 0.05 s a page, settle time 0.2 s, an inbox with
`uploads: true`) takes a one-page PDF `--rounds` times each way, alternating, one at a time:

- dropped: copied into the inbox under a hidden name and renamed into place (how a careful
  copy appears); time to done is from the rename to its `document.finished` event;
- uploaded: `POST /api/documents` (multipart, httpx, on loopback), then the client waits
  with `GET /api/documents/{id}?wait=60`; time to done is from the start of the POST to
  its `document.finished` event, and to the answer saying `done` (what the client sees).

Then one `--large-mb` upload of random bytes streamed from a generator: its rate, and how
much the daemon's resident memory grew meanwhile (sampled every 20 ms), which shows that
the body goes to disk in pieces rather than into memory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
from harness import DaemonRun, make_pdf, simulated_engine

TOKEN = "benchmark-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def uploaded(daemon: DaemonRun, url: str, pdf: Path, round_: int) -> tuple[float, float, float]:
    """Seconds to the 202, to `document.finished`, and to the waiting client's answer."""
    started = time.monotonic()
    with pdf.open("rb") as handle:
        answer = httpx.post(
            f"{url}/api/documents",
            headers=AUTH,
            files={"file": (f"upload-{round_}.pdf", handle, "application/pdf")},
        )
    accepted = time.monotonic()
    assert answer.status_code == 202, answer.text
    body = answer.json()
    done = httpx.get(f"{body['status_url']}?wait=60", headers=AUTH, timeout=70).json()
    answered = time.monotonic()
    assert done["state"] == "done", done
    return accepted - started, daemon.finished_at(body["path"]) - started, answered - started


def large_upload(daemon: DaemonRun, url: str, megabytes: int) -> tuple[float, int]:
    """MB/s of one large upload, and the daemon's resident memory growth during it."""
    process = psutil.Process(daemon.process.pid)
    before = process.memory_info().rss
    peak = [before]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.02)

    block = os.urandom(1024 * 1024)

    def body() -> Iterator[bytes]:
        for _ in range(megabytes):
            yield block

    sampler = threading.Thread(target=sample)
    sampler.start()
    started = time.monotonic()
    answer = httpx.post(
        f"{url}/api/documents",
        params={"filename": "large.bin"},
        headers=AUTH,
        content=body(),
        timeout=600,
    )
    seconds = time.monotonic() - started
    sampling.set()
    sampler.join()
    assert answer.status_code == 202, answer.text
    return megabytes / seconds, peak[0] - before


def summary(label: str, values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return (
        f"| {label} | {statistics.median(values) * 1000:.0f} | {p90 * 1000:.0f} | "
        f"{statistics.mean(values) * 1000:.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--large-mb", type=int, default=150)
    args = parser.parse_args()
    os.environ["OCRD_HTTP_TOKEN"] = TOKEN
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        pdf = make_pdf(folder / "one-page.pdf", 1)
        daemon = DaemonRun(
            folder / "run",
            simulated_engine(16, 0.05),
            inbox={"uploads": True},
            http={"listen": "127.0.0.1:0", "max_upload_mb": args.large_mb + 10},
        )
        try:
            [listening] = daemon.wait_for("http.listening", timeout=120)
            url = f"http://{listening.fields['address']}"
            daemon.wait_for("daemon.ready", timeout=300)
            drops: list[float] = []
            posts: list[float] = []
            uploads: list[float] = []
            answers: list[float] = []
            for round_ in range(args.rounds):
                drops.append(daemon.drop_to_finish(pdf, f"drop-{round_}.pdf"))
                post, done, answer = uploaded(daemon, url, pdf, round_)
                posts.append(post)
                uploads.append(done)
                answers.append(answer)
            rate, growth = large_upload(daemon, url, args.large_mb)
        finally:
            daemon.stop()
    print(f"one-page PDF, {args.rounds} rounds each, one at a time (milliseconds)")
    print("| way in | median | p90 | mean |")
    print("| --- | --- | --- | --- |")
    print(summary("dropped: rename to `document.finished`", drops))
    print(summary("uploaded: POST to its 202", posts))
    print(summary("uploaded: POST to `document.finished`", uploads))
    print(summary("uploaded: POST to the `?wait=` answer `done`", answers))
    overhead = [u - d for u, d in zip(uploads, drops, strict=True)]
    median = statistics.median(overhead) * 1000
    print(f"overhead of the upload route to done, median: {median:.0f} ms")
    print(
        f"large upload: {args.large_mb} MiB at {rate:.0f} MiB/s; "
        f"daemon resident memory grew {growth / 2**20:.1f} MiB meanwhile"
    )


if __name__ == "__main__":
    main()
