"""Hostile ground around a fleet (issue 35): a router's worker list is a suggestion, not a
trust. Whoever reaches vllm-router's `/workers` (it asks no key) can add a server: it must
get no request and never the fleet's key. ocrd's test page must look like any page, and be
sent again at times a server cannot expect, so that one that reads the check and garbles
the work is caught. A router answering an endless worker list costs a bounded read.

Workers are ocrd's simulated servers (tests/routed_fleet.py) and the stand-in server of
tests/fleet.py; the router is the real `vllm-router` where a router's own behaviour
matters, a stand-in (tests/fleet.py) where it must answer what no real router would.
"""

from __future__ import annotations

import asyncio
import re
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import markdown_under, write_config
from fleet import StandInFleetServer, StandInRouter
from helpers import make_pdf
from PIL import Image
from routed_fleet import GARBLE, Worker, fleet_behind
from test_http import base_url, run_ocrd_status

from ocrd.config import EngineConfig, OpenAiConfig, PromptMode
from ocrd.domain import PageImage
from ocrd.engines import create_engine
from ocrd.engines.registry import MAX_LIST_BYTES
from ocrd.engines.trust import WorkerTrust

pytestmark = pytest.mark.slow

KEY = "fleet-secret-key"
PAGE_ID = re.compile(r"ocrd-\d+-page-\d+")


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


