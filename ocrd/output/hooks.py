"""Hooks: a command and/or a webhook run after a document settled in done/ or failed/.

They run in the background once the document is settled, so they never delay or change
settling: a hook that fails, hangs or is slow is logged (`hook.finished`, `hook.failed`)
and counted, and the document stays where it is. A command is an argument list run
without a shell, in a process group of its own, with the document's facts in environment
variables (`OCRD_*`, below; the whole summary also as a file, since a large one does not
fit the environment), a time limit after which the whole group is killed, and the tail of
its output logged (read as it comes: a flood costs no memory). A webhook gets the summary
as a JSON POST (with a `text` line for chat services), retried with backoff, with an
optional secret header. Hooks still running when ocrd stops are cancelled and logged.
A document split at separator sheets is told part by part, each part as a document of its
own (its files, `OCRD_PART`), so whatever a hook hands on gets every part.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx

from ocrd.backoff import Backoff
from ocrd.config import HookConfig, InboxConfig, WebhookConfig
from ocrd.config.strict import hook_problem
from ocrd.domain import DocumentSummary, Outcome
from ocrd.files import json_bytes
from ocrd.files.dropped import printable
from ocrd.log import get_logger

OUTPUT_LIMIT = 4000  # bytes of a command's output kept for the log (its tail)
READ_CHUNK = 65536
HOOKS_AT_ONCE = 8
SUMMARY_IN_ENVIRONMENT = 32768  # bytes; a larger summary is only in OCRD_SUMMARY_FILE
WEBHOOK_BACKOFF = Backoff(first=1.0, cap=60.0)
STOP_GRACE_SECONDS = 5.0

Counter = Callable[[str, str, str], None]  # event, kind, result


def payload(summary: DocumentSummary) -> dict[str, Any]:
    """The summary as hooks see it: the `document.finished` event, with who and where."""
    data: dict[str, Any] = {
        "event": summary.outcome.value,
        "document_id": summary.doc,
        "inbox": summary.inbox,
        "path": summary.path,
        **summary.event(),
    }
    data["outcome"] = summary.outcome.value
    what = summary.path
    if summary.part is not None:
        number, count = summary.part
        data["part"] = {"number": number, "of": count}
        what = f"{summary.path} (part {number} of {count})"
    data = _printable(data)  # paths in any encoding, as JSON can carry them
    if summary.outcome is Outcome.done:
        data["text"] = (
            f"ocrd: {printable(what)} is done: {summary.pages} pages in "
            f"{summary.seconds:.1f} s ({data['markdown']})"
        )
    else:
        data["text"] = f"ocrd: {summary.path} failed: {summary.reason}"
    return data


def _printable(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {key: _printable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_printable(item) for item in value]
    return value


def environment(summary: DocumentSummary, summary_file: Path) -> dict[str, str]:
    """What a hook command learns about the document, besides ocrd's own environment.
    Paths are the files' own names (valid UTF-8 or not); the summary is JSON."""
    text = json.dumps(payload(summary), ensure_ascii=False)
    values = {
        "OCRD_EVENT": summary.outcome.value,
        "OCRD_DOCUMENT_ID": summary.doc,
        "OCRD_INBOX": summary.inbox,
        "OCRD_PATH": summary.path,
        "OCRD_ORIGINAL": summary.original or "",
        "OCRD_MARKDOWN": summary.markdown or "",
        "OCRD_PDF": summary.pdf or "",
        "OCRD_PART": "{}/{}".format(*(summary.part or (1, 1))),
        "OCRD_ERROR_REPORT": summary.error_report or "",
        "OCRD_REASON": summary.reason or "",
        "OCRD_PAGES": str(summary.pages),
        "OCRD_SECONDS": f"{summary.seconds:.3f}",
        "OCRD_SUMMARY_FILE": str(summary_file),
    }
    if len(text.encode()) <= SUMMARY_IN_ENVIRONMENT:
        values["OCRD_SUMMARY"] = text
    return {**os.environ, **values}


def _logger(summary: DocumentSummary, event: str, kind: str) -> Any:
    """The log of one hook run: the document's, and which part it was told of."""
    part = {"part": "{}/{}".format(*summary.part)} if summary.part else {}
    return get_logger(doc=summary.doc, path=summary.path, hook=event, kind=kind, **part)


def _write_summary(summary: DocumentSummary) -> Path:
    """The summary as a private JSON file for a hook command (removed after it ran)."""
    fd, name = tempfile.mkstemp(prefix="ocrd-hook-", suffix=".json")
    with os.fdopen(fd, "wb") as handle:
        handle.write(json_bytes(payload(summary), indent=2))
    return Path(name)


class OutputTail:
    """The last `limit` bytes of a stream, read as it comes."""

    def __init__(self, limit: int = OUTPUT_LIMIT) -> None:
        self.limit = limit
        self.data = b""
        self.total = 0

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(READ_CHUNK):
            self.total += len(chunk)
            self.data = (self.data + chunk)[-self.limit :]

    def text(self) -> str:
        text = self.data.decode(errors="replace").rstrip()
        if self.total > self.limit:
            return f"[{self.total - len(self.data)} bytes before]\n{text}"
        return text


