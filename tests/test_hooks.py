"""Hooks after settling: a command with the document's facts in its environment, a webhook
retried until it answers, and a hook that hangs; none of them delays or changes settling."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pymupdf
import pytest
import yaml
from conftest import write_config
from helpers import make_pdf
from separator_sheets import LETTERS, LETTERS_PARTS, stack_pdf
from test_http import base_url, metric

from ocrd.config import InboxEntry
from ocrd.domain import DocumentSummary, Outcome
from ocrd.output.hooks import Hooks

pytestmark = pytest.mark.slow


class WebhookReceiver:
    """A chat service's incoming webhook on loopback that fails its first `failures` posts."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.received: list[tuple[dict[str, str], dict[str, Any]]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.received.append((dict(self.headers), body))
                status = 500 if len(receiver.received) <= receiver.failures else 204
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_hooks_run_after_settling_and_never_hold_it_up(tmp_path: Path, start_daemon) -> None:
    record = tmp_path / "hook-record.jsonl"
    script = tmp_path / "record_hook.py"
    script.write_text(
        "import json, os, sys\n"
        "facts = {k: v for k, v in os.environ.items() if k.startswith('OCRD_')}\n"
        "facts['argv'] = sys.argv[1:]\n"
        f"open({str(record)!r}, 'a').write(json.dumps(facts) + '\\n')\n"
        "print('recorded', facts['OCRD_PATH'])\n"
    )
    receiver = WebhookReceiver(failures=2)
    try:
        hooks = {
            "on_done": {"command": [sys.executable, str(script), "--flag", "a b"]},
            "on_failed": {
                "webhook": {"url": receiver.url, "secret_env": "HOOK_SECRET"},
                "command": [sys.executable, "-c", "import time; time.sleep(60)"],
                "timeout_seconds": 1,
            },
        }
        config = write_config(tmp_path, {"hooks": hooks, "outputs": ["markdown", "pdf"]})
        daemon = start_daemon(config, env={"HOOK_SECRET": "shared-secret"})
        url = base_url(daemon)
        daemon.wait_for("daemon.ready")
        inbox = tmp_path / "data" / "inbox"
        make_pdf(inbox / "letter.pdf", 2)
        (inbox / "broken.pdf").write_text("this is no PDF")
        daemon.wait_for("document.finished", count=2)
        daemon.wait_for("hook.finished", count=2, timeout=60)  # the command and the webhook
        [killed] = daemon.wait_for("hook.failed", timeout=30)
        order = [(e["event"], e.get("doc")) for e in daemon.events if "doc" in e]
        for index, (event, doc) in enumerate(order):  # every hook after its settlement
            if event.startswith("hook."):
                assert ("document.finished", doc) in order[:index]
        assert "killed" in killed["error"] and killed["hook"] == "on_failed"
        retries = daemon.find("hook.retrying")
        assert len(retries) == 2 and retries[0]["retry_in_seconds"] == 1.0
        metrics = httpx.get(f"{url}/metrics").text
        assert (
            metric(metrics, "ocrd_hook_runs_total", event="on_done", kind="command", result="ok")
            == 1
        )
        assert (
            metric(metrics, "ocrd_hook_runs_total", event="on_failed", kind="webhook", result="ok")
            == 1
        )
        assert (
            metric(
                metrics, "ocrd_hook_runs_total", event="on_failed", kind="command", result="timeout"
            )
            == 1
        )
        assert daemon.stop() == 0
    finally:
        receiver.close()

    [facts] = [json.loads(line) for line in record.read_text().splitlines()]
    assert facts["argv"] == ["--flag", "a b"]
    assert facts["OCRD_EVENT"] == "done" and facts["OCRD_PATH"] == "letter.pdf"
    assert facts["OCRD_PAGES"] == "2"
    assert Path(facts["OCRD_MARKDOWN"]).read_text().startswith("# Simulated page 1")
    assert Path(facts["OCRD_ORIGINAL"]) == tmp_path / "data" / "done" / "letter.pdf"
    assert Path(facts["OCRD_PDF"]) == Path(facts["OCRD_MARKDOWN"]).with_suffix(".pdf")
    assert Path(facts["OCRD_PDF"]).read_bytes().startswith(b"%PDF")
    assert json.loads(facts["OCRD_SUMMARY"])["outcome"] == "done"
    [output] = [e for e in daemon.find("hook.finished") if e.get("kind") == "command"]
    assert output["output"] == "recorded letter.pdf"

    headers, body = receiver.received[-1]
    assert len(receiver.received) == 3  # two failures, then accepted
    assert headers["X-Ocrd-Secret"] == "shared-secret"
    assert body["event"] == "failed" and body["path"] == "broken.pdf"
    assert "not a PDF" in body["reason"] and body["text"].startswith("ocrd: broken.pdf failed")
    assert (tmp_path / "data" / "failed" / "broken.pdf").exists()


