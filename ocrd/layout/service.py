"""The detector processes, as the daemon uses them: start (and wait for the checkpoint to
load), detect a page, stop.

Each process (ocrd/layout/detector.py) takes one page at a time; `workers` of them take
pages in turn. A page is handed over at most `VIEW_SIDE` pixels on its longer side (the
detectors look at 640 to 800 pixels: more is transport for nothing), and its regions come
back scaled to the page as rendered. A process that dies or takes longer than the
timeout is ended and started again; the page gets a `DetectorError` (the engine fails
it, and the daemon's page retries send it again).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from PIL import Image

from ocrd.layout.detector import Detection, DetectorSettings, serve
from ocrd.layout.regions import Region

VIEW_SIDE = 1280
STOP_SECONDS = 5.0


class DetectorError(Exception):
    """The detector could not be started, or failed on a page (the message says why)."""


@dataclass
class _DetectorProcess:
    process: BaseProcess
    connection: Connection


class Detectors:
    """`workers` detector processes of one checkpoint."""

    def __init__(self, settings: DetectorSettings, workers: int, timeout: float) -> None:
        self.settings = settings
        self.timeout = timeout
        self.size = workers
        self.labels: list[str] = []
        self._idle: asyncio.Queue[_DetectorProcess] = asyncio.Queue()
        self._all: list[_DetectorProcess] = []

    async def start(self) -> None:
        """Start every process and wait for each to load the checkpoint; DetectorError
        naming the checkpoint and what went wrong otherwise."""
        for _ in range(self.size):
            worker = await self._started()
            self._idle.put_nowait(worker)

    async def _started(self) -> _DetectorProcess:
        context = multiprocessing.get_context("spawn")  # no copy of the daemon's threads
        ours, theirs = context.Pipe()
        process = context.Process(
            target=serve, args=(theirs, self.settings), name="ocrd-layout", daemon=True
        )
        process.start()
        theirs.close()
        worker = _DetectorProcess(process, ours)
        self._all.append(worker)
        answer = await self._answer(worker, self.timeout)
        if answer[0] != "ready":
            self._end(worker)
            raise DetectorError(f"the layout detector {self.settings.source!r}: {answer[1]}")
        self.labels = list(answer[1])
        return worker

    async def detect(self, image: Image.Image) -> Detection:
        """The regions of a page, in pixels of `image`. A process found dead (ended after a
        failure) is started again first."""
        view, scale = await asyncio.to_thread(_view, image)
        worker = await self._idle.get()
        try:
            if not worker.process.is_alive():
                await asyncio.to_thread(self._end, worker)
                worker = await self._started()
            kind, found = await self._ask(worker, view)
        finally:
            self._idle.put_nowait(worker)
        if kind != "done":
            raise DetectorError(f"the layout detector failed on the page: {found}")
        return _scaled(found, scale)

    async def _ask(self, worker: _DetectorProcess, view: Image.Image) -> tuple[str, Any]:
        """The worker's answer for one page; a worker that fails to answer is ended (the
        next page starts another)."""
        try:
            try:
                worker.connection.send(view)
            except OSError as error:
                raise DetectorError(f"the layout detector process is gone ({error})") from None
            return await self._answer(worker, self.timeout)
        except DetectorError:
            await asyncio.to_thread(self._end, worker)
            raise

    async def _answer(self, worker: _DetectorProcess, timeout: float) -> tuple[str, Any]:
        def receive() -> tuple[str, Any]:
            if not worker.connection.poll(timeout):
                raise DetectorError(f"no answer from the layout detector in {timeout:g} s")
            try:
                answer: tuple[str, Any] = worker.connection.recv()
            except (EOFError, OSError):
                worker.process.join(STOP_SECONDS)
                code = worker.process.exitcode
                raise DetectorError(f"the layout detector process ended (exit {code})") from None
            return answer

        return await asyncio.to_thread(receive)

    def _end(self, worker: _DetectorProcess) -> None:
        with contextlib.suppress(OSError):
            worker.connection.close()
        if worker.process.is_alive():
            worker.process.kill()
        worker.process.join(STOP_SECONDS)
        if worker in self._all:
            self._all.remove(worker)

    async def stop(self) -> None:
        for worker in list(self._all):
            await asyncio.to_thread(self._end, worker)


def _view(image: Image.Image) -> tuple[Image.Image, float]:
    """The page as the detector gets it: at most VIEW_SIDE pixels a side, in RGB; and
    the factor from its pixels back to the page's."""
    rgb = image.convert("RGB")
    longest = max(rgb.size)
    if longest <= VIEW_SIDE:
        return rgb, 1.0
    factor = VIEW_SIDE / longest
    size = (max(1, round(rgb.width * factor)), max(1, round(rgb.height * factor)))
    return rgb.resize(size, Image.Resampling.BILINEAR), 1 / factor


def _scaled(found: Detection, scale: float) -> Detection:
    if scale == 1.0:
        return found
    regions = tuple(
        replace(r, x1=r.x1 * scale, y1=r.y1 * scale, x2=r.x2 * scale, y2=r.y2 * scale)
        for r in found.regions
    )
    return Detection(regions, found.ordered)


__all__ = ["Detection", "DetectorError", "DetectorSettings", "Detectors", "Region"]
