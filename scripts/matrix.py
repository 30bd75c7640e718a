"""Run the whole combination matrix (every input kind x outputs x splitting x delivery, not
only the pairs CI runs) and print it as a table: a row per input kind, a column per
outputs and splitting, and in each cell the deliveries that gave what the README promises
(`c` command, `w` webhook, `a` the API), `-` where one did not, `refused` where
`ocrd check-config` refuses the configuration (with its reason).

    .venv/bin/python scripts/matrix.py [--keep JUNIT.xml] [pytest options]
    .venv/bin/python scripts/matrix.py --report JUNIT.xml    (a run's table again)

Exit status 0 when every cell passed or was refused as it should be. It runs
tests/test_matrix.py with OCRD_MATRIX=full: one daemon, an inbox per configuration.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from matrix_inputs import DELIVERIES, KINDS, OUTPUTS, SPLITS, refusal  # noqa: E402

TEST = "test_a_cell_gives_what_the_readme_promises_or_is_refused"


def outcomes(junit: Path) -> dict[str, bool]:
    """Each cell's id (kind|outputs|split|delivery): passed or not."""
    found = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = case.get("name", "")
        if not name.startswith(TEST + "["):
            continue
        failed = any(child.tag in ("failure", "error", "skipped") for child in case)
        found[name[len(TEST) + 1 : -1]] = not failed
    return found


def table(results: dict[str, bool]) -> str:
    columns = [(outputs, split) for outputs in OUTPUTS for split in SPLITS]
    header = ["input"] + [f"{o.replace('markdown+', '+')} / {s}" for o, s in columns]
    rows = [header]
    for kind in KINDS:
        row = [kind]
        for outputs, split in columns:
            if refusal(kind, split):
                row.append("refused")
                continue
            marks = ""
            for delivery in DELIVERIES:
                passed = results.get(f"{kind}|{outputs}|{split}|{delivery}")
                marks += delivery[0] if passed else "-" if passed is False else "?"
            row.append(marks)
        rows.append(row)
    rows.insert(1, ["---"] * len(header))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(  # a Markdown table, as BENCHMARKS.md keeps it
        "| " + " | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) + " |"
        for row in rows
    )


def report(junit: Path) -> None:
    """The table and the totals of a run's JUnit report."""
    results = outcomes(junit)
    refused = 0
    for cell in results:
        kind, _, split, _ = cell.split("|")
        refused += refusal(kind, split) is not None
    print(table(results))
    print()
    passed = sum(results.values())
    print(
        f"{len(results)} cells: {passed} as the README says ({refused} of them refused by "
        f"check-config), {len(results) - passed} not"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", type=Path, help="keep pytest's JUnit XML report here")
    parser.add_argument("--report", type=Path, help="only print the table of this JUnit report")
    options, pytest_options = parser.parse_known_args()
    if options.report:
        report(options.report)
        return 0
    junit = options.keep or Path(tempfile.mkdtemp()) / "matrix.xml"
    started = time.monotonic()
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "--timeout",
        "7200",
        f"--junitxml={junit}",
        "tests/test_matrix.py",
        *pytest_options,
    ]
    environment = {**os.environ, "OCRD_MATRIX": "full"}
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    environment["PYTHONPATH"] = os.pathsep.join(paths)
    finished = subprocess.run(command, cwd=ROOT, env=environment, check=False)
    seconds = time.monotonic() - started
    print()
    report(junit)
    print(f"{seconds:.0f} s")
    return finished.returncode


if __name__ == "__main__":
    sys.exit(main())
