"""`ocrd run` with a fleet behind the real `vllm-router`: the router is the fleet's registry
(`openai.router_url`), ocrd reads its worker list and sends each worker its pages directly.

The cases are issue 30's table: a worker that garbles from the start, one that comes back
garbling after a restart, the router's first worker dead, a worker added and removed at the
router while ocrd runs, all workers down at once, and a page that kills the workers it is
sent to. Workers are ocrd's simulated servers (tests/routed_fleet.py): real processes and
sockets, no model (they read nothing; they answer the test page by its request id).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import files_under, markdown_under, wait_until, write_config
from helpers import make_pdf
from PIL import Image
from routed_fleet import GARBLE, Worker, fleet_behind
from test_http import base_url, metric, run_ocrd_status
from test_replicas import marked_pdf

from ocrd.config import EngineConfig, OpenAiConfig, PromptMode
from ocrd.domain import PageImage, PageText
from ocrd.engines import EngineState, PageCrashedError, ReplicaState, create_engine
from ocrd.engines.blame import CrashRecord
from ocrd.engines.replica import Replica
from ocrd.engines.sending import Gone
from ocrd.log import get_logger

pytestmark = pytest.mark.slow


def page(number: int) -> PageImage:
    image = Image.new("RGB", (300, 400), (250, 250, 250))
    image.putpixel((number, 200), (0, 0, 0))  # each page looks different
    return PageImage(number, image, 216, 288)


def routed_config(tmp_path: Path, router_url: str) -> Path:
    engine = {
        "kind": "openai",
        "openai": {
            "router_url": router_url,
            "router_poll_seconds": 0.5,
            "model": "simulated",
            "max_concurrency": 4,
            "retry_backoff_seconds": 0.2,
            "request_timeout_seconds": 30,
        },
    }
    return write_config(tmp_path, {"max_image_side": 768}, engine=engine)


@contextlib.contextmanager
def stopping(worker: Worker) -> Iterator[Worker]:
    try:
        yield worker
    finally:
        worker.stop()


def outbox_text(data: Path) -> str:
    return "\n".join(path.read_text() for path in sorted((data / "outbox").rglob("*.md")))


def test_garbling_workers_a_dead_first_worker_and_workers_added_at_the_router(
    tmp_path: Path, start_daemon
) -> None:
    first, garbling, good = (
        Worker(tmp_path, 1),
        Worker(tmp_path, 2, garble=True),
        Worker(tmp_path, 3),
    )
    added = Worker(tmp_path, 4)
    with fleet_behind(tmp_path, [first, garbling, good]) as router, stopping(added):
        first.kill()  # the router still lists it first: dead from the start
        config = routed_config(tmp_path, router.url)
        daemon = start_daemon(config)
        url = base_url(daemon)
        daemon.wait_for("daemon.ready", timeout=60)
        inbox, data = tmp_path / "data" / "inbox", tmp_path / "data"
        for index in range(4):
            make_pdf(inbox / f"early{index}.pdf", 4, label=f"Early {index} page")
        daemon.wait_for("document.finished", timeout=60, count=4)

        added.start()  # registered once, at the router: ocrd is not touched
        router.add(added)
        daemon.wait_for("engine.worker_joined", worker=added.url, timeout=30)
        daemon.wait_for("engine.replica_ready", replica=added.url, timeout=30)
        for index in range(6):
            make_pdf(inbox / f"late{index}.pdf", 4, label=f"Late {index} page")
        daemon.wait_for("page.recognised", timeout=60, count=16 + 6)
        good.kill()  # a worker restarts mid-run and comes back garbling
        good.start(garble=True)
        finished = daemon.wait_for("document.finished", timeout=90, count=10)
        daemon.wait_for("engine.self_check_failed", replica=good.url, timeout=30)

        report = httpx.get(f"{url}/api/status").json()
        metrics = httpx.get(f"{url}/metrics").text
        (tmp_path / "config.yaml").write_text(
            (tmp_path / "config.yaml").read_text().replace("127.0.0.1:0", url[len("http://") :])
        )
        status = run_ocrd_status(config).stdout

        router.remove(added)
        daemon.wait_for("engine.worker_left", worker=added.url, timeout=30)
        wait_until(
            lambda: added.url not in str(httpx.get(f"{url}/api/status").json()["replicas"]),
            30,
            "the removed worker gone from the status report",
        )
        assert daemon.stop() == 0

    assert {event["outcome"] for event in finished} == {"done"}
    assert GARBLE.strip()[:10] not in outbox_text(data)  # no garbage in done/
    assert len(markdown_under(data / "outbox")) == 10 and files_under(data / "failed") == []
    assert garbling.answered_pages() == []  # the garbling worker got only the test page
    assert len(added.answered_pages()) > 0  # the worker added at the router got pages
    # What an operator sees: every worker, its state, its self-check and its pages.
    replicas = {r["name"]: r for r in report["replicas"]}
    assert sorted(replicas) == sorted(w.url for w in (first, garbling, good, added))
    assert replicas[first.url]["state"] == "down"
    assert replicas[garbling.url]["state"] == "garbled"
    assert not replicas[garbling.url]["self_check_passed"]
    assert replicas[good.url]["state"] == "garbled"  # after its restart
    assert replicas[added.url]["state"] == "ready" and replicas[added.url]["self_check_passed"]
    assert report["ready"] and garbling.url in report["degraded"]
    for worker, state in ((first, "down"), (garbling, "garbled"), (added, "ready")):
        assert metric(metrics, "ocrd_engine_replica_state", replica=worker.url, state=state) == 1
    assert (metric(metrics, "ocrd_engine_replica_pages_total", replica=added.url) or 0) > 0
    assert f"  {added.url} ready" in status and f"  {garbling.url} garbled" in status, status
    # The dead first worker never held the fleet up: it was found down once and probed.
    assert len(daemon.find("engine.unreachable")) == 0


def test_all_workers_down_at_once_every_page_is_answered_once_and_nothing_fails(
    tmp_path: Path, start_daemon
) -> None:
    workers = [Worker(tmp_path, n, seconds_per_page=0.3, capacity=4) for n in (1, 2, 3)]
    with fleet_behind(tmp_path, workers) as router:
        daemon = start_daemon(routed_config(tmp_path, router.url))
        daemon.wait_for("daemon.ready", timeout=60)
        inbox = tmp_path / "data" / "inbox"
        for index in range(5):
            make_pdf(inbox / f"doc{index}.pdf", 6, label=f"Doc {index} page")
        daemon.wait_for("page.recognised", timeout=60, count=6)
        for worker in workers:
            worker.kill()
        daemon.wait_for("engine.unreachable", timeout=30)
        for worker in workers:
            worker.start()
        daemon.wait_for("engine.reachable", timeout=60)
        finished = daemon.wait_for("document.finished", timeout=90, count=5)
        assert daemon.stop() == 0
    assert {event["outcome"] for event in finished} == {"done"}
    # Pages cut off by the outage went again; none that was answered was sent again.
    answered = sum(len(worker.answered_pages()) for worker in workers)
    assert answered == 30, answered
    assert not daemon.find("page.engine_error")


def test_a_page_that_kills_routed_workers_fails_only_its_document(
    tmp_path: Path, start_daemon
) -> None:
    workers = [Worker(tmp_path, n, exit_on_marked_pages=True) for n in (1, 2)]
    with fleet_behind(tmp_path, workers) as router:
        for worker in workers:
            worker.restart_on_exit()  # as systemd restarts a `vllm serve` unit
        config = routed_config(tmp_path, router.url)
        inbox = tmp_path / "data" / "inbox"
        make_pdf(inbox / "good.pdf", 4)
        marked_pdf(inbox / "poison.pdf", 3, marked_page=2)
        daemon = start_daemon(config)
        finished = daemon.wait_for("document.finished", timeout=120, count=2)
        assert daemon.stop() == 0
    outcomes = {event["path"]: event["outcome"] for event in finished}
    assert outcomes == {"good.pdf": "done", "poison.pdf": "failed"}
    assert sum(worker.restarts for worker in workers) >= 2
    report = json.loads((tmp_path / "data" / "failed" / "poison.error.json").read_text())
    assert report["page"] == 2 and "the engine crashed on page 2" in report["message"]


def test_a_router_that_does_not_answer_yet_leaves_the_fleet_unreachable_until_it_does(
    tmp_path: Path,
) -> None:
    worker = Worker(tmp_path, 1)
    with fleet_behind(tmp_path, [worker]) as router:
        address = router.url
        router.stop()

        async def scenario() -> tuple[Any, Any, Any]:
            config = OpenAiConfig(router_url=address, router_poll_seconds=0.2, model="simulated")
            engine = create_engine(EngineConfig(kind="openai", openai=config), "openai")
            await engine.start()
            try:
                before = (engine.health.state, engine.health.problem)
                router.start()  # the same router, answering now
                while engine.health.state is not EngineState.ready:
                    await asyncio.sleep(0.1)
                return before, engine.replicas, engine.health.degraded
            finally:
                await engine.stop()

        (state, problem), replicas, degraded = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert state is EngineState.unreachable
    assert f"the router at {address} does not give its workers" in problem
    assert [r.name for r in replicas] == [worker.url] and degraded is None


def test_one_refusal_is_one_pages_and_no_other_page_is_sent_again(tmp_path: Path) -> None:
    # Each refuses page 3 once (whichever it lands on first), and serves on.
    workers = [Worker(tmp_path, n, refuse_page_once=3) for n in (1, 2)]
    with fleet_behind(tmp_path, workers) as router:

        async def scenario() -> tuple[list[PageText], list[Any]]:
            config = OpenAiConfig(
                router_url=router.url,
                model="simulated",
                max_concurrency=8,
                retry_backoff_seconds=0.2,
            )
            engine = create_engine(EngineConfig(kind="openai", openai=config), "openai")
            await engine.start()
            try:
                texts = await asyncio.gather(
                    *(engine.recognise(page(n), PromptMode.text) for n in range(1, 13))
                )
                return texts, engine.replicas
            finally:
                await engine.stop()

        texts, replicas = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert [t.finish_reason for t in texts] == ["stop"] * 12
    answered = [i for worker in workers for i in worker.answered_pages()]
    assert len(answered) == 12  # the refused page once more, no other page again
    assert sum(r.pages_failed for r in replicas) >= 1  # counted as the page's failure
    assert all(r.restarts == 0 and r.deaths_with_pages == 0 for r in replicas)  # no death


def test_a_router_and_a_list_of_servers_are_not_both_the_fleet() -> None:
    with pytest.raises(ValueError, match="not both"):
        OpenAiConfig(router_url="http://router:30000", base_urls=("http://a:8000/v1",))


def test_a_pages_second_death_among_other_workers_deaths_is_an_outage_once() -> None:
    """The rule behind the outage test, step by step: a page cut off by one worker's death
    and sent to a second that dies too is set aside only if no worker that never had it
    went down meanwhile; an outage spares it once, and the next death sets it aside."""
    fleet = [Replica(f"http://w{n}", link=None, keeper=None, capacity=4) for n in (1, 2, 3)]
    first, second, third = fleet
    record = CrashRecord(7, get_logger())
    record.sent_to.add(first.name)
    record.died_with(first, first.generation, Gone("w1 went away"))
    first.state, first.since = ReplicaState.down, time.time()
    record.sent_to.add(second.name)
    assert record.would_be_set_aside(second)

    assert not record.in_an_outage(fleet, 5)  # the third still serves: it may be the page
    third.state, third.since = ReplicaState.down, time.time()
    assert record.in_an_outage(fleet, 5)  # the third went down without the page: an outage

    record.spare(second, Gone("w2 went away"))
    record.sent_to.add(first.name)
    with pytest.raises(PageCrashedError):
        record.died_with(first, first.generation, Gone("w1 went away again"))
