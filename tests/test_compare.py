"""`ocrd compare`: a user's sample read by two configured models, side by side.

The engines are ocrd's simulated ones (they read nothing), each standing in for its model by
answering in that model's own format, and differently where the model's recipe sends the page
at another size: DeepSeek-OCR-2 in ocrd's process, LightOnOCR-2 on a simulated server (a real
process speaking `vllm serve`'s HTTP) reached as a fleet is, self-check included. Real PDFs
from the corpus, read in place; a real `ocrd compare` process.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pymupdf
import pytest
from conftest import write_config
from fleet import free_port
from helpers import make_pdf
from routed_fleet import wait_serving

from ocrd.text.agreement import agreement, words

pytestmark = pytest.mark.slow

MODELS = ("deepseek-ocr-2", "lightonocr-2")
REAL = ("ocrmypdf__skew.pdf", "sample-files__pdflatex-4-pages.pdf")


def ocrd_compare(
    config: Path, *args: str, models: tuple[str, ...] = MODELS
) -> subprocess.CompletedProcess[str]:
    chosen = [part for model in models for part in ("--model", model)]
    command = [sys.executable, "-m", "ocrd", "compare", "--config", str(config), *chosen, *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


@contextlib.contextmanager
def lighton_server(*options: str) -> Iterator[str]:
    """A simulated LightOnOCR-2 server on a loopback port (its URL), run with `options`."""
    port = free_port()
    argv = [sys.executable, "-m", "ocrd.engines.simulated_server", "--replica", "1"]
    argv += ["--port", str(port), "--seconds-per-page", "0.01", "--model", "lightonocr-2"]
    process = subprocess.Popen([*argv, *options], stdout=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_serving(url, process, "the simulated lightonocr-2 server")
        yield f"{url}/v1"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()


def served_by(url: str, **openai: object) -> dict[str, object]:
    """engine.models' entry for LightOnOCR-2 on the server at `url`, self-check on."""
    served = {"base_urls": [url], **openai}
    return {"lightonocr-2": {"kind": "openai", "self_check": True, "openai": served}}


def row(stdout: str, first: str, model: str) -> list[str]:
    """The cells after `model` on the table's line for document `first` (a document's
    model lines follow its first line)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    for line in lines[start : start + 4]:
        cells = line[len(first) :].split() if line.startswith(first) else line.split()
        if cells and cells[0] == model:
            return cells[1:]
    raise AssertionError(f"no {model} line for {first} in:\n{stdout}")


def test_a_sample_read_by_two_models_shows_their_pace_agreement_and_diffs(
    corpus: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "scans"
    folder.mkdir()
    make_pdf(folder / "letter.pdf", 2)
    (folder / "notes.txt").write_text("not a page\n")
    (folder / "linked.pdf").symlink_to(corpus / "real" / "ocrmypdf__linn.pdf")
    real = [corpus / "real" / name for name in REAL]
    out, record = tmp_path / "diffs", tmp_path / "requests.log"

    with lighton_server("--answers-test-page", "--record-file", str(record)) as url:
        config = write_config(tmp_path, engine={"models": served_by(url)})
        result = ocrd_compare(config, *map(str, real), str(folder), "--diff", str(out))

    assert result.returncode == 0, result.stderr
    assert "left out of the sample: scans/notes.txt: not a PDF" in result.stderr
    assert "left out of the sample: scans/linked.pdf: a symbolic link, never followed" in (
        result.stderr
    )
    assert "linked" not in result.stdout
    assert "A: deepseek-ocr-2, engine simulated" in result.stdout
    assert "B: lightonocr-2, engine openai" in result.stdout
    pages = {path.name: pymupdf.open(path).page_count for path in real}
    pages["scans/letter.pdf"] = 2
    for label, count in pages.items():
        for model in MODELS:
            cells = row(result.stdout, label, model)
            assert int(cells[0]) == count  # pages, then seconds, pages/s, s/page
            assert float(cells[2]) > 0 and float(cells[3]) > 0
    # Every page went to the LightOnOCR-2 server, after the test page it had to read.
    sent = record.read_text().count("POST /v1/chat/completions")
    assert sent == sum(pages.values()) + 1

    matched, read = 0, 0
    for label, count in pages.items():
        texts = tuple((out / f"{label}.{model}.md").read_text() for model in MODELS)
        for text in texts:
            for page in range(1, count + 1):
                assert f"# Simulated page {page}\n" in text
        found = agreement(*texts)
        assert _agreement_shown(result.stdout, label) == f"{found.ratio:.3f}"
        matched, read = matched + found.matched, read + found.words_a + found.words_b
        diff = out / f"{label}.diff"
        assert _patched(out / f"{label}.{MODELS[0]}.md", diff) == texts[1]
        if texts[0] != texts[1]:
            names = [f"{label}.{model}.md" for model in MODELS]
            assert diff.read_text().startswith(f"--- {names[0]}\n+++ {names[1]}\n")
    assert 0 < 2 * matched / read < 1  # the answers differ where the models' image sizes do
    assert _agreement_shown(result.stdout, "total (3 documents)") == f"{2 * matched / read:.3f}"
    assert f"{3 * len(pages)} files written to {out}" in result.stdout


def _patched(reading: Path, diff: Path) -> str:
    """`reading` with `diff` applied by GNU patch: the other model's reading, if the diff
    is a true unified diff of the two."""
    if not diff.read_text():
        return reading.read_text()  # no difference: patch takes an empty diff for garbage
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder, "patched.md")
        command = ["patch", "--quiet", "-o", str(result), str(reading), str(diff)]
        subprocess.run(command, check=True, capture_output=True)
        return result.read_text()


def _agreement_shown(stdout: str, first: str) -> str:
    """The agreement the table shows on the lines of document `first` (or the total)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(first))
    block = "\n".join(lines[start : start + 4])
    [shown] = re.findall(r"agreement\s+(\S+) of the words", block)
    return shown


