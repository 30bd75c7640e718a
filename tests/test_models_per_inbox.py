"""Models chosen per inbox: one daemon, inboxes on DeepSeek-OCR-2, LightOnOCR-2 and
olmOCR-2 at once. The engine is ocrd's simulated one (it reads nothing), standing in for
each model by answering in that model's own format (grounded Markdown; plain Markdown;
front matter and Markdown), so that what is tested is the daemon's logic per model: each
page goes to its inbox's model's engine and is read by that model's parser, every output
is made for every model, and status, metrics, summaries and log events name the model.
Real PDFs from the corpus, a real `ocrd run` process, real HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from conftest import NotifySocket, files_under, write_config
from helpers import make_pdf
from routed_fleet import wait_serving
from test_uploads import WITH_TOKEN

from ocrd.config import PromptMode, parse_config
from ocrd.config.reload import plan_reload
from ocrd.engines import EngineState, create_engine
from ocrd.engines.models import ModelEngines
from ocrd.models import models

pytestmark = pytest.mark.slow

MODELS = {"deskew": "deepseek-ocr-2", "lighton": "lightonocr-2", "olm": "olmocr-2"}
OUTPUTS = ["markdown", "pdf", "docling", "chunks"]
SOURCES = {
    "deskew": "ocrmypdf__skew.pdf",
    "lighton": "ocrmypdf__c02-22.pdf",
    "olm": "sample-files__habibi.pdf",
}


def three_models_config(tmp_path: Path, seconds_per_page: float = 0.05) -> Path:
    inboxes = []
    for folder, model in MODELS.items():
        (tmp_path / folder / "inbox").mkdir(parents=True)
        inboxes.append(
            {
                "path": f"{folder}/inbox",
                "settle_seconds": 0.5,
                "model": model,
                "outputs": OUTPUTS,
                "keep_raw": True,
                "layout_file": True,
            }
        )
    config = write_config(
        tmp_path,
        engine={
            "kind": "simulated",
            "simulated": {"seconds_per_page": seconds_per_page},
            "models": {"lightonocr-2": {}, "olmocr-2": {}},
        },
    )
    data = yaml.safe_load(config.read_text())
    data["inboxes"] = inboxes
    config.write_text(yaml.safe_dump(data))
    return config


def base_url(daemon: Any) -> str:
    [listening] = daemon.wait_for("http.listening", timeout=60)
    return f"http://{listening['address']}"


def raw_texts(outbox: Path, stem: str) -> list[str]:
    lines = (outbox / f"{stem}.raw.jsonl").read_text().splitlines()
    return [json.loads(line)["text"] for line in lines if '"page"' in line]


def test_three_inboxes_on_three_models_each_read_by_its_models_parser_with_every_output(
    tmp_path: Path, corpus: Path, start_daemon: Any
) -> None:
    config = three_models_config(tmp_path)
    daemon = start_daemon(config)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready", timeout=60)
    for folder, name in SOURCES.items():
        shutil.copy(corpus / "real" / name, tmp_path / folder / "inbox" / name)
    finished = daemon.wait_for("document.finished", timeout=180, count=3)

    by_path = {event["path"]: event for event in finished}
    for folder, model in MODELS.items():
        event = by_path[SOURCES[folder]]
        assert (event["outcome"], event["model"]) == ("done", model)
        pages = daemon.find("page.recognised", path=SOURCES[folder])
        assert pages and all(page["model"] == model for page in pages)
        stem = Path(SOURCES[folder]).stem
        outbox = tmp_path / folder / "outbox"
        written = files_under(outbox)
        for suffix in (".md", ".pdf", ".docling.json", ".chunks.jsonl", ".raw.jsonl"):
            assert f"{stem}{suffix}" in written, (model, suffix, written)
        markdown = (outbox / f"{stem}.md").read_text()
        assert "# Simulated page 1" in markdown and "pixel digest" in markdown
        docling = json.loads((outbox / f"{stem}.docling.json").read_text())
        assert any(t.get("text") == "Simulated page 1" for t in docling["texts"])
        chunks = [json.loads(line) for line in (outbox / f"{stem}.chunks.jsonl").open()]
        assert any("pixel digest" in chunk["text"] for chunk in chunks)

    # Each model answered in its own format, and only its parser's reading reached the
    # Markdown: no grounding tags, no front matter.
    deepseek_raw = raw_texts(tmp_path / "deskew" / "outbox", "ocrmypdf__skew")
    assert all(text.startswith("<|ref|>title<|/ref|>") for text in deepseek_raw)
    lighton_raw = raw_texts(tmp_path / "lighton" / "outbox", "ocrmypdf__c02-22")
    assert all(text.startswith("# Simulated page") for text in lighton_raw)
    assert all("![image](image_1.png)" in text for text in lighton_raw)
    olm_raw = raw_texts(tmp_path / "olm" / "outbox", "sample-files__habibi")
    assert all(text.startswith("---\nprimary_language: en\n") for text in olm_raw)
    for folder in MODELS:
        markdown = (tmp_path / folder / "outbox" / f"{Path(SOURCES[folder]).stem}.md").read_text()
        assert "<|ref|>" not in markdown and "<|det|>" not in markdown
        assert "primary_language" not in markdown and "is_rotation_valid" not in markdown
    # Figures: DeepSeek's and olmOCR's answers place theirs (cut out beside the Markdown);
    # plain LightOnOCR gives none (its figure has no box).
    assert files_under(tmp_path / "deskew" / "outbox" / "ocrmypdf__skew.assets")
    assert files_under(tmp_path / "olm" / "outbox" / "sample-files__habibi.assets")
    assert not (tmp_path / "lighton" / "outbox" / "ocrmypdf__c02-22.assets").exists()

    status = httpx.get(f"{url}/api/status").json()
    assert {inbox["path"]: inbox["model"] for inbox in status["inboxes"]} == {
        str(tmp_path / folder / "inbox"): model for folder, model in MODELS.items()
    }
    assert {d["path"]: d["model"] for d in status["finished"]} == {
        SOURCES[folder]: model for folder, model in MODELS.items()
    }
    assert sorted(r["model"] for r in status["replicas"]) == sorted(MODELS.values())
    assert len({r["name"] for r in status["replicas"]}) == 3
    page = httpx.get(f"{url}/").text
    assert all(model in page for model in MODELS.values())

    metrics = httpx.get(f"{url}/metrics").text
    for model in MODELS.values():
        assert f'model="{model}"' in metrics
        assert any(
            line.startswith("ocrd_pages_recognised_total") and f'model="{model}"' in line
            for line in metrics.splitlines()
        )
    # `ocrd status` finds the daemon where the configuration says it listens.
    config.write_text(config.read_text().replace("127.0.0.1:0", url.removeprefix("http://")))
    shown = subprocess.run(
        [sys.executable, "-m", "ocrd", "status", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    for folder, model in MODELS.items():
        assert f"inbox {tmp_path / folder / 'inbox'} (model {model})" in shown.stdout
    assert daemon.stop() == 0


def test_an_inbox_naming_a_model_no_engine_serves_is_refused(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"model": "lightonocr-2"})
    run = subprocess.run(
        [sys.executable, "-m", "ocrd", "run", "--config", str(config), "--log-format", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 78
    [line] = [line for line in run.stderr.splitlines() if "startup.refused" in line]
    assert "names the model 'lightonocr-2', which no engine serves" in line
    assert "served: deepseek-ocr-2" in line and "engine.models" in line
    assert files_under(tmp_path / "data" / "inbox") == []


def test_a_model_ocrd_does_not_know_is_refused_with_the_names_it_knows(
    tmp_path: Path, start_daemon: Any
) -> None:
    config = write_config(
        tmp_path, {"model": "tesseract-9"}, engine={"models": {"tesseract-9": {}}}
    )
    daemon = start_daemon(config)
    assert daemon.process.wait(timeout=60) == 78
    [refused] = daemon.find("startup.refused")
    assert "engine.models.tesseract-9" in refused["reason"]
    assert "deepseek-ocr-2" in refused["reason"] and "lightonocr-2" in refused["reason"]


def test_a_reload_plan_changes_an_inbox_model_only_to_a_served_one() -> None:
    engine = {"kind": "simulated", "models": {"olmocr-2": {}}}
    old = parse_config({"inboxes": [{"path": "/srv/a/inbox"}], "engine": engine}, Path("/"))
    to_served = parse_config(
        {"inboxes": [{"path": "/srv/a/inbox", "model": "olmocr-2"}], "engine": engine}, Path("/")
    )
    plan = plan_reload(old, to_served)
    assert [(i.path, i.model) for i in plan.changed] == [(Path("/srv/a/inbox"), "olmocr-2")]
    assert plan.config.inboxes[0].model == "olmocr-2" and plan.refused == []

    # A model only the new engine section serves: the engine is not reloaded, so the inbox
    # keeps its model, and a new inbox on it is not added.
    more = {"kind": "simulated", "models": {"olmocr-2": {}, "lightonocr-2": {}}}
    to_unserved = parse_config(
        {
            "inboxes": [
                {"path": "/srv/a/inbox", "model": "lightonocr-2"},
                {"path": "/srv/b/inbox", "model": "lightonocr-2"},
            ],
            "engine": more,
        },
        Path("/"),
    )
    plan = plan_reload(old, to_unserved)
    assert [(i.path, i.model) for i in plan.config.inboxes] == [
        (Path("/srv/a/inbox"), "deepseek-ocr-2")
    ]
    assert plan.added == [] and plan.changed == []
    assert sorted(line.split(":")[0] for line in plan.refused) == [
        "engine",
        "inbox /srv/a/inbox",
        "inbox /srv/b/inbox",
    ]


def test_a_reload_changing_an_inbox_model_affects_only_documents_not_yet_started(
    tmp_path: Path, start_daemon: Any
) -> None:
    config = three_models_config(tmp_path, seconds_per_page=1.0)
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready", timeout=60)
    inbox = tmp_path / "deskew" / "inbox"
    make_pdf(inbox / "before.pdf", 4)
    daemon.wait_for("document.started", path="before.pdf")

    data = yaml.safe_load(config.read_text())
    data["inboxes"][0]["model"] = "olmocr-2"
    config.write_text(yaml.safe_dump(data))
    daemon.process.send_signal(signal.SIGHUP)
    [reloaded] = daemon.wait_for("config.reloaded", timeout=30)
    assert reloaded["changed"] == [str(inbox)]
    make_pdf(inbox / "after.pdf", 1)
    daemon.wait_for("document.finished", path="after.pdf", timeout=120)
    daemon.wait_for("document.finished", path="before.pdf", timeout=120)

    [before] = daemon.find("document.finished", path="before.pdf")
    [after] = daemon.find("document.finished", path="after.pdf")
    assert (before["model"], after["model"]) == ("deepseek-ocr-2", "olmocr-2")
    outbox = tmp_path / "deskew" / "outbox"
    assert all(t.startswith("<|ref|>") for t in raw_texts(outbox, "before"))
    assert all(t.startswith("---\n") for t in raw_texts(outbox, "after"))
    assert daemon.stop() == 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def model_servers() -> Iterator[dict[tuple[str, bool], str]]:
    """A simulated server per model, one that reads ocrd's test page and one that garbles
    everything, each answering in that model's format."""
    started: list[subprocess.Popen[bytes]] = []
    urls: dict[tuple[str, bool], str] = {}
    env = {k: v for k, v in os.environ.items() if k != "OCRD_REPLICA_API_KEY"}
    try:
        for name in models():
            for garble in (False, True):
                port = free_port()
                argv = [sys.executable, "-m", "ocrd.engines.simulated_server", "--replica", "1"]
                argv += ["--port", str(port), "--seconds-per-page", "0.01", "--model", name]
                argv += ["--answers-test-page"] + (["--garble"] if garble else [])
                process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
                started.append(process)
                url = f"http://127.0.0.1:{port}"
                wait_serving(url, process, f"simulated {name} server")
                urls[name, garble] = url
        yield urls
    finally:
        for process in started:
            process.send_signal(signal.SIGKILL)
            process.wait()


