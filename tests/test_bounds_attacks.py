"""Attacks on the bounds of what an inference server may answer and on StrictModes, kept
as tests: each was a hole, found by trying it, and is closed; the gzip bomb and the answer
trickling in held already, and stay as tests of the bounds they meet.

The servers are hostile stand-ins (tests/test_worker_answers.py's HostileWorker: aiohttp on
loopback, named as such), behind ocrd's real `openai` engine in a real daemon. The hooks
are real files with real modes, judged by the real `ocrd check-config`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from aiohttp import web
from conftest import wait_until, write_config
from helpers import make_pdf
from prometheus_client.parser import text_string_to_metric_families
from test_worker_answers import (
    HIGH_WATER_BOUND_BYTES,
    MAX_TOKENS,
    Answerer,
    HostileWorker,
    MiB,
    completion,
    run_one_page,
    worker_config,
)

from ocrd.engines.replica_metrics import MAX_FAMILIES_PER_REPLICA
from ocrd.engines.sending import answer_limits

pytestmark = pytest.mark.slow


def answer_bytes(body: bytes) -> Answerer:
    async def answer(_: web.Request) -> web.StreamResponse:
        return web.Response(body=body, content_type="application/json")

    return answer


def with_usage(**usage: Any) -> bytes:
    body = completion("A page.")
    body["usage"] = usage
    return json.dumps(body).encode()


def with_content(content: Any) -> bytes:
    body = completion("A page.")
    body["choices"][0]["message"]["content"] = content
    return json.dumps(body).encode()


MALFORMED = {
    # json.loads raises RecursionError, not ValueError, past Python's recursion limit
    "choices-empty": (json.dumps({"choices": []}).encode(), "has no completion: IndexError"),
    "nested-a-million-deep": (b"[" * 1_000_000, "the answer is not JSON"),
    "content-a-list": (with_content(["A", "page"]), "its content is list, not text"),
    "content-a-number": (with_content(5), "its content is int, not text"),
    "tokens-infinite": (with_usage(prompt_tokens=10**400), "is not a number of tokens"),
    "tokens-negative": (with_usage(completion_tokens=-5), "is not a number of tokens"),
    "tokens-a-float": (
        json.dumps(completion("A page.")).encode().replace(b"257", b"1e999"),
        "is not a number of tokens",
    ),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_answer_fails_its_page_naming_the_server(
    tmp_path: Path, start_daemon: Any, name: str
) -> None:
    """Each was an exception ocrd did not expect (RecursionError, AttributeError,
    OverflowError, a metric counter's ValueError): the document failed as a bug in ocrd
    (`document.internal_error`, a traceback), not as the server's fault."""
    body, said = MALFORMED[name]
    worker = HostileWorker(answer_bytes(body))
    summary, _, daemon = run_one_page(tmp_path, start_daemon, worker)
    assert summary["outcome"] == "failed"
    [report_path] = (tmp_path / "data" / "failed").glob("*.error.json")
    report = json.loads(report_path.read_text())
    assert report["stage"] == "recognise" and report["page"] == 1
    assert worker.root in report["message"] and said in report["message"]
    assert worker.page_requests == 2  # the page's try and its one retry
    assert daemon.find("document.internal_error") == []


def test_a_finish_reason_per_page_makes_no_new_metric_series(
    tmp_path: Path, start_daemon: Any
) -> None:
    """A server giving each page its own finish reason made a new labelled series of
    `ocrd_pages_recognised` for each (memory, and /metrics, growing without end)."""
    reasons = iter(f"reason-{n}-" + "x" * 1000 for n in range(1000))

    async def answer(_: web.Request) -> web.StreamResponse:
        body = completion("A page.")
        body["choices"][0]["finish_reason"] = next(reasons)
        return web.json_response(body)

    worker = HostileWorker(answer)
    worker.start()
    try:
        daemon = start_daemon(worker_config(tmp_path, worker))
        [listening] = daemon.wait_for("http.listening", timeout=60)
        daemon.wait_for("daemon.ready", timeout=60)
        make_pdf(tmp_path / "data" / "inbox" / "pages.pdf", 3)
        [summary] = daemon.wait_for("document.finished", timeout=120)
        exposition = httpx.get(f"http://{listening['address']}/metrics").text
        assert daemon.stop() == 0
    finally:
        worker.stop()
    assert "reason-" not in exposition
    families = {family.name: family for family in text_string_to_metric_families(exposition)}
    reasons_seen = {s.labels["finish_reason"] for s in families["ocrd_pages_recognised"].samples}
    assert reasons_seen == {"unknown"}
    assert summary["finish_reasons"] == {"unknown": 3}


def tiny_families(size: int) -> str:
    lines, total, number = [], 0, 0
    while total < size:
        line = f"vllm:f{number} 1\n"
        lines.append(line)
        total += len(line)
        number += 1
    return "".join(lines)


def test_a_megabyte_of_tiny_metric_families_is_cut_at_the_family_bound(
    tmp_path: Path, start_daemon: Any
) -> None:
    """1 MiB of one-sample families (75,000) took the daemon's event loop seconds of CPU
    at each scrape, parsing each on its own, and came out six times larger."""
    worker = HostileWorker(answer_bytes(json.dumps(completion("A page.")).encode()))
    worker.metrics = tiny_families(1024 * 1024 - 100)
    worker.start()
    try:
        daemon = start_daemon(worker_config(tmp_path, worker))
        [listening] = daemon.wait_for("http.listening", timeout=60)
        daemon.wait_for("daemon.ready", timeout=60)
        exposition = httpx.get(f"http://{listening['address']}/metrics", timeout=60).text
        assert daemon.stop() == 0
    finally:
        worker.stop()
    names = {family.name for family in text_string_to_metric_families(exposition)}
    taken = sorted(name for name in names if name.startswith("vllm:f"))
    assert len(taken) == MAX_FAMILIES_PER_REPLICA
    assert "vllm:f0" in taken and f"vllm:f{MAX_FAMILIES_PER_REPLICA}" not in taken


def ocrd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocrd", *args], capture_output=True, text=True, timeout=120
    )


