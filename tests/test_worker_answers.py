"""What an inference server answers is bounded: a page's answer by bytes and characters
(from its `max_tokens`), its figures by the inbox's `max_figures_per_page`, a server's
`/metrics` by size and syntax.

The servers are hostile stand-ins (aiohttp on loopback, named as such: they read nothing),
behind ocrd's real `openai` engine in a real daemon: they answer ocrd's test page (known by
its pixels) as a good server would, and every other page with what an attacker sends.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from conftest import files_under, markdown_under, write_config
from fleet import free_port
from helpers import make_pdf
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from ocrd.config import PromptMode, SamplingConfig
from ocrd.domain import PageResult, PageText
from ocrd.engines.sending import answer_limits
from ocrd.engines.simulated_server import CheckReader
from ocrd.output.page import figure_plan
from ocrd.text.grounding import MAX_BLOCKS, parse_page

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
# How much more memory than at its start the daemon may have used at its peak while a
# hostile server answered: an answer held whole (150 MB) would be over it.
HIGH_WATER_BOUND_BYTES = 150 * 1000 * 1000
MAX_TOKENS = SamplingConfig().max_tokens

Answerer = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HostileWorker:
    """An OpenAI-compatible stand-in on loopback: honest to ocrd's self-check, its pages
    answered by `pages`, its `/metrics` the given text."""

    def __init__(self, pages: Answerer, metrics: str = "") -> None:
        self.port = free_port()
        self.pages = pages
        self.metrics = metrics
        self.page_requests = 0
        self._reader: CheckReader | None = None  # made at the first page
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._empty)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._completion)
        self._runner = web.AppRunner(app)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=10)

    async def _serve(self) -> None:
        assert self._runner is not None
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "stand-in", "object": "model"}]})

    async def _empty(self, _: web.Request) -> web.Response:
        return web.Response()

    async def _metrics(self, _: web.Request) -> web.Response:
        return web.Response(text=self.metrics, content_type="text/plain")

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        test_text = await asyncio.to_thread(self._test_page_text, body)  # by its pixels
        if test_text is not None:
            return web.json_response(completion(test_text))
        self.page_requests += 1
        return await self.pages(request)

    def _test_page_text(self, body: dict[str, Any]) -> str | None:
        if self._reader is None:
            self._reader = CheckReader()
        content = body["messages"][0]["content"]
        url = next(part["image_url"]["url"] for part in content if part["type"] == "image_url")
        return self._reader.read(Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))))


def completion(text: str) -> dict[str, Any]:
    return {
        "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 257, "completion_tokens": 40},
    }


def _text_answer_parts() -> tuple[bytes, bytes]:
    """A completion's JSON before and after its text, so that the text can be streamed."""
    before, after = json.dumps(completion("TEXT")).encode().split(b"TEXT")
    return before, after