def test_a_garbling_server_is_caught_for_every_model(
    model_servers: dict[tuple[str, bool], str],
) -> None:
    """Each model's engine reads its own test page with its own prompt and judges the
    answer with its own parser: a server that answers it (in the model's format) is
    ready, one that garbles is caught, for every model ocrd knows."""
    names = list(models())
    # DeepSeek-OCR-2 (the engine section's own), LightOnOCR and GLM-OCR garble; the others
    # read: each engine must tell which.
    garbled = {names[0]} | {n for n in names if n.startswith(("lighton", "glm"))}
    servers = {
        name: {"base_urls": [f"{model_servers[name, name in garbled]}/v1"]} for name in names
    }
    engine_config = parse_config(
        {
            "inboxes": [{"path": "/srv/a/inbox"}],
            "engine": {
                "kind": "openai",
                "self_check": True,
                "openai": servers[names[0]],
                "models": {name: {"openai": servers[name]} for name in names[1:]},
            },
        },
        Path("/"),
    ).engine

    async def scenario() -> dict[str, tuple[EngineState, str | None]]:
        engine = create_engine(engine_config, "openai")
        assert isinstance(engine, ModelEngines)
        await engine.start()
        try:
            return {
                name: (part.health.state, part.health.problem)
                for name, part in engine.engines.items()
            }
        finally:
            await engine.stop()

    states = asyncio.run(scenario())
    for name in names:
        state, problem = states[name]
        if name in garbled:
            assert state is EngineState.garbled, (name, state)
            assert problem is not None and "output is garbled" in problem
        else:
            assert state is EngineState.ready, (name, state, problem)