def writable_by_everyone_script(folder: Path) -> Path:
    script = folder / "notify.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o757)  # everyone may write it
    os.chmod(script, 0o757)
    return script


@pytest.mark.parametrize(
    "command",
    [
        ["env", "-S", "sh {script}"],
        ["/usr/bin/env", "--split-string=sh {script} --quiet"],
        ["env", "-vS", "sh {script}"],
        ["sh", "-c", ". {script}"],
        ["bash", "-c", 'exec {script} "$@"'],
        ["nice", "-n", "5", "{script}"],
        ["timeout", "60", "{script}"],
        ["nohup", "{script}"],
    ],
    ids=[
        "env-S",
        "env-split-string",
        "env-vS",
        "sh-c-dot",
        "bash-c-exec",
        "nice",
        "timeout",
        "nohup",
    ],
)
def test_a_script_run_through_a_runner_or_one_line_of_code_is_judged(
    tmp_path: Path, command: list[str]
) -> None:
    """The script that such a hook runs was never looked at: only `env`'s or `sh`'s own
    file, and for `nice`, `timeout`, `nohup` not even the arguments."""
    script = writable_by_everyone_script(tmp_path)
    hook = [part.format(script=script) for part in command]
    config = write_config(tmp_path, {"hooks": {"on_done": {"command": hook}}})
    checked = ocrd("check-config", "--config", str(config))
    assert checked.returncode == 78, checked.stderr
    assert f"{script} may be changed by others" in checked.stderr
    assert "everyone may write it" in checked.stderr


def test_the_same_runners_with_a_safe_script_pass(tmp_path: Path) -> None:
    """The control: the script writable by its owner alone passes in each form."""
    script = tmp_path / "notify.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o755)
    for command in (
        ["env", "-S", f"sh {script}"],
        ["sh", "-c", f". {script}"],
        ["nice", str(script)],
    ):
        config = write_config(tmp_path, {"hooks": {"on_done": {"command": command}}})
        checked = ocrd("check-config", "--config", str(config))
        assert checked.returncode == 0, (command, checked.stderr)


async def answer_gzip_bomb(request: web.Request) -> web.StreamResponse:
    """A completion of 200 MB of text, sent gzip-compressed in some 200 KB."""
    before, after = json.dumps(completion("TEXT")).encode().split(b"TEXT")
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: the gzip format
    parts = [packer.compress(before)]
    chunk = b"a" * MiB
    parts += [packer.compress(chunk) for _ in range(200)]
    parts += [packer.compress(after), packer.flush()]
    body = b"".join(parts)
    return web.Response(
        body=body, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}
    )


def test_a_gzip_bomb_is_bounded_by_its_decoded_bytes(tmp_path: Path, start_daemon: Any) -> None:
    """The limit counts the bytes aiohttp decodes, not those on the wire: 200 KB of gzip
    that inflate to 200 MB fail the page at the limit, and are never held whole."""
    worker = HostileWorker(answer_gzip_bomb)
    summary, grown, _ = run_one_page(tmp_path, start_daemon, worker)
    assert summary["outcome"] == "failed"
    [report_path] = (tmp_path / "data" / "failed").glob("*.error.json")
    message = json.loads(report_path.read_text())["message"]
    byte_limit, _ = answer_limits(MAX_TOKENS)
    assert worker.root in message and f"longer than the limit of {byte_limit:,} bytes" in message
    assert grown < HIGH_WATER_BOUND_BYTES, f"the daemon's peak memory grew by {grown:,} bytes"


async def answer_a_byte_at_a_time(request: web.Request) -> web.StreamResponse:
    """A completion that trickles in a byte at a time, each a while after the last: it
    would take hours to finish."""
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    try:
        for byte in json.dumps(completion("A page. " * 1000)).encode():
            await response.write(bytes([byte]))
            await asyncio.sleep(0.5)
    except (ConnectionError, RuntimeError):
        pass
    return response


