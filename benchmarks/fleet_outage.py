"""An inference fleet that goes away while pages are in flight, as an operator would see it.

    python benchmarks/fleet_outage.py [--documents 20] [--pages 10] [--outages 2] [--outage 25]
        [--retry-backoff 1]
    python benchmarks/fleet_outage.py --tree ../older-checkout   # the same, for another ocrd

`ocrd run` with `engine.kind: openai` against a stand-in OpenAI-compatible server on
loopback (tests/fleet.py: it speaks the API and answers after a delay, reading nothing on
the page). Good PDFs are dropped into the inbox; while pages are in flight the server is
stopped for `--outage` seconds (requests in flight are cut off, new connections refused),
`--outages` times. Whenever the daemon exits it is started again at once, as systemd's
`Restart=on-failure` would. At the end it prints how many documents reached done/ and
failed/, how often the daemon exited, and runs the invariant check.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from harness import REPO, make_pdf, python_of

sys.path.insert(0, str(REPO / "scripts"))
from check_invariants import check
from fleet import StandInFleetServer


def write_config(folder: Path, fleet: StandInFleetServer, backoff: float) -> Path:
    (folder / "data" / "inbox").mkdir(parents=True)
    config = {
        "inboxes": [{"path": "data/inbox", "settle_seconds": 0.5, "max_image_side": 768}],
        "engine": {
            "kind": "openai",
            "openai": {
                "base_urls": [fleet.url],
                "max_concurrency": 8,
                "retry_backoff_seconds": backoff,
            },
        },
        "pipeline": {"status_interval_seconds": 1},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Supervisor:
    """Runs `ocrd run` and starts it again whenever it exits, until told to stop."""

    def __init__(self, config: Path, tree: Path) -> None:
        self.config = config
        self.python = python_of(tree)
        self.exits: list[int] = []
        self.events: list[dict] = []
        self._stopping = False
        self._process: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._supervise, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def count(self, event: str) -> int:
        return sum(1 for e in list(self.events) if e.get("event") == event)

    def _supervise(self) -> None:
        while not self._stopping:
            command = [self.python, "-m", "ocrd", "run", "--config", str(self.config)]
            self._process = subprocess.Popen(
                [*command, "--log-format", "json"],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            assert self._process.stdout is not None
            for line in self._process.stdout:
                if line.startswith("{"):
                    self.events.append(json.loads(line))
            code = self._process.wait()
            if not self._stopping:
                self.exits.append(code)

    def stop(self) -> None:
        self._stopping = True
        if self._process is not None:
            self._process.terminate()
        self._thread.join(timeout=120)


def wait_until(condition, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--documents", type=int, default=20)
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument("--outages", type=int, default=2)
    parser.add_argument("--outage", type=float, default=25.0, help="seconds the fleet is gone")
    parser.add_argument("--delay", type=float, default=0.5, help="the server's seconds a page")
    parser.add_argument(
        "--retry-backoff", type=float, default=1.0, help="openai.retry_backoff_seconds"
    )
    parser.add_argument("--tree", type=Path, default=REPO, help="checkout whose ocrd runs")
    args = parser.parse_args()

    fleet = StandInFleetServer(delay=args.delay)
    fleet.start()
    with tempfile.TemporaryDirectory(prefix="ocrd-outage-") as tmp:
        folder = Path(tmp)
        config = write_config(folder, fleet, args.retry_backoff)
        inputs = folder / "inputs"
        inputs.mkdir()
        for index in range(args.documents):
            make_pdf(inputs / f"doc{index}.pdf", args.pages, label=f"Doc {index} page")
        supervisor = Supervisor(config, args.tree.resolve())
        supervisor.start()
        wait_until(lambda: supervisor.count("daemon.ready") >= 1, 120)
        inbox = folder / "data" / "inbox"
        for path in sorted(inputs.iterdir()):
            (inbox / path.name).write_bytes(path.read_bytes())
        started = time.monotonic()
        pages = args.documents * args.pages
        for outage in range(1, args.outages + 1):
            target = outage * pages // (args.outages + 1)
            wait_until(lambda t=target: supervisor.count("page.recognised") >= t, 600)
            fleet.stop()
            print(f"outage {outage}: fleet stopped for {args.outage:g} s", flush=True)
            time.sleep(args.outage)
            fleet.start()
        wait_until(lambda: supervisor.count("document.finished") >= args.documents, 900)
        seconds = time.monotonic() - started
        supervisor.stop()
        fleet.stop()
        data = folder / "data"
        problems, summary = check(
            inputs, inbox, data / "outbox", data / "done", data / "failed", data / "work"
        )
        print(
            f"{args.documents} documents of {args.pages} pages, {args.outages} outages of "
            f"{args.outage:g} s: {summary['done']} done, {summary['failed']} failed, "
            f"daemon exits {supervisor.exits or 'none'}, dropped requests {fleet.dropped}, "
            f"{seconds:.0f} s"
        )
        print("invariants: " + ("all hold" if not problems else "; ".join(problems)))
        sys.exit(1 if problems or summary["failed"] else 0)


if __name__ == "__main__":
    main()