def test_a_document_no_model_can_read_is_named_and_fails_the_run(
    corpus: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path, engine={"models": {"lightonocr-2": {}}})
    locked = corpus / "real" / "sample-files__libreoffice-writer-password.pdf"
    readable = corpus / "real" / "ocrmypdf__skew.pdf"
    out = tmp_path / "diffs"

    result = ocrd_compare(config, str(locked), str(readable), "--diff", str(out))

    assert result.returncode == 1, result.stderr
    for model in MODELS:
        assert row(result.stdout, locked.name, model)[:2] == ["failed:", "encrypted,"]
        assert f"{model}: {locked.name}: failed: encrypted" in result.stderr
    written = {f"{readable.name}.{model}.md" for model in MODELS} | {f"{readable.name}.diff"}
    assert {path.name for path in out.iterdir()} == written


def test_what_compare_cannot_use_is_refused_with_the_reason(tmp_path: Path) -> None:
    config = write_config(tmp_path, engine={"models": {"lightonocr-2": {}}})
    sample = make_pdf(tmp_path / "one.pdf", 1)

    unserved = ocrd_compare(config, str(sample), models=("deepseek-ocr-2", "olmocr-2"))
    assert unserved.returncode == 2
    assert "'olmocr-2': the configuration serves no such model" in unserved.stderr
    assert "it serves: deepseek-ocr-2, lightonocr-2" in unserved.stderr

    one = ocrd_compare(config, str(sample), models=("deepseek-ocr-2",))
    assert one.returncode == 2 and "give two different models" in one.stderr

    missing = ocrd_compare(config, str(tmp_path / "gone.pdf"))
    assert missing.returncode == 2 and "gone.pdf: no such file or folder" in missing.stderr

    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = ocrd_compare(config, str(empty))
    assert nothing.returncode == 2 and "no PDF or image to read in" in nothing.stderr

    broken = tmp_path / "broken.yaml"
    broken.write_text(config.read_text().replace("kind: simulated", "kind: quantum"))
    refused = ocrd_compare(broken, str(sample))
    assert refused.returncode == 78 and str(broken) in refused.stderr

    closed = f"http://127.0.0.1:{free_port()}/v1"
    away = write_config(tmp_path / "away", engine={"models": served_by(closed)})
    unreachable = ocrd_compare(away, str(sample))
    assert unreachable.returncode == 69
    assert "lightonocr-2: its openai engine is unreachable after its start" in unreachable.stderr
    assert unreachable.stdout == ""  # nothing was read, nothing shown

    # A server that fails ocrd's test page is sent no page of the sample.
    record = tmp_path / "garbling.log"
    with lighton_server("--garble", "--record-file", str(record)) as url:
        # No second test page within the run: the first try's answer is what counts.
        models = served_by(url, retry_backoff_seconds=600)
        garbling = write_config(tmp_path / "garbling", engine={"models": models})
        garbled = ocrd_compare(garbling, str(sample), models=("lightonocr-2", "deepseek-ocr-2"))
    assert garbled.returncode == 69
    assert "lightonocr-2: its openai engine is garbled after its start" in garbled.stderr
    assert record.read_text().count("POST /v1/chat/completions") == 1  # the test page alone
    assert garbled.stdout == ""


def test_readings_that_differ_only_in_markup_agree_fully() -> None:
    """Two models that read the same words agree fully however each lays them out; a
    word only one of them read counts its characters on that side."""
    html = "<table><tr><td>Tracks</td><td>32</td></tr></table>\n\n![](fig.png)\n\nSee **you**"
    markdown = "| Tracks | 32 |\n| --- | --- |\n\n# See you"
    assert words(html) == words(markdown) == ["tracks", "32", "see", "you"]
    assert agreement(html, markdown).ratio == 1.0
    differs = agreement("Tracks 32 see you", "Tracks 33 see you soon")
    assert (differs.matched, differs.only_a, differs.only_b) == (3, 2, 6)
    assert differs.ratio == pytest.approx(6 / 9)