def test_an_answer_trickling_in_is_cut_at_the_request_timeout(
    tmp_path: Path, start_daemon: Any
) -> None:
    """There is a bound on an answer's whole time, not only on the wait for each byte."""
    worker = HostileWorker(answer_a_byte_at_a_time)
    timeout = 3
    worker.start()
    try:
        config = worker_config(tmp_path, worker)
        data = yaml.safe_load(config.read_text())
        data["engine"]["openai"]["request_timeout_seconds"] = timeout
        config.write_text(yaml.safe_dump(data))
        daemon = start_daemon(config)
        daemon.wait_for("daemon.ready", timeout=60)
        make_pdf(tmp_path / "data" / "inbox" / "page.pdf", 1)
        [summary] = daemon.wait_for("document.finished", timeout=120)
        assert daemon.stop() == 0
    finally:
        worker.stop()
    assert summary["outcome"] == "failed"
    [report_path] = (tmp_path / "data" / "failed").glob("*.error.json")
    message = json.loads(report_path.read_text())["message"]
    assert worker.root in message and f"no answer within {timeout} s" in message
    assert worker.page_requests == 2


def linked_config(tmp_path: Path, hop: str) -> tuple[Path, Path]:
    """A configuration given as `safe/...`, reached through a link lying in `shared/`, a
    folder everyone may write: (the path given to ocrd, the shared folder)."""
    real = tmp_path / "real"
    config = write_config(real)
    safe, shared = tmp_path / "safe", tmp_path / "shared"
    safe.mkdir()
    shared.mkdir()
    shared.chmod(0o777)
    if hop == "file":  # safe/ocrd.yaml -> shared/hop -> real/config.yaml
        (shared / "hop").symlink_to(config)
        (safe / "ocrd.yaml").symlink_to("../shared/hop")
        return safe / "ocrd.yaml", shared
    # safe/etc -> shared/etc -> real: a linked folder, /etc/ocrd as some systems make it
    (shared / "etc").symlink_to(real)
    (safe / "etc").symlink_to(shared / "etc")
    return safe / "etc" / "config.yaml", shared


@pytest.mark.parametrize("hop", ["file", "folder"])
def test_a_configuration_reached_through_a_link_in_a_folder_others_may_write_is_refused(
    tmp_path: Path, hop: str
) -> None:
    """Only the last file and the first link's folder were looked at: a link in the middle
    of a chain, in a folder everyone may write, could be pointed at anyone's file."""
    given, shared = linked_config(tmp_path, hop)
    checked = ocrd("check-config", "--config", str(given))
    assert checked.returncode == 78, checked.stderr
    assert f"configuration file {given} may be changed by others" in checked.stderr
    assert str(shared) in checked.stderr
    shared.chmod(0o755)  # the control: the same chain with the folder safe passes
    checked = ocrd("check-config", "--config", str(given))
    assert checked.returncode == 0, checked.stderr


def test_a_redirect_is_not_followed_to_another_address(tmp_path: Path, start_daemon: Any) -> None:
    """aiohttp follows redirects by default: a server answering 307 had ocrd post the page
    (and the server's key) to any address it named, one inside ocrd's network too. Now the
    server is taken down as wrongly listed, and the file waits rather than failing."""
    elsewhere = HostileWorker(answer_bytes(json.dumps(completion("Taken.")).encode()))
    elsewhere.start()

    async def redirect(_: web.Request) -> web.StreamResponse:
        raise web.HTTPTemporaryRedirect(f"{elsewhere.root}/v1/chat/completions")

    worker = HostileWorker(redirect)
    worker.start()
    try:
        daemon = start_daemon(worker_config(tmp_path, worker))
        daemon.wait_for("daemon.ready", timeout=60)
        make_pdf(tmp_path / "data" / "inbox" / "page.pdf", 1)
        said = wait_until(
            lambda: [line for line in daemon.raw if "answers with a redirect" in line],
            120,
            lambda: daemon.output(),
        )
        assert "HTTP 307" in said[0] and worker.root in said[0]
        assert daemon.stop() == 0
    finally:
        worker.stop()
        elsewhere.stop()
    assert elsewhere.page_requests == 0
    assert list((tmp_path / "data" / "failed").glob("*")) == []


async def answer_with_escapes(_: web.Request) -> web.StreamResponse:
    """A refusal whose text drives a terminal (a title, a cleared screen) and forges a line."""
    text = "\x1b]0;owned\x07\x1b[2J\n2026-01-01 ocrd daemon.ready all is well"
    return web.Response(status=400, text=text)


def test_a_servers_words_reach_reports_and_logs_without_control_characters(
    tmp_path: Path, start_daemon: Any
) -> None:
    """The start of a server's answer is quoted in the page's failure: in failed/'s report,
    the log, a hook's OCRD_REASON and a webhook's chat text. Its escapes went there raw."""
    worker = HostileWorker(answer_with_escapes)
    summary, _, _ = run_one_page(tmp_path, start_daemon, worker)
    assert summary["outcome"] == "failed"
    [report_path] = (tmp_path / "data" / "failed").glob("*.error.json")
    message = json.loads(report_path.read_text())["message"]
    assert "HTTP 400" in message and "\\x1b]0;owned\\x07" in message
    assert "\x1b" not in message and "\n" not in message and "\x07" not in message
    assert "\x1b" not in summary["reason"] and "\n" not in summary["reason"]
