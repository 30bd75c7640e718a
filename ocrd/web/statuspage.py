"""The status page at `/`: for the people who drop files, one server-rendered HTML page.

No scripts, no build step, no external assets: inline CSS, an inline SVG chart, and a
`<meta http-equiv="refresh">` so it refreshes itself. Every name on it comes from a
user's file, so everything is escaped.
"""

from __future__ import annotations

import time
from html import escape
from urllib.parse import quote

from ocrd.status import (
    BlockedFile,
    DocumentProgress,
    FinishedDocument,
    InboxStatus,
    InstanceStatus,
    ReplicaStatus,
    StatusReport,
)

REFRESH_SECONDS = 5
WAITING_SHOWN = 50
CHART_WIDTH, CHART_HEIGHT = 640, 140

STYLE = """
body { font: 15px/1.4 system-ui, sans-serif; margin: 1.5em auto; max-width: 72em;
       padding: 0 1em; color: #1d1d1f; background: #fbfbfd; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ddd; }
.state { display: inline-block; padding: 0.1em 0.6em; border-radius: 0.8em; color: white; }
.ready { background: #2e7d32; } .notready { background: #c62828; }
.problems { color: #c62828; } .attention { color: #a15c00; } .paused { color: #c62828; }
table { border-collapse: collapse; width: 100%; margin: 0.4em 0; }
th, td { text-align: left; padding: 0.25em 0.5em; border-bottom: 1px solid #eee;
         vertical-align: top; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
progress { width: 12em; }
.done { color: #2e7d32; } .failed { color: #c62828; font-weight: 600; }
tr.instance.down td:nth-child(2) { color: #c62828; }
.muted { color: #777; }
svg { background: white; border: 1px solid #ddd; }
"""


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "…"
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _waiting(inbox: InboxStatus) -> str:
    if not inbox.waiting_count:
        return '<p class="muted">No files waiting.</p>'
    rows = "".join(
        f"<tr><td>{escape(f.path)}</td><td>{'queued' if f.ready else 'arriving'}</td>"
        f'<td class="num">{_duration(f.waiting_seconds)}</td></tr>'
        for f in inbox.waiting[:WAITING_SHOWN]
    )
    more = inbox.waiting_count - min(len(inbox.waiting), WAITING_SHOWN)
    tail = f'<p class="muted">and {more} more</p>' if more > 0 else ""
    return (
        f"<p>{inbox.waiting_count} waiting</p><table><tr><th>file</th><th>state</th>"
        f"<th>waiting</th></tr>{rows}</table>{tail}"
    )


def _blocked_row(file: BlockedFile) -> str:
    return (
        f'<tr class="blocked"><td>{escape(file.path)}</td><td>{escape(file.reason)}</td>'
        f"<td>{escape(file.fix)}</td></tr>"
    )


def _blocked(inbox: InboxStatus) -> str:
    if not inbox.blocked:
        return ""
    rows = "".join(_blocked_row(f) for f in inbox.blocked)
    return (
        "<h3>Cannot be taken</h3><p>ocrd may not move these files out of the inbox; they "
        "wait here until their permissions are fixed.</p><table><tr><th>file</th>"
        f"<th>why</th><th>what to do</th></tr>{rows}</table>"
    )


def instance_state(instance: InstanceStatus) -> str:
    """A daemon sharing the inbox, in words."""
    if instance.this:
        return "this daemon" if instance.alive else "this daemon, without its lease now"
    if instance.taken_over_by:
        return f"down: {instance.taken_over_by} is taking its claims over"
    if instance.alive:
        return "alive"
    # a lease that ran out (or was released), or none left: stopped or taken over
    return "down" if instance.lease_age_seconds is not None else "gone"


def _instance_row(instance: InstanceStatus) -> str:
    age = instance.lease_age_seconds
    state = instance_state(instance)
    kind = "alive" if instance.alive else "down"
    return (
        f'<tr class="instance {kind}"><td>{escape(instance.name)}</td>'
        f"<td>{escape(state)}</td><td>{escape(instance.host or '')}</td>"
        f'<td class="num">{"" if age is None else _duration(age)}</td>'
        f'<td class="num">{instance.claims}</td><td class="num">{instance.taken_over}</td></tr>'
    )


