"""Inboxes on every model, on real vLLM (CPU, random weights): an `ocrd run` holds an
in-process vLLM engine for DeepSeek-OCR-2 and one for each of two other models ocrd reads
with vLLM's own code (olmOCR-2, LightOnOCR-2, GLM-OCR and PaddleOCR-VL, tiny folders from
tests/tiny_models.py, two a daemon), with an inbox on each. Every inbox gets the same real
PDFs from the corpus and writes every output kind (Markdown, searchable PDF,
DoclingDocument, chunks): each page goes to its own model's engine, prompted its own way
(DeepSeek-OCR-2's prompt as written, the others' chat templates), and its answer is read by
its model's parser. `ocrd compare` then reads a sample with two of them, each on its own
engine.

Two models a daemon: one daemon with all five engines peaked at 17.4 GiB (DeepSeek-OCR-2's
engine 4.7, each tiny one 2 to 2.8, the daemon 1.8), too close to a 24 GiB CI machine's
memory with the other test worker beside it; a daemon of three peaks at about 12. One a model
would start DeepSeek-OCR-2's engine four times (BENCHMARKS.md, "Every model on real vLLM")."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pymupdf
import pytest
import yaml
from docling_core.types.doc.document import DoclingDocument
from tiny_model import vllm_engine_section
from tiny_models import BUILDERS

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

# Pages at most 768 px; random weights never stop by themselves, so a second try of each
# unfinished page would double the work and test nothing. The PDFs' own text is never used:
# every page goes to its inbox's model.
PAGE = {
    "max_image_side": 768,
    "settle_seconds": 0.5,
    "retry_unfinished": False,
    "pdf_text": "ocr",
    "outputs": ["markdown", "pdf", "docling", "chunks"],
    "keep_raw": True,
}
FOLDERS = {  # the model an inbox names: the inbox's folder
    "deepseek-ocr-2": "deepseek",
    "olmocr-2": "olmocr",
    "lightonocr-2": "lighton",
    "glm-ocr": "glm",
    "paddleocr-vl-1.5": "paddle",
}
# The models beside DeepSeek-OCR-2, two a daemon: the heaviest tiny engine (GLM-OCR's) with
# the lightest (olmOCR-2's).
PAIRS = [("glm-ocr", "olmocr-2"), ("lightonocr-2", "paddleocr-vl-1.5")]
TINY = {  # model: its tiny folder's builder (DeepSeek-OCR-2's is the `tiny_model` fixture)
    "olmocr-2": "qwen2_5_vl",
    "lightonocr-2": "lightonocr",
    "glm-ocr": "glm_ocr",
    "paddleocr-vl-1.5": "paddleocr_vl",
}
# A scanned letter and a one-page document written with LibreOffice: 2 pages a model.
SOURCES = ("ocrmypdf__skew.pdf", "sample-files__002-trivial-libre-office-writer.pdf")


def engine_section(tmp_path: Path, deepseek: Path, others: tuple[str, ...]) -> dict[str, Any]:
    """DeepSeek-OCR-2 in the section's own settings, each other model in `models` with its
    tiny folder and the prompt length its page needs (its own image rule, not 257 tokens)."""
    engine = vllm_engine_section(deepseek)
    engine["models"] = {}
    for model in others:
        builder = TINY[model]
        tiny = BUILDERS[builder](tmp_path / f"{builder}-tiny")
        engine["models"][model] = {
            "vllm": {
                "model": str(tiny.folder),
                "max_model_len": 4096,
                "max_num_batched_tokens": 4096,
                "trust_remote_code": tiny.trust_remote_code,
            }
        }
    return engine


def write_config(tmp_path: Path, deepseek: Path, models: tuple[str, ...]) -> Path:
    for model in models:
        (tmp_path / FOLDERS[model] / "inbox").mkdir(parents=True)
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "inboxes": [
                    {**PAGE, "path": f"{FOLDERS[model]}/inbox", "model": model} for model in models
                ],
                "engine": engine_section(tmp_path, deepseek, models[1:]),
                "pipeline": {"status_interval_seconds": 1},
                "http": {"listen": "127.0.0.1:0"},
            }
        )
    )
    return config


def page_records(outbox: Path, stem: str) -> list[dict[str, Any]]:
    lines = (outbox / f"{stem}.raw.jsonl").read_text().splitlines()
    return [record for record in map(json.loads, lines) if "page" in record]


def check_outputs(outbox: Path, source: Path, model: str) -> None:
    """Every output kind of one document, as a user would open it."""
    stem = source.stem
    with pymupdf.open(source) as original:
        pages = original.page_count
    records = page_records(outbox, stem)
    assert [r["page"] for r in records] == list(range(1, pages + 1)), (model, records)
    assert all(r["model"] == model and r["text"] for r in records), (model, records)
    markdown = (outbox / f"{stem}.md").read_text()
    assert markdown.strip(), (model, stem)
    with pymupdf.open(outbox / f"{stem}.pdf") as searchable:
        assert searchable.page_count == pages
    docling = DoclingDocument.load_from_json(outbox / f"{stem}.docling.json")
    assert sorted(docling.pages) == list(range(1, pages + 1))
    chunks = [json.loads(line) for line in (outbox / f"{stem}.chunks.jsonl").open()]
    texts = {item.text for item in docling.texts}
    assert chunks and texts, (model, stem)
    # The chunks are the DoclingDocument's text items cut for retrieval: each on a page
    # of the document, its text one of the document's.
    for chunk in chunks:
        assert chunk["filename"] == f"{stem}.pdf"
        assert set(chunk["page_numbers"] or []) <= set(range(1, pages + 1))
        assert chunk["raw_text"] in texts or any(chunk["raw_text"] in t for t in texts)


@pytest.mark.parametrize("others", PAIRS, ids="+".join)
def test_an_inbox_on_each_model_beside_deepseek_each_read_by_its_own_vllm_engine(
    others: tuple[str, str], tmp_path: Path, corpus: Path, tiny_model: Path, start_daemon: Any
) -> None:
    models = ("deepseek-ocr-2", *others)
    daemon = start_daemon(write_config(tmp_path, tiny_model, models))
    url = f"http://{daemon.wait_for('http.listening', timeout=60)[0]['address']}"
    daemon.wait_for("daemon.ready", timeout=600)
    for model in models:
        for name in SOURCES:
            shutil.copy(corpus / "real" / name, tmp_path / FOLDERS[model] / "inbox" / name)
    expected = len(models) * len(SOURCES)
    finished = daemon.wait_for("document.finished", timeout=600, count=expected)
    status = httpx.get(f"{url}/api/status", timeout=60).json()
    assert daemon.stop() == 0

    outcomes = {(e["model"], e["path"]): e["outcome"] for e in finished}
    assert outcomes == {(model, name): "done" for model in models for name in SOURCES}
    for model in models:
        outbox = tmp_path / FOLDERS[model] / "outbox"
        for name in SOURCES:
            pages = daemon.find("page.recognised", path=name, model=model)
            assert pages and all(page["completion_tokens"] > 0 for page in pages)
            check_outputs(outbox, corpus / "real" / name, model)
    assert sorted(r["model"] for r in status["replicas"]) == sorted(models)
    assert all(r["state"] == "ready" for r in status["replicas"])


def test_ocrd_compare_reads_a_sample_with_two_models_each_on_its_own_vllm_engine(
    tmp_path: Path, corpus: Path
) -> None:
    """`ocrd compare` on real vLLM: LightOnOCR-2 and GLM-OCR (the two quickest tiny
    engines), one after the other as the command runs them, each page prompted and parsed
    as its model's; both read every page, and each reading is written for the diff."""
    lighton = BUILDERS["lightonocr"](tmp_path / "lightonocr-tiny")
    glm = BUILDERS["glm_ocr"](tmp_path / "glm_ocr-tiny")
    wide = {"max_model_len": 4096, "max_num_batched_tokens": 4096}
    engine = vllm_engine_section(lighton.folder, **wide)
    engine["model"] = "lightonocr-2"
    engine["models"] = {"glm-ocr": {"vllm": {"model": str(glm.folder), **wide}}}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"inboxes": [{"path": "inbox"}], "engine": engine}))
    (tmp_path / "inbox").mkdir()
    sample = corpus / "real" / SOURCES[1]
    out = tmp_path / "diffs"

    command = [sys.executable, "-m", "ocrd", "compare", "--config", str(config)]
    command += ["--model", "lightonocr-2", "--model", "glm-ocr", str(sample), "--diff", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)

    assert result.returncode == 0, result.stderr[-3000:]
    assert "A: lightonocr-2, engine vllm" in result.stdout, result.stdout
    assert "B: glm-ocr, engine vllm" in result.stdout, result.stdout
    lines = result.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(sample.name))
    for model in ("lightonocr-2", "glm-ocr"):
        [cells] = [
            line.split()[1:] for line in lines[start + 1 : start + 4] if line.split()[0] == model
        ]
        assert int(cells[0]) == 1 and float(cells[2]) > 0, result.stdout  # pages, s, pages/s
        assert (out / f"{sample.name}.{model}.md").read_text().strip()
    assert (out / f"{sample.name}.diff").exists()
