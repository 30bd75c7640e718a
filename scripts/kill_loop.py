"""SIGKILL `ocrd run` at random moments over a backlog, then check every invariant.

    python scripts/kill_loop.py --kills 200 --documents 60 [--seed 1] [--keep DIR]

Makes a backlog of PDFs (1 to 4 pages, same names in different folders, some bad files),
drops it into the inbox of a daemon with the simulated engine, and kills the daemon with
SIGKILL at a random moment after it is ready, again and again (dropping the backlog once
more whenever it has drained, so that every kill lands on work). Then one last daemon runs
until the inbox and the work area are empty, and `check_invariants.check` must find
nothing wrong. Prints the figures and exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from check_invariants import check
from helpers import make_pdf


def make_backlog(folder: Path, documents: int, rng: random.Random) -> int:
    """PDFs in two folders with repeating names, plus three files that must fail."""
    for index in range(documents):
        subfolder = folder / ("a" if index % 3 else "b")
        subfolder.mkdir(parents=True, exist_ok=True)
        name = f"doc{index % 8}-{index}.pdf"
        make_pdf(subfolder / name, rng.randint(1, 4), label=f"File {index}")
    make_pdf(folder / "a" / "same.pdf", 2, label="A")
    make_pdf(folder / "b" / "same.pdf", 2, label="B")
    (folder / "a" / "notes.pdf").write_text("not a PDF at all")
    (folder / "b" / "empty.pdf").touch()
    (folder / "b" / "truncated.pdf").write_bytes(b"%PDF-1.7\n1 0 obj\n<< /Type /Cat")
    return documents + 5


def write_config(folder: Path) -> Path:
    (folder / "data" / "inbox").mkdir(parents=True, exist_ok=True)
    config = folder / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "inboxes": [
                    {
                        "path": "data/inbox",
                        "settle_seconds": 0.2,
                        "layout_file": True,
                        "keep_raw": True,
                    }
                ],
                "engine": {
                    "kind": "simulated",
                    "simulated": {"seconds_per_page": 0.1, "capacity": 4},
                },
                "pipeline": {"max_documents_in_flight": 3, "rescan_interval_seconds": 1},
            }
        )
    )
    return config


def start(config: Path) -> subprocess.Popen[str]:
    """`ocrd run`, returned once it announced readiness."""
    daemon = subprocess.Popen(
        [sys.executable, "-m", "ocrd", "run", "--config", str(config), "--log-format", "json"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert daemon.stdout is not None
    for line in daemon.stdout:
        if line.startswith("{") and json.loads(line).get("event") == "daemon.ready":
            return daemon
    raise RuntimeError(f"ocrd exited before it was ready (exit {daemon.wait()})")


def drain(daemon: subprocess.Popen[str]) -> None:
    """Read the daemon's output in the background so that it never blocks on a full pipe."""
    import threading

    threading.Thread(target=lambda: daemon.stdout and daemon.stdout.read(), daemon=True).start()


def kill_loop(folder: Path, kills: int, documents: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    backlog = folder / "backlog"
    per_round = make_backlog(backlog, documents, rng)
    config = write_config(folder)
    data = folder / "data"
    dropped = folder / "dropped"
    rounds = 0

    def drop_backlog() -> None:
        nonlocal rounds
        rounds += 1
        shutil.copytree(backlog, dropped / f"round{rounds}")
        shutil.copytree(backlog, data / "inbox" / f"round{rounds}")

    def idle() -> bool:
        work = data / "work"
        inbox_files = [p for p in (data / "inbox").rglob("*") if p.is_file()]
        return not inbox_files and not (work.exists() and any(work.iterdir()))

    started = time.monotonic()
    drop_backlog()
    for _ in range(kills):
        if idle():
            drop_backlog()
        daemon = start(config)
        drain(daemon)
        time.sleep(rng.uniform(0.05, 1.0))
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(timeout=30)

    daemon = start(config)
    drain(daemon)
    deadline = time.monotonic() + 60 + 5 * per_round * rounds
    while not idle() and time.monotonic() < deadline:
        time.sleep(0.2)
    daemon.send_signal(signal.SIGTERM)
    exit_code = daemon.wait(timeout=120)

    problems, summary = check(
        dropped, data / "inbox", data / "outbox", data / "done", data / "failed", data / "work"
    )
    reports = [json.loads(p.read_text()) for p in (data / "failed").rglob("*.error.json")]
    return {
        "kills": kills,
        "set_aside": sum(1 for r in reports if r.get("error_type") == "PoisonDocument"),
        "backlogs": rounds,
        "expected_inputs": per_round * rounds,
        "final_exit_code": exit_code,
        "seconds": round(time.monotonic() - started, 1),
        **summary,
        "problems": problems,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--documents", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="ocrd-kill-loop-"))
    try:
        result = kill_loop(folder, args.kills, args.documents, args.seed)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    for problem in result["problems"]:  # type: ignore[attr-defined]
        print("VIOLATION:", problem)
    print(json.dumps({k: v for k, v in result.items() if k != "problems"}))
    os._exit(1 if result["problems"] or result["final_exit_code"] != 0 else 0)


if __name__ == "__main__":
    main()
