"""SIGKILL `ocrd run` at random moments over a backlog, then check every invariant.

    python scripts/kill_loop.py --kills 200 --documents 60 [--seed 1] [--keep DIR]
    python scripts/kill_loop.py --daemons 3 --kills 40 --documents 200 [--lease-seconds 4]

Makes a backlog of PDFs (1 to 4 pages, same names in different folders, some bad files),
drops it into the inbox of a daemon with the simulated engine, and kills the daemon with
SIGKILL at a random moment after it is ready, again and again (dropping the backlog once
more whenever it has drained, so that every kill lands on work). Then one last daemon runs
until the inbox and the work area are empty, and `check_invariants.check` must find
nothing wrong. Prints the figures and exits 1 on any violation.

With `--daemons N`, N daemons (`OCRD_INSTANCE` d1, d2, ...) share the inbox and the backlog
is dropped once; again and again one of those that are ready, chosen at random, is
SIGKILLed 0.3 to 3 s after it became ready (and 0.5 to 3 s after the kill before), and is
started again at once (30 %) or after half a lease to three
(`--lease-seconds`), in which the others may take its claims over; the last N - 1 killed
stay dead and are taken over for good (ten more documents per daemon are dropped before
them, so that they die holding claims). Then the daemons left run until everything is
settled and the dead ones' leases are taken over.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from check_invariants import check, left_in_work
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


def write_config(folder: Path, lease_seconds: float | None = None) -> Path:
    (folder / "data" / "inbox").mkdir(parents=True, exist_ok=True)
    config = folder / "config.yaml"
    settings: dict[str, object] = {
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
        "http": {"listen": "127.0.0.1:0"},  # several daemons on one host
    }
    if lease_seconds is not None:
        settings["instances"] = {"lease_seconds": lease_seconds}
    config.write_text(yaml.safe_dump(settings))
    return config


def launch(config: Path, instance: str | None = None) -> subprocess.Popen[str]:
    """`ocrd run` (as `instance`), its output a pipe to read."""
    env = {**os.environ, **({"OCRD_INSTANCE": instance} if instance else {})}
    return subprocess.Popen(
        [sys.executable, "-m", "ocrd", "run", "--config", str(config), "--log-format", "json"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def start(config: Path) -> subprocess.Popen[str]:
    """`ocrd run`, returned once it announced readiness."""
    daemon = launch(config)
    assert daemon.stdout is not None
    for line in daemon.stdout:
        if line.startswith("{") and json.loads(line).get("event") == "daemon.ready":
            return daemon
    raise RuntimeError(f"ocrd exited before it was ready (exit {daemon.wait()})")


def drain(daemon: subprocess.Popen[str]) -> None:
    """Read the daemon's output in the background so that it never blocks on a full pipe."""
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
        inbox_files = [p for p in (data / "inbox").rglob("*") if p.is_file()]
        return not inbox_files and not left_in_work(data / "work")

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


class Daemon:
    """One of several daemons of the shared kill loop: its process, and the events it logged
    (counted by name), read in the background."""

    def __init__(self, config: Path, instance: str, events: Counter[str]) -> None:
        self.instance = instance
        self.process = launch(config, instance)
        self.events = events
        self.ready = threading.Event()  # it announced readiness
        self.ready_at = 0.0  # monotonic
        logs = config.parent / "logs"
        logs.mkdir(exist_ok=True)
        self.log = logs / f"{instance}-{self.process.pid}.jsonl"  # kept with --keep
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        with self.log.open("w") as log:
            for line in self.process.stdout:
                log.write(line)
                self._count(line)

    def _count(self, line: str) -> None:
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                event = json.loads(line).get("event", "")
                self.events[event] += 1
                if event == "daemon.ready":
                    self.ready_at = time.monotonic()
                    self.ready.set()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=120)


def _holds_claims(folder: Path) -> bool:
    """Whether an instance's folder holds a claim."""
    try:
        return any(not entry.name.startswith(".") for entry in folder.iterdir())
    except FileNotFoundError:
        return False


def add_late_documents(dropped: Path, inbox: Path, documents: int, rng: random.Random) -> int:
    """Drop `documents` more PDFs of 6 pages (kept in `dropped/late` for the check)."""
    late = dropped / "late"
    late.mkdir()
    for index in range(documents):
        make_pdf(late / f"late-{index}.pdf", 6, label=f"Late {index} {rng.random()}")
    shutil.copytree(late, inbox / "late")
    return documents


