"""Attacks on a fleet's trust (after issue 35's defences): from whoever reaches the
vllm-router's `/workers`, from a hostile or broken inference server, and from a careless
operator's config. Each test is one attack that once got through, kept so it stays shut.

The router is the real `vllm-router`; workers are ocrd's simulated servers and small
stand-in servers on loopback ports (tests/routed_fleet.py, tests/fleet.py).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import files_under, markdown_under, write_config
from fleet import StandInRouter, free_port
from helpers import make_pdf
from routed_fleet import GARBLE, Worker, fleet_behind
from structlog.testing import capture_logs
from test_http import base_url

from ocrd.config import OpenAiConfig
from ocrd.engines import selfcheck
from ocrd.engines.link import DEFAULT_LIMIT_BYTES, ServerLink, TooLarge
from ocrd.engines.registry import MAX_WORKERS, SHOWN_REFUSALS, RouterLink, RouterRegistry
from ocrd.engines.simulated_server import CheckReader
from ocrd.engines.trust import WorkerTrust
from ocrd.log import get_logger

KEY = "fleet-secret-key"


def fleet_engine(**openai: object) -> dict[str, Any]:
    return {
        "kind": "openai",
        "openai": {
            "model": "simulated",
            "max_concurrency": 4,
            "retry_backoff_seconds": 0.2,
            "request_timeout_seconds": 30,
            **openai,
        },
    }


class Redirector:
    """A server that answers its /health and sends every other request on to `target`
    (HTTP `status`, the same path): a trusted worker pointing ocrd at another server."""

    def __init__(self, target: str, status: int = 307) -> None:
        self.port = free_port()
        self.target = target
        self.status = status
        self.seen: list[str] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self._answer()

            def _answer(self) -> None:
                outer.seen.append(f"{self.command} {self.path}")
                if self.path == "/health":
                    self.send_response(200)
                else:
                    self.send_response(outer.status)
                    self.send_header("Location", f"{outer.target}{self.path}")
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@pytest.mark.slow
def test_a_trusted_worker_redirecting_to_an_untrusted_server_sends_it_nothing(
    tmp_path: Path, start_daemon
) -> None:
    honest, elsewhere = Worker(tmp_path, 1), Worker(tmp_path, 2)
    elsewhere.start()  # listens on 127.0.0.1 too, but on a port nobody trusted
    redirector = Redirector(elsewhere.url)
    redirector.start()
    try:
        with fleet_behind(tmp_path, [honest]) as router:
            trusted = [honest.url.removeprefix("http://"), f"127.0.0.1:{redirector.port}"]
            engine = fleet_engine(
                router_url=router.url, router_poll_seconds=0.3, trusted_workers=trusted
            )
            config = write_config(tmp_path, {"max_image_side": 768}, engine=engine)
            daemon = start_daemon(config, env={"OCRD_OPENAI_API_KEY": KEY})
            daemon.wait_for("daemon.ready", timeout=60)
            httpx.post(f"{router.url}/workers", json={"url": redirector.url}, timeout=60)
            daemon.wait_for("engine.worker_joined", worker=redirector.url, timeout=30)
            make_pdf(tmp_path / "data" / "inbox" / "doc.pdf", 3)
            finished = daemon.wait_for("document.finished", timeout=90)
            report = httpx.get(f"{base_url(daemon)}/api/status").json()
            assert daemon.stop() == 0
    finally:
        redirector.stop()
        elsewhere.stop()

    assert finished[0]["outcome"] == "done"
    assert len(markdown_under(tmp_path / "data" / "outbox")) == 1
    # ocrd asked the redirector and was told to go on; it did not go on.
    assert any(line.startswith("GET /v1/models") for line in redirector.seen)
    assert [line for line in elsewhere.received() if line != "GET /health -"] == []
    replicas = {r["name"]: r for r in report["replicas"]}
    assert replicas[redirector.url]["state"] != "ready"
    assert "redirect" in (replicas[redirector.url]["problem"] or "")


@pytest.mark.slow
def test_a_worker_that_replays_answers_to_pictures_it_saw_is_caught(
    tmp_path: Path, start_daemon
) -> None:
    # It reads its first request (the check at its joining), keeps each picture's answer,
    # replays it for that picture and garbles every new one. Were the check the same
    # picture each time, it would pass every check while garbling every page.
    honest, cheat = Worker(tmp_path, 1), Worker(tmp_path, 2)
    cheat.extra = ["--replays-seen"]
    honest.start()
    cheat.start()
    try:
        repeat = 1.0
        engine = fleet_engine(
            base_urls=[f"{honest.url}/v1", f"{cheat.url}/v1"], self_check_repeat_seconds=repeat
        )
        config = write_config(tmp_path, {"max_image_side": 768}, engine=engine)
        daemon = start_daemon(config)
        daemon.wait_for("daemon.ready", timeout=60)
        caught = daemon.wait_for(
            "engine.self_check_failed", replica=f"{cheat.url}/v1", timeout=30 + 3 * repeat
        )
        make_pdf(tmp_path / "data" / "inbox" / "after.pdf", 4, label="After page")
        finished = daemon.wait_for("document.finished", timeout=60)
        assert daemon.stop() == 0
    finally:
        honest.stop()
        cheat.stop()

    assert caught[0]["unannounced"] is True
    assert finished[0]["outcome"] == "done"
    outbox = "\n".join(p.read_text() for p in (tmp_path / "data" / "outbox").rglob("*.md"))
    assert GARBLE.strip()[:10] not in outbox
    assert [test_page for _, test_page in cheat.answered()][:2] == [True, True]


def test_no_two_test_pages_are_the_same_picture_and_each_is_judged_by_its_own_words() -> None:
    draws = random.Random(35)
    first, second = selfcheck.draw_check(draws), selfcheck.draw_check(draws)
    assert first.image.size == second.image.size
    assert first.image.tobytes() != second.image.tobytes()
    assert first.score(first.text()).passed
    assert not first.score(second.text()).passed  # an answer kept from another check
    assert not first.score(selfcheck.expected_text()).passed  # the old fixed page's words
    assert not first.score(GARBLE).passed
    # A stand-in reads what was drawn, and nothing from a page that is not a test page.
    reader = CheckReader()
    assert reader.read(first.image) == first.text()
    assert reader.read(second.image) == second.text()
    assert reader.read(selfcheck.check_page()) is None


class Endless:
    """A server whose every answer is an endless body (an announced length, or chunks)."""

    def __init__(self, announce: bool) -> None:
        self.port = free_port()
        self.announce = announce
        self.sent = 0
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                return None

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if outer.announce:
                    self.send_header("Content-Length", str(1 << 40))
                self.send_header("Connection", "close")
                self.end_headers()
                chunk = b" " * 65536
                try:
                    while outer.sent < 256 * 1024 * 1024:
                        self.wfile.write(chunk)
                        outer.sent += len(chunk)
                except OSError:
                    return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@pytest.mark.parametrize("announce", [True, False])
def test_an_endless_answer_from_a_server_is_cut_off_not_read(announce: bool) -> None:
    server = Endless(announce)
    server.start()

    async def probe() -> str:
        link = ServerLink(f"http://127.0.0.1:{server.port}/v1", KEY)
        try:
            await link.get("/models", timeout=60)
        except TooLarge as error:
            return str(error)
        finally:
            await link.close()
        raise AssertionError("an endless /v1/models answer was read to its end")

    try:
        said = asyncio.run(probe())
    finally:
        server.stop()
    assert f"longer than the limit of {DEFAULT_LIMIT_BYTES:,} bytes" in said
    assert "/v1/models" in said
    assert server.sent < 4 * DEFAULT_LIMIT_BYTES  # ocrd stopped reading long before the end


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000@evil.example:8000",  # userinfo: the host is evil.example
        "http://127.0.0.1:8000#@evil.example",  # a fragment: pages would go to its path /
        "http://127.0.0.1:8000?@evil.example",
        "http://evil.example\\@127.0.0.1:8000",  # a backslash two parsers read apart
        "http://ＬＯＣＡＬＨＯＳＴ:8000",  # fullwidth: urlsplit and aiohttp disagree on it
        "http://127.0.0.1.:8000",  # a trailing dot: not the address trusted
        "http://0x7f.1:8000",  # inet_aton spellings of 127.0.0.1
        "http://2130706433:8000",
        "http://[::ffff:127.0.0.1]:8000",
        "http://127%2e0.0.1:8000",
        "http://127.0.0.1:8001",  # another port of a trusted host:port
    ],
)
def test_worker_urls_spelled_to_slip_past_the_trusted_set_are_refused(url: str) -> None:
    trusted = ("127.0.0.1:8000", "localhost:8000")
    config = OpenAiConfig(router_url="http://127.0.0.1:30000", trusted_workers=trusted)
    assert WorkerTrust.of(config).refusal(url) is not None
    assert WorkerTrust.of(config).refusal("http://127.0.0.1:8000") is None
    assert WorkerTrust.of(config).refusal("http://LOCALHOST:8000/") is None


def listed_in_status(url: str, name: str) -> dict[str, Any]:
    """The daemon's status report once it lists the file `name` (waiting, queued)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        report: dict[str, Any] = httpx.get(f"{url}/api/status").json()
        if name in json.dumps(report):
            return report
        time.sleep(0.2)
    raise AssertionError(f"the status never listed {name}")


