"""Every line ocrd writes is a structured event: its own, and what libraries and Python's
warnings say (aiohttp, asyncio, RapidOCR with its coloured handler), in real processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import write_config
from PIL import Image

pytestmark = pytest.mark.slow

LIBRARIES_TALK = r"""
import asyncio, logging, warnings
from ocrd.log import configure_logging, get_logger
from rapidocr.utils.log import logger as rapidocr  # adds its coloured terminal handler
configure_logging("json")
warnings.warn("careful now")
logging.getLogger("aiohttp.web").warning("odd \x1b[33mrequest\x1b[0m")
rapidocr.warning("The identified content is empty.")
rapidocr.info("Using engine_name: onnxruntime")  # chatter: below warning level
logging.getLogger("some.new.library").propagate = False
late = logging.getLogger("some.new.library")
late.addHandler(logging.StreamHandler())
late.error("made after logging was configured")
try:
    1 / 0
except ZeroDivisionError:
    logging.getLogger("asyncio").exception("Task exception was never retrieved")
logging.getLogger("some.chatty.library").warning("watch " + "/inbox/aside-1" * 20000)
get_logger().info("ocrd.own", answer=42)
"""


def json_lines(text: str) -> list[dict[str, Any]]:
    lines = [line for line in text.splitlines() if line.strip()]
    plain = [line for line in lines if not line.startswith("{")]
    assert plain == [], f"lines that are no JSON event: {plain}"
    return [json.loads(line) for line in lines]


def test_libraries_and_warnings_become_events(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", LIBRARIES_TALK],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert result.returncode == 0, result.stderr
    events = json_lines(result.stderr + result.stdout)
    by_logger = {e.get("logger"): e for e in events}
    assert by_logger["py.warnings"]["event"] == "python.warning"
    assert "careful now" in by_logger["py.warnings"]["message"]
    assert by_logger["aiohttp.web"]["message"] == "odd request", "colours are stripped"
    assert by_logger["RapidOCR"]["message"] == "The identified content is empty."
    assert by_logger["some.new.library"]["event"] == "library.log"
    assert "ZeroDivisionError" in by_logger["asyncio"]["exception"]
    assert not any("Using engine_name" in str(e) for e in events)
    assert any(e["event"] == "ocrd.own" and e["answer"] == 42 for e in events)
    assert "\x1b" not in result.stderr
    # A library's 280,000-character message (as watchdog's naming every watched folder) is cut.
    long = by_logger["some.chatty.library"]["message"]
    assert long.startswith("watch /inbox/aside-1") and len(long) < 2100
    assert long.endswith("(278006 characters more left out)")


def test_the_daemon_with_rapidocr_writes_only_events(tmp_path: Path, start_daemon: Any) -> None:
    """RapidOCR, which warns in colour on a page where it finds nothing, inside the daemon:
    every line of its output is a JSON event, the warning among them."""
    config = write_config(tmp_path, {"blank_pages": "keep"}, engine={"kind": "rapidocr"})
    Image.new("RGB", (800, 600), "white").save(tmp_path / "data" / "inbox" / "blank.png")
    daemon = start_daemon(config)
    daemon.wait_for("document.finished", path="blank.png", timeout=180)
    assert daemon.stop() == 0
    events = json_lines("".join(daemon.raw))
    warned = [e for e in events if e.get("logger") == "RapidOCR"]
    assert warned and "\x1b" not in "".join(daemon.raw), warned