def _kill_group(process: asyncio.subprocess.Process) -> None:
    """The command and every process it started (its own process group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)


class Hooks:
    """Runs the hooks of settled documents in background tasks."""

    def __init__(self, count: Counter | None = None) -> None:
        self._count = count or (lambda *_: None)
        self._tasks: set[asyncio.Task[None]] = set()
        # A flood of documents settling at once waits its turn: each hook holds a process,
        # pipes and a file, and the daemon's open files are shared with everything else.
        self._turns = asyncio.Semaphore(HOOKS_AT_ONCE)
        self._client: httpx.AsyncClient | None = None

    def document_finished(self, inbox: InboxConfig, summary: DocumentSummary) -> None:
        hook = inbox.hooks.on_done if summary.outcome is Outcome.done else inbox.hooks.on_failed
        if hook is None:
            return
        event = f"on_{summary.outcome.value}"
        for told in summary.part_summaries():  # each part of a split document on its own
            if hook.command:
                self._start(self._run_command(hook, event, told))
            if hook.webhook is not None:
                self._start(self._post(hook.webhook, event, told))

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(self._in_turn(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _in_turn(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            async with self._turns:
                await work
        finally:
            work.close()  # one cancelled (ocrd stopping) before its turn never started

    async def _run_command(self, hook: HookConfig, event: str, summary: DocumentSummary) -> None:
        assert hook.command is not None
        log = _logger(summary, event, "command")
        try:
            summary_file = await asyncio.to_thread(_write_summary, summary)
        except OSError as error:
            log.error("hook.failed", command=list(hook.command), error=printable(str(error)))
            self._count(event, "command", "error")
            return
        try:
            await self._command(hook, event, summary, summary_file, log)
        finally:
            summary_file.unlink(missing_ok=True)

    async def _command(
        self, hook: HookConfig, event: str, summary: DocumentSummary, summary_file: Path, log: Any
    ) -> None:
        assert hook.command is not None
        refused = await asyncio.to_thread(hook_problem, hook.command)
        if refused is not None:  # made writable by others since the configuration was read
            log.error("hook.failed", command=list(hook.command), error=refused)
            self._count(event, "command", "error")
            return
        try:
            process = await asyncio.create_subprocess_exec(
                *hook.command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=environment(summary, summary_file),
                start_new_session=True,  # a group of its own, killed whole at the time limit
            )
        except OSError as error:
            log.error("hook.failed", command=list(hook.command), error=str(error))
            self._count(event, "command", "error")
            return
        assert process.stdout is not None
        output = OutputTail()
        try:
            async with asyncio.timeout(hook.timeout_seconds):
                await asyncio.gather(output.read(process.stdout), process.wait())
        except TimeoutError:
            _kill_group(process)
            await process.wait()
            log.error(
                "hook.failed",
                command=list(hook.command),
                error=f"still running after {hook.timeout_seconds:g} s; killed with the "
                "processes it started",
                output=output.text(),
            )
            self._count(event, "command", "timeout")
            return
        except asyncio.CancelledError:
            _kill_group(process)
            log.warning(
                "hook.cancelled",
                command=list(hook.command),
                reason="ocrd is stopping; the command and the processes it started were killed",
            )
            self._count(event, "command", "cancelled")
            raise
        _kill_group(process)  # what it left running in the background ends with it
        text = output.text()
        if process.returncode == 0:
            log.info("hook.finished", exit_code=0, output=text)
            self._count(event, "command", "ok")
        else:
            log.error("hook.failed", exit_code=process.returncode, output=text)
            self._count(event, "command", "error")

    async def _post(self, webhook: WebhookConfig, event: str, summary: DocumentSummary) -> None:
        log = _logger(summary, event, "webhook")
        headers = {}
        if webhook.secret_env and os.environ.get(webhook.secret_env):
            headers[webhook.secret_header] = os.environ[webhook.secret_env]
        body = payload(summary)
        attempt = 0
        try:
            for attempt, delay in enumerate(self._webhook_delays(webhook), start=1):
                problem = await self._attempt(webhook, headers, body)
                if problem is None:
                    log.info("hook.finished", url=webhook.url, attempt=attempt)
                    self._count(event, "webhook", "ok")
                    return
                last = delay is None
                log.warning(
                    "hook.failed" if last else "hook.retrying",
                    url=webhook.url,
                    attempt=attempt,
                    error=problem,
                    **({} if last else {"retry_in_seconds": delay}),
                )
                if delay is not None:
                    await asyncio.sleep(delay)
        except asyncio.CancelledError:
            log.warning(
                "hook.cancelled",
                url=webhook.url,
                attempt=attempt,
                reason="ocrd is stopping; this document's webhook was not delivered",
            )
            self._count(event, "webhook", "cancelled")
            raise
        self._count(event, "webhook", "error")

    @staticmethod
    def _webhook_delays(webhook: WebhookConfig) -> list[float | None]:
        """The wait after each attempt; None after the last."""
        return [WEBHOOK_BACKOFF.nth(n) for n in range(1, webhook.retries + 1)] + [None]

    async def _attempt(
        self, webhook: WebhookConfig, headers: dict[str, str], body: dict[str, Any]
    ) -> str | None:
        """None if the webhook took the summary (2xx), else what went wrong."""
        if self._client is None:
            self._client = httpx.AsyncClient()
        try:
            response = await self._client.post(
                webhook.url, json=body, headers=headers, timeout=webhook.timeout_seconds
            )
        except httpx.HTTPError as error:
            return f"{type(error).__name__}: {error}"
        if 200 <= response.status_code < 300:
            return None
        return f"HTTP {response.status_code}: {response.text[:200]}"

    async def stop(self) -> None:
        """Give running hooks a moment, then cancel them (they are logged as cancelled)."""
        if self._tasks:
            _, pending = await asyncio.wait(self._tasks, timeout=STOP_GRACE_SECONDS)
            for task in pending:
                task.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*pending, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None
