"""Hooks: a command and/or a webhook run after a document settled in done/ or failed/.

They run in the background once the document is settled, so they never delay or change
settling: a hook that fails, hangs or is slow is logged (`hook.finished`, `hook.failed`)
and counted, and the document stays where it is. A command is an argument list run
without a shell, with the document's facts in environment variables (`OCRD_*`, below), a
time limit, and its output logged. A webhook gets the summary as a JSON POST (with a
`text` line for chat services), retried with backoff, with an optional secret header.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import Callable
from typing import Any

import httpx

from ocrd.config import HookConfig, InboxConfig, WebhookConfig
from ocrd.domain import DocumentSummary, Outcome
from ocrd.log import get_logger

OUTPUT_LIMIT = 4000  # characters of a command's output kept in the log
WEBHOOK_BACKOFF_FIRST_SECONDS = 1.0
WEBHOOK_BACKOFF_MAX_SECONDS = 60.0
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
    if summary.outcome is Outcome.done:
        data["text"] = (
            f"ocrd: {summary.path} is done: {summary.pages} pages in {summary.seconds:.1f} s"
            f" ({summary.markdown})"
        )
    else:
        data["text"] = f"ocrd: {summary.path} failed: {summary.reason}"
    return data


def environment(summary: DocumentSummary) -> dict[str, str]:
    """What a hook command learns about the document, besides ocrd's own environment."""
    values = {
        "OCRD_EVENT": summary.outcome.value,
        "OCRD_DOCUMENT_ID": summary.doc,
        "OCRD_INBOX": summary.inbox,
        "OCRD_PATH": summary.path,
        "OCRD_ORIGINAL": summary.original or "",
        "OCRD_MARKDOWN": summary.markdown or "",
        "OCRD_ERROR_REPORT": summary.error_report or "",
        "OCRD_REASON": summary.reason or "",
        "OCRD_PAGES": str(summary.pages),
        "OCRD_SECONDS": f"{summary.seconds:.3f}",
        "OCRD_SUMMARY": json.dumps(payload(summary), ensure_ascii=False),
    }
    return {**os.environ, **values}


class Hooks:
    """Runs the hooks of settled documents in background tasks."""

    def __init__(self, count: Counter | None = None) -> None:
        self._count = count or (lambda *_: None)
        self._tasks: set[asyncio.Task[None]] = set()
        self._client: httpx.AsyncClient | None = None

    @property
    def running(self) -> int:
        return len(self._tasks)

    def document_finished(self, inbox: InboxConfig, summary: DocumentSummary) -> None:
        hook = inbox.hooks.on_done if summary.outcome is Outcome.done else inbox.hooks.on_failed
        if hook is None:
            return
        event = f"on_{summary.outcome.value}"
        if hook.command:
            self._start(self._run_command(hook, event, summary))
        if hook.webhook is not None:
            self._start(self._post(hook.webhook, event, summary))

    def _start(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run_command(self, hook: HookConfig, event: str, summary: DocumentSummary) -> None:
        assert hook.command is not None
        log = get_logger(doc=summary.doc, path=summary.path, hook=event, kind="command")
        try:
            process = await asyncio.create_subprocess_exec(
                *hook.command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=environment(summary),
            )
        except OSError as error:
            log.error("hook.failed", command=list(hook.command), error=str(error))
            self._count(event, "command", "error")
            return
        try:
            output, _ = await asyncio.wait_for(process.communicate(), hook.timeout_seconds)
        except TimeoutError:
            process.kill()
            await process.wait()
            log.error(
                "hook.failed",
                command=list(hook.command),
                error=f"still running after {hook.timeout_seconds:g} s; killed",
            )
            self._count(event, "command", "timeout")
            return
        text = output.decode(errors="replace")[-OUTPUT_LIMIT:].rstrip()
        if process.returncode == 0:
            log.info("hook.finished", exit_code=0, output=text)
            self._count(event, "command", "ok")
        else:
            log.error("hook.failed", exit_code=process.returncode, output=text)
            self._count(event, "command", "error")

    async def _post(self, webhook: WebhookConfig, event: str, summary: DocumentSummary) -> None:
        log = get_logger(doc=summary.doc, path=summary.path, hook=event, kind="webhook")
        headers = {}
        if webhook.secret_env and os.environ.get(webhook.secret_env):
            headers[webhook.secret_header] = os.environ[webhook.secret_env]
        body = payload(summary)
        delay = WEBHOOK_BACKOFF_FIRST_SECONDS
        for attempt in range(1, webhook.retries + 2):
            problem = await self._attempt(webhook, headers, body)
            if problem is None:
                log.info("hook.finished", url=webhook.url, attempt=attempt)
                self._count(event, "webhook", "ok")
                return
            last = attempt == webhook.retries + 1
            log.warning(
                "hook.failed" if last else "hook.retrying",
                url=webhook.url,
                attempt=attempt,
                error=problem,
                **({} if last else {"retry_in_seconds": delay}),
            )
            if not last:
                await asyncio.sleep(delay)
                delay = min(delay * 2, WEBHOOK_BACKOFF_MAX_SECONDS)
        self._count(event, "webhook", "error")

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