def _instances(inbox: InboxStatus) -> str:
    """The daemons sharing the inbox, where there is more than this one."""
    if len(inbox.instances) < 2:
        return ""
    rows = "".join(_instance_row(i) for i in inbox.instances)
    return (
        "<h3>Daemons on this inbox</h3><table><tr><th>instance</th><th>state</th>"
        "<th>host</th><th>lease age</th><th>claims</th><th>taken over by this one</th>"
        f"</tr>{rows}</table>"
    )


def _progress(document: DocumentProgress) -> str:
    if document.pages:
        bar = f'<progress max="{document.pages}" value="{document.pages_done}"></progress>'
        pages = f"page {document.pages_done} of {document.pages}"
    else:
        bar, pages = "<progress></progress>", "opening"
    return (
        f'<tr class="in-flight"><td>{escape(document.path)}{_model(document.model)}</td>'
        f"<td>{bar}</td>"
        f'<td class="pages">{pages}</td><td class="num">{_duration(document.seconds)}</td>'
        f'<td class="num">{_duration(document.eta_seconds)} left</td></tr>'
    )


def _in_flight(inbox: InboxStatus) -> str:
    if not inbox.in_flight:
        return '<p class="muted">Nothing being converted.</p>'
    rows = "".join(_progress(d) for d in inbox.in_flight)
    return (
        "<table><tr><th>file</th><th>progress</th><th>pages</th><th>so far</th>"
        f"<th>estimate</th></tr>{rows}</table>"
    )


def _markdown_link(document: FinishedDocument, query: str) -> str:
    """The Markdown's name, linked through the documents API for people who cannot reach
    the outbox's share."""
    name = escape(document.markdown or "")
    if not document.doc:
        return f'<span class="muted">{name}</span>'
    href = f"api/documents/{quote(document.doc)}/markdown{query}"
    return f'<a class="markdown" href="{escape(href)}">{name}</a>'


def _finished_row(document: FinishedDocument, query: str) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(document.finished_at))
    outcome = document.outcome.value
    if document.outcome.value == "failed":
        detail = (
            f'<span class="reason">{escape(document.reason or "")}</span>'
            f'<br><span class="muted">report: {escape(document.error_report or "")}</span>'
        )
    else:
        detail = _markdown_link(document, query)
        if document.pages_without_text:
            numbers = ", ".join(map(str, document.pages_without_text))
            detail += f'<br><span class="reason">no text from page {numbers}</span>'
    return (
        f'<tr class="finished"><td>{when}</td>'
        f"<td>{escape(document.path)}{_model(document.model)}</td>"
        f'<td class="{outcome}">{outcome}</td><td class="num">{document.pages}</td>'
        f'<td class="num">{document.seconds:.1f}</td><td>{detail}</td></tr>'
    )


def _finished(report: StatusReport, query: str) -> str:
    if not report.finished:
        return '<p class="muted">No document finished since ocrd started.</p>'
    rows = "".join(_finished_row(d, query) for d in reversed(report.finished))
    return (
        "<table><tr><th>finished</th><th>file</th><th>outcome</th><th>pages</th>"
        f"<th>seconds</th><th>Markdown, or why it failed</th></tr>{rows}</table>"
    )


def _paused(inbox: InboxStatus) -> str:
    """Why the inbox's files wait, where its model's engine takes no pages now."""
    if not inbox.paused:
        return ""
    why = escape(inbox.paused)
    return (
        f'<p class="paused">Paused: its model\'s engine takes no pages ({why}); '
        "files wait, nothing fails.</p>"
    )


def _model(model: str | None) -> str:
    """Which OCR model reads (or read) it, after its name."""
    return f' <span class="model">{escape(model)}</span>' if model else ""


def _replica_row(replica: ReplicaStatus, now: float) -> str:
    state_class = "done" if replica.state == "ready" else "failed"
    problem = escape(replica.problem) if replica.problem else ""
    return (
        f"<tr><td>{escape(replica.name)}{_model(replica.model)}</td>"
        f"<td>{escape(replica.device or '')}</td>"
        f'<td class="{state_class}">{escape(replica.state)}</td>'
        f'<td class="num">{_duration(now - replica.since) if replica.since else ""}</td>'
        f'<td class="num">{replica.in_flight} / {replica.capacity}</td>'
        f'<td class="num">{replica.pages_done}</td><td class="num">{replica.pages_failed}</td>'
        f'<td class="num">{replica.restarts}</td>'
        f"<td>{escape(replica.self_check_words())}</td><td>{problem}</td></tr>"
    )


