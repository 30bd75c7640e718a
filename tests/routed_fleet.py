"""A fleet behind the real `vllm-router` (PyPI, pinned in the test extra): workers are ocrd's
simulated servers (`python -m ocrd.engines.simulated_server`, real processes on loopback
ports, which read nothing: they answer ocrd's test page, known by its pixels, or garble
when told), the router is the real Rust binary, started and driven through its own worker API.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
from fleet import free_port

from ocrd.engines.simulated_server import GARBLE

__all__ = ["GARBLE", "VllmRouter", "Worker", "fleet_behind", "router_binary"]


def router_binary() -> str:
    """The `vllm-router` command installed beside this Python (the test extra's)."""
    beside = Path(sys.executable).parent / "vllm-router"
    found = str(beside) if beside.exists() else shutil.which("vllm-router")
    if found is None:
        raise AssertionError(
            "vllm-router is not installed: pip install -e '.[test]' installs the pinned one"
        )
    return found


def serving(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def wait_serving(url: str, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 60
    while not serving(url):
        if process.poll() is not None:
            raise AssertionError(f"{what} exited with status {process.returncode}")
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not serving after 60 s")
        time.sleep(0.1)


class Worker:
    """One simulated server on a loopback port; every answered request's id is appended to
    `answers` (kept across its restarts). With `restart_on_exit`, a worker that exits by
    itself (a page crashed it) is started again at once, as systemd would."""

    def __init__(
        self,
        folder: Path,
        number: int,
        seconds_per_page: float = 0.2,
        capacity: int = 8,
        garble: bool = False,
        exit_on_marked_pages: bool = False,
        refuse_page_once: int = 0,
        reads_first: int = 0,
    ) -> None:
        self.number = number
        self.reads_first = reads_first
        self.requests = folder / f"worker{number}.requests"
        self.refuse_page_once = refuse_page_once
        self.port = free_port()
        self.answers = folder / f"worker{number}.answers"
        self.seconds_per_page = seconds_per_page
        self.capacity = capacity
        self.garble = garble
        self.exit_on_marked_pages = exit_on_marked_pages
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._watching = False
        self.extra: list[str] = []  # more of simulated_server's options

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, garble: bool | None = None) -> None:
        if garble is not None:
            self.garble = garble
        argv = [
            sys.executable,
            "-m",
            "ocrd.engines.simulated_server",
            "--replica",
            str(self.number),
            "--port",
            str(self.port),
            "--seconds-per-page",
            str(self.seconds_per_page),
            "--capacity",
            str(self.capacity),
            "--answers-test-page",
            "--answers-file",
            str(self.answers),
            "--record-file",
            str(self.requests),
        ]
        if self.reads_first:
            argv += ["--reads-first", str(self.reads_first)]
        if self.garble:
            argv.append("--garble")
        if self.exit_on_marked_pages:
            argv.append("--exit-on-marked-pages")
        if self.refuse_page_once:
            argv += ["--refuse-page-once", str(self.refuse_page_once)]
        argv += self.extra
        env = {k: v for k, v in os.environ.items() if k != "OCRD_REPLICA_API_KEY"}
        self.process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
        wait_serving(self.url, self.process, f"simulated worker {self.number}")

    def kill(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()

    def restart_on_exit(self) -> None:
        self._watching = True

        def watch() -> None:
            while self._watching:
                process = self.process
                if process is not None and process.poll() is not None:
                    self.restarts += 1
                    self.start()
                time.sleep(0.1)

        threading.Thread(target=watch, daemon=True).start()

    def stop(self) -> None:
        self._watching = False
        self.kill()

    def answered(self) -> list[tuple[str, bool]]:
        """The request id of each request it answered, and whether it was ocrd's test page
        (which the worker knows by its pixels; ocrd's request does not say)."""
        if not self.answers.exists():
            return []
        lines = [line.split() for line in self.answers.read_text().splitlines() if line]
        return [(words[0], words[1:] == ["test-page"]) for words in lines]

    def answered_pages(self) -> list[str]:
        """The request ids of the pages it answered (not ocrd's test page)."""
        return [request_id for request_id, test_page in self.answered() if not test_page]

    def received(self) -> list[str]:
        """Every request it received: 'METHOD path Authorization-header' (or '-')."""
        return self.requests.read_text().splitlines() if self.requests.exists() else []


class VllmRouter:
    """`vllm-router` on a loopback port in front of the workers at `urls`."""

    def __init__(self, folder: Path, urls: list[str]) -> None:
        self.port = free_port()
        self.log = folder / "vllm-router.log"
        self.argv = [
            router_binary(),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(free_port()),
            "--worker-urls",
            *urls,
            "--log-level",
            "warning",
        ]
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (again, on the same port, with the workers it was made with)."""
        with self.log.open("a") as output:
            self.process = subprocess.Popen(self.argv, stdout=output, stderr=subprocess.STDOUT)
        wait_serving(self.url, self.process, "vllm-router")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def workers(self) -> list[str]:
        answer = httpx.get(f"{self.url}/workers", timeout=10).json()
        return [w["url"] for w in answer["workers"]]

    def add(self, worker: Worker) -> None:
        answer = httpx.post(f"{self.url}/workers", json={"url": worker.url}, timeout=60)
        assert answer.status_code == 200 and answer.json()["success"], answer.text

    def remove(self, worker: Worker) -> None:
        answer = httpx.delete(f"{self.url}/workers/{quote(worker.url, safe='')}", timeout=60)
        assert answer.status_code == 200, answer.text

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def fleet_behind(folder: Path, workers: list[Worker]) -> Iterator[VllmRouter]:
    """Start `workers`, then the router in front of them; stop all of it afterwards."""
    router: VllmRouter | None = None
    try:
        for worker in workers:
            worker.start()
        router = VllmRouter(folder, [worker.url for worker in workers])
        router.start()
        yield router
    finally:
        if router is not None:
            router.stop()
        for worker in workers:
            worker.stop()
