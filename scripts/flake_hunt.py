"""Run tests again and again, optionally with the machine kept busy, and count how each ends.

    .venv/bin/python scripts/flake_hunt.py --runs 10 [--busy 1] [-- PYTEST ARGS...]
    .venv/bin/python scripts/flake_hunt.py --runs 5 --timing     # the tests that wait on time

A test that fails in some runs and passes in others is a flake: it costs every submission a
try. `--busy N` keeps N cores busy beside the tests (`stress-ng --cpu N` where Debian's
stress-ng is installed, else N spinning processes), as a CI machine shared with other work
is. `--timing` selects the tests whose outcome depends on time: they wait for states with
deadlines, count events in a window, or depend on the order of events (the list below;
keep it current when such a test is added). Each run's results are read from pytest's
JUnit XML; the table at the end says, for every test that did not pass every time, how
often it passed, failed or errored, and the first line of its first failure.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import multiprocessing
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Tests whose outcome depends on time: leases and takeovers, settle and collate windows,
# stop deadlines, health while loading, events counted while something runs.
TIMING = [
    "tests/test_several_daemons.py",
    "tests/test_leases.py",
    "tests/test_crash_safety.py",
    "tests/test_scan_jobs.py",
    "tests/test_supervision.py",
    "tests/test_daemon.py",
    "tests/test_http.py",
    "tests/test_http_clients.py",
    "tests/test_hooks.py",
    "tests/test_storage.py",
    "tests/test_watch.py",
    "tests/test_fleet.py",
    "tests/test_replicas.py",
    "tests/test_uploads.py",
    "tests/test_shared_folder.py",
    "tests/test_attacks.py",
    "tests/test_routed_fleet.py",
    "tests/test_load.py",
    "tests/test_group_member.py",
]


def spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy(cores: int) -> Iterator[str]:
    """`cores` cores kept busy while the context lasts; says how."""
    if cores <= 0:
        yield "idle"
        return
    if shutil.which("stress-ng"):
        process = subprocess.Popen(
            ["stress-ng", "--cpu", str(cores), "--quiet"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            yield f"stress-ng --cpu {cores}"
        finally:
            process.terminate()
            process.wait()
        return
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(cores)]
    for spinner in spinners:
        spinner.start()
    try:
        yield f"{cores} spinning process(es)"
    finally:
        for spinner in spinners:
            spinner.terminate()
            spinner.join()


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """Each test's outcome in one run (passed, failed, error, skipped), with the first line
    of its message."""
    found = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome = "failed" if kind == "failure" else kind
                message = (element.get("message") or "").splitlines()[0][:100]
                break
        found[name] = (outcome, message)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="cores kept busy beside the tests")
    parser.add_argument("--timing", action="store_true", help="the tests that wait on time")
    parser.add_argument("pytest_args", nargs="*", help="after --: what pytest runs")
    args = parser.parse_args()
    selection = args.pytest_args or (TIMING if args.timing else [])
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    first_failure: dict[str, str] = {}
    started = time.monotonic()
    with busy(args.busy) as load, tempfile.TemporaryDirectory() as folder:
        for run in range(1, args.runs + 1):
            report = Path(folder) / f"run{run}.xml"
            command = [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                f"--junitxml={report}",
                *selection,
            ]
            began = time.monotonic()
            subprocess.run(command, cwd=ROOT, stdout=subprocess.DEVNULL, check=False)
            ended = outcomes(report) if report.exists() else {}
            for name, (outcome, message) in ended.items():
                counts[name][outcome] += 1
                if outcome in ("failed", "error"):
                    first_failure.setdefault(name, message)
            bad = sum(1 for outcome, _ in ended.values() if outcome in ("failed", "error"))
            print(
                f"run {run}: {len(ended)} tests, {bad} not passed, "
                f"{time.monotonic() - began:.0f} s ({load})",
                flush=True,
            )
    unstable = {name: c for name, c in counts.items() if c["failed"] or c["error"]}
    minutes = (time.monotonic() - started) / 60
    print(
        f"\n{args.runs} runs of {len(counts)} tests with the machine {load}, "
        f"{minutes:.1f} min: {len(unstable)} not always passing"
    )
    for name, c in sorted(unstable.items()):
        print(
            f"  {name}: {c['passed']} passed, {c['failed']} failed, {c['error']} errors;"
            f" first: {first_failure.get(name, '')}"
        )


if __name__ == "__main__":
    main()
