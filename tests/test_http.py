"""The daemon's HTTP server as operators and users meet it: metrics, health, readiness,
`ocrd status`, the bearer token, and the status page in a real headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import wait_until, write_config
from fleet import StandInFleetServer, free_port
from helpers import make_pdf

pytestmark = pytest.mark.slow

ARTIFACTS = Path(
    os.environ.get("OCRD_TEST_ARTIFACTS", Path(__file__).parents[1] / "test-artifacts")
)


def base_url(daemon) -> str:  # type: ignore[no-untyped-def]
    [listening] = daemon.wait_for("http.listening", timeout=60)
    return f"http://{listening['address']}"


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text format, or None."""
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        sample, _, value = line.rpartition(" ")
        metric_name, _, label_text = sample.partition("{")
        if metric_name != name:
            continue
        found = ",".join(sorted(label_text.rstrip("}").split(","))) if label_text else ""
        if found == wanted:
            return float(value)
    return None


def test_metrics_health_and_readiness_follow_the_work(tmp_path: Path, start_daemon) -> None:
    config = write_config(tmp_path)
    daemon = start_daemon(config)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready")
    inbox = tmp_path / "data" / "inbox"
    make_pdf(inbox / "report.pdf", 3)
    (inbox / "notes.pdf").write_text("not a PDF")
    daemon.wait_for("document.finished", count=2)

    metrics = httpx.get(f"{url}/metrics").text
    inbox_label = str(inbox)
    assert (
        metric(
            metrics,
            "ocrd_documents_finished_total",
            inbox=inbox_label,
            outcome="done",
            stage="",
            model="deepseek-ocr-2",
        )
        == 1
    )
    assert (
        metric(
            metrics,
            "ocrd_documents_finished_total",
            inbox=inbox_label,
            outcome="failed",
            stage="detect",
            model="deepseek-ocr-2",
        )
        == 1
    )
    assert (
        metric(
            metrics,
            "ocrd_pages_recognised_total",
            finish_reason="stop",
            prompt="layout",
            model="deepseek-ocr-2",
        )
        == 3
    )
    assert metric(metrics, "ocrd_render_failures_total", reason="unsupported") == 1
    assert metric(metrics, "ocrd_document_seconds_count", pages="2-10") == 1
    assert metric(metrics, "ocrd_files_waiting", inbox=inbox_label) == 0
    assert metric(metrics, "ocrd_engine_state", state="ready") == 1
    assert metric(metrics, "ocrd_completion_tokens_total") == 3 * 400
    assert metric(metrics, "process_resident_memory_bytes") is not None

    health = httpx.get(f"{url}/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    ready = httpx.get(f"{url}/readyz")
    assert ready.status_code == 200 and ready.json()["problems"] == []

    shutil.rmtree(inbox)  # an inbox that vanishes makes ocrd not ready, and says why
    daemon.wait_for("inbox.missing", timeout=30)
    ready = httpx.get(f"{url}/readyz")
    assert ready.status_code == 503
    assert any("INBOX MISSING" in problem for problem in ready.json()["problems"])
    inbox.mkdir()
    daemon.wait_for("inbox.restored", timeout=30)
    wait_until(lambda: httpx.get(f"{url}/readyz").status_code == 200, 60, "ready again")
    assert daemon.stop() == 0


def test_an_unreachable_fleet_shows_in_readiness_and_in_ocrd_status(
    tmp_path: Path, start_daemon
) -> None:
    fleet = StandInFleetServer(delay=0.05)
    fleet.start()
    try:
        engine = {
            "kind": "openai",
            "openai": {"base_urls": [fleet.url], "retry_backoff_seconds": 0.2},
        }
        config = write_config(tmp_path, engine=engine)
        daemon = start_daemon(config)
        url = base_url(daemon)
        daemon.wait_for("daemon.ready")
        listen = url.removeprefix("http://")
        (tmp_path / "config.yaml").write_text(
            (tmp_path / "config.yaml").read_text().replace("127.0.0.1:0", listen)
        )  # `ocrd status` finds the daemon where the configuration says it listens
        status = run_ocrd_status(config)
        assert status.returncode == 0, status.stderr
        assert "READY" in status.stdout and str(tmp_path / "data" / "inbox") in status.stdout

        fleet.stop()
        make_pdf(tmp_path / "data" / "inbox" / "waits.pdf", 1)  # makes the engine notice
        daemon.wait_for("engine.unreachable", timeout=30)
        ready = httpx.get(f"{url}/readyz")
        assert ready.status_code == 503 and ready.json()["engine_state"] == "unreachable"
        status = run_ocrd_status(config)
        assert status.returncode == 1
        assert "NOT READY" in status.stdout and "INFERENCE FLEET UNREACHABLE" in status.stdout
        report = json.loads(run_ocrd_status(config, "--json").stdout)
        assert report["engine_state"] == "unreachable"

        fleet.start()
        daemon.wait_for("document.finished", timeout=60)
        assert daemon.stop() == 0
    finally:
        fleet.stop()
    gone = run_ocrd_status(config)
    assert gone.returncode == 2 and "no ocrd answers" in gone.stderr


def test_ocrd_status_says_when_the_daemon_answering_serves_another_configuration(
    tmp_path: Path, start_daemon
) -> None:
    ours = write_config(tmp_path / "ours", http={"listen": f"127.0.0.1:{free_port()}"})
    daemon = start_daemon(ours)
    daemon.wait_for("daemon.ready")
    assert run_ocrd_status(ours).returncode == 0
    # Another configuration on the same address: its daemon never started, ours answers.
    theirs = tmp_path / "theirs" / "config.yaml"
    (tmp_path / "theirs" / "data" / "inbox").mkdir(parents=True)
    theirs.write_text(ours.read_text())

    other = run_ocrd_status(theirs)

    assert other.returncode == 3, other
    assert "is not this configuration's" in other.stderr
    assert str(tmp_path / "ours" / "data" / "inbox") in other.stderr
    assert str(tmp_path / "theirs" / "data" / "inbox") in other.stderr
    # The same file with an inbox added but not reloaded: the daemon lags behind it.
    data = yaml.safe_load(ours.read_text())
    data["inboxes"].append({"path": "more/inbox"})
    ours.write_text(yaml.safe_dump(data))
    changed = run_ocrd_status(ours)
    assert changed.returncode == 3 and "systemctl reload ocrd" in changed.stderr
    assert f"not served: {tmp_path / 'ours' / 'more' / 'inbox'}" in changed.stderr
    assert daemon.stop() == 0


def run_ocrd_status(config: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ocrd", "status", "--config", str(config), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def outward_address() -> str:
    """This machine's address on its network (not loopback), as another host reaches it."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # no packet is sent; this picks the outgoing address
        return probe.getsockname()[0]


def test_clients_other_than_loopback_need_the_token(tmp_path: Path, start_daemon) -> None:
    config = write_config(tmp_path, http={"listen": "0.0.0.0:0"})
    daemon = start_daemon(config, env={"OCRD_HTTP_TOKEN": "s3cret"})
    port = base_url(daemon).rsplit(":", 1)[1]
    daemon.wait_for("daemon.ready")
    outside = f"http://{outward_address()}:{port}"
    assert httpx.get(f"http://127.0.0.1:{port}/api/status").status_code == 200  # loopback
    refused = httpx.get(f"{outside}/api/status")
    assert refused.status_code == 401 and "bearer token" in refused.json()["error"]
    assert httpx.get(f"{outside}/readyz").status_code == 200  # health: a load balancer's
    assert (
        httpx.get(f"{outside}/metrics", headers={"Authorization": "Bearer wrong"}).status_code
        == 401
    )
    allowed = httpx.get(f"{outside}/api/status", headers={"Authorization": "Bearer s3cret"})
    assert allowed.status_code == 200
    assert httpx.get(f"{outside}/?token=s3cret").status_code == 200
    assert daemon.stop() == 0


def chromium(*arguments: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("Chromium is not installed: run scripts/install_test_packages.sh (as root)")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
    ]
    return subprocess.run([binary, *flags, *arguments], capture_output=True, text=True, timeout=120)


def test_the_status_page_in_a_real_browser(tmp_path: Path, start_daemon) -> None:
    """Chromium loads `/` while a document is being converted and after another failed:
    the rendered page names the document, shows its progress and the failure's reason."""
    engine = {"kind": "simulated", "simulated": {"seconds_per_page": 1.5, "capacity": 2}}
    config = write_config(tmp_path, engine=engine)
    daemon = start_daemon(config)
    url = base_url(daemon)
    daemon.wait_for("daemon.ready")
    inbox = tmp_path / "data" / "inbox"
    (inbox / "contract scan.pdf").write_bytes(b"%PDF-1.7\n1 0 obj\n<< /Type /Cat")
    daemon.wait_for("document.finished")
    make_pdf(inbox / "annual report.pdf", 12)
    daemon.wait_for("page.recognised", count=3, timeout=60)

    profile = tmp_path / "chromium-profile"
    dom = chromium(f"--user-data-dir={profile}", "--dump-dom", f"{url}/")
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = dom.stdout
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    screenshot = ARTIFACTS / "status-page.png"
    shot = chromium(
        f"--user-data-dir={profile}",
        f"--screenshot={screenshot}",
        "--window-size=1200,1400",
        f"{url}/",
    )
    assert daemon.stop() == 0

    assert "annual report.pdf" in page
    assert '<progress max="12" value="' in page and "of 12" in page
    assert "contract scan.pdf" in page and "the PDF is damaged beyond repair" in page
    assert 'id="rate-chart"' in page and "<rect" in page
    assert shot.returncode == 0 and screenshot.stat().st_size > 10_000
