"""Stopping with documents in flight: `ocrd run` as a subprocess, real files, real signals.

watchdog's bookkeeping of a recursive inotify watch can break when folders of the inbox are
renamed in a loop (its `stop()` then raises KeyError). Stopping the watch used to come
before the documents were drained, in the same step: the error skipped the drain, the
render pool and the engine were stopped under the documents still opening or converting
(each ended in `document.internal_error`), and the daemon exited 70. Whatever stopping the
watch meets, a stop is clean: exit 0, the documents not finished stay claimed, and the next
start takes them back and finishes them."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import claims_left, files_under, markdown_under, write_config
from helpers import make_pdf

pytestmark = pytest.mark.slow

DOCUMENTS = 6
SWAP_SECONDS = 3.0
SWAP_IN_A_LOOP = r"""
import os, sys, time
inbox, seconds = sys.argv[1], float(sys.argv[2])
folder = os.path.join(inbox, "scans")
end, swaps = time.monotonic() + seconds, 0
while time.monotonic() < end:
    try:
        os.rename(folder, os.path.join(inbox, f"mine-{swaps}"))
        os.mkdir(folder)
        if swaps % 2:  # and back, as ocrd's own tidying puts its uploads folder back
            os.rename(folder, os.path.join(inbox, f"aside-{swaps}"))
            os.rename(os.path.join(inbox, f"mine-{swaps}"), folder)
        swaps += 1
    except OSError:
        pass
print(swaps)
"""


def test_a_stop_while_folders_are_renamed_and_documents_open_is_clean_and_loses_nothing(
    tmp_path: Path, start_daemon: Any
) -> None:
    slow = {"kind": "simulated", "simulated": {"seconds_per_page": 1.0}}
    config = write_config(tmp_path, engine=slow, pipeline={"shutdown_grace_seconds": 0})
    data = tmp_path / "data"
    inbox = data / "inbox"
    (inbox / "scans").mkdir()
    daemon = start_daemon(config)
    daemon.wait_for("daemon.ready", timeout=60)
    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAP_IN_A_LOOP, str(inbox), str(SWAP_SECONDS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    names = [f"doc{index:02d}.pdf" for index in range(DOCUMENTS)]
    for name in names:
        make_pdf(inbox / name, 3, label=name)
    swaps, _ = swapper.communicate(timeout=60)
    assert int(swaps) > 0
    daemon.wait_for("document.started")
    assert daemon.stop(signal.SIGTERM) == 0, daemon.output()

    for event in ("document.internal_error", "document.crashed", "daemon.failed"):
        assert not daemon.find(event), daemon.output()
    started = {e["path"] for e in daemon.find("document.started")}
    ended = {e["path"] for e in daemon.find("document.finished", outcome="done")}
    interrupted = {e["path"] for e in daemon.find("document.interrupted")}
    assert started <= ended | interrupted, daemon.output()  # one settling finished it
    settled = set(files_under(data / "done"))
    assert settled == ended and files_under(data / "failed") == []

    again = start_daemon(write_config(tmp_path))
    if len(settled) < DOCUMENTS:  # all may have ended before the stop on a quick machine
        again.wait_for("document.finished", timeout=180, count=DOCUMENTS - len(settled))
    else:
        again.wait_for("daemon.ready", timeout=60)
    assert again.stop() == 0, again.output()
    assert {e["path"] for e in again.find("document.recovered")} >= interrupted
    assert files_under(data / "done") == names  # each once, none failed
    assert markdown_under(data / "outbox") == [n.replace(".pdf", ".md") for n in names]
    assert files_under(data / "failed") == [] and claims_left(data / "work") == []