def test_each_models_request_carries_its_recipe() -> None:
    """What a fleet server is sent per model: the model's prompt (none for LightOnOCR, the
    image alone), its sampling, the n-gram guard only for the model that has one."""
    config = parse_config(
        {
            "inboxes": [{"path": "/srv/a/inbox"}],
            "engine": {
                "kind": "openai",
                "models": {
                    "lightonocr-2": {"openai": {"base_urls": ["http://127.0.0.1:9/v1"]}},
                    "olmocr-2": {"openai": {"base_urls": ["http://127.0.0.1:9/v1"]}},
                },
            },
        },
        Path("/"),
    ).engine
    engine = create_engine(config, "openai")
    assert isinstance(engine, ModelEngines)
    bodies = {}
    for name, part in engine.engines.items():
        router: Any = part.engine
        prompt = router.recipe.prompts[0].text
        bodies[name] = router.request_body("data:image/png;base64,AA==", prompt)
        assert router.settings.model == models()[name].hf_id
    deepseek, lighton, olm = bodies["deepseek-ocr-2"], bodies["lightonocr-2"], bodies["olmocr-2"]
    assert deepseek["messages"][0]["content"][1]["text"].startswith("<|grounding|>")
    assert deepseek["vllm_xargs"]["ngram_size"] == 30 and deepseek["temperature"] == 0.0
    assert deepseek["skip_special_tokens"] is False
    assert [part["type"] for part in lighton["messages"][0]["content"]] == ["image_url"]
    assert (lighton["temperature"], lighton["top_p"], lighton["max_tokens"]) == (0.2, 0.9, 4096)
    assert "vllm_xargs" not in lighton and "vllm_xargs" not in olm
    assert "front matter" in olm["messages"][0]["content"][1]["text"]