async def answer_150_mb(request: web.Request) -> web.StreamResponse:
    """A well-formed completion whose text is 150 MB, its length declared up front."""
    before, after = _text_answer_parts()
    size = 150 * 1000 * 1000
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(before) + size + len(after)
    await response.prepare(request)
    chunk = b"a" * MiB
    with_ocrd_gone = (ConnectionError, RuntimeError)
    try:
        await response.write(before)
        for _ in range(size // MiB):
            await response.write(chunk)
        await response.write(chunk[: size % MiB] + after)
    except with_ocrd_gone:
        pass
    return response


async def answer_endlessly(request: web.Request) -> web.StreamResponse:
    """A completion whose text never ends, streamed chunk by chunk with no length given."""
    before, _ = _text_answer_parts()
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    chunk = b"a" * MiB
    try:
        await response.write(before)
        while True:
            await response.write(chunk)
    except (ConnectionError, RuntimeError):
        pass
    return response


def figure_blocks(count: int) -> str:
    """`count` grounding blocks of the label `image`, each a different 100x100 box (in the
    model's 0..999 coordinates: many pixels apart on any page image)."""
    blocks = []
    for index in range(count):
        x, y = (index % 60) * 15, (index // 60) * 15
        blocks.append(f"<|ref|>image<|/ref|><|det|>[[{x}, {y}, {x + 100}, {y + 100}]]<|/det|>\n")
    return "".join(blocks)


def answer_with(text: str) -> Answerer:
    async def answer(_: web.Request) -> web.StreamResponse:
        return web.json_response(completion(text))

    return answer


def high_water_bytes(pid: int) -> int:
    """The process's peak resident memory so far (VmHWM)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def worker_config(tmp_path: Path, worker: HostileWorker, **inbox: Any) -> Path:
    engine = {
        "kind": "openai",
        "openai": {
            "base_urls": [f"{worker.root}/v1"],
            "max_concurrency": 2,
            "retries": 1,
            "retry_backoff_seconds": 0.2,
            "request_timeout_seconds": 60,
        },
    }
    return write_config(tmp_path, {"max_image_side": 768, **inbox}, engine=engine)


def run_one_page(tmp_path: Path, start_daemon: Any, worker: HostileWorker, **inbox: Any) -> Any:
    """One one-page PDF through a daemon whose only server is `worker`: (the document's
    summary event, the daemon's peak memory above what it had when ready, the daemon)."""
    worker.start()
    try:
        daemon = start_daemon(worker_config(tmp_path, worker, **inbox))
        daemon.wait_for("daemon.ready", timeout=60)
        ready = high_water_bytes(daemon.process.pid)
        make_pdf(tmp_path / "data" / "inbox" / "page.pdf", 1)
        [summary] = daemon.wait_for("document.finished", timeout=120)
        grown = high_water_bytes(daemon.process.pid) - ready
        assert daemon.stop() == 0
    finally:
        worker.stop()
    return summary, grown, daemon


def assert_failed_for_its_size(tmp_path: Path, summary: dict[str, Any], worker: HostileWorker):
    data = tmp_path / "data"
    byte_limit, _ = answer_limits(MAX_TOKENS)
    assert summary["outcome"] == "failed"
    [report_path] = (data / "failed").glob("*.error.json")
    report = json.loads(report_path.read_text())
    assert report["stage"] == "recognise" and report["page"] == 1
    assert worker.root in report["message"]  # which server
    assert f"longer than the limit of {byte_limit:,} bytes" in report["message"]
    assert f"max_tokens {MAX_TOKENS}" in report["message"]
    assert worker.page_requests == 2  # the page's try and its one retry
    assert markdown_under(data / "outbox") == [] and files_under(data / "done") == []
    assert max(path.stat().st_size for path in data.rglob("*") if path.is_file()) < MiB


def test_a_150_mb_answer_fails_its_page_and_is_never_held(tmp_path: Path, start_daemon) -> None:
    worker = HostileWorker(answer_150_mb)
    summary, grown, _ = run_one_page(tmp_path, start_daemon, worker)
    assert_failed_for_its_size(tmp_path, summary, worker)
    assert grown < HIGH_WATER_BOUND_BYTES, f"the daemon's peak memory grew by {grown:,} bytes"


def test_an_endless_answer_fails_its_page_and_is_never_held(tmp_path: Path, start_daemon) -> None:
    worker = HostileWorker(answer_endlessly)
    summary, grown, _ = run_one_page(tmp_path, start_daemon, worker)
    assert_failed_for_its_size(tmp_path, summary, worker)
    assert grown < HIGH_WATER_BOUND_BYTES, f"the daemon's peak memory grew by {grown:,} bytes"


def test_more_text_than_max_tokens_can_produce_fails_its_page(tmp_path: Path, start_daemon) -> None:
    byte_limit, character_limit = answer_limits(MAX_TOKENS)
    # Plain ASCII: one byte a character, so within the byte limit, over the characters'.
    text = "word " * (character_limit // 5 + 1000)
    assert len(text.encode()) < byte_limit
    worker = HostileWorker(answer_with(text))
    summary, _, _ = run_one_page(tmp_path, start_daemon, worker)
    assert summary["outcome"] == "failed"
    [report_path] = (tmp_path / "data" / "failed").glob("*.error.json")
    message = json.loads(report_path.read_text())["message"]
    assert worker.root in message
    assert f"holds {len(text):,} characters of text" in message
    assert f"more than max_tokens {MAX_TOKENS} can produce (at most {character_limit:,})" in message


def test_3000_figures_on_a_page_cut_at_most_the_inbox_limit(tmp_path: Path, start_daemon) -> None:
    limit = 10
    # Past MAX_BLOCKS the page's text is one last block: the figures counted are those before.
    figures = min(3000, MAX_BLOCKS - 1)
    worker = HostileWorker(answer_with(figure_blocks(3000)))
    summary, grown, daemon = run_one_page(
        tmp_path, start_daemon, worker, max_figures_per_page=limit, layout_file=True
    )
    assert summary["outcome"] == "done"
    outbox = tmp_path / "data" / "outbox"
    assert files_under(outbox / "page.assets") == sorted(
        f"page1-figure{n}.png" for n in range(1, limit + 1)
    )
    markdown = (outbox / "page.md").read_text()
    assert markdown.count("](page.assets/") == limit
    assert f"page 1 has {figures - limit} more figures than max_figures_per_page ({limit})" in (
        markdown
    )
    layout = json.loads((outbox / "page.layout.json").read_text())
    assert layout["pages"][0]["figures_left_out"] == figures - limit
    [event] = daemon.find("page.figures_left_out")
    assert event["left_out"] == figures - limit and event["cut"] == limit
    assert event["max_figures_per_page"] == limit
    assert grown < HIGH_WATER_BOUND_BYTES, f"the daemon's peak memory grew by {grown:,} bytes"


def test_small_and_repeated_figures_are_not_cut_and_not_counted() -> None:
    big = "<|ref|>image<|/ref|><|det|>[[100, 100, 500, 500]]<|/det|>\n"
    tiny = "<|ref|>image<|/ref|><|det|>[[0, 0, 5, 5]]<|/det|>\n"
    other = "<|ref|>image<|/ref|><|det|>[[500, 500, 900, 900]]<|/det|>\n"
    third = "<|ref|>image<|/ref|><|det|>[[0, 600, 400, 990]]<|/det|>\n"
    raw = big * 50 + tiny * 50 + other + third
    blocks = parse_page(raw)
    page = PageResult(1, PageText(raw, "stop"), PromptMode.layout, (1000, 1000), (595, 842), blocks)
    plan = figure_plan(page, limit=2)
    assert list(plan.regions) == [0, 100]  # the first big one, then `other`
    assert set(plan.same_as) == set(range(1, 50)) and set(plan.same_as.values()) == {0}
    assert plan.left_out == 1  # `third`: over the limit of two


def test_a_page_of_endless_blocks_keeps_its_text_past_the_block_bound() -> None:
    raw = figure_blocks(3000) + "The last words."
    blocks = parse_page(raw, max_blocks=100)
    assert len(blocks) == 100
    assert all(block.label == "image" for block in blocks[:99])
    assert blocks[-1].label == "text" and blocks[-1].content.endswith("The last words.")


HOSTILE_METRICS = """\
# HELP vllm:num_requests_running Requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="stand-in"} 2
# HELP vllm:duplicate A sample with a label given twice.
# TYPE vllm:duplicate gauge
vllm:duplicate{model_name="a",model_name="b"} 1
# HELP vllm:quote A label value never closed.
# TYPE vllm:quote gauge
vllm:quote{model_name="stand-in} 1
# HELP vllm:requests_total Requests, with ocrd's own label name in them.
# TYPE vllm:requests_total counter
vllm:requests_total{replica="someone else"} 5
vllm:requests_total{replica="someone else"} 6
# TYPE vllm:num_requests_running counter
vllm:num_requests_running 7
# HELP ocrd_documents_total Not vLLM's: never taken.
# TYPE ocrd_documents_total counter
ocrd_documents_total 1e9
this is no metric {{{
"""


def test_a_workers_bad_metrics_never_break_ocrds_metrics(tmp_path: Path, start_daemon) -> None:
    worker = HostileWorker(answer_with("A page."), metrics=HOSTILE_METRICS)
    worker.start()
    try:
        daemon = start_daemon(worker_config(tmp_path, worker))
        [listening] = daemon.wait_for("http.listening", timeout=60)
        daemon.wait_for("daemon.ready", timeout=60)
        exposition = httpx.get(f"http://{listening['address']}/metrics").text
        assert daemon.stop() == 0
    finally:
        worker.stop()
    families = {family.name: family for family in text_string_to_metric_families(exposition)}
    replica = f"{worker.root}/v1"
    [running] = families["vllm:num_requests_running"].samples
    assert running.labels == {"model_name": "stand-in", "replica": replica}
    assert running.value == 2 and families["vllm:num_requests_running"].type == "gauge"
    [requests] = families["vllm:requests"].samples
    assert requests.labels == {"replica": replica} and requests.value == 5
    assert "vllm:duplicate" not in families and "vllm:quote" not in families
    assert not [s for f in families.values() for s in f.samples if s.value == 1e9]
