"""What one document's file work costs the main process: claimed, its attempt counted,
settled to done/ (one page of Markdown), without the daemon around it.

    python benchmarks/settle_cost.py [--tree DIR ...] [--documents 300] [--rounds 6]

Each `--tree` (a checkout; its own `.venv` if it has one) runs the same steps in a process
of its own, the trees taking turns round by round, so two commits compare side by side on
one machine at one moment. Printed first: the CPU each kind of file operation costs here (a
new file costs far more than the others on some filesystems). Then for each tree: the CPU
(user and system, of the one thread doing the work, `time.thread_time`) and the wall time
a document, median and range over the rounds. The folders are in the system's temporary
folder, as in `profile_daemon.py`: its filesystem's costs are part of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness import REPO, python_of

# Runs inside each tree's own Python, importing that tree's ocrd (only names both the trees
# compared here have).
WORKER = r"""
import json, shutil, sys, time
from pathlib import Path
from ocrd.config import DocumentOptions, InboxEntry, PromptMode
from ocrd.domain import DocumentResult, InputFormat
from ocrd.engines.base import PageText
from ocrd.intake.claiming import WorkArea
from ocrd.output.page import PageResult
from ocrd.output.settle import Settler
from ocrd.text.grounding import Block

documents, root = int(sys.argv[1]), Path(sys.argv[2]) / "run"
text = "# A page\n\nSome words on it."
page = PageResult(1, PageText(text, "stop"), PromptMode.text, (100, 100), (72, 72),
                  [Block("text", (), text)])
result = DocumentResult(InputFormat.pdf, [page], 0.1)
inbox = InboxEntry(path=root / "inbox").located(root)
folders = (inbox.path, inbox.outbox, inbox.done, inbox.failed, inbox.work)
for folder in folders:
    folder.mkdir(parents=True)
work, settler = WorkArea(inbox.path, inbox.work), Settler(inbox, "simulated")
options = DocumentOptions()
cpu = wall = 0.0
for number in range(documents):
    path = inbox.path / f"doc{number}.pdf"
    path.write_bytes(b"%PDF-1.4 " + bytes(number % 251 for _ in range(2000)))
    started_cpu, started = time.thread_time(), time.perf_counter()
    claim = work.claim(path)
    claim.start_attempt()
    settler.done(claim, result, options)
    cpu += time.thread_time() - started_cpu
    wall += time.perf_counter() - started
assert len(list(inbox.done.iterdir())) == documents
shutil.rmtree(root)
print(json.dumps({"cpu_us": 1e6 * cpu / documents, "wall_us": 1e6 * wall / documents}))
"""


def primitive_costs(folder: Path, count: int = 300) -> dict[str, float]:
    """CPU us of the file operations settling is made of, here (one folder, `count` each)."""
    steps: dict[str, Callable[[int], object]] = {
        "new file": lambda i: os.close(os.open(folder / f"f{i}", os.O_WRONLY | os.O_CREAT)),
        "symbolic link": lambda i: os.symlink("20261127T000000-000000", folder / f"s{i}"),
        "hard link": lambda i: os.link(folder / f"f{i}", folder / f"h{i}"),
        "rename": lambda i: os.rename(folder / f"h{i}", folder / f"r{i}"),
        "folder": lambda i: os.mkdir(folder / f"d{i}"),
        "stat": lambda i: os.stat(folder / f"f{i}"),
        "unlink": lambda i: os.unlink(folder / f"r{i}"),
    }
    costs = {}
    for name, step in steps.items():
        started = time.thread_time()
        for index in range(count):
            step(index)
        costs[name] = 1e6 * (time.thread_time() - started) / count
    return costs


def one_round(tree: Path, documents: int, folder: Path) -> dict[str, float]:
    output = subprocess.run(
        [python_of(tree), "-c", WORKER, str(documents), str(folder)],
        cwd=tree,  # `-c` imports from the working folder first: the tree's ocrd
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    figures: dict[str, float] = json.loads(output.splitlines()[-1])
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, action="append", help="a checkout (repeatable)")
    parser.add_argument("--documents", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    trees: list[Path] = args.tree or [REPO]
    runs: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    # Every run's folders are made anew in one folder: on ext4 what a new file costs
    # depends on where its folder lies (a new temporary folder of the system's may land
    # elsewhere: 0.03 to 0.7 ms seen), and grows in a folder that once held many files.
    with tempfile.TemporaryDirectory(prefix="ocrd-settle-cost-") as folder:
        with tempfile.TemporaryDirectory(dir=folder) as scratch:
            costs = primitive_costs(Path(scratch))
        shown = ", ".join(f"{name} {cost:.0f} us" for name, cost in costs.items())
        print(f"CPU a file operation here: {shown}")
        for index in range(args.rounds):
            order = trees[index % len(trees) :] + trees[: index % len(trees)]
            for tree in order:
                runs[tree].append(one_round(tree, args.documents, Path(folder)))
    print(f"{args.documents} documents a run, {args.rounds} runs a tree, taking turns")
    for tree, figures in runs.items():
        cpu = [run["cpu_us"] for run in figures]
        wall = [run["wall_us"] for run in figures]
        print(
            f"{tree}: CPU {statistics.median(cpu):.0f} us a document "
            f"({min(cpu):.0f} to {max(cpu):.0f}), wall {statistics.median(wall):.0f} us "
            f"({min(wall):.0f} to {max(wall):.0f})"
        )
        print("  CPU by run: " + ", ".join(f"{value:.0f}" for value in cpu))


if __name__ == "__main__":
    main()
