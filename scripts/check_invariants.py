"""Check ocrd's promise on a set of folders: every input ended exactly once, nothing lost.

    python scripts/check_invariants.py --inputs COPIES --inbox IN --outbox OUT \\
        --done DONE --failed FAILED --work WORK [--separator "<!-- page {page} -->"]

COPIES holds a copy of every file that was dropped into the inbox (any layout). Checked:

1. nothing is left in the inbox or the work area (no claim in any daemon's folder there;
   the daemons' leases, `.leases/`, are no claims);
2. each input is, by content, exactly once in done/ or failed/, and nothing else is there;
3. each original in done/ has exactly one Markdown file, `<outbox>/<same folder>/<same
   stem>.md`, complete (for a PDF: one page separator per page after the first);
4. no output exists without its original in done/: no Markdown, figure folder, layout or
   raw file without one, and no temporary files;
5. each original in failed/ has its `<stem>.error.json` with a reason.

Prints one line per violation and exits 1 if there is any; exits 0 and prints a summary
otherwise. `check()` returns the violations for tests and benchmarks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

COMPANION_SUFFIXES = (".assets", ".layout.json", ".raw.jsonl", ".md")


def _files(root: Path) -> list[Path]:
    """The files under `root`, but `.nfsXXXX` ones: an NFS client keeps a file deleted while
    open under such a name until it is closed; it is no file of anyone's."""
    if not root.exists():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".nfs"))


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pdf_pages(path: Path) -> int | None:
    try:
        import pymupdf

        with pymupdf.open(path) as doc:
            return doc.page_count
    except Exception:
        return None


def left_in_work(work: Path) -> list[Path]:
    """The claims a work area still holds: claim folders in the daemons' folders (and an
    older ocrd's, straight in it), and any file that is not ocrd's own hidden one."""
    if not work.exists():
        return []
    left = []
    for entry in sorted(work.iterdir()):
        if entry.name.startswith("."):
            continue  # the leases
        if not entry.is_dir() or (entry / ".claim.json").exists():
            left.append(entry)
            continue
        left += [p for p in sorted(entry.iterdir()) if not p.name.startswith(".")]
    return left


def _output_stem(path: Path, outbox: Path) -> tuple[Path, str] | None:
    """(folder relative to the outbox, stem) of an output file, or None if it is no output."""
    relative = path.relative_to(outbox)
    for part_index, part in enumerate(relative.parts):
        if part.endswith(".assets") and part_index < len(relative.parts) - 1:
            return Path(*relative.parts[:part_index]), part[: -len(".assets")]
    for suffix in COMPANION_SUFFIXES:
        if relative.name.endswith(suffix):
            return relative.parent, relative.name[: -len(suffix)]
    return None


def check(
    inputs: Path,
    inbox: Path,
    outbox: Path,
    done: Path,
    failed: Path,
    work: Path,
    separator: str = "<!-- page {page} -->",
) -> tuple[list[str], dict[str, int]]:
    problems: list[str] = []
    left = [p for p in _files(inbox) if not p.name.startswith(".")]
    problems += [f"left in the inbox: {p}" for p in left]
    problems += [f"left in the work area: {p}" for p in left_in_work(work)]

    expected = Counter(_digest(p) for p in _files(inputs))
    failed_originals = [p for p in _files(failed) if not p.name.endswith(".error.json")]
    settled = Counter(_digest(p) for p in [*_files(done), *failed_originals])
    for digest, count in expected.items():
        if settled[digest] != count:
            times = settled[digest]
            problems.append(
                f"input {digest[:12]} is {times} times in done/ and failed/, not {count}"
            )
    for digest in settled.keys() - expected.keys():
        problems.append(f"a file in done/ or failed/ is no input: {digest[:12]}")

    outputs: dict[tuple[Path, str], list[Path]] = {}
    for path in _files(outbox):
        key = _output_stem(path, outbox)
        if key is None:
            problems.append(f"not an ocrd output: {path}")
            continue
        outputs.setdefault(key, []).append(path)
    originals = {(p.relative_to(done).parent, p.stem): p for p in _files(done)}
    for key, paths in sorted(outputs.items()):
        if key not in originals:
            problems.append(f"output without its original in done/: {paths[0]}")
    for key, original in sorted(originals.items()):
        markdown = outbox / key[0] / f"{key[1]}.md"
        if not markdown.is_file():
            problems.append(
                f"original in done/ without its Markdown: {original} (expected {markdown})"
            )
            continue
        text = markdown.read_text(encoding="utf-8", errors="replace")
        pages = _pdf_pages(original) if original.suffix.lower() == ".pdf" else None
        if not text.endswith("\n"):
            problems.append(f"incomplete Markdown (no final newline): {markdown}")
        if pages and any(
            separator.replace("{page}", str(n)) not in text for n in range(2, pages + 1)
        ):
            problems.append(f"incomplete Markdown (not all {pages} pages): {markdown}")

    for original in failed_originals:
        report = original.with_name(original.stem + ".error.json")
        try:
            reason = json.loads(report.read_text())["message"]
        except (OSError, ValueError, KeyError):
            reason = ""
        if not str(reason).strip():
            problems.append(f"failed original without a readable reason: {original}")
    for path in _files(failed):
        if path.name.endswith(".error.json") and not any(
            p.name == path.name[: -len(".error.json")] + p.suffix
            for p in failed_originals
            if p.parent == path.parent
        ):
            problems.append(f"error report without its original: {path}")

    summary = {
        "inputs": sum(expected.values()),
        "done": len(originals),
        "failed": len(failed_originals),
        "markdown": sum(1 for p in _files(outbox) if p.suffix == ".md"),
    }
    return problems, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("inputs", "inbox", "outbox", "done", "failed", "work"):
        parser.add_argument(f"--{name}", type=Path, required=True)
    parser.add_argument("--separator", default="<!-- page {page} -->")
    args = parser.parse_args()
    problems, summary = check(
        args.inputs, args.inbox, args.outbox, args.done, args.failed, args.work, args.separator
    )
    for problem in problems:
        print(problem)
    print(", ".join(f"{key} {value}" for key, value in summary.items()))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