def test_a_hook_that_floods_output_and_leaves_children_is_bounded(
    tmp_path: Path, start_daemon
) -> None:
    """One command writes 50 MB to its output, another starts a child and then outlives
    its time limit: only the flood's tail is kept, the second is killed with its child,
    and documents keep converting."""
    child_pid = tmp_path / "child.pid"
    flood = "import sys\nfor _ in range(800): sys.stdout.write('x' * 65535 + '\\n')\nprint('END')"
    hooks = {
        "on_done": {"command": [sys.executable, "-c", flood]},
        "on_failed": {
            "command": ["sh", "-c", f"sleep 300 & echo $! > {child_pid}; wait"],
            "timeout_seconds": 2,
        },
    }
    config = write_config(tmp_path, {"hooks": hooks})
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready")
    inbox = tmp_path / "data" / "inbox"
    make_pdf(inbox / "letter.pdf", 1)
    (inbox / "broken.pdf").write_text("not a PDF")
    [flooded] = daemon.wait_for("hook.finished", timeout=120)
    [killed] = daemon.wait_for("hook.failed", timeout=60)
    make_pdf(inbox / "next.pdf", 1)
    daemon.wait_for("document.finished", path="next.pdf", timeout=60)
    assert daemon.stop() == 0

    assert flooded["output"].endswith("x\nEND")
    assert flooded["output"].startswith(f"[{800 * 65536 + 4 - 4000} bytes before]\n")
    assert len(flooded["output"]) < 5000
    assert "killed with the processes it started" in killed["error"]
    assert not running(int(child_pid.read_text()))  # the background child died with its group


def running(pid: int) -> bool:
    """Whether the process is alive (a zombie nobody reaped yet is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_a_large_summary_reaches_the_hook_command_as_a_file(tmp_path: Path) -> None:
    """A 40,000-page document's summary is too large for the environment (the kernel
    refuses a variable over 128 KiB): the command finds it in OCRD_SUMMARY_FILE."""
    result = tmp_path / "result.json"
    script = (
        "import json, os\n"
        "summary = json.load(open(os.environ['OCRD_SUMMARY_FILE']))\n"
        f"json.dump({{'in_env': 'OCRD_SUMMARY' in os.environ, "
        f"'blank': len(summary['blank_pages']), 'file': os.environ['OCRD_SUMMARY_FILE']}}, "
        f"open({str(result)!r}, 'w'))\n"
    )
    hooks = {"on_done": {"command": [sys.executable, "-c", script]}}
    inbox = InboxEntry(path=tmp_path, hooks=hooks).located(tmp_path)
    summary = DocumentSummary(
        doc="d1",
        inbox=str(tmp_path),
        path="book.pdf",
        outcome=Outcome.done,
        seconds=1.0,
        pages=40_000,
        blank_pages=list(range(1, 40_001)),
        markdown=str(tmp_path / "book.md"),
    )

    async def run() -> Path:
        hooks = Hooks()
        hooks.document_finished(inbox, summary)
        await asyncio.wait_for(asyncio.gather(*hooks._tasks), 60)
        await hooks.stop()
        return result

    asyncio.run(run())
    seen = json.loads(result.read_text())
    assert (seen["in_env"], seen["blank"]) == (False, 40_000)
    assert not Path(seen["file"]).exists()  # removed once the command ended


def test_webhooks_cut_off_by_a_stop_are_logged(tmp_path: Path, start_daemon) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts, never answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
        hooks = {"on_done": {"webhook": {"url": url, "timeout_seconds": 300}}}
        config = write_config(tmp_path, {"hooks": hooks})
        daemon = start_daemon(config)
        daemon.wait_for("daemon.ready")
        make_pdf(tmp_path / "data" / "inbox" / "letter.pdf", 1)
        daemon.wait_for("document.finished", timeout=60)
        time.sleep(0.5)  # the delivery is under way
        assert daemon.stop() == 0
    finally:
        silent.close()
    [cancelled] = daemon.find("hook.cancelled")
    assert cancelled["url"] == url and cancelled["path"] == "letter.pdf"
    assert "not delivered" in cancelled["reason"]


def readme_block(language: str, containing: str) -> str:
    """The manual's fenced `language` block (docs/operations.md) that contains `containing`."""
    readme = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    blocks = re.findall(rf"```{language}\n(.*?)```", readme, re.S)
    [block] = [b for b in blocks if containing in b]
    return str(block)