def _replicas(report: StatusReport) -> str:
    if not report.replicas:
        return ""
    now = time.time()
    rows = "".join(_replica_row(replica, now) for replica in report.replicas)
    return (
        f"<h2>Engine replicas: {escape(report.engine_summary)}</h2>"
        "<table><tr><th>replica</th><th>device</th><th>state</th><th>for</th>"
        "<th>pages in flight</th><th>done</th><th>failed</th><th>restarts</th>"
        f"<th>self-check</th><th>problem</th></tr>{rows}</table>"
    )


def _chart(history: list[tuple[float, float]]) -> str:
    """Pages a second, a bar a minute over the last hour, as inline SVG."""
    if not history:
        return ""
    peak = max(max(rate for _, rate in history), 0.1)
    width = CHART_WIDTH / len(history)
    bars = "".join(
        f'<rect x="{i * width:.1f}" y="{CHART_HEIGHT - rate / peak * (CHART_HEIGHT - 20):.1f}" '
        f'width="{max(width - 1, 1):.1f}" height="{rate / peak * (CHART_HEIGHT - 20):.1f}" '
        f'fill="#1565c0"><title>{rate:.2f} pages/s</title></rect>'
        for i, (_, rate) in enumerate(history)
    )
    return (
        f'<svg id="rate-chart" width="{CHART_WIDTH}" height="{CHART_HEIGHT}" '
        f'viewBox="0 0 {CHART_WIDTH} {CHART_HEIGHT}" role="img" '
        f'aria-label="pages per second over the last hour">'
        f'<text x="4" y="14" font-size="12" fill="#555">peak {peak:.2f} pages/s</text>'
        f'{bars}</svg><p class="muted">Pages per second, each bar a minute, the last hour; '
        f"now {history[-1][1]:.2f}.</p>"
    )


def render(report: StatusReport, token: str = "") -> str:
    """The page; `token`, where the browser came with one in its address, is kept on the
    page's links."""
    query = f"?token={quote(token)}" if token else ""
    state = "ready" if report.ready else "notready"
    instance = f", instance {escape(report.instance)}" if report.instance else ""
    problems = "".join(f"<li>{escape(p)}</li>" for p in report.problems)
    attention = "".join(
        f"<li>{escape(line)}</li>"
        for line in report.attention + ([f"degraded: {report.degraded}"] if report.degraded else [])
    )
    inboxes = "".join(
        f'<section class="inbox"><h2>Inbox {escape(inbox.path)}'
        f"{'' if inbox.watching else ' (not watched)'}{_model(inbox.model)}</h2>"
        f"{_paused(inbox)}"
        f"<h3>Being converted</h3>{_in_flight(inbox)}<h3>Waiting</h3>{_waiting(inbox)}"
        f"{_blocked(inbox)}{_instances(inbox)}</section>"
        for inbox in report.inboxes
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{REFRESH_SECONDS}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>ocrd status</title><style>{STYLE}</style></head>
<body>
<h1>ocrd <span class="state {state}">{"ready" if report.ready else "not ready"}</span></h1>
<p>engine {escape(report.engine)} ({escape(report.engine_state)}),
{_count(report.documents_in_flight, "document")} and
{_count(report.pages_in_flight, "page")} in flight,
{report.pages_per_second:.2f} pages/s over the last minute.
ocrd {escape(report.version)}{instance}.</p>
{f'<ul class="problems">{problems}</ul>' if problems else ""}
{f'<ul class="attention">{attention}</ul>' if attention else ""}
{inboxes}
{_replicas(report)}
<h2>Throughput</h2>{_chart(report.history)}
<h2>Finished lately</h2>{_finished(report, query)}
<p class="muted">This page refreshes itself every {REFRESH_SECONDS} s.
Machine-readable: <a href="api/status{escape(query)}">api/status</a>,
<a href="metrics{escape(query)}">metrics</a>, <a href="readyz{escape(query)}">readyz</a>,
<a href="api/openapi.json{escape(query)}">api/openapi.json</a>.</p>
</body></html>
"""
