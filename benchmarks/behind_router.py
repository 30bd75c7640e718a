"""Fleets behind vllm-router, side by side: the cases of issue 30's table, each run the four
ways an operator could put ocrd in front of a fleet.

    python benchmarks/behind_router.py [--cases kill,throughput,garble,restart,outage,first-dead]
        [--ways listed,through,checked,registry] [--runs 3] [--out results.json]

Ways:
- listed:   the workers in `openai.base_urls` (no router);
- through:  the router's one URL in `openai.base_urls`, as a new user would do it today;
- checked:  way (a) of the issue, as a prototype: through the router, and beside it a checker
            that learns the workers from the router's worker API (GET /workers), has each
            read ocrd's test page directly, and takes a garbling one out of rotation
            (DELETE /workers/{url}) and back once it reads (POST /workers), every second;
- registry: way (b), what ocrd does: `openai.router_url`, the router as the registry and ocrd
            routing pages to each worker itself.

Workers are ocrd's simulated servers on loopback ports (tests/routed_fleet.py: real
processes that read nothing; they answer the test page by its request id, or garble when
told); the router is the real `vllm-router` (the test extra's). Every run starts its own
workers, router and `ocrd run` (benchmarks/harness.py) and drops A5 PDFs into the inbox.
Reported per run: seconds from the first drop until every document finished, documents
done and failed, garbage pages in done/ (the garbling text in the Markdown), pages answered
by the workers (every answer counted, also one whose page was sent again).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
from harness import DaemonRun, make_pdf
from routed_fleet import GARBLE, VllmRouter, Worker

from ocrd.engines import selfcheck
from ocrd.engines.media import png_data_url

SECONDS_PER_PAGE = 0.5
CAPACITY = 4  # pages each worker works on at once (and ocrd sends each)
GIVE_UP_SECONDS = 240.0
WAYS = ("listed", "through", "checked", "registry")
GARBLE_MARK = GARBLE.strip()[:12]  # a garbled page's text holds it GARBLE.count(...) times


class RotationChecker:
    """Way (a)'s checker: every `interval` s, each worker the router lists (and each it took
    out) reads ocrd's test page, sent to the worker directly; a garbling one is removed from
    the router's rotation, and registered again once it reads."""

    def __init__(self, router: str, interval: float = 1.0) -> None:
        self.router = router
        self.interval = interval
        self.taken_out: set[str] = set()
        self.page = png_data_url(selfcheck.check_page())
        self._running = True
        threading.Thread(target=self._run, daemon=True).start()

    def reads(self, worker: str) -> bool | None:
        """Whether the worker reads the test page; None if it does not answer."""
        body = {
            "model": "simulated",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": self.page}},
                        {"type": "text", "text": "<|grounding|>Convert the document to markdown."},
                    ],
                }
            ],
            "max_tokens": selfcheck.MAX_TOKENS,
        }
        try:
            answer = httpx.post(
                f"{worker}/v1/chat/completions",
                json=body,
                headers={"X-Request-Id": "ocrd-self-check-checker"},
                timeout=10,
            )
            text = answer.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, KeyError, ValueError):
            return None
        return selfcheck.score(text).passed

    def sweep(self) -> None:
        listed = [
            w["url"] for w in httpx.get(f"{self.router}/workers", timeout=10).json()["workers"]
        ]
        for worker in sorted(set(listed) | self.taken_out):
            reads = self.reads(worker)
            if reads is False and worker in listed:
                httpx.delete(f"{self.router}/workers/{quote(worker, safe='')}", timeout=30)
                self.taken_out.add(worker)
            elif reads and worker in self.taken_out:
                httpx.post(f"{self.router}/workers", json={"url": worker}, timeout=60)
                self.taken_out.discard(worker)

    def _run(self) -> None:
        while self._running:
            with contextlib.suppress(httpx.HTTPError):  # the router is down: again later
                self.sweep()
            time.sleep(self.interval)

    def stop(self) -> None:
        self._running = False


def engine_section(way: str, workers: list[Worker], router: VllmRouter) -> dict[str, Any]:
    openai: dict[str, Any] = {"model": "simulated", "max_concurrency": CAPACITY}
    if way == "listed":
        openai["base_urls"] = [f"{w.url}/v1" for w in workers]
    elif way in ("through", "checked"):  # one server to ocrd: let it fill every worker
        openai["base_urls"] = [f"{router.url}/v1"]
        openai["max_concurrency"] = CAPACITY * len(workers)
    else:
        openai["router_url"] = router.url
        openai["router_poll_seconds"] = 1.0
    return {"kind": "openai", "openai": openai}