@pytest.mark.slow
def test_the_honest_worker_deleted_at_the_router_holds_files_until_it_is_back(
    tmp_path: Path, start_daemon
) -> None:
    # Whoever reaches the router's port deletes the only worker: files must wait, none
    # fail; the worker added again reads a fresh check before it gets a page.
    worker = Worker(tmp_path, 1)
    with fleet_behind(tmp_path, [worker]) as router:
        poll = 0.3
        engine = fleet_engine(router_url=router.url, router_poll_seconds=poll)
        config = write_config(tmp_path, {"max_image_side": 768}, engine=engine)
        daemon = start_daemon(config)
        daemon.wait_for("daemon.ready", timeout=60)
        url = base_url(daemon)

        router.remove(worker)
        daemon.wait_for("engine.worker_left", worker=worker.url, timeout=30)
        daemon.wait_for("engine.unreachable", timeout=30)
        ready = httpx.get(f"{url}/readyz")
        report = httpx.get(f"{url}/api/status").json()
        checks_before = [test_page for _, test_page in worker.answered()].count(True)
        data = tmp_path / "data"
        make_pdf(data / "inbox" / "waits.pdf", 2)
        waiting = listed_in_status(url, "waits.pdf")
        held = sorted(p.name for p in (data / "inbox").iterdir())
        failed_meanwhile = files_under(data / "failed")

        router.add(worker)
        daemon.wait_for("engine.worker_joined", worker=worker.url, count=2, timeout=30)
        finished = daemon.wait_for("document.finished", timeout=60)
        assert daemon.stop() == 0

    assert ready.status_code == 503 and ready.json()["engine_state"] == "unreachable"
    assert report["engine_state"] == "unreachable"
    assert "lists no worker" in str(report)
    assert held == ["waits.pdf"] and failed_meanwhile == []
    assert waiting["engine_state"] == "unreachable"
    assert finished[0]["outcome"] == "done" and files_under(data / "failed") == []
    checks_after = [test_page for _, test_page in worker.answered()].count(True)
    assert checks_after > checks_before  # checked again on its return