def engine_of(engine: dict[str, Any]) -> Any:
    return parse_config({"inboxes": [{"path": "/srv/a/inbox"}], "engine": engine}, Path("/")).engine


def test_models_sharing_a_gpu_must_share_its_memory_out() -> None:
    """Two models' vLLM engines on one GPU, each asking for 0.9 of its memory, cannot both
    start: refused before either loads, naming the shares; shares that fit, or separate
    GPUs, are accepted (the check passes and the engines are built)."""
    too_much = engine_of({"kind": "vllm", "vllm": {"gpus": [0]}, "models": {"lightonocr-2": {}}})
    with pytest.raises(ValueError, match="more than all of GPU 0's memory") as refused:
        create_engine(too_much, "vllm")
    assert "deepseek-ocr-2 0.9, lightonocr-2 0.9" in str(refused.value)

    from ocrd.engines.models import check_gpu_shares

    shared = engine_of(
        {
            "kind": "vllm",
            "vllm": {"gpus": [0], "gpu_memory_utilization": 0.55, "tokenizer": "/srv/ds-tok"},
            "models": {"lightonocr-2": {"vllm": {"gpu_memory_utilization": 0.3}}},
        }
    )
    apart = engine_of(
        {"kind": "vllm", "vllm": {"gpus": [0]}, "models": {"olmocr-2": {"vllm": {"gpus": [1]}}}}
    )
    for config in (shared, apart):
        check_gpu_shares([(name, config.for_model(name)) for name in config.served_models])
    lighton = shared.for_model("lightonocr-2")
    assert lighton.vllm.gpus == (0,) and lighton.vllm.gpu_memory_utilization == 0.3
    # the model's own weights and tokenizer, not DeepSeek's
    assert not {"model", "tokenizer"} & lighton.vllm.model_fields_set
    assert shared.for_model("deepseek-ocr-2").vllm.tokenizer == "/srv/ds-tok"


