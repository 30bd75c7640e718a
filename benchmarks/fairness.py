"""A one-page scan behind a backlog of books: how long does its owner wait?

    python benchmarks/fairness.py [--capacity 32] [--seconds-per-page 2] [--tree DIR]

Three runs of `ocrd run` with its default pipeline settings and the simulated engine at a
GPU's pace (`--capacity` pages at once, `--seconds-per-page` each), settle time 0.2 s:

1. alone: a 1-page PDF dropped into an idle daemon;
2. behind a book: the same PDF dropped `--delay` seconds after one 400-page PDF;
3. behind ten books: the same, after ten 100-page PDFs.

Latency is from the moment the PDF appears in the inbox to its `document.finished` event.
The target (issue 9): behind books at most twice the latency alone plus one engine page
time. Each run's daemon is stopped as soon as the scan is done (the books stay claimed).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from harness import REPO, DaemonRun, make_pdf, simulated_engine


def scan_latency(
    folder: Path, books: list[Path], scan: Path, args: argparse.Namespace
) -> tuple[float, int]:
    """Seconds from dropping `scan` (after `books`) to its summary; book pages done by then."""
    daemon = DaemonRun(
        folder,
        simulated_engine(args.capacity, args.seconds_per_page),
        pipeline={"shutdown_grace_seconds": 0},
        tree=args.tree,
    )
    try:
        daemon.wait_for("daemon.ready", timeout=300)
        for book in books:
            daemon.drop(book)
        if books:
            daemon.wait_for("page.recognised", timeout=300)  # the books are being read
            time.sleep(args.delay)
        dropped = daemon.drop(scan)
        [finished] = daemon.wait_until(lambda: daemon.find("document.finished", path=scan.name))
        book_pages = len(daemon.find("page.recognised")) - 1
        return finished.at - dropped, book_pages
    finally:
        daemon.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--capacity", type=int, default=32)
    parser.add_argument("--seconds-per-page", type=float, default=2.0)
    parser.add_argument("--delay", type=float, default=5.0, help="books' head start, seconds")
    parser.add_argument("--tree", type=Path, default=REPO, help="checkout whose ocrd runs")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="ocrd-fairness-") as tmp:
        folder = Path(tmp)
        scan = make_pdf(folder / "scan.pdf", 1, label="Scan")
        book = make_pdf(folder / "book.pdf", 400, label="Book page")
        shelf = [make_pdf(folder / f"volume{n}.pdf", 100, label=f"Volume {n}") for n in range(10)]
        alone, _ = scan_latency(folder / "alone", [], scan, args)
        behind_book, book_pages = scan_latency(folder / "book", [book], scan, args)
        behind_shelf, shelf_pages = scan_latency(folder / "shelf", shelf, scan, args)

    target = 2 * alone + args.seconds_per_page
    print(
        f"tree {args.tree}: simulated engine, {args.capacity} pages at once, "
        f"{args.seconds_per_page:g} s a page; books got a {args.delay:g} s head start"
    )
    print(f"1-page scan alone:                {alone:7.2f} s")
    print(f"behind one 400-page book:         {behind_book:7.2f} s  ({book_pages} book pages done)")
    print(f"behind ten 100-page books:        {behind_shelf:7.2f} s  ({shelf_pages} pages done)")
    print(f"target (2 x alone + 1 page time): {target:7.2f} s")


if __name__ == "__main__":
    main()
