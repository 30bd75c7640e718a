"""What the benchmarks share: `ocrd run` in a subprocess, its events as they arrive, files
dropped into its inbox as a scanner or a copy would, and the memory of its processes.

Times are taken here, on the monotonic clock, when a line of the daemon's log arrives (the
pipe adds well under a millisecond), so latencies compare with the moment a file was
dropped.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO.parent / "shared" / "corpus"
if not CORPUS.is_dir():
    raise SystemExit(f"the corpus is missing: expected {CORPUS} (shared/ beside the checkout)")
sys.path.insert(0, str(REPO / "tests"))

from helpers import make_pdf  # noqa: E402

T = TypeVar("T")

__all__ = ["CORPUS", "REPO", "DaemonRun", "Event", "make_pdf", "simulated_engine"]


def python_of(tree: Path) -> str:
    """The Python that runs `tree`'s ocrd: the checkout's own `.venv` (an editable install
    there imports that checkout's code, also in its render workers), else this one."""
    own = tree.resolve() / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def simulated_engine(capacity: int, seconds_per_page: float) -> dict[str, Any]:
    """The engine section of a simulated engine standing in for a GPU."""
    return {
        "kind": "simulated",
        "simulated": {"capacity": capacity, "seconds_per_page": seconds_per_page},
    }


@dataclass(frozen=True)
class Event:
    at: float  # monotonic seconds when the line arrived
    fields: dict[str, Any]

    @property
    def name(self) -> str:
        return str(self.fields.get("event"))


class DaemonRun:
    """`ocrd run` on a config of one inbox under `folder`, from a checkout (`tree`)."""

    def __init__(
        self,
        folder: Path,
        engine: dict[str, Any],
        inbox: dict[str, Any] | None = None,
        pipeline: dict[str, Any] | None = None,
        tree: Path = REPO,  # another checkout (with its own .venv) measures older code
        lag_probe: bool = False,
        log_level: str = "info",
        http: dict[str, Any] | None = None,
        instance: str | None = None,  # OCRD_INSTANCE: several daemons on one inbox
        sections: dict[str, Any] | None = None,  # more of the configuration (`instances`)
    ) -> None:
        self.folder = folder
        self.inbox = folder / "data" / "inbox"
        self.inbox.mkdir(parents=True, exist_ok=True)
        config = {
            "inboxes": [{"path": "data/inbox", "settle_seconds": 0.2, **(inbox or {})}],
            "engine": engine,
            "pipeline": {"status_interval_seconds": 1, **(pipeline or {})},
            **({"http": http} if http else {}),
            **(sections or {}),
        }
        if instance is not None:  # the same file for every daemon, each on a port of its own
            config["http"] = {"listen": "127.0.0.1:0"}
        self.config = folder / "config.yaml"
        self.config.write_text(yaml.safe_dump(config))
        self.events: list[Event] = []
        self.lag_file = folder / "lag.jsonl"
        env = dict(os.environ)
        if instance is not None:
            env["OCRD_INSTANCE"] = instance
        if lag_probe:
            env["PYTHONPATH"] = str(REPO / "benchmarks" / "lagprobe")
            env["OCRD_LAG_PROBE"] = str(self.lag_file)
        command = [python_of(tree), "-m", "ocrd", "run", "--config", str(self.config)]
        self.process = subprocess.Popen(
            [*command, "--log-format", "json", "--log-level", log_level],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=tree,  # `python -m` imports from the working folder first: the tree's ocrd
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.peak_rss = 0
        self._sampling = False

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("{"):
                self.events.append(Event(time.monotonic(), json.loads(line)))
            else:  # a traceback, or vLLM's own lines: shown, so that a failed run says why
                sys.stderr.write(line)

    def find(self, name: str, **fields: Any) -> list[Event]:
        return [
            event
            for event in list(self.events)
            if event.name == name and all(event.fields.get(k) == v for k, v in fields.items())
        ]

    def wait_for(self, name: str, count: int = 1, timeout: float = 600) -> list[Event]:
        """The events called `name` once there are `count` of them."""

        def enough() -> tuple[list[Event]] | None:
            found = self.find(name)
            return (found,) if len(found) >= count else None  # a tuple: true even if empty

        return self.wait_until(enough, timeout)[0]

    def wait_until(self, condition: Callable[[], T], timeout: float = 600) -> T:
        """`condition()`'s first true value, polled every 20 ms."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = condition()
            if value:
                return value
            if self.process.poll() is not None:
                raise RuntimeError(f"ocrd exited ({self.process.returncode})")
            time.sleep(0.02)
        raise TimeoutError(f"nothing came within {timeout} s")

    def drop(self, source: Path, name: str | None = None) -> float:
        """Copy `source` into the inbox the way a finished copy appears (a hidden name, then
        a rename); the monotonic time it appeared."""
        target = self.inbox / (name or source.name)
        hidden = self.inbox / f".{target.name}.incoming"
        shutil.copyfile(source, hidden)
        hidden.rename(target)
        return time.monotonic()

    def finished_at(self, path: str, timeout: float = 60) -> float:
        """When the document `path` (relative to its inbox) finished."""
        [event] = self.wait_until(lambda: self.find("document.finished", path=path), timeout)
        return event.at

    def drop_to_finish(self, source: Path, name: str) -> float:
        """Seconds from `source` appearing in the inbox as `name` to its document finished."""
        appeared = self.drop(source, name)
        return self.finished_at(name) - appeared

    # --- processes -------------------------------------------------------------------------

    def processes(self) -> list[psutil.Process]:
        """The daemon and its render workers (vLLM's processes too, where it runs them)."""
        try:
            daemon = psutil.Process(self.process.pid)
            return [daemon, *daemon.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def rss(self) -> int:
        """Resident memory of the daemon and its children together, in bytes."""
        total = 0
        for process in self.processes():
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def sample_memory(self, interval: float = 0.1) -> None:
        """Keep `peak_rss` up to date in the background until `stop()`."""
        self._sampling = True

        def sample() -> None:
            while self._sampling:
                self.peak_rss = max(self.peak_rss, self.rss())
                time.sleep(interval)

        threading.Thread(target=sample, daemon=True).start()

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU seconds so far of the daemon's main process, and of its children."""
        processes = self.processes()
        if not processes:
            return 0.0, 0.0

        def cpu(process: psutil.Process) -> float:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                return 0.0
            return times.user + times.system

        return cpu(processes[0]), sum(cpu(p) for p in processes[1:])

    def stop(self, timeout: float = 120) -> int:
        self._sampling = False
        if self.process.poll() is None:
            self.process.terminate()
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def lag(self, start: float, end: float) -> tuple[float, float] | None:
        """Worst and 99th-percentile event-loop lag in seconds between `start` and `end`
        (needs `lag_probe=True`; the samples are written when the daemon exits)."""
        if not self.lag_file.exists():
            return None
        lags = sorted(
            lag
            for when, lag in map(json.loads, self.lag_file.read_text().splitlines())
            if start <= when <= end
        )
        if not lags:
            return None
        return lags[-1], lags[int(0.99 * (len(lags) - 1))]