def test_a_router_listing_thousands_of_workers_costs_a_bounded_fleet_and_log() -> None:
    trusted = [f"http://127.0.0.1:{port}" for port in range(20000, 20000 + MAX_WORKERS + 44)]
    strangers = [f"http://10.{i // 250}.{i % 250}.1:8000" for i in range(3000)]
    router = StandInRouter([*trusted, *strangers])
    router.start()
    joined: list[str] = []

    async def leave(url: str) -> None:
        return None

    async def read_twice() -> RouterRegistry:
        config = OpenAiConfig(router_url=router.url)  # trusted: the router's host
        registry = RouterRegistry(
            RouterLink(router.url), 1.0, WorkerTrust.of(config), joined.append, leave,
            get_logger(engine="openai"),
        )  # fmt: skip
        try:
            await registry.refresh()
            await registry.refresh()
        finally:
            await registry.link.close()
        return registry

    try:
        with capture_logs() as logs:
            registry = asyncio.run(read_twice())
    finally:
        router.stop()
    assert joined == trusted[:MAX_WORKERS]
    assert len(registry.refused) == len(strangers) + 44
    told = [event for event in logs if event["event"] == "engine.worker_refused"]
    assert [event["worker"] for event in told] == trusted[MAX_WORKERS:][:SHOWN_REFUSALS]
    assert f"more than {MAX_WORKERS} trusted workers" in told[0]["reason"]
    [summary] = [event for event in logs if event["event"] == "engine.workers_refused"]
    assert summary["count"] == len(strangers) + 44 - SHOWN_REFUSALS
    assert registry.problem is not None and len(registry.problem) < 2000
    assert f"and {len(strangers) + 44 - 3} more refused" in registry.problem


def test_a_real_ocr_engine_reads_a_drawn_test_page_well_enough_to_pass() -> None:
    # The drawn page must stay legible to a reader that knows nothing of how it was drawn.
    from ocrd.config import PromptMode, RapidOcrConfig
    from ocrd.domain import PageImage
    from ocrd.engines.rapidocr import RapidOcrEngine

    check = selfcheck.draw_check(random.Random(7))

    async def read() -> str:
        engine = RapidOcrEngine(RapidOcrConfig())
        await engine.start()
        try:
            page = PageImage(1, check.image, 420, 315)
            return (await engine.recognise(page, PromptMode.text)).text
        finally:
            await engine.stop()

    score = check.score(asyncio.run(read()))
    assert score.passed, score
