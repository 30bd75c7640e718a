"""Engine replicas: routing, supervision, crash accounting and the self-check, with real
processes on real Unix sockets (simulated replicas: `python -m ocrd.engines.simulated_server`,
which speaks vllm serve's HTTP and reads nothing on the page) and, for remote fleets, the
stand-in server of tests/fleet.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pymupdf
import pytest
from conftest import files_under, markdown_under, wait_until, write_config
from fleet import StandInFleetServer, fleet_config
from helpers import make_pdf
from PIL import Image
from test_http import base_url, metric, run_ocrd_status

from ocrd.backoff import Backoff
from ocrd.config import (
    DocumentOptions,
    EngineConfig,
    PipelineConfig,
    PromptMode,
    SamplingConfig,
    SupervisionConfig,
)
from ocrd.documents.pipeline import DocumentContext, Pipeline
from ocrd.domain import PageImage, PageText
from ocrd.engines import EngineState, PageCrashedError, ReplicaState, create_engine, selfcheck
from ocrd.engines.keepers import ChildCommand, ProcessKeeper
from ocrd.engines.link import ServerLink
from ocrd.engines.media import PageFiles
from ocrd.engines.replica import Replica, RouterSettings
from ocrd.engines.replica_metrics import merge_metrics
from ocrd.engines.router import Router
from ocrd.engines.simulated_server import MARK

FAST_SUPERVISION = {
    "restart_backoff_seconds": 0.3,
    "health_interval_seconds": 0.3,
    "health_timeout_seconds": 0.5,
    "health_failures": 2,
    "stop_grace_seconds": 1.0,
}


def simulated(replicas: int, **settings: Any) -> EngineConfig:
    simulated = {"replicas": replicas, "capacity": 4, "seconds_per_page": 0.2}
    simulated.update({k: v for k, v in settings.items() if k != "self_check"})
    section: dict[str, Any] = {
        "kind": "simulated",
        "simulated": simulated,
        "supervision": FAST_SUPERVISION,
    }
    if "self_check" in settings:
        section["self_check"] = settings["self_check"]
    return EngineConfig.model_validate(section)


def page(number: int, marked: bool = False) -> PageImage:
    image = Image.new("RGB", (300, 400), (250, 250, 250))
    image.putpixel((number % 300, 200), (0, 0, 0))  # each page looks different
    if marked:
        image.paste(MARK, (0, 0, 20, 20))
    return PageImage(number, image, 216, 288)


def run(coroutine: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coroutine, 120))


async def started(config: EngineConfig) -> Router:
    engine = create_engine(config, config.kind)
    assert isinstance(engine, Router)
    await engine.start()
    return engine


def test_a_documents_pages_spread_over_the_replicas_by_fewest_in_flight() -> None:
    async def scenario() -> tuple[list[PageText], list[int], int]:
        engine = await started(simulated(2))
        try:
            texts = await asyncio.gather(
                *(engine.recognise(page(n), PromptMode.layout) for n in range(1, 25))
            )
            return texts, [r.pages_done for r in engine.replicas], engine.max_concurrency
        finally:
            await engine.stop()

    texts, done, capacity = run(scenario())
    assert capacity == 8  # the pipeline's auto sizing follows the sum of the replicas
    assert [t.finish_reason for t in texts] == ["stop"] * 24
    assert "# Simulated page 7" in texts[6].text
    assert sum(done) == 24 and min(done) >= 8, done


def test_waiting_pages_go_to_a_replica_lower_priority_value_first() -> None:
    async def scenario() -> list[int]:
        engine = await started(simulated(1, capacity=1, seconds_per_page=0.3))
        finished: list[int] = []

        async def one(number: int, priority: int) -> None:
            await engine.recognise(page(number), PromptMode.text, priority)
            finished.append(number)

        try:
            first = asyncio.create_task(one(1, 0))
            await asyncio.sleep(0.1)  # page 1 holds the only slot
            await asyncio.gather(first, one(2, 30), one(3, 10), one(4, 20))
            return finished
        finally:
            await engine.stop()

    assert run(scenario()) == [1, 3, 4, 2]


def test_a_killed_replica_is_restarted_while_the_other_works_and_no_page_fails() -> None:
    async def scenario() -> tuple[list[Any], Any, Any, EngineState, int, int]:
        engine = await started(simulated(2))
        victim = engine.replicas[0]
        assert victim.pid is not None

        async def kill_soon() -> None:
            await asyncio.sleep(0.5)
            os.kill(victim.pid, signal.SIGKILL)

        try:
            killer = asyncio.create_task(kill_soon())
            results = await asyncio.gather(
                *(engine.recognise(page(n), PromptMode.layout) for n in range(1, 41)),
                return_exceptions=True,
            )
            await killer
            for _ in range(50):  # it is back soon after (backoff 0.3 s)
                if engine.replicas[0].state is ReplicaState.ready:
                    break
                await asyncio.sleep(0.1)
            restarted, other = engine.replicas
            return results, restarted, other, engine.health.state, victim.pid, restarted.pid
        finally:
            await engine.stop()

    results, restarted, other, state, old_pid, new_pid = run(scenario())
    assert all(isinstance(r, PageText) for r in results), results
    assert restarted.restarts == 1 and restarted.deaths_with_pages == 1
    assert restarted.state is ReplicaState.ready and new_pid != old_pid
    assert other.restarts == 0 and other.pages_done > restarted.pages_done
    assert state is EngineState.ready
    assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == "zombie"


def test_a_replica_that_stops_answering_is_restarted() -> None:
    async def scenario() -> tuple[list[Any], Any, int]:
        engine = await started(simulated(2))
        hung = engine.replicas[1].pid
        assert hung is not None
        try:
            os.kill(hung, signal.SIGSTOP)  # alive, but answers nothing
            results = await asyncio.gather(
                *(engine.recognise(page(n), PromptMode.layout) for n in range(1, 21)),
                return_exceptions=True,
            )
            for _ in range(50):
                if engine.replicas[1].state is ReplicaState.ready:
                    break
                await asyncio.sleep(0.1)
            return results, engine.replicas[1], hung
        finally:
            with_suppressed_lookup(lambda: os.kill(hung, signal.SIGCONT))
            await engine.stop()

    results, replica, hung = run(scenario())
    assert all(isinstance(r, PageText) for r in results), results
    assert replica.restarts == 1 and replica.pid != hung
    assert not psutil.pid_exists(hung) or psutil.Process(hung).status() == "zombie"


def with_suppressed_lookup(action: Any) -> None:
    with contextlib.suppress(ProcessLookupError):
        action()


def test_a_page_that_kills_its_replica_twice_is_set_aside_and_the_others_finish() -> None:
    async def scenario() -> tuple[list[Any], list[Any]]:
        engine = await started(simulated(2, exit_on_marked_pages=True))
        try:
            pages = [page(n, marked=n == 5) for n in range(1, 13)]
            results = await asyncio.gather(
                *(engine.recognise(p, PromptMode.layout) for p in pages),
                return_exceptions=True,
            )
            return results, engine.replicas
        finally:
            await engine.stop()

    results, replicas = run(scenario())
    poisoned = results[4]
    assert isinstance(poisoned, PageCrashedError) and not poisoned.retryable
    assert poisoned.page == 5
    assert str(poisoned) in (
        "the engine crashed on page 5 twice",
        "the engine crashed on page 5 3 times",
    )
    assert all(isinstance(r, PageText) for i, r in enumerate(results) if i != 4), results
    assert sum(r.restarts for r in replicas) >= 2


def test_a_replica_that_cannot_start_fails_the_engines_start_with_its_reason(
    tmp_path: Path,
) -> None:
    async def scenario() -> str:
        socket = tmp_path / "never.sock"
        command = ChildCommand([sys.executable, "-c", "import sys; sys.exit(2)"], {}, socket)
        link = ServerLink("http://localhost/v1", socket=socket)
        keeper = ProcessKeeper(lambda: command, link, SupervisionConfig(**FAST_SUPERVISION))
        settings = RouterSettings(
            model="m", request_timeout=5, self_check=False, restart=Backoff(0.2), local=True
        )
        engine = Router(
            "test",
            [Replica("broken", link, keeper, 1)],
            SamplingConfig(),
            settings,
            PageFiles(tmp_path).write,
        )
        try:
            await engine.start()
        except Exception as error:
            return f"{type(error).__name__}: {error}"
        return "started"

    assert run(scenario()) == (
        "EngineStartError: no test replica started: broken: exited with status 2 while starting"
    )


def test_replicas_that_do_not_read_the_test_page_get_no_pages_and_the_engine_says_garbled() -> None:
    async def scenario() -> tuple[Any, list[Any], bool]:
        engine = await started(simulated(2, self_check=True))  # it reads nothing
        try:
            waiting = asyncio.create_task(engine.recognise(page(1), PromptMode.layout))
            await asyncio.sleep(1.0)
            return engine.health, engine.replicas, waiting.done()
        finally:
            await engine.stop()

    health, replicas, answered = run(scenario())
    assert health.state is EngineState.garbled
    assert "answers but its output is garbled: it read" in health.problem
    assert "words of ocrd's test page" in health.problem
    assert "set engine.self_check to false" in health.problem
    assert not answered
    assert [r.state for r in replicas] == [ReplicaState.garbled] * 2
    assert all(r.self_check is not None and not r.self_check.passed for r in replicas)
    assert all(r.pages_done == 0 for r in replicas)


def fleet_engine(*fleets: StandInFleetServer, self_check: bool = True) -> Any:
    config = EngineConfig.model_validate(
        {
            "kind": "openai",
            "self_check": self_check,
            "openai": {
                "base_urls": [f.url for f in fleets],
                "max_concurrency": 4,
                "retry_backoff_seconds": 0.2,
            },
        }
    )
    return create_engine(config, "openai")


def test_a_fleet_server_with_garbled_output_fails_the_self_check_and_a_reading_one_passes() -> None:
    garbled, reading = StandInFleetServer(delay=0.05), StandInFleetServer(delay=0.05)
    garbled.garbled = True
    garbled.start()
    reading.start()

    async def scenario() -> tuple[Any, list[Any], Any, list[Any]]:
        both = fleet_engine(garbled, reading)
        only_garbled = fleet_engine(garbled)
        await both.start()
        await only_garbled.start()
        try:
            texts = await asyncio.gather(
                *(both.recognise(page(n), PromptMode.layout) for n in range(1, 9))
            )
            assert all(t.finish_reason == "stop" for t in texts)
            return both.health, both.replicas, only_garbled.health, only_garbled.replicas
        finally:
            await both.stop()
            await only_garbled.stop()

    try:
        health, replicas, garbled_health, garbled_replicas = run(scenario())
    finally:
        garbled.stop()
        reading.stop()
    bad, good = replicas
    assert good.state is ReplicaState.ready and good.self_check.passed
    drawn = len(selfcheck.COLUMNS) * selfcheck.DRAWN_ROWS  # a fleet check: its drawn cells
    assert good.self_check.words_found == good.self_check.words_expected == drawn
    assert bad.state is ReplicaState.garbled and not bad.self_check.passed
    assert bad.pages_done == 0 and good.pages_done == 8  # the garbled server got no page
    assert health.state is EngineState.ready and garbled.url in health.degraded
    assert garbled_health.state is EngineState.garbled
    assert "output is garbled" in garbled_health.problem
    assert "vLLM version ocrd is tested with (0.18)" in garbled_health.problem  # what to do
    assert garbled_replicas[0].self_check.words_found < 10


def test_replica_metrics_are_merged_with_a_replica_label() -> None:
    one = (
        "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        "# HELP python_gc_objects_collected_total GC.\n"
        "python_gc_objects_collected_total 5.0\n"
    )
    two = (
        "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
    )
    assert merge_metrics([("gpu0", one), ("gpu1", two)]) == (
        "# HELP vllm:num_requests_running Running.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{engine="0",model_name="m",replica="gpu0"} 3.0\n'
        'vllm:num_requests_running{engine="0",model_name="m",replica="gpu1"} 1.0\n'
    )


def test_simulated_replicas_expose_their_metrics_labelled_by_replica() -> None:
    async def scenario() -> str:
        engine = await started(simulated(2))
        try:
            await asyncio.gather(*(engine.recognise(page(n), PromptMode.text) for n in (1, 2)))
            return await engine.metrics_text()
        finally:
            await engine.stop()

    text = run(scenario())
    assert 'vllm:num_requests_running{model_name="simulated",replica="replica1"} 0' in text
    assert 'vllm:request_success_total{model_name="simulated",replica="replica2"}' in text


def test_a_real_ocr_engine_reads_ocrds_test_page_well_enough_to_pass() -> None:
    """The page is legible: RapidOCR (a small CPU model) reads enough of it; garbage not."""
    from ocrd.config import RapidOcrConfig
    from ocrd.engines.rapidocr import RapidOcrEngine

    async def read() -> str:
        engine = RapidOcrEngine(RapidOcrConfig())
        await engine.start()
        try:
            image = selfcheck.check_page()
            return (await engine.recognise(PageImage(1, image, 420, 315), PromptMode.text)).text
        finally:
            await engine.stop()

    score = selfcheck.score(run(read()))
    assert score.passed, score
    assert not selfcheck.score("<td>1</td> the the of" * 30).passed


# --- the daemon with replicas ------------------------------------------------------------


def marked_pdf(path: Path, pages: int, marked_page: int) -> Path:
    """Like helpers.make_pdf, with a magenta square in the top-left corner of one page
    (a simulated replica exits when it is sent that page)."""
    document = pymupdf.open()
    for number in range(1, pages + 1):
        pdf_page = document.new_page(width=420, height=595)
        pdf_page.insert_text((40, 100), f"Page {number}", fontsize=36)
        if number == marked_page:
            pdf_page.draw_rect(pymupdf.Rect(0, 0, 30, 30), color=None, fill=(1, 0, 1))
    document.save(path)
    document.close()
    return path


@pytest.mark.slow
def test_ocrd_run_with_simulated_replicas_fails_only_the_document_whose_page_kills_them(
    tmp_path: Path, start_daemon
) -> None:
    engine = {
        "kind": "simulated",
        "simulated": {
            "replicas": 2,
            "capacity": 4,
            "seconds_per_page": 0.2,
            "exit_on_marked_pages": True,
        },
        "supervision": FAST_SUPERVISION,
    }
    config = write_config(tmp_path, {"max_image_side": 768}, engine=engine)
    daemon = start_daemon(config)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready", timeout=60)
    children = [" ".join(c.cmdline()) for c in psutil.Process(daemon.process.pid).children()]
    inbox = tmp_path / "data" / "inbox"
    for index in range(4):
        make_pdf(inbox / f"good{index}.pdf", 6, label=f"Good {index} page")
    marked_pdf(inbox / "poison.pdf", 3, marked_page=2)
    finished = daemon.wait_for("document.finished", timeout=120, count=5)
    assert daemon.process.poll() is None  # the daemon never exited

    # What an operator sees of the replicas: the status report, the metrics, ocrd status.
    def both_ready() -> dict[str, Any] | None:
        report = httpx.get(f"{url}/api/status").json()
        return report if {r["state"] for r in report["replicas"]} == {"ready"} else None

    report = wait_until(both_ready, 30, "both replicas ready again")
    replicas = {r["name"]: r for r in report["replicas"]}
    assert sorted(replicas) == ["replica1", "replica2"] and report["ready"]
    assert report["engine_summary"] == "2 of 2 replicas ready"
    assert sum(r["pages_done"] for r in replicas.values()) >= 24  # the good documents' pages
    assert sum(r["restarts"] for r in replicas.values()) >= 2  # the poison page killed two
    assert sum(r["deaths_with_pages"] for r in replicas.values()) >= 2
    metrics = httpx.get(f"{url}/metrics").text
    for name in replicas:
        assert metric(metrics, "ocrd_engine_replica_state", replica=name, state="ready") == 1
        assert metric(metrics, "ocrd_engine_replica_capacity", replica=name) == 4
    done = [metric(metrics, "ocrd_engine_replica_pages_total", replica=n) for n in replicas]
    assert sum(value or 0 for value in done) >= 24
    page = httpx.get(url).text
    assert "Engine replicas: 2 of 2 replicas ready" in page and "replica2" in page
    (tmp_path / "config.yaml").write_text(
        (tmp_path / "config.yaml").read_text().replace("127.0.0.1:0", url[len("http://") :])
    )
    status = run_ocrd_status(config)
    assert "engine replicas: 2 of 2 replicas ready" in status.stdout, status.stdout
    assert "  replica1 ready, 0/4 in flight" in status.stdout
    assert daemon.stop() == 0

    assert sum("ocrd.engines.simulated_server --replica 1" in c for c in children) == 1
    assert sum("ocrd.engines.simulated_server --replica 2" in c for c in children) == 1
    outcomes = {event["path"]: event["outcome"] for event in finished}
    assert outcomes == {**{f"good{i}.pdf": "done" for i in range(4)}, "poison.pdf": "failed"}
    data = tmp_path / "data"
    report = json.loads((data / "failed" / "poison.error.json").read_text())
    assert report["stage"] == "recognise" and report["page"] == 2
    assert "the engine crashed on page 2" in report["message"]
    assert markdown_under(data / "outbox") == [f"good{i}.md" for i in range(4)]
    assert len(daemon.find("engine.replica_down")) >= 2
    assert files_under(data / "work") == []


@pytest.mark.slow
def test_a_fleet_server_that_drops_the_same_page_twice_fails_only_that_document(
    tmp_path: Path, start_daemon
) -> None:
    fleet = StandInFleetServer(delay=0.3)
    fleet.crash_on_marked_pages = True
    fleet.start()
    try:
        config = fleet_config(tmp_path, fleet)
        inbox = tmp_path / "data" / "inbox"
        make_pdf(inbox / "good.pdf", 4)
        marked_pdf(inbox / "poison.pdf", 2, marked_page=1)
        daemon = start_daemon(config)
        finished = daemon.wait_for("document.finished", timeout=120, count=2)
        assert daemon.stop() == 0
    finally:
        fleet.stop()
    outcomes = {event["path"]: event["outcome"] for event in finished}
    assert outcomes == {"good.pdf": "done", "poison.pdf": "failed"}
    assert fleet.crashes >= 2
    report = json.loads((tmp_path / "data" / "failed" / "poison.error.json").read_text())
    assert report["page"] == 1 and "the engine crashed on page 1" in report["message"]


@pytest.mark.slow
def test_files_wait_in_the_inbox_while_every_fleet_server_writes_garbage(
    tmp_path: Path, start_daemon
) -> None:
    fleet = StandInFleetServer(delay=0.05)
    fleet.garbled = True
    fleet.start()
    try:
        engine = {"kind": "openai", "openai": {"base_urls": [fleet.url]}}
        config = write_config(tmp_path, engine=engine)
        inbox = tmp_path / "data" / "inbox"
        make_pdf(inbox / "waiting.pdf", 2)
        daemon = start_daemon(config)
        url = base_url(daemon)
        daemon.wait_for("engine.self_check_failed", timeout=60)
        daemon.wait_for("daemon.ready", timeout=60)
        [garbled] = daemon.wait_for("engine.garbled", timeout=30)
        time.sleep(3)  # several main-loop ticks: nothing is claimed
        assert not daemon.find("document.claimed")
        ready = httpx.get(f"{url}/readyz")
        assert ready.status_code == 503 and ready.json()["engine_state"] == "garbled"
        [problem] = ready.json()["problems"]
        assert problem.startswith("ENGINE OUTPUT GARBLED: ") and "output is garbled" in problem
        assert "tested with (0.18)" in problem and "files wait in the inbox" in problem
        assert "output is garbled" in garbled["error"]
        report = httpx.get(f"{url}/api/status").json()
        [replica] = report["replicas"]
        assert replica["state"] == "garbled" and not replica["self_check_passed"]
        assert replica["self_check"].startswith("read ") and "words" in replica["self_check"]
        metrics = httpx.get(f"{url}/metrics").text
        server = replica["name"]
        assert metric(metrics, "ocrd_engine_replica_self_check_passed", replica=server) == 0
        assert metric(metrics, "ocrd_engine_state", state="garbled") == 1
        assert "ENGINE OUTPUT GARBLED" in httpx.get(url).text
        assert daemon.stop() == 0
    finally:
        fleet.stop()
    assert files_under(inbox) == ["waiting.pdf"]
    assert fleet.answered == 0  # no page was sent, only the self-check


# --- choosing devices, and what each replica runs ------------------------------------------


def test_gpus_auto_gives_each_visible_gpu_a_replica_and_a_list_picks_among_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ocrd.config import VllmConfig
    from ocrd.engines.replicas import device_groups, visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5,7")
    visible = visible_gpus()
    assert visible == ["2", "3", "5", "7"]
    assert device_groups(VllmConfig(), visible) == [["2"], ["3"], ["5"], ["7"]]
    assert device_groups(VllmConfig(tensor_parallel_size=2), visible) == [["2", "3"], ["5", "7"]]
    assert device_groups(VllmConfig(gpus=(1, 3)), visible) == [["3"], ["7"]]
    with pytest.raises(ValueError, match="lists device 4, but only 4 GPUs are visible"):
        device_groups(VllmConfig(gpus=(0, 4)), visible)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")  # CUDA's way of hiding every GPU
    assert visible_gpus() == []


def test_a_device_list_must_make_whole_tensor_parallel_replicas() -> None:
    from ocrd.config import ConfigError, parse_config

    engine = {"kind": "vllm", "vllm": {"gpus": [0, 1, 2], "tensor_parallel_size": 2}}
    with pytest.raises(ConfigError, match="3 gpus do not make whole replicas"):
        parse_config({"inboxes": [{"path": "in"}], "engine": engine}, Path("/tmp"))


def test_the_self_check_is_on_by_default_except_where_nothing_can_read() -> None:
    def check(section: dict[str, Any], kind: str) -> bool:
        return EngineConfig.model_validate(section).self_check_for(kind)

    assert check({}, "vllm") and check({}, "openai")
    assert not check({}, "simulated")
    assert not check({"vllm": {"load_format": "dummy"}}, "vllm")
    assert check({"self_check": True, "vllm": {"load_format": "dummy"}}, "vllm")
    assert not check({"self_check": False}, "openai")


def test_each_vllm_replica_serves_with_the_recipes_settings_on_a_private_socket() -> None:
    from ocrd.config import VllmConfig
    from ocrd.engines.replicas import vllm_serve_argv

    config = VllmConfig(model="m", enforce_eager=True, kv_cache_memory_bytes=1 << 30)
    argv = " ".join(vllm_serve_argv(config, Path("/run/x/gpu0.sock"), Path("/run/x/pages")))
    for setting in (
        "-m vllm.entrypoints.openai.api_server --model m",
        "--no-enable-prefix-caching",
        "--mm-processor-cache-gb 0",
        "--logits-processors vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor",
        '--limit-mm-per-prompt {"image": 1}',
        "--scheduling-policy priority",
        "--max-num-seqs 128 --max-num-batched-tokens 16384",
        "--uds /run/x/gpu0.sock --allowed-local-media-path /run/x/pages",
        "--enforce-eager",
        f"--kv-cache-memory-bytes {1 << 30}",
    ):
        assert setting in argv
    assert "--api-key" not in argv  # the key travels in the environment, not in `ps`


def test_a_vllm_replica_runs_the_models_own_python_files_only_when_told() -> None:
    from ocrd.config import VllmConfig
    from ocrd.engines.replicas import vllm_serve_argv

    socket, media = Path("/run/x/gpu0.sock"), Path("/run/x/pages")
    assert "--trust-remote-code" not in vllm_serve_argv(VllmConfig(model="m"), socket, media)
    trusted = VllmConfig(model="m", trust_remote_code=True)
    assert "--trust-remote-code" in vllm_serve_argv(trusted, socket, media)


def test_a_page_a_worker_wrote_into_the_engines_page_folder_is_sent_as_it_is() -> None:
    """The hook for render workers that write pages where the replicas read them: the
    daemon then copies no pixels; the file is the engine's once handed over."""

    async def scenario() -> tuple[str, str, list[str], bool]:
        engine = await started(simulated(1))
        try:
            assert engine.page_folder is not None
            image = page(3).image
            in_memory = await engine.recognise(PageImage(3, image, 216, 288), PromptMode.text)
            written = engine.page_folder / "worker-page-3.ppm"
            image.save(written, format="PPM")
            lazy = Image.open(written)  # reads the header only, not the pixels
            from_file = await engine.recognise(PageImage(3, lazy, 216, 288), PromptMode.text)
            left = sorted(p.name for p in engine.page_folder.iterdir())
            return in_memory.text, from_file.text, left, written.exists()
        finally:
            await engine.stop()

    in_memory, from_file, left, still_there = run(scenario())
    assert from_file == in_memory and "pixel digest" in from_file
    assert left == [] and not still_there


