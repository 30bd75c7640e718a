"""`ocrd run` with the vllm engine: real vLLM on the CPU, random weights, real processes."""

from __future__ import annotations

import json
import signal
import tomllib
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from conftest import claimed_originals, files_under, markdown_under, wait_until
from helpers import make_pdf
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from tiny_model import vllm_engine_section

from ocrd.engines.replicas import installed_vllm_version

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

# 257-token pages: about 8 s on 2 cores. Random weights never stop by themselves: a second
# try of each unfinished page (retry_unfinished) would double the work and test nothing.
PAGE = {"max_image_side": 768, "settle_seconds": 0.5, "retry_unfinished": False}


def vllm_config(folder: Path, model: Path, inboxes: list[dict], **pipeline: object) -> Path:
    for inbox in inboxes:
        (folder / inbox["path"]).mkdir(parents=True, exist_ok=True)
    data = {
        "inboxes": [{**PAGE, **inbox} for inbox in inboxes],
        "engine": vllm_engine_section(model),
        "pipeline": {"status_interval_seconds": 1, **pipeline},
        "http": {"listen": "127.0.0.1:0"},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def vllm_extra_range() -> SpecifierSet:
    """The versions pyproject.toml's [vllm] extra allows."""
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    [requirement] = project["project"]["optional-dependencies"]["vllm"]
    return SpecifierSet(requirement.removeprefix("vllm"))


def overlap(a: list[float], b: list[float]) -> float:
    return min(a[1], b[1]) - max(a[0], b[0])


def test_documents_end_to_end_with_pages_batched_together(
    tmp_path: Path, tiny_model: Path, start_daemon, notify_socket
) -> None:
    config = vllm_config(
        tmp_path,
        tiny_model,
        [
            {"path": "keep/inbox"},  # unfinished pages kept, with a marker
            {"path": "strict/inbox", "unfinished_pages": "failed"},
        ],
    )
    daemon = start_daemon(config, env={"NOTIFY_SOCKET": str(notify_socket.path)})
    url = f"http://{daemon.wait_for('http.listening', timeout=60)[0]['address']}"
    loading = httpx.get(f"{url}/readyz", timeout=60)  # answers while the model loads
    daemon.wait_for("daemon.ready", timeout=300)
    make_pdf(tmp_path / "keep" / "inbox" / "three.pdf", 3)
    make_pdf(tmp_path / "keep" / "inbox" / "two.pdf", 2)
    make_pdf(tmp_path / "strict" / "inbox" / "one.pdf", 1)
    finished = daemon.wait_for("document.finished", timeout=600, count=3)
    metrics = httpx.get(f"{url}/metrics", timeout=60).text
    assert daemon.stop() == 0

    assert loading.status_code == 503 and "the engine is loading" in loading.json()["problems"]
    ready_at = next(i for i, m in enumerate(notify_socket.messages) if "READY=1" in m)
    assert any(
        "EXTEND_TIMEOUT_USEC=" in m and "loading the vllm engine" in m
        for m in notify_socket.messages[:ready_at]
    )
    # The vLLM the [vllm] extra allows is logged as known good; any other as untested.
    installed = installed_vllm_version()
    assert installed is not None
    if Version(installed) in vllm_extra_range():
        assert daemon.find("engine.vllm_version", version=installed, known_good=True)
        assert not daemon.find("engine.vllm_untested")
    else:
        assert daemon.find("engine.vllm_untested", version=installed)
    assert "ocrd_pages_recognised_total" in metrics
    assert "vllm:num_requests_running" in metrics  # vLLM's own metrics on the same endpoint

    outcomes = {e["path"]: e["outcome"] for e in finished}
    assert outcomes == {"three.pdf": "done", "two.pdf": "done", "one.pdf": "failed"}
    keep = tmp_path / "keep"
    assert markdown_under(keep / "outbox") == ["three.md", "two.md"]
    assert files_under(keep / "done") == ["three.pdf", "two.pdf"]
    three = daemon.find("document.finished", path="three.pdf")[0]
    assert three["pages"] == 3
    assert three["finish_reasons"] == {"length": 3}  # random weights never stop by themselves
    assert three["unfinished_pages"] == [1, 2, 3]
    assert three["completion_tokens"] == 3 * 24
    markdown = (keep / "outbox" / "three.md").read_text()
    assert markdown.count("is incomplete: the engine stopped it") == 3

    strict = tmp_path / "strict"
    assert files_under(strict / "outbox") == []
    report = json.loads((strict / "failed" / "one.error.json").read_text())
    assert report["error_type"] == "UnfinishedPages" and report["page"] == 1

    # Continuous batching: the engine worked on pages of both documents at the same time.
    pages = daemon.find("page.recognised")
    intervals = {
        name: [e["engine_interval"] for e in pages if e["path"] == name]
        for name in ("three.pdf", "two.pdf")
    }
    assert all(interval for group in intervals.values() for interval in group)
    best = max(overlap(a, b) for a in intervals["three.pdf"] for b in intervals["two.pdf"])
    assert best > 1.0, f"no overlap between the documents' pages: {intervals}"


def engine_core(daemon_pid: int) -> psutil.Process:
    def find() -> psutil.Process | None:
        for child in psutil.Process(daemon_pid).children(recursive=True):
            if "EngineCor" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                return child
        return None

    return wait_until(find, 60, "vLLM's engine-core process")


def test_sigterm_and_engine_death_lose_nothing(
    tmp_path: Path, tiny_model: Path, start_daemon
) -> None:
    config = vllm_config(tmp_path, tiny_model, [{"path": "data/inbox"}], shutdown_grace_seconds=1)
    data = tmp_path / "data"
    make_pdf(data / "inbox" / "long.pdf", 4)

    # 1. SIGTERM while pages are in the engine: they are aborted, the document stays claimed.
    first = start_daemon(config)
    first.wait_for("document.opened", timeout=300)
    assert not first.find("document.finished")
    assert first.stop(signal.SIGTERM, timeout=120) == 0
    assert first.find("document.interrupted", path="long.pdf")
    assert claimed_originals(data / "work") == ["long.pdf"]

    # 2. The engine's core process dies: the daemon exits non-zero, still nothing lost.
    second = start_daemon(config)
    second.wait_for("document.recovered", timeout=300, path="long.pdf")
    second.wait_for("document.opened", timeout=300)
    engine_core(second.process.pid).kill()
    assert second.process.wait(timeout=120) == 70
    assert second.find("engine.dead")
    assert claimed_originals(data / "work") == ["long.pdf"]
    assert files_under(data / "outbox") == files_under(data / "done") == []
    assert files_under(data / "failed") == []

    # 3. Restarted (as systemd would), the document finishes exactly once.
    third = start_daemon(config)
    third.wait_for("document.finished", timeout=600, path="long.pdf")
    assert third.stop() == 0
    assert markdown_under(data / "outbox") == ["long.md"]
    assert files_under(data / "done") == ["long.pdf"]
    assert files_under(data / "work") == []