def test_a_journal_line_is_read_back_by_the_parser_of_the_model_that_wrote_it() -> None:
    """`ocrd rerender` and a resumed document read each raw page with its model's parser:
    olmOCR's front matter stays out of its blocks; a model this ocrd does not know (a
    journal of another version) is read as grounded Markdown, not an error."""
    from ocrd.engines.simulated_answers import page_answer
    from ocrd.output.page import page_blocks, text_from_record

    answer = page_answer(models()["olmocr-2"], 1, (600, 800), "ab12", PromptMode.layout)
    record = {"page": 1, "text": answer, "model": "olmocr-2"}
    blocks = page_blocks(text_from_record(record).text, (600, 800))
    assert [b.label for b in blocks] == ["title", "text", "image"]
    assert not any("primary_language" in b.content for b in blocks)
    unknown = text_from_record({**record, "model": "no-such-model"}).text
    assert unknown.model == "no-such-model"
    assert any("primary_language" in b.content for b in page_blocks(unknown, (600, 800)))


def start_model_server(name: str, port: int, garble: bool) -> subprocess.Popen[bytes]:
    """ocrd's simulated OpenAI-compatible server for model `name`: it reads ocrd's test page
    (answering in the model's format), or garbles everything."""
    env = {k: v for k, v in os.environ.items() if k != "OCRD_REPLICA_API_KEY"}
    argv = [sys.executable, "-m", "ocrd.engines.simulated_server", "--replica", "1"]
    argv += ["--port", str(port), "--seconds-per-page", "0.01", "--model", name]
    argv += ["--answers-test-page"] + (["--garble"] if garble else [])
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    wait_serving(f"http://127.0.0.1:{port}", process, f"simulated {name} server")
    return process


RECHECK_SECONDS = 2  # how often the garbling model's server is asked to read again