def test_the_readme_paperless_hook_hands_over_every_part_of_a_split_batch(
    tmp_path: Path, start_daemon
) -> None:
    """The README's hook script and its `on_done`, as written (only the script's path and
    the consume folder are this test's): each part's searchable PDF reaches the consume
    folder, the same bytes as in the outbox."""
    script = tmp_path / "ocrd-to-paperless"
    script.write_text(readme_block("sh", "ocrd-to-paperless"))
    script.chmod(0o755)
    on_done = yaml.safe_load(readme_block("yaml", "ocrd-to-paperless"))["inboxes"][0]["hooks"]
    assert on_done["on_done"]["command"] == ["/usr/local/bin/ocrd-to-paperless"]
    hooks = {"on_done": {"command": [str(script)]}}
    consume = tmp_path / "consume"
    consume.mkdir()
    inbox = {"hooks": hooks, "outputs": ["markdown", "pdf"], "split_on": ["patch_t"]}
    config = write_config(tmp_path, inbox)
    daemon = start_daemon(config, env={"PAPERLESS_CONSUMPTION_DIR": str(consume)})
    stack_pdf(LETTERS, tmp_path / "batch.pdf").rename(tmp_path / "data" / "inbox" / "batch.pdf")
    daemon.wait_for("hook.finished", count=3, timeout=180)
    assert daemon.stop() == 0
    outbox = tmp_path / "data" / "outbox"
    names = [f"batch-{k}.pdf" for k in (1, 2, 3)]
    assert sorted(p.name for p in consume.iterdir()) == names
    for name in names:
        assert (consume / name).read_bytes() == (outbox / name).read_bytes()
    assert sorted(e["part"] for e in daemon.find("hook.finished")) == ["1/3", "2/3", "3/3"]


def test_each_part_of_a_split_document_gets_its_own_hook_run_and_webhook_delivery(
    tmp_path: Path, start_daemon
) -> None:
    record = tmp_path / "hook-record.jsonl"
    script = (
        "import json, os\n"
        "facts = {k: v for k, v in os.environ.items() if k.startswith('OCRD_')}\n"
        f"open({str(record)!r}, 'a').write(json.dumps(facts) + '\\n')\n"
    )
    receiver = WebhookReceiver(failures=0)
    try:
        hooks = {
            "on_done": {"command": [sys.executable, "-c", script], "webhook": {"url": receiver.url}}
        }
        inbox = {"hooks": hooks, "outputs": ["markdown", "pdf"], "split_on": ["patch_t"]}
        daemon = start_daemon(write_config(tmp_path, inbox))
        url = base_url(daemon)
        stack_pdf(LETTERS, tmp_path / "data" / "inbox" / "batch.pdf")
        daemon.wait_for("hook.finished", count=6, timeout=180)
        metrics = httpx.get(f"{url}/metrics").text
        assert daemon.stop() == 0
    finally:
        receiver.close()
    outbox, done = tmp_path / "data" / "outbox", tmp_path / "data" / "done"
    runs = sorted(
        (json.loads(line) for line in record.read_text().splitlines()),
        key=lambda facts: facts["OCRD_PART"],
    )
    bodies = sorted((body for _, body in receiver.received), key=lambda b: b["part"]["number"])
    assert [facts["OCRD_PART"] for facts in runs] == ["1/3", "2/3", "3/3"]
    for number, (facts, body) in enumerate(zip(runs, bodies, strict=True), start=1):
        pages = LETTERS_PARTS[number - 1]
        assert facts["OCRD_MARKDOWN"] == body["markdown"] == str(outbox / f"batch-{number}.md")
        assert facts["OCRD_PDF"] == body["pdf"] == str(outbox / f"batch-{number}.pdf")
        assert facts["OCRD_PAGES"] == str(len(pages)) and body["pages"] == len(pages)
        assert facts["OCRD_ORIGINAL"] == body["original"] == str(done / "batch.pdf")
        assert body["part"] == {"number": number, "of": 3}
        assert [part["pages"] for part in body["parts"]] == LETTERS_PARTS
        assert f"(part {number} of 3)" in body["text"]
        with pymupdf.open(facts["OCRD_PDF"]) as pdf:
            assert pdf.page_count == len(pages)
    assert len({facts["OCRD_DOCUMENT_ID"] for facts in runs}) == 1
    for kind in ("command", "webhook"):
        assert metric(metrics, "ocrd_hook_runs_total", event="on_done", kind=kind, result="ok") == 3