def high_water_kib(pid: int) -> int:
    """The process's peak resident memory (VmHWM), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmHWM for process {pid}")


def test_a_worker_added_at_the_router_outside_the_trusted_set_is_sent_nothing(
    tmp_path: Path, start_daemon
) -> None:
    good, intruder = Worker(tmp_path, 1), Worker(tmp_path, 2)
    with fleet_behind(tmp_path, [good]) as router:
        trusted = [good.url.removeprefix("http://")]  # 127.0.0.1:<its port> only
        poll = 0.3
        engine = fleet_engine(
            router_url=router.url, router_poll_seconds=poll, trusted_workers=trusted
        )
        config = write_config(tmp_path, {"max_image_side": 768}, engine=engine)
        daemon = start_daemon(config, env={"OCRD_OPENAI_API_KEY": KEY})
        daemon.wait_for("daemon.ready", timeout=60)
        url = base_url(daemon)

        intruder.start()
        router.add(intruder)  # as the attacker did: no key asked
        refused = daemon.wait_for("engine.worker_refused", worker=intruder.url, timeout=30)
        inbox = tmp_path / "data" / "inbox"
        for index in range(3):
            make_pdf(inbox / f"doc{index}.pdf", 3, label=f"Doc {index} page")
        finished = daemon.wait_for("document.finished", timeout=90, count=3)
        time.sleep(10 * poll)  # ten more reads of the list with the intruder on it
        report = httpx.get(f"{url}/api/status").json()
        (tmp_path / "config.yaml").write_text(
            (tmp_path / "config.yaml").read_text().replace("127.0.0.1:0", url[len("http://") :])
        )
        status = run_ocrd_status(config).stdout
        assert daemon.stop() == 0
        intruder.stop()

    assert {event["outcome"] for event in finished} == {"done"}
    assert len(markdown_under(tmp_path / "data" / "outbox")) == 3
    # vllm-router checks its workers' /health itself (no key); from ocrd: no probe, no test
    # page, no page, and never the key.
    received = intruder.received()
    assert [line for line in received if line != "GET /health -"] == [], received
    assert not any(KEY in line for line in received)
    from_ocrd = [line for line in good.received() if line != "GET /health -"]
    assert from_ocrd and all(line.endswith(f"Bearer {KEY}") for line in from_ocrd)
    assert "not in engine.openai.trusted_workers" in refused[0]["reason"]
    assert len(daemon.find("engine.worker_refused")) == 1
    replicas = {r["name"]: r for r in report["replicas"]}
    assert replicas[intruder.url]["state"] == "refused"
    assert "not in engine.openai.trusted_workers" in replicas[intruder.url]["problem"]
    assert replicas[good.url]["state"] == "ready"
    assert intruder.url in report["degraded"]
    assert f"  {intruder.url} refused" in status, status


def test_a_worker_that_reads_only_the_check_is_caught_by_a_later_unannounced_check(
    tmp_path: Path, start_daemon
) -> None:
    # The cheat a marker made easy, without the marker: read the first request (the check
    # at its joining), garble everything after.
    honest, cheat = Worker(tmp_path, 1), Worker(tmp_path, 2, reads_first=1)
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
        # Its next check comes within 1.5 x `repeat`, unannounced; then it is out.
        caught = daemon.wait_for(
            "engine.self_check_failed", replica=f"{cheat.url}/v1", timeout=30 + 3 * repeat
        )
        daemon.wait_for(
            "engine.self_check_repeated", replica=f"{honest.url}/v1", timeout=30 + 3 * repeat
        )
        report = httpx.get(f"{base_url(daemon)}/api/status").json()
        make_pdf(tmp_path / "data" / "inbox" / "after.pdf", 4, label="After page")
        finished = daemon.wait_for("document.finished", timeout=60)
        assert daemon.stop() == 0
    finally:
        honest.stop()
        cheat.stop()

    assert caught[0]["unannounced"] is True
    assert "failed an unannounced check while serving" in caught[0]["error"]
    replicas = {r["name"]: r for r in report["replicas"]}
    assert replicas[f"{cheat.url}/v1"]["state"] == "garbled"
    assert "unannounced check" in replicas[f"{cheat.url}/v1"]["problem"]
    assert finished[0]["outcome"] == "done"
    outbox = "\n".join(p.read_text() for p in (tmp_path / "data" / "outbox").rglob("*.md"))
    assert GARBLE.strip()[:10] not in outbox
    # It was checked at its joining and then unannounced, and after that was sent no page:
    # only the rechecks a garbled server gets (at most `repeat` apart).
    answered = [test_page for _, test_page in cheat.answered()]
    assert answered[:2] == [True, True] and all(answered), answered


def page(number: int) -> PageImage:
    image = Image.new("RGB", (300, 400), (250, 250, 250))
    image.putpixel((number, 200), (0, 0, 0))  # each page looks different
    return PageImage(number, image, 216, 288)


def test_the_test_page_is_sent_as_a_page_is_sent(tmp_path: Path) -> None:
    server = StandInFleetServer(delay=0.05, api_key=KEY)
    server.start()

    async def scenario() -> None:
        config = OpenAiConfig(
            base_urls=(server.url,), model="stand-in", self_check_repeat_seconds=0.2
        )
        engine = create_engine(EngineConfig(kind="openai", openai=config), "openai")
        await engine.start()
        try:
            for number in range(1, 4):
                await engine.recognise(page(number), PromptMode.text)
            while sum(test_page for *_, test_page in server.posts) < 3:  # a few rechecks
                await asyncio.sleep(0.05)
        finally:
            await engine.stop()

    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("OCRD_OPENAI_API_KEY", KEY)
        try:
            asyncio.run(asyncio.wait_for(scenario(), 60))
        finally:
            server.stop()

    checks = [(h, b) for h, b, test_page in server.posts if test_page]
    pages = [(h, b) for h, b, test_page in server.posts if not test_page]
    assert len(checks) >= 3 and len(pages) == 3
    ids = [headers["X-Request-Id"] for headers, _, _ in server.posts]
    assert all(PAGE_ID.fullmatch(i) for i in ids), ids  # no id of its own
    numbers = [int(i.split("-")[1]) for i in ids]
    assert len(set(numbers)) == len(numbers)  # one sequence for pages and checks
    header_names = {frozenset(h) - {"Content-Length"} for h, _, _ in server.posts}
    assert len(header_names) == 1, header_names  # the same headers, no marker
    assert not any("self-check" in value.lower() for h, _ in checks for value in h.values())

    def shape(body: dict[str, Any]) -> dict[str, Any]:
        content = body["messages"][0]["content"]
        text = [part for part in content if part["type"] == "text"]
        return {**body, "messages": text}  # all but the image

    # Once pages went (here in text mode), the check goes with their prompt too.
    first_page = next(i for i, (_, _, test_page) in enumerate(server.posts) if not test_page)
    later = [body for _, body, _ in server.posts[first_page:]]
    assert sum(test_page for *_, test_page in server.posts[first_page:]) >= 1
    assert all(shape(body) == shape(pages[0][1]) for body in later)


def test_an_endless_worker_list_fails_the_poll_and_memory_stays_bounded(
    tmp_path: Path, start_daemon
) -> None:
    worker = Worker(tmp_path, 1)
    worker.start()
    router = StandInRouter([worker.url])
    router.start()
    try:
        engine = fleet_engine(router_url=router.url, router_poll_seconds=0.3)
        config = write_config(tmp_path, {"max_image_side": 768}, engine=engine)
        daemon = start_daemon(config)
        daemon.wait_for("engine.replica_ready", replica=worker.url, timeout=60)
        make_pdf(tmp_path / "data" / "inbox" / "before.pdf", 2)
        daemon.wait_for("document.finished", timeout=60)
        before = high_water_kib(daemon.process.pid)

        router.endless_bytes = 300 * 1024 * 1024  # a 300 MiB "worker list"
        failed = daemon.wait_for("engine.registry_unreadable", timeout=60)
        after = high_water_kib(daemon.process.pid)
        make_pdf(tmp_path / "data" / "inbox" / "after.pdf", 2)
        finished = daemon.wait_for("document.finished", timeout=60, count=2)
        assert daemon.stop() == 0
    finally:
        router.stop()
        worker.stop()

    assert f"more than {MAX_LIST_BYTES // (1024 * 1024)} MiB" in failed[0]["error"]
    assert failed[0]["workers"] == [worker.url]  # the workers last listed keep working
    assert {event["outcome"] for event in finished} == {"done"}
    assert after - before < 200 * 1024, (before, after)  # KiB: far below the body's size
    assert router.sent < router.endless_bytes  # ocrd stopped reading; the rest was never sent


@pytest.mark.parametrize(
    ("trusted", "url", "refused"),
    [
        (["10.0.0.0/8"], "http://10.1.2.3:8000", False),
        (["10.0.0.0/8"], "http://11.1.2.3:8000", True),
        (["10.0.0.0/8"], "http://gpu1.internal:8000", True),  # a name is not looked up
        (["gpu1.internal"], "http://GPU1.internal:8000", False),
        (["gpu1.internal:8000"], "http://gpu1.internal:8001", True),
        (["gpu1.internal:8000"], "http://gpu1.internal:8000", False),
        (["gpu1.internal"], "http://gpu1.internal@evil.example:8000", True),
        (["::1"], "http://[::1]:8000", False),
        (["gpu1.internal"], "ftp://gpu1.internal", True),
    ],
)
def test_trusted_workers_entries(trusted: list[str], url: str, refused: bool) -> None:
    config = OpenAiConfig(router_url="http://router:30000", trusted_workers=tuple(trusted))
    assert (WorkerTrust.of(config).refusal(url) is not None) is refused


def test_by_default_only_the_routers_host_is_trusted_and_tls_can_be_required() -> None:
    default = WorkerTrust.of(OpenAiConfig(router_url="http://10.0.0.5:30000"))
    assert default.refusal("http://10.0.0.5:8000") is None
    assert "not in engine.openai.trusted_workers" in (default.refusal("http://10.0.0.6:8000") or "")
    tls = OpenAiConfig(router_url="https://router:30000", trusted_workers=("10.0.0.0/8",))
    strict = WorkerTrust.of(tls.model_copy(update={"require_tls": True}))
    assert strict.refusal("https://10.0.0.7:8000") is None
    assert "not https" in (strict.refusal("http://10.0.0.7:8000") or "")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"router_url": "http://r:1", "trusted_workers": ["10.0.0.0/33"]}, "not a CIDR network"),
        ({"router_url": "http://r:1", "trusted_workers": ["h:port"]}, "no valid port"),
        ({"trusted_workers": ["10.0.0.0/8"]}, "trusted_workers needs router_url"),
        ({"base_urls": ["http://a:8000/v1"], "require_tls": True}, "not https URLs"),
        ({"router_url": "http://r:1", "require_tls": True}, "not https URLs"),
    ],
)
def test_trust_settings_that_cannot_hold_are_config_errors(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        OpenAiConfig.model_validate(settings)


def certificates(folder: Path) -> tuple[Path, ssl.SSLContext]:
    """A private CA (its PEM file) and a server context whose certificate, signed by it,
    names only `localhost` (made with the openssl command)."""

    def openssl(command: str) -> None:
        subprocess.run(["openssl", *command.split()], cwd=folder, check=True, capture_output=True)

    (folder / "names.ext").write_text(
        "subjectAltName=DNS:localhost\nauthorityKeyIdentifier=keyid\n"
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
    )
    openssl("req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=ca -keyout ca.key -out ca.pem")
    openssl("req -newkey rsa:2048 -nodes -subj /CN=localhost -keyout server.key -out server.csr")
    openssl(
        "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 "
        "-extfile names.ext -out server.pem"
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "server.pem", folder / "server.key")
    return folder / "ca.pem", context


def test_with_require_tls_a_server_is_reached_only_under_the_name_its_certificate_carries(
    tmp_path: Path,
) -> None:
    ca, context = certificates(tmp_path)
    named, misnamed = StandInFleetServer(0.05, KEY, context), StandInFleetServer(0.05, KEY, context)
    named.start()
    misnamed.start()

    async def scenario() -> tuple[list[str], list[Any]]:
        config = OpenAiConfig(
            base_urls=(named.https_url("localhost"), misnamed.https_url("127.0.0.1")),
            model="stand-in",
            require_tls=True,
            tls_ca=str(ca),
            retry_backoff_seconds=5.0,
        )
        engine = create_engine(EngineConfig(kind="openai", openai=config), "openai")
        await engine.start()
        try:
            texts = [await engine.recognise(page(n), PromptMode.text) for n in (1, 2)]
            return [t.text for t in texts], engine.replicas
        finally:
            await engine.stop()

    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("OCRD_OPENAI_API_KEY", KEY)
        try:
            texts, replicas = asyncio.run(asyncio.wait_for(scenario(), 60))
        finally:
            named.stop()
            misnamed.stop()

    assert all("Image digest" in text for text in texts)  # answered over https, verified
    assert len(named.posts) >= 3 and misnamed.requests == []  # not even the key went there
    state = {r.name: r for r in replicas}[misnamed.https_url("127.0.0.1")]
    assert state.state.value == "down" and "certificate" in (state.problem or "").lower()
