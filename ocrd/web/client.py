"""`ocrd status`: a running daemon's report, read from its HTTP server, for a terminal."""

from __future__ import annotations

import os
import time

import httpx

from ocrd.config import Config, HttpConfig
from ocrd.status import InstanceStatus, StatusReport

TIMEOUT_SECONDS = 5.0


def fetch_status(config: HttpConfig) -> StatusReport:
    """The report at `/api/status`; OSError saying what is wrong when there is none."""
    if not config.enabled:
        raise OSError("the configuration switches the HTTP server off (http.enabled: false)")
    headers = {}
    token = os.environ.get(config.token_env)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{config.url}/api/status"
    try:
        response = httpx.get(url, headers=headers, timeout=TIMEOUT_SECONDS)
    except httpx.HTTPError as error:
        raise OSError(f"no ocrd answers at {url} ({error}); is it running?") from None
    if response.status_code == 401:
        raise OSError(f"{url} wants a token: set {config.token_env} as the daemon has it")
    if response.status_code not in (200, 503):
        raise OSError(f"{url} answered HTTP {response.status_code}")
    return StatusReport.model_validate_json(response.content)


def other_daemon(report: StatusReport, config: Config) -> str | None:
    """Why the daemon that answered is not the one serving `config`, or None if it serves
    exactly its inboxes (also None while it loads: it lists no inboxes yet)."""
    if report.engine_state == "loading" and not report.inboxes:
        return None
    served = {inbox.path for inbox in report.inboxes}
    configured = {str(inbox.path) for inbox in config.inboxes}
    if served == configured:
        return None
    where = config.http.url
    if served & configured:
        missing, extra = sorted(configured - served), sorted(served - configured)
        return (
            f"the daemon at {where} serves other inboxes than this configuration lists "
            f"(not served: {', '.join(missing) or 'none'}; served but not listed: "
            f"{', '.join(extra) or 'none'}): if the file was changed, reload the daemon "
            "(systemctl reload ocrd)"
        )
    return (
        f"the daemon at {where} is not this configuration's: it serves "
        f"{', '.join(sorted(served)) or 'no inboxes'}, this configuration lists "
        f"{', '.join(sorted(configured))}; another ocrd answers on http.listen "
        f"{config.http.listen} (give each configuration its own http.listen)"
    )


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = round(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"


def _instance_line(instance: InstanceStatus) -> str:
    """A daemon sharing the inbox: alive or down, its lease's age, its claims."""
    if instance.this:
        state = "this one" if instance.alive else "this one, WITHOUT ITS LEASE now"
    elif instance.taken_over_by:
        state = f"DOWN, {instance.taken_over_by} is taking its claims over"
    elif instance.alive:
        state = "alive"
    else:  # a lease that ran out (or was released), or none left: stopped or taken over
        state = "DOWN" if instance.lease_age_seconds is not None else "gone"
    parts = [state]
    if instance.lease_age_seconds is not None:
        parts.append(f"lease {_duration(instance.lease_age_seconds)} old")
    parts.append(f"{instance.claims} claim{'' if instance.claims == 1 else 's'}")
    if instance.taken_over:
        parts.append(f"{instance.taken_over} taken over by this one")
    if instance.leases_lost:
        parts.append(f"lost its lease {instance.leases_lost} times")
    return f"  daemon {instance.name}: " + ", ".join(parts)


def format_status(report: StatusReport) -> str:
    lines = [
        f"ocrd {report.version}"
        + (f" ({report.instance})" if report.instance else "")
        + f": {'READY' if report.ready else 'NOT READY'}; "
        f"engine {report.engine} ({report.engine_state}); "
        f"{report.documents_in_flight} documents, {report.pages_in_flight} pages in flight; "
        f"{report.pages_per_second:.2f} pages/s"
    ]
    lines += [f"  problem: {problem}" for problem in report.problems]
    lines += [f"  attention: {line}" for line in report.attention]
    lines += [
        f"  paused: model {m}, its inboxes wait: {why}" for m, why in report.paused_models.items()
    ]
    if report.degraded:
        lines.append(f"  degraded: {report.degraded}")
    if len(report.replicas) == 1 and not report.degraded:
        lines.append(f"  self-check: {report.replicas[0].self_check_words()}")
    if len(report.replicas) > 1 or report.degraded:
        lines.append(f"engine replicas: {report.engine_summary}")
        for replica in report.replicas:
            device = f" on {replica.device}" if replica.device else ""
            check = f", self-check {replica.self_check_words()}"
            problem = f": {replica.problem}" if replica.problem else ""
            lines.append(
                f"  {replica.name}{device} {replica.state}, {replica.in_flight}/"
                f"{replica.capacity} in flight, {replica.pages_done} done, "
                f"{replica.restarts} restarts{_served(replica.model)}{check}{problem}"
            )
    for inbox in report.inboxes:
        watching = "" if inbox.watching else " (not watched)"
        model = f" (model {inbox.model})" if inbox.model else ""
        paused = f" (PAUSED: {inbox.paused})" if inbox.paused else ""
        lines.append(f"inbox {inbox.path}{watching}{model}: {inbox.waiting_count} waiting{paused}")
        if len(inbox.instances) > 1:
            lines += [_instance_line(instance) for instance in inbox.instances]
        for blocked in inbox.blocked:
            lines.append(f"  cannot take {blocked.path}: {blocked.reason}; fix: {blocked.fix}")
        for document in inbox.in_flight:
            pages = f"{document.pages_done}/{document.pages}" if document.pages else "opening"
            by = f" by {document.model}" if document.model else ""
            lines.append(
                f"  converting {document.path}{by}: page {pages}, "
                f"{_duration(document.seconds)} so far, {_duration(document.eta_seconds)} left"
            )
        for waiting in inbox.waiting[:10]:
            state = "queued" if waiting.ready else "arriving"
            lines.append(f"  {state} {waiting.path} ({_duration(waiting.waiting_seconds)})")
        if inbox.waiting_count > 10:
            lines.append(f"  ... and {inbox.waiting_count - 10} more waiting")
    if report.finished:
        lines.append("finished lately:")
    for finished in list(reversed(report.finished))[:10]:
        when = time.strftime("%H:%M:%S", time.localtime(finished.finished_at))
        detail = finished.reason if finished.outcome.value == "failed" else finished.markdown
        if finished.pages_without_text:
            numbers = ", ".join(map(str, finished.pages_without_text))
            detail = f"{detail} (no text from page {numbers})"
        lines.append(
            f"  {when} {finished.outcome.value:6} {finished.path} "
            f"({finished.pages} pages, {finished.seconds:.1f} s): {detail}"
        )
    return "\n".join(lines)


def _served(model: str | None) -> str:
    """The OCR model a replica serves, after its counts."""
    return f", serving {model}" if model else ""
