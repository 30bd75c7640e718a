"""Hooks after settling: a command with the document's facts in its environment, a webhook
retried until it answers, and a hook that hangs; none of them delays or changes settling."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import write_config
from helpers import make_pdf
from test_http import base_url, metric

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
        config = write_config(tmp_path, {"hooks": hooks})
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
        assert metric(metrics, "ocrd_hook_runs_total", event="on_done", kind="command",
                      result="ok") == 1  # fmt: skip
        assert metric(metrics, "ocrd_hook_runs_total", event="on_failed", kind="webhook",
                      result="ok") == 1  # fmt: skip
        assert metric(metrics, "ocrd_hook_runs_total", event="on_failed", kind="command",
                      result="timeout") == 1  # fmt: skip
        assert daemon.stop() == 0
    finally:
        receiver.close()

    [facts] = [json.loads(line) for line in record.read_text().splitlines()]
    assert facts["argv"] == ["--flag", "a b"]
    assert facts["OCRD_EVENT"] == "done" and facts["OCRD_PATH"] == "letter.pdf"
    assert facts["OCRD_PAGES"] == "2"
    assert Path(facts["OCRD_MARKDOWN"]).read_text().startswith("# Simulated page 1")
    assert Path(facts["OCRD_ORIGINAL"]) == tmp_path / "data" / "done" / "letter.pdf"
    assert json.loads(facts["OCRD_SUMMARY"])["outcome"] == "done"
    [output] = [e for e in daemon.find("hook.finished") if e.get("kind") == "command"]
    assert output["output"] == "recorded letter.pdf"

    headers, body = receiver.received[-1]
    assert len(receiver.received) == 3  # two failures, then accepted
    assert headers["X-Ocrd-Secret"] == "shared-secret"
    assert body["event"] == "failed" and body["path"] == "broken.pdf"
    assert "not a PDF" in body["reason"] and body["text"].startswith("ocrd: broken.pdf failed")
    assert (tmp_path / "data" / "failed" / "broken.pdf").exists()
