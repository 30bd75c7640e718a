"""Benchmark harness, not part of ocrd: the event loop's lag in any process started with
this folder on PYTHONPATH and OCRD_LAG_PROBE=FILE in its environment.

It wraps `asyncio.run` so that a probe task runs beside the program's main coroutine: the
probe sleeps 10 ms again and again, and how much later than asked each sleep wakes up is
how long something else held the loop (blocking work on it). At exit every sample goes to
FILE as JSON lines `[monotonic seconds, lag seconds]`, so that a benchmark can take the
ones of its own time window. Being outside ocrd, it measures any checkout the same way
(benchmarks/profile_daemon.py --tree).
"""

from __future__ import annotations

import asyncio
import atexit
import json
import os

_OUT = os.environ.get("OCRD_LAG_PROBE")
_INTERVAL = 0.01

if _OUT:
    _samples: list[tuple[float, float]] = []
    _original_run = asyncio.run

    async def _probe() -> None:
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(_INTERVAL)
            now = loop.time()
            _samples.append((now, max(0.0, now - before - _INTERVAL)))

    def _run(main, **kwargs):  # type: ignore[no-untyped-def]
        async def probed():  # type: ignore[no-untyped-def]
            probe = asyncio.ensure_future(_probe())
            try:
                return await main
            finally:
                probe.cancel()

        return _original_run(probed(), **kwargs)

    def _report() -> None:
        if not _samples:
            return  # a child process (a render worker) that ran no event loop
        with open(_OUT, "w") as handle:
            handle.writelines(json.dumps(sample) + "\n" for sample in _samples)

    asyncio.run = _run
    atexit.register(_report)
