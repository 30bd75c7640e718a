"""Two real `vllm serve` replicas on the CPU behind ocrd's router (tiny model, random weights,
float32, eager): pages spread over both, and a replica killed mid-run is restarted while the
other works, with no page failed. Without GPUs each replica gets its own core."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from conftest import files_under, keep_running, markdown_under, wait_until
from helpers import make_pdf
from tiny_model import vllm_engine_section

from ocrd.config import EngineConfig, PromptMode, RenderSettings
from ocrd.domain import PageImage, PageText
from ocrd.engines import EngineState, ReplicaState, create_engine
from ocrd.engines.router import Router
from ocrd.render import RenderLimits, RenderPool, SourceFile, detect_format

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

SUPERVISION = {"restart_backoff_seconds": 1, "health_interval_seconds": 2, "stop_grace_seconds": 10}


def two_replicas(model: Path, **vllm: object) -> EngineConfig:
    section = vllm_engine_section(model, max_tokens=8, gpus=[0, 1], **vllm)
    return EngineConfig.model_validate({**section, "supervision": SUPERVISION})


class Running:
    """A started engine and the one event loop it lives on."""

    def __init__(self, engine: Router) -> None:
        self.engine = engine
        self.loop = asyncio.new_event_loop()

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)


@pytest.fixture(scope="module")
def running(tiny_model: Path) -> Iterator[Running]:
    engine = create_engine(two_replicas(tiny_model), "vllm")
    assert isinstance(engine, Router)
    running = Running(engine)
    running.run(engine.start())
    yield running
    running.run(engine.stop())
    running.loop.close()


def rendered_document(engine: Router, folder: Path, pages: int) -> list[PageImage]:
    """Pages rendered as the daemon renders them: into files in the replicas' page folder."""
    path = make_pdf(folder / "document.pdf", pages)

    async def render() -> list[PageImage]:
        pool = RenderPool(1, RenderLimits(), page_folder=engine.page_folder)
        document = SourceFile(path, detect_format(path), RenderSettings(144, 768))
        try:
            count = await pool.open(document)
            return [await pool.render(document, n) for n in range(1, count + 1)]
        finally:
            pool.shutdown()

    return asyncio.run(render())


def test_ocrd_run_with_two_vllm_replicas_converts_documents(
    tiny_model: Path, tmp_path: Path, start_daemon
) -> None:
    (tmp_path / "data" / "inbox").mkdir(parents=True)
    section = vllm_engine_section(tiny_model, gpus=[0, 1])
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "inboxes": [
                    {
                        "path": "data/inbox",
                        "settle_seconds": 0.5,
                        "max_image_side": 768,
                        # random weights never stop: a second try of each page is no test
                        "retry_unfinished": False,
                    }
                ],
                "engine": {**section, "supervision": SUPERVISION},
                "pipeline": {"status_interval_seconds": 1},
                "http": {"listen": "127.0.0.1:0"},
            }
        )
    )
    make_pdf(tmp_path / "data" / "inbox" / "two.pdf", 2)
    make_pdf(tmp_path / "data" / "inbox" / "three.pdf", 3)
    daemon = start_daemon(config)
    finished = daemon.wait_for("document.finished", timeout=900, count=2)
    ready = daemon.find("engine.replica_ready")
    replicas = psutil.Process(daemon.process.pid).children(recursive=True)
    servers = [p for p in replicas if "vllm.entrypoints.openai.api_server" in _command(p)]
    assert daemon.stop() == 0
    assert {e["outcome"] for e in finished} == {"done"}
    assert sorted(e["replica"] for e in ready) == ["gpu0", "gpu1"]
    assert markdown_under(tmp_path / "data" / "outbox") == ["three.md", "two.md"]
    assert files_under(tmp_path / "data" / "done") == ["three.pdf", "two.pdf"]
    assert len(servers) == 2
    # None left behind: SIGKILLed with their group, though one holding gigabytes of memory
    # takes a moment to be gone.
    wait_until(
        lambda: not [p.pid for p in replicas if _not_zombie(p.pid)],
        30,
        lambda: (
            "the replicas' processes gone: "
            + ", ".join(_command(p) for p in replicas if _not_zombie(p.pid))
        ),
    )


def _command(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.NoSuchProcess:
        return ""


def test_a_documents_pages_spread_over_two_vllm_replicas(running: Running, tmp_path: Path) -> None:
    engine = running.engine
    facts = engine.replicas
    assert [f.name for f in facts] == ["gpu0", "gpu1"]
    assert [f.state for f in facts] == [ReplicaState.ready] * 2
    assert engine.max_concurrency == 16  # two replicas of max_num_seqs 8
    for replica in facts:  # each its own process, pinned to its device and its core
        environment = psutil.Process(replica.pid).environ()
        assert environment["CUDA_VISIBLE_DEVICES"] == replica.device
        assert environment["VLLM_CPU_OMP_THREADS_BIND"] == replica.device
        # vLLM 0.18's CPU backend sizes its KV cache from this variable alone (half of
        # the machine's memory without it); and its CPU worker starts only with these.
        assert environment["VLLM_CPU_KVCACHE_SPACE"] == "1"  # kv_cache_memory_bytes: 1 GiB
        assert "libtcmalloc" in environment["LD_PRELOAD"]
        assert "libiomp5" in environment["LD_PRELOAD"]
    pages = rendered_document(engine, tmp_path, 4)
    before = [f.pages_done for f in facts]

    async def recognise_all() -> list[PageText]:
        return await asyncio.gather(
            *(engine.recognise(p, PromptMode.layout, p.number) for p in pages)
        )

    texts = running.run(recognise_all())
    after = [f.pages_done for f in engine.replicas]
    assert [t.finish_reason for t in texts] == ["length"] * 4  # random weights never stop
    assert all(t.completion_tokens == 8 and t.prompt_tokens > 257 for t in texts)
    assert [a - b for a, b in zip(after, before, strict=True)] == [2, 2]


def test_a_vllm_replica_killed_mid_run_is_restarted_and_no_page_fails(
    running: Running, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    engine = running.engine
    victim = engine.replicas[0]
    assert victim.pid is not None
    group = [victim.pid, *(c.pid for c in psutil.Process(victim.pid).children(recursive=True))]
    pages = rendered_document(engine, tmp_path, 6)

    async def scenario() -> list[Any]:
        async def kill_when_busy() -> None:
            while engine.replicas[0].in_flight == 0:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)
            os.kill(victim.pid, signal.SIGKILL)

        killer = asyncio.create_task(kill_when_busy())
        results = await asyncio.gather(
            *(engine.recognise(p, PromptMode.layout) for p in pages), return_exceptions=True
        )
        await killer
        for _ in range(600):  # a vLLM start on a shared CPU core takes a while
            if engine.replicas[0].state is ReplicaState.ready:
                break
            await asyncio.sleep(0.5)
        return results

    results = running.run(scenario())
    restarted, other = engine.replicas
    if restarted.pid is not None:  # the module's engine stops it, with the other replica
        keep_running(request, restarted.pid)
    assert all(isinstance(r, PageText) for r in results), results
    assert restarted.deaths_with_pages == 1 and restarted.restarts == 1
    assert restarted.state is ReplicaState.ready and restarted.pid != victim.pid
    assert other.restarts == 0
    assert engine.health.state is EngineState.ready and engine.health.degraded is None
    # The killed server's engine core and worker went with it.
    wait_until(
        lambda: not [pid for pid in group if psutil.pid_exists(pid) and _not_zombie(pid)],
        30,
        "the killed server's engine core and worker gone",
    )


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
