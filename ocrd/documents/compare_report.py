"""What `ocrd compare` shows: each document's pages, seconds, pages a second and seconds a
page under each model, side by side, how far the two readings agree, and the total; and,
where asked, each model's Markdown and a unified diff per document for a person to read."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ocrd.documents.compare import ModelReading, ModelRun, Sample
from ocrd.files.dropped import printable
from ocrd.text.agreement import Agreement, agreement, unified_diff

MOST_LABEL_WIDTH = 40
WRAP_WIDTH = 92


@dataclass(frozen=True)
class DocumentComparison:
    label: str
    readings: tuple[ModelReading, ModelReading]  # model A's, model B's
    agreement: Agreement | None  # None where a model could not read it


def compare_runs(sample: Sample, runs: tuple[ModelRun, ModelRun]) -> list[DocumentComparison]:
    """Each document's two readings, with their agreement where both read it."""
    compared = []
    for document in sample.documents:
        a, b = runs[0].readings[document.label], runs[1].readings[document.label]
        both = a.markdown is not None and b.markdown is not None
        found = agreement(a.markdown or "", b.markdown or "") if both else None
        compared.append(DocumentComparison(document.label, (a, b), found))
    return compared


def report(runs: tuple[ModelRun, ModelRun], compared: list[DocumentComparison]) -> str:
    """The table: per document, then in total, a line per model and one of agreement."""
    labels = [printable(c.label) for c in compared]
    total_label = f"total ({len(compared)} document{'' if len(compared) == 1 else 's'})"
    width = min(max(len(total_label), *map(len, labels)), MOST_LABEL_WIDTH)
    names = [run.model for run in runs]
    model_width = max(len("agreement"), *map(len, names))
    table = _Table(width, model_width, names)
    lines = [*_header(runs), "", table.heading()]
    for label, comparison in zip(labels, compared, strict=True):
        lines += table.document(label, comparison)
    read = [c for c in compared if c.agreement is not None]
    total = sum((c.agreement for c in read if c.agreement is not None), Agreement())
    lines += table.total(runs, total if read else None, total_label, len(read) < len(compared))
    return "\n".join(lines) + "\n"


def _header(runs: tuple[ModelRun, ModelRun]) -> list[str]:
    lines = []
    for letter, run in zip("AB", runs, strict=True):
        lines.append(
            f"{letter}: {run.model}, engine {run.choice.kind} ({run.choice.reason}), "
            f"started in {run.start_seconds:.1f} s"
        )
    lines += textwrap.wrap(
        "The models ran one after the other, each engine alone on the machine (a vLLM engine "
        "holds its share of a GPU's memory); the documents were read together, as the daemon "
        "reads an inbox's. A document's seconds are its own, from its start to its last "
        "page; the total's are the whole sample's.",
        width=WRAP_WIDTH,
    )
    return lines


@dataclass(frozen=True)
class _Table:
    width: int
    model_width: int
    names: list[str]

    def row(self, first: str, model: str, rest: str) -> str:
        return f"{first:<{self.width}}  {model:<{self.model_width}}  {rest}".rstrip()

    def heading(self) -> str:
        columns = f"{'pages':>6}  {'seconds':>8}  {'pages/s':>8}  {'s/page':>7}"
        return self.row("document", "model", columns)

    def document(self, label: str, comparison: DocumentComparison) -> list[str]:
        """Its lines; a name too long for the column has a line of its own above them."""
        lines = [label] if len(label) > self.width else []
        first = "" if lines else label
        for index, (name, reading) in enumerate(zip(self.names, comparison.readings, strict=True)):
            lines.append(self.row(first if index == 0 else "", name, _figures(reading)))
        if comparison.agreement is not None:
            lines.append(self.row("", "agreement", self.agreement(comparison.agreement)))
        return lines

    def total(
        self, runs: tuple[ModelRun, ModelRun], total: Agreement | None, label: str, part: bool
    ) -> list[str]:
        """The sample's lines; `part`: the agreement is over the documents both read."""
        lines = []
        for index, run in enumerate(runs):
            first = label if index == 0 else ""
            lines.append(self.row(first, run.model, _pace(run.pages, run.seconds)))
        if total is not None:
            over = " (over the documents both read)" if part else ""
            lines.append(self.row("", "agreement", self.agreement(total) + over))
        return lines

    def agreement(self, found: Agreement) -> str:
        a, b = self.names
        return (
            f"{found.ratio:.3f} of the words; characters only in {a}: {found.only_a}, "
            f"only in {b}: {found.only_b}"
        )


def _figures(reading: ModelReading) -> str:
    if reading.failure is not None:
        return f"failed: {printable(reading.failure)}"
    return _pace(reading.pages, reading.seconds)


def _pace(pages: int, seconds: float) -> str:
    rate = f"{pages / seconds:8.2f}" if seconds > 0 and pages else f"{'-':>8}"
    per_page = f"{seconds / pages:7.2f}" if pages else f"{'-':>7}"
    return f"{pages:>6}  {seconds:8.2f}  {rate}  {per_page}"


def write_readings(
    folder: Path, runs: tuple[ModelRun, ModelRun], compared: list[DocumentComparison]
) -> list[Path]:
    """`<label>.<model>.md` for each model that read a document and `<label>.diff` (A's
    reading against B's) where both did, under `folder`; the files written."""
    names = tuple(run.model for run in runs)
    written = []
    for comparison in compared:
        base = _inside(folder, comparison.label)
        base.parent.mkdir(parents=True, exist_ok=True)
        texts = [reading.markdown for reading in comparison.readings]
        for name, text in zip(names, texts, strict=True):
            if text is not None:
                written.append(_write(base.with_name(f"{base.name}.{name}.md"), text))
        if texts[0] is not None and texts[1] is not None:
            files = [f"{comparison.label}.{name}.md" for name in names]
            diff = unified_diff(texts[0], texts[1], *files)
            written.append(_write(base.with_name(f"{base.name}.diff"), diff))
    return written


def _inside(folder: Path, label: str) -> Path:
    """Where a document's files go: its label's path below `folder`, never above it."""
    parts = [part for part in PurePosixPath(label).parts if part not in ("/", ".", "..")]
    return folder.joinpath(*parts) if parts else folder / "document"


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    return path