class Run:
    """One run of one case one way: workers, router, the checker where (a), ocrd."""

    def __init__(
        self,
        folder: Path,
        way: str,
        garbling: int | None = None,
        seconds_per_page: float = SECONDS_PER_PAGE,
    ) -> None:
        self.folder = folder
        self.way = way
        self.workers = [
            Worker(folder, n, seconds_per_page, CAPACITY, garble=n == garbling) for n in (1, 2, 3)
        ]
        for worker in self.workers:
            worker.start()
        self.router = VllmRouter(folder, [worker.url for worker in self.workers])
        self.router.start()
        self.checker: RotationChecker | None = None
        if way == "checked":
            self.checker = RotationChecker(self.router.url)
            self.checker.sweep()  # before ocrd starts, as an operator's checker would be
        self.daemon: DaemonRun | None = None

    def start_ocrd(self) -> DaemonRun:
        engine = engine_section(self.way, self.workers, self.router)
        self.daemon = DaemonRun(self.folder, engine, inbox={"max_image_side": 768})
        self.daemon.wait_for("daemon.ready", timeout=120)
        return self.daemon

    def drop(self, documents: int, pages: int) -> float:
        assert self.daemon is not None
        sources = self.folder / "sources"
        sources.mkdir(exist_ok=True)
        first = 0.0
        for index in range(documents):
            source = make_pdf(sources / f"doc{index}.pdf", pages, label=f"Doc {index} page")
            at = self.daemon.drop(source)
            first = first or at
        return first

    def finish(self, documents: int, started: float) -> dict[str, Any]:
        assert self.daemon is not None
        try:
            self.daemon.wait_for("document.finished", count=documents, timeout=GIVE_UP_SECONDS)
            seconds: float | None = time.monotonic() - started
        except TimeoutError:
            seconds = None
        finished = [e.fields for e in self.daemon.find("document.finished")]
        outcomes = [fields["outcome"] for fields in finished]
        markdown = "".join(p.read_text() for p in (self.folder / "data" / "outbox").rglob("*.md"))
        return {
            "way": self.way,
            "seconds": None if seconds is None else round(seconds, 1),
            "done": outcomes.count("done"),
            "failed": outcomes.count("failed"),
            "garbage_pages": markdown.count(GARBLE_MARK) // GARBLE.count(GARBLE_MARK),
            "answers": sum(len(w.answered_pages()) for w in self.workers),
            "failures": [f.get("reason") for f in finished if f["outcome"] == "failed"],
        }

    def close(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
        if self.checker is not None:
            self.checker.stop()
        self.router.stop()
        for worker in self.workers:
            worker.stop()


def at(seconds: float, action: Callable[[], None]) -> None:
    """Do `action` in `seconds`, beside the run."""
    threading.Timer(seconds, action).start()


def kill(folder: Path, way: str) -> dict[str, Any]:
    """20 documents x 10 pages; a worker SIGKILLed at 4 s, back 6 s later."""
    run = Run(folder, way)
    try:
        run.start_ocrd()
        victim = run.workers[1]
        started = run.drop(20, 10)
        at(4.0, victim.kill)
        at(10.0, victim.start)
        return run.finish(20, started)
    finally:
        run.close()


def throughput(folder: Path, way: str) -> dict[str, Any]:
    """20 documents x 10 pages, three workers."""
    run = Run(folder, way)
    try:
        run.start_ocrd()
        return run.finish(20, run.drop(20, 10))
    finally:
        run.close()


def garble(folder: Path, way: str) -> dict[str, Any]:
    """One of three workers garbles from the start; 12 documents x 10 pages."""
    run = Run(folder, way, garbling=2)
    try:
        run.start_ocrd()
        return run.finish(12, run.drop(12, 10))
    finally:
        run.close()


def restart(folder: Path, way: str) -> dict[str, Any]:
    """A worker is restarted at 3 s and comes back garbling; 24 documents x 10 pages at 3 s a
    page, so that the run outlasts the router's circuit breaker (it keeps a returning worker
    out for about 60 s)."""
    run = Run(folder, way, seconds_per_page=3.0)
    try:
        run.start_ocrd()
        victim = run.workers[1]
        started = run.drop(24, 10)
        at(3.0, lambda: (victim.kill(), victim.start(garble=True)))
        return run.finish(24, started)
    finally:
        run.close()


def outage(folder: Path, way: str) -> dict[str, Any]:
    """All three workers down for 20 s from 3 s on; 20 documents x 10 pages."""
    run = Run(folder, way)
    try:
        run.start_ocrd()
        started = run.drop(20, 10)

        def all_down() -> None:
            for worker in run.workers:
                worker.kill()

        def all_back() -> None:
            for worker in run.workers:
                worker.start()

        at(3.0, all_down)
        at(23.0, all_back)
        return run.finish(20, started)
    finally:
        run.close()


def first_dead(folder: Path, way: str) -> dict[str, Any]:
    """The router's first worker dead, two alive; one document of 10 pages."""
    run = Run(folder, way)
    try:
        first = run.router.workers()[0]
        next(w for w in run.workers if w.url == first).kill()
        run.start_ocrd()
        return run.finish(1, run.drop(1, 10))
    finally:
        run.close()


CASES: dict[str, Callable[[Path, str], dict[str, Any]]] = {
    "kill": kill,
    "throughput": throughput,
    "garble": garble,
    "restart": restart,
    "outage": outage,
    "first-dead": first_dead,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--runs", type=int, default=1, help="runs of each case each way")
    parser.add_argument("--out", type=Path, help="also write the results here (JSON lines)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    for case in args.cases.split(","):
        for number in range(args.runs):
            for way in args.ways.split(","):
                with tempfile.TemporaryDirectory(prefix="ocrd-routed-") as folder:
                    result = {"case": case, "run": number + 1, **CASES[case](Path(folder), way)}
                result["load"] = round(os.getloadavg()[0], 1)
                print(json.dumps(result), flush=True)
                if args.out is not None:
                    with args.out.open("a") as out:
                        out.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
