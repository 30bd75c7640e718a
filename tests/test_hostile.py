"""The whole hostile corpus through `ocrd run`: each file ends in done/ or failed/ with a reason."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from conftest import files_under, write_config
from helpers import make_pdf

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from check_invariants import check

pytestmark = pytest.mark.slow

PASSWORDS = [
    "ELXRTQWS",
    "abc",
    "Hello",
]  # pdf.js' test manifest: issue3371, issue6010_1, bug1782186


def test_hostile_corpus_ends_with_reasons_and_the_daemon_keeps_serving(
    corpus: Path, tmp_path: Path, start_daemon
) -> None:
    dropped = tmp_path / "dropped"
    shutil.copytree(corpus / "hostile", dropped)
    (dropped / "zero-bytes.pdf").touch()
    (dropped / "text-named-pdf.pdf").write_text("Dear reader, this is not a PDF.\n")
    config = write_config(
        tmp_path,
        {"passwords": PASSWORDS},
        engine={"kind": "simulated", "simulated": {"seconds_per_page": 0.02, "capacity": 32}},
        pipeline={"page_render_timeout_seconds": 30},
    )
    data = tmp_path / "data"
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready")
    shutil.copytree(dropped, data / "inbox", dirs_exist_ok=True)
    count = len(files_under(dropped))
    daemon.wait_for("document.finished", timeout=600, count=count)

    make_pdf(data / "inbox" / "after.pdf", 1)  # still serving other files
    daemon.wait_for("document.finished", timeout=60, path="after.pdf")
    assert daemon.stop() == 0

    shutil.copy(data / "done" / "after.pdf", dropped / "after.pdf")
    problems, summary = check(
        dropped, data / "inbox", data / "outbox", data / "done", data / "failed", data / "work"
    )
    assert problems == [], "\n".join(problems)
    assert summary["inputs"] == count + 1

    reasons = {
        path.name: json.loads(path.read_text())["message"]
        for path in (data / "failed").glob("*.error.json")
    }
    for name in ("pdf-js__issue3371.pdf", "pdf-js__issue6010_1.pdf", "pdf-js__bug1782186.pdf"):
        assert (data / "done" / name).exists(), f"{name} should open with its password"
    assert (data / "done" / "pdf-js__empty_protected.pdf").exists()  # owner password only
    assert reasons["zero-bytes.error.json"] == "the file is empty (0 bytes)"
    assert reasons["text-named-pdf.error.json"].startswith("not a PDF, TIFF, PNG or JPEG file")
    assert reasons["qpdf__empty.error.json"].startswith("no pages")
    assert reasons["pdf-js__encrypted-attachment.error.json"].startswith(
        "encrypted, no password matched"
    )
    assert "over the limit" in reasons["ocrmypdf__hugemono.error.json"]
    assert reasons["ocrmypdf__hugemono.error.json"].startswith("page 1 is 16800x16800 px")
    assert all(reason.strip() for reason in reasons.values())
