"""What keeps one replica serving: a child process ocrd starts and watches, or a remote server
it can only probe.

Supervision (ocrd/engines/supervision.py) runs the same loop for both: bring the replica
up, prove it reads, wait until it goes down, take it down, wait with backoff, start again.
A keeper supplies the four steps:

- a `ProcessKeeper` starts a server process (a `vllm serve` per GPU, or a simulated
  replica) in its own process group on a private Unix socket, waits for its /health, then
  watches it: an exit, an engine that /health reports dead, or `health_failures` unanswered
  health checks in a row (a hang) bring it down; taking it down ends the whole group
  (SIGTERM, then SIGKILL), so that vLLM's engine-core and worker processes go with it.
  Each child is asked to receive SIGTERM if the daemon dies (PR_SET_PDEATHSIG), so a
  SIGKILLed daemon leaves no model loaded on a GPU.
- a `RemoteKeeper` only probes `GET /v1/models`: a server ocrd did not start is restarted by
  whoever runs it, and ocrd reconnects when it answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ocrd.config import SupervisionConfig
from ocrd.engines.link import LinkError, ServerLink

REFUSES_US = {401: "credentials", 403: "credentials", 404: "model or address"}
START_POLL_SECONDS = 0.5


class ReplicaUnavailable(Exception):
    """The replica cannot serve now; the message says why."""


class Keeper(Protocol):
    local: bool

    @property
    def pid(self) -> int | None: ...

    async def bring_up(self) -> None:
        """Return once it serves; raise ReplicaUnavailable if it cannot."""
        ...

    async def until_down(self) -> str:
        """Wait until it stops serving by itself; why. (A remote server never returns here:
        the router sees its failures in requests and probes.)"""
        ...

    async def alive(self) -> bool:
        """A quick look after a failed request: does it still serve?"""
        ...

    async def take_down(self) -> None: ...


class RemoteKeeper:
    local = False
    pid = None

    def __init__(self, link: ServerLink) -> None:
        self.link = link

    async def bring_up(self) -> None:
        problem = await probe_models(self.link)
        if problem is not None:
            raise ReplicaUnavailable(problem)

    async def until_down(self) -> str:
        await asyncio.Event().wait()  # never: failures are seen in requests
        raise AssertionError("unreachable")

    async def alive(self) -> bool:
        return await probe_models(self.link) is None

    async def take_down(self) -> None:
        await self.link.reset()  # a server that comes back gets fresh connections


async def probe_models(link: ServerLink) -> str | None:
    """None if the server serves ocrd (its model list answers), else what is wrong."""
    try:
        answer = await link.get("/models")
    except LinkError as error:
        return str(error) or "no answer"
    if answer.status == 200:
        return None
    if answer.status in REFUSES_US:
        return f"refuses ocrd's {REFUSES_US[answer.status]} (HTTP {answer.status})"
    if 300 <= answer.status < 400:  # link.py follows none: a redirect could lead anywhere
        where = answer.location or "no Location"
        return (
            f"/models answered a redirect (HTTP {answer.status} to {where}); ocrd follows "
            "no redirect: list the server under the URL that answers itself"
        )
    return f"HTTP {answer.status}"


@dataclass(frozen=True)
class ChildCommand:
    """How to start one replica's server process."""

    argv: list[str]
    env: dict[str, str]  # added to the daemon's environment
    socket: Path  # where it listens (it must create this Unix socket)


class ProcessKeeper:
    local = True

    def __init__(
        self,
        command: Callable[[], ChildCommand],
        link: ServerLink,
        supervision: SupervisionConfig,
    ) -> None:
        self.command = command
        self.link = link
        self.supervision = supervision
        self.process: asyncio.subprocess.Process | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    async def bring_up(self) -> None:
        command = self.command()
        with contextlib.suppress(FileNotFoundError):
            command.socket.unlink()  # a socket left by the previous process
        try:
            self.process = await asyncio.create_subprocess_exec(
                *command.argv,
                env={**os.environ, **command.env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sys.stderr.fileno(),  # its lines go where the daemon's go
                stderr=sys.stderr.fileno(),
                start_new_session=True,  # its own process group: taken down as a whole
                preexec_fn=_die_with_parent,
            )
        except OSError as error:
            raise ReplicaUnavailable(f"cannot start {command.argv[0]}: {error}") from None
        await self._wait_until_serving()

    async def _wait_until_serving(self) -> None:
        assert self.process is not None
        timeout = self.supervision.start_timeout_seconds
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.returncode is not None:
                raise ReplicaUnavailable(f"{_exit(self.process.returncode)} while starting")
            if await self._healthy(timeout=2.0) is None:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.process.wait()), START_POLL_SECONDS)
        raise ReplicaUnavailable(f"not serving {timeout:g} s after its start")

    async def _healthy(self, timeout: float) -> str | None:
        """None if /health answers 200, else what it said."""
        try:
            answer = await self.link.get("/health", timeout=timeout, root=True)
        except LinkError as error:
            return str(error)
        return None if answer.status == 200 else f"/health answered HTTP {answer.status}"

    async def until_down(self) -> str:
        assert self.process is not None
        process = self.process
        unanswered = 0
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    asyncio.shield(process.wait()), self.supervision.health_interval_seconds
                )
            if process.returncode is not None:
                return _exit(process.returncode)
            problem = await self._healthy(self.supervision.health_timeout_seconds)
            if problem is None:
                unanswered = 0
            elif problem.startswith("/health answered"):
                return f"its engine reports itself dead ({problem})"
            else:
                unanswered += 1
                if unanswered >= self.supervision.health_failures:
                    return f"stopped answering ({unanswered} health checks in a row: {problem})"

    async def alive(self) -> bool:
        if self.process is None or self.process.returncode is not None:
            return False
        # vLLM's /health fails as soon as its engine core is gone; its server then exits.
        return await self._healthy(self.supervision.health_timeout_seconds) is None

    async def take_down(self) -> None:
        process = self.process
        if process is None:
            return
        try:
            if process.returncode is None:
                _signal_group(process.pid, signal.SIGTERM)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(process.wait(), self.supervision.stop_grace_seconds)
        finally:  # also when cancelled: the whole group, as vLLM's engine core and workers
            _signal_group(process.pid, signal.SIGKILL)  # may outlive their server
        if process.returncode is None:
            await process.wait()
        self.process = None
        await self.link.reset()


def _signal_group(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def _exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"killed by {name}"
    return f"exited with status {returncode}"


PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the daemon's thread that started it dies.
    Only a call into libc that is resolved already (no imports, no locks), as a
    preexec function must be."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