def test_a_garbled_server_that_gets_fixed_is_asked_again_and_then_gets_pages(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ocrd.engines import supervision

    monkeypatch.setattr(supervision, "RECHECK", Backoff(first=0.5))
    fleet = StandInFleetServer(delay=0.05)
    fleet.garbled = True
    fleet.start()

    async def scenario() -> tuple[EngineState, EngineState, PageText, int]:
        engine = fleet_engine(fleet)
        await engine.start()
        try:
            before = engine.health.state
            waiting = asyncio.create_task(engine.recognise(page(1), PromptMode.layout))
            await asyncio.sleep(0.2)
            assert not waiting.done()
            fleet.garbled = False  # say, the server was pinned to a good vLLM and restarted
            text = await asyncio.wait_for(waiting, 30)
            return before, engine.health.state, text, fleet.self_checks
        finally:
            await engine.stop()

    try:
        before, after, text, checks = run(scenario())
    finally:
        fleet.stop()
    assert before is EngineState.garbled and after is EngineState.ready
    assert text.finish_reason == "stop" and checks >= 2


def test_pages_are_rendered_into_the_replicas_folder_and_none_is_left_behind(
    tmp_path: Path,
) -> None:
    """With local replicas the render workers write each page where the replicas read it;
    the router sends those files as they are, and pages that never reach the engine (blank
    ones here) leave no file behind."""
    pdf = tmp_path / "mixed.pdf"
    document = pymupdf.open()
    for number in range(1, 5):
        page_ = document.new_page(width=420, height=595)
        if number != 2:  # page 2 is blank: marked, never sent
            page_.insert_text((40, 100), f"Page {number}", fontsize=36)
    document.save(pdf)
    document.close()

    async def scenario() -> tuple[Any, list[Path], int, list[str]]:
        engine = await started(simulated(2, self_check=False))
        pipeline = Pipeline.create(engine, PipelineConfig(), 768)
        written_here = 0
        prepare = engine._prepare

        def counting(image: Image.Image) -> Any:
            nonlocal written_here
            written_here += 1
            return prepare(image)

        engine._prepare = counting  # type: ignore[method-assign]
        sent: list[str] = []
        request_body = engine.request_body

        def recording(url: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
            sent.append(url)
            return request_body(url, *args, **kwargs)

        engine.request_body = recording  # type: ignore[method-assign]
        try:
            result = await pipeline.convert(
                DocumentContext.of(pdf, DocumentOptions(), tmp_path / "scratch")
            )
            assert engine.page_folder is not None
            left = sorted(engine.page_folder.iterdir())
        finally:
            pipeline.renderers.shutdown()
            await engine.stop()
        return result, left, written_here, sent

    result, left, written_here, sent = run(scenario())
    assert [p.source.value for p in result.pages] == ["engine", "blank", "engine", "engine"]
    assert left == []  # every page file removed: the sent ones after their answer
    assert written_here == 0  # no page was copied into a file by the daemon's process
    assert len(sent) == 3 and all(url.startswith("file://") and "render-" in url for url in sent)
