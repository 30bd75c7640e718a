"""Two inboxes on two models, on real vLLM (CPU, random weights): one `ocrd run` holds an
in-process vLLM engine for DeepSeek-OCR-2 and one for LightOnOCR-2 (tests/tiny_models.py),
and each inbox's pages go to its own model's engine, prompted its own way (DeepSeek-OCR-2's
prompt as written, LightOnOCR-2's chat template around the image alone)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import files_under
from helpers import make_pdf
from tiny_model import vllm_engine_section
from tiny_models import BUILDERS

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

PAGE = {"max_image_side": 768, "settle_seconds": 0.5, "retry_unfinished": False}


def test_two_inboxes_on_two_models_each_read_by_its_own_vllm_engine(
    tmp_path: Path, tiny_model: Path, start_daemon: Any
) -> None:
    lighton = BUILDERS["lightonocr"](tmp_path / "lightonocr-tiny")
    engine = vllm_engine_section(tiny_model)
    engine["models"] = {"lightonocr-2": {"vllm": {"model": str(lighton.folder)}}}
    inboxes = {"deepseek": "deepseek-ocr-2", "lighton": "lightonocr-2"}
    for folder in inboxes:
        (tmp_path / folder / "inbox").mkdir(parents=True)
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "inboxes": [
                    {**PAGE, "path": f"{folder}/inbox", "model": model, "keep_raw": True}
                    for folder, model in inboxes.items()
                ],
                "engine": engine,
                "pipeline": {"status_interval_seconds": 1},
                "http": {"listen": "127.0.0.1:0"},
            }
        )
    )
    daemon = start_daemon(config)
    url = f"http://{daemon.wait_for('http.listening', timeout=60)[0]['address']}"
    daemon.wait_for("daemon.ready", timeout=600)
    for folder in inboxes:
        make_pdf(tmp_path / folder / "inbox" / f"{folder}.pdf", 1)
    finished = daemon.wait_for("document.finished", timeout=600, count=2)
    status = httpx.get(f"{url}/api/status", timeout=60).json()
    assert daemon.stop() == 0

    assert {e["path"]: (e["outcome"], e["model"]) for e in finished} == {
        f"{folder}.pdf": ("done", model) for folder, model in inboxes.items()
    }
    for folder, model in inboxes.items():
        [page] = daemon.find("page.recognised", path=f"{folder}.pdf")
        assert page["model"] == model and page["completion_tokens"] > 0
        assert f"{folder}.md" in files_under(tmp_path / folder / "outbox")
        [record] = [
            json.loads(line)
            for line in (tmp_path / folder / "outbox" / f"{folder}.raw.jsonl").open()
            if '"page"' in line
        ]
        assert record["model"] == model
    assert sorted(r["model"] for r in status["replicas"]) == sorted(inboxes.values())
    assert all(r["state"] == "ready" for r in status["replicas"])
