"""Test documents made with real PyMuPDF."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pymupdf


def make_pdf(path: Path, pages: int, label: str = "Page") -> Path:
    """A PDF whose page N says '<label> N' in large type (A5, so it renders quickly)."""
    doc = pymupdf.open()
    for number in range(1, pages + 1):
        page = doc.new_page(width=420, height=595)
        page.insert_text((40, 100), f"{label} {number}", fontsize=36)
        page.insert_text((40, 160), "The quick brown fox jumps over the lazy dog.", fontsize=14)
    doc.save(path)
    doc.close()
    return path


def repeated_ngrams(tokens: tuple[int, ...] | list[int], n: int) -> int:
    """How many n-grams of `tokens` repeat an earlier one."""
    counts = Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))
    return sum(count - 1 for count in counts.values() if count > 1)


# What qpdf says of a stream whose data the original already had damaged: kept as it is
# (repairing it would change what the page shows), so not a fault of the output.
STREAM_DATA_WARNINGS = ("error decoding stream data", "stream will be re-processed")


def pdf_problems(path: Path, password: str = "") -> list[str]:
    """What keeps a PDF from opening cleanly: the errors and warnings of `qpdf --check`
    (those about a stream's damaged data left out), and pikepdf refusing to open it
    without repairing it. [] for a sound file."""
    import shutil
    import subprocess

    import pikepdf

    if shutil.which("qpdf") is None:
        raise AssertionError("qpdf is missing: run scripts/install_test_packages.sh")
    command = ["qpdf", "--check", *([f"--password={password}"] if password else []), str(path)]
    checked = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = (checked.stdout + checked.stderr).splitlines()
    problems = (
        []
        if checked.returncode == 0
        else [
            line
            for line in lines
            if (line.startswith(("WARNING", "ERROR")) or checked.returncode == 2)
            and not any(known in line for known in STREAM_DATA_WARNINGS)
        ]
    )
    try:
        pikepdf.open(path, password=password, attempt_recovery=False).close()
    except pikepdf.PdfError as error:
        problems.append(f"pikepdf: {error}")
    return problems


def without_trailer(source: Path, target: Path) -> Path:
    """`source` (a PDF with a classic cross-reference table) cut off before its trailer, as
    a transfer that stopped short leaves it: readers must rebuild its structure."""
    data = source.read_bytes()
    end = data.rfind(b"trailer")
    assert end > 0, f"{source.name} has no classic trailer"
    target.write_bytes(data[:end])
    return target


def with_broken_xref(source: Path, target: Path) -> Path:
    """`source` with every offset in its cross-reference table off by a few bytes, as a
    tool that edited the file without rewriting the table leaves it."""
    import re

    data = source.read_bytes()
    broken, count = re.subn(
        rb"(\d{10})( \d{5} n)", lambda m: b"%010d" % (int(m.group(1)) + 7) + m.group(2), data
    )
    assert count > 0, f"{source.name} has no classic cross-reference table"
    target.write_bytes(broken)
    return target