def wait_until_one_is_ready(daemons: Iterable[Daemon], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any(d.ready.is_set() for d in daemons):
        if time.monotonic() > deadline:
            raise RuntimeError("no daemon became ready")
        time.sleep(0.05)


def shared_kill_loop(
    folder: Path, daemons: int, kills: int, documents: int, seed: int, lease_seconds: float
) -> dict[str, object]:
    """`daemons` daemons on one inbox; `kills` SIGKILLs of any of them, each restarted at
    once or later (or never, at the end); then every invariant."""
    rng = random.Random(seed)
    per_round = make_backlog(folder / "dropped", documents, rng)
    config = write_config(folder, lease_seconds)
    data = folder / "data"
    shutil.copytree(folder / "dropped", data / "inbox", dirs_exist_ok=True)
    events: Counter[str] = Counter()
    names = [f"d{n}" for n in range(1, daemons + 1)]
    running = {name: Daemon(config, name, events) for name in names}
    dead: dict[str, float] = {}  # -> when it is started again (infinity: never)
    started = last_kill = time.monotonic()
    late = 0
    for kill in range(kills):
        for name, back_at in list(dead.items()):
            if time.monotonic() >= back_at:
                del dead[name]
                running[name] = Daemon(config, name, events)
        wait_until_one_is_ready(running.values())
        victim = rng.choice([name for name, d in running.items() if d.ready.is_set()])
        # at a random moment 0.3 to 3 s after it became ready (with documents in flight),
        # and 0.5 to 3 s after the kill before
        moment = max(
            running[victim].ready_at + rng.uniform(0.3, 3.0), last_kill + rng.uniform(0.5, 3.0)
        )
        time.sleep(max(0.0, moment - time.monotonic()))
        last_kill = time.monotonic()
        last = kill >= kills - (daemons - 1)  # the last ones stay dead: taken over for good
        if last:  # with claims in hand, which the others must take over
            if not late:  # the backlog may be done by now: new documents, so there are claims
                late = add_late_documents(folder / "dropped", data / "inbox", 10 * daemons, rng)
            deadline = time.monotonic() + 10
            while not _holds_claims(data / "work" / victim) and time.monotonic() < deadline:
                time.sleep(0.02)
        running[victim].kill()
        del running[victim]
        if last:
            dead[victim] = float("inf")
        elif rng.random() < 0.3:  # restarted at once: it takes its own claims back
            running[victim] = Daemon(config, victim, events)
        else:  # down for half a lease to three: the others may take its claims over meanwhile
            dead[victim] = time.monotonic() + rng.uniform(0.5, 3) * lease_seconds
        if not running:
            back = min(dead, key=lambda name: dead[name])
            del dead[back]
            running[back] = Daemon(config, back, events)

    def idle() -> bool:
        """Everything settled, and the dead daemons' leases taken over by the living."""
        inbox_files = [p for p in (data / "inbox").rglob("*") if p.is_file()]
        leases = {n for n in os.listdir(data / "work" / ".leases") if not n.startswith(".")}
        settled = not inbox_files and not left_in_work(data / "work")
        return settled and leases == set(running)

    deadline = time.monotonic() + 120 + 2 * per_round
    while not idle() and time.monotonic() < deadline:
        time.sleep(0.2)
    exit_codes = [daemon.stop() for daemon in running.values()]
    problems, summary = check(
        folder / "dropped",
        data / "inbox",
        data / "outbox",
        data / "done",
        data / "failed",
        data / "work",
    )
    reports = [json.loads(p.read_text()) for p in (data / "failed").rglob("*.error.json")]
    return {
        "daemons": daemons,
        "kills": kills,
        "left_dead": sorted(dead),  # those not started again
        "set_aside": sum(1 for r in reports if r.get("error_type") == "PoisonDocument"),
        "expected_inputs": per_round + late,
        "final_exit_codes": exit_codes,
        "takeovers": events["instance.took_over"],
        "documents_taken_over": events["document.taken_over"],
        "leases_lost": events["instance.lease_lost"],
        "seconds": round(time.monotonic() - started, 1),
        **summary,
        "problems": problems,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=200)
    parser.add_argument("--documents", type=int, default=60)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--daemons", type=int, default=1, help="several on one inbox")
    parser.add_argument("--lease-seconds", type=float, default=4.0, help="with --daemons")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="ocrd-kill-loop-"))
    try:
        if args.daemons > 1:
            result = shared_kill_loop(
                folder, args.daemons, args.kills, args.documents, args.seed, args.lease_seconds
            )
        else:
            result = kill_loop(folder, args.kills, args.documents, args.seed)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    for problem in result["problems"]:  # type: ignore[attr-defined]
        print("VIOLATION:", problem)
    print(json.dumps({k: v for k, v in result.items() if k != "problems"}))
    codes = result.get("final_exit_codes", [result.get("final_exit_code")])
    os._exit(1 if result["problems"] or any(codes) else 0)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