def test_a_garbling_model_pauses_only_its_own_inbox_and_resumes_once_its_server_reads(
    tmp_path: Path, start_daemon: Any
) -> None:
    """Three inboxes on three models, each model's own server; olmOCR's garbles. Only the
    olmOCR inbox pauses: its file waits in the inbox (not failed), the others convert; the
    status, /api/status, /readyz, `ocrd status`, systemd's STATUS and docling's /health
    (its tasks go to the paused inbox) say which model is paused and why. Once olmOCR's
    server reads again, the held file converts."""
    ports = {model: free_port() for model in MODELS.values()}
    servers = {m: start_model_server(m, p, garble=m == "olmocr-2") for m, p in ports.items()}
    notify = NotifySocket(tmp_path / "notify.sock")
    try:
        urls = {m: {"base_urls": [f"http://127.0.0.1:{p}/v1"]} for m, p in ports.items()}
        olm_serving = {**urls["olmocr-2"], "self_check_repeat_seconds": RECHECK_SECONDS}
        engine = {
            "kind": "openai",
            "self_check": True,
            "openai": urls["deepseek-ocr-2"],
            "models": {
                "lightonocr-2": {"openai": urls["lightonocr-2"]},
                "olmocr-2": {"openai": olm_serving},
            },
        }
        inboxes = []
        for folder, model in MODELS.items():
            (tmp_path / folder / "inbox").mkdir(parents=True)
            inbox = {"path": f"{folder}/inbox", "settle_seconds": 0.5, "model": model}
            inboxes.append({**inbox, "uploads": True} if folder == "olm" else inbox)
        config = write_config(tmp_path, engine=engine)
        data = yaml.safe_load(config.read_text())
        data["inboxes"] = inboxes
        config.write_text(yaml.safe_dump(data))
        env = {"NOTIFY_SOCKET": str(notify.path), **WITH_TOKEN}
        daemon = start_daemon(config, env=env)
        url = base_url(daemon)
        daemon.wait_for("daemon.ready", timeout=90)
        [paused] = daemon.wait_for("model.paused", model="olmocr-2", timeout=60)
        assert paused["inboxes"] == [str(tmp_path / "olm" / "inbox")]
        assert paused["reason"].startswith("garbled: ") and "output is garbled" in paused["reason"]
        for folder in MODELS:
            make_pdf(tmp_path / folder / "inbox" / f"{folder}.pdf", 2, label=folder)
        daemon.wait_for("document.finished", count=2, timeout=120)
        finished = {e["path"]: e["outcome"] for e in daemon.find("document.finished")}
        assert finished == {"deskew.pdf": "done", "lighton.pdf": "done"}
        assert files_under(tmp_path / "olm" / "inbox") == ["olm.pdf"]  # held, not failed
        assert files_under(tmp_path / "olm" / "failed") == []
        assert not daemon.find("document.claimed", path="olm.pdf")

        # Where the user looks: each says the olmOCR model is paused, and why.
        status = httpx.get(f"{url}/api/status").json()
        assert status["ready"] is True and list(status["paused_models"]) == ["olmocr-2"]
        by_inbox = {Path(i["path"]).parent.name: i for i in status["inboxes"]}
        assert "output is garbled" in by_inbox["olm"]["paused"]
        assert by_inbox["olm"]["waiting_count"] == 1
        assert by_inbox["deskew"]["paused"] is None and by_inbox["lighton"]["paused"] is None
        ready = httpx.get(f"{url}/readyz")
        assert ready.status_code == 200 and "olmocr-2" in ready.json()["paused_models"]
        assert "Paused: its model" in httpx.get(f"{url}/").text
        health = httpx.get(f"{url}/health")
        assert health.status_code == 503 and "olmocr-2" in health.json()["detail"]
        assert any("olmocr-2 paused (garbled)" in m for m in notify.messages if "STATUS=" in m)
        config.write_text(config.read_text().replace("127.0.0.1:0", url.removeprefix("http://")))
        shown = subprocess.run(
            [sys.executable, "-m", "ocrd", "status", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert "paused: model olmocr-2, its inboxes wait: garbled" in shown.stdout, shown.stdout
        assert f"inbox {tmp_path / 'olm' / 'inbox'} (model olmocr-2): 1 waiting (PAUSED" in (
            shown.stdout
        )

        # The server is mended (it reads again, on the same address): the file converts.
        servers["olmocr-2"].send_signal(signal.SIGKILL)
        servers["olmocr-2"].wait()
        servers["olmocr-2"] = start_model_server("olmocr-2", ports["olmocr-2"], garble=False)
        daemon.wait_for("model.resumed", model="olmocr-2", timeout=60)
        [olm] = daemon.wait_for("document.finished", path="olm.pdf", timeout=60)
        assert (olm["outcome"], olm["model"]) == ("done", "olmocr-2")
        assert files_under(tmp_path / "olm" / "done") == ["olm.pdf"]
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/api/status").json()["paused_models"] == {}
        assert daemon.stop() == 0
    finally:
        notify.close()
        for process in servers.values():
            process.send_signal(signal.SIGKILL)
            process.wait()
