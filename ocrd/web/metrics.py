"""Prometheus metrics: counters fed by the pipeline's events, gauges read from the status
report at each scrape. They live in a registry of their own; the exposition adds the
process-wide default registry, where the in-process vLLM engine keeps its `vllm:*` metrics
(and prometheus-client its `process_*` ones), and the `vllm:*` metrics of the engine's
replica processes, each sample labelled with its replica."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ocrd.domain import DocumentSummary, Outcome, PageResult, PageSource
from ocrd.engines import EngineState, ReplicaState
from ocrd.engines.replica_metrics import without_families
from ocrd.status import ReplicaStatus, StatusReport

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PAGE_SECONDS = (0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300, 600)
_FAMILY = re.compile(r"^# TYPE (\S+)", re.MULTILINE)
DOCUMENT_SECONDS = (1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600)


def size_class(pages: int) -> str:
    """Documents are bucketed by page count, so a book's time does not hide a scan's."""
    if pages <= 1:
        return "1"
    if pages <= 10:
        return "2-10"
    if pages <= 100:
        return "11-100"
    return "101+"


class _StateCollector(Collector):
    """Gauges of the moment, from the status report."""

    def __init__(self, report: Callable[[], StatusReport]) -> None:
        self.report = report

    def collect(self) -> Iterator[Metric]:
        report = self.report()
        waiting = GaugeMetricFamily(
            "ocrd_files_waiting", "Files in an inbox not yet claimed", labels=["inbox"]
        )
        oldest = GaugeMetricFamily(
            "ocrd_oldest_waiting_file_seconds",
            "Age of the oldest file waiting in an inbox (0 when none waits)",
            labels=["inbox"],
        )
        blocked = GaugeMetricFamily(
            "ocrd_files_blocked",
            "Files in an inbox that ocrd's user may not move out (see the status page)",
            labels=["inbox"],
        )
        uploads = GaugeMetricFamily(
            "ocrd_uploads_usable",
            "1 when an inbox taking uploads can keep them, 0 when its uploads folder is "
            "unusable (see /readyz)",
            labels=["inbox"],
        )
        for inbox in report.inboxes:
            waiting.add_metric([inbox.path], inbox.waiting_count)
            oldest.add_metric([inbox.path], inbox.oldest_waiting_seconds or 0.0)
            blocked.add_metric([inbox.path], len(inbox.blocked))
            if inbox.uploads:
                uploads.add_metric([inbox.path], 0.0 if inbox.uploads_problem else 1.0)
        yield waiting
        yield oldest
        yield blocked
        yield uploads
        yield from _instance_metrics(report)
        yield GaugeMetricFamily(
            "ocrd_documents_in_flight",
            "Documents claimed and being processed",
            value=report.documents_in_flight,
        )
        yield GaugeMetricFamily(
            "ocrd_pages_in_flight",
            "Pages rendered and not yet recognised",
            value=report.pages_in_flight,
        )
        state = GaugeMetricFamily(
            "ocrd_engine_state", "1 for the engine's current state", labels=["state"]
        )
        for value in EngineState:
            state.add_metric([value.value], 1.0 if report.engine_state == value.value else 0.0)
        yield state
        yield GaugeMetricFamily(
            "ocrd_ready", "1 when ocrd is ready (see /readyz)", value=1.0 if report.ready else 0.0
        )
        yield from _replica_metrics(report.replicas)


# Each replica's numbers: (ReplicaStatus field, metric name, help, a counter?).
REPLICA_NUMBERS = (
    ("in_flight", "ocrd_engine_replica_pages_in_flight", "Pages a replica works on now", False),
    ("capacity", "ocrd_engine_replica_capacity", "Pages a replica works on at once at most", False),
    ("pages_done", "ocrd_engine_replica_pages", "Pages a replica recognised", True),
    (
        "pages_failed",
        "ocrd_engine_replica_page_failures",
        "Page requests that failed on a replica while it stayed up",
        True,
    ),
    (
        "restarts",
        "ocrd_engine_replica_restarts",
        "Restarts (local) or reconnections (remote) of a replica after its first start",
        True,
    ),
    (
        "deaths_with_pages",
        "ocrd_engine_replica_deaths_with_pages",
        "Times a replica died or dropped its connection with pages in flight",
        True,
    ),
)


def _replica_metrics(replicas: list[ReplicaStatus]) -> Iterator[Metric]:
    """Each engine replica's state and counts, labelled `replica` (its name)."""
    state = GaugeMetricFamily(
        "ocrd_engine_replica_state",
        "1 for each replica's current state",
        labels=["replica", "state"],
    )
    checked = GaugeMetricFamily(
        "ocrd_engine_replica_self_check_passed",
        "1 if the replica read ocrd's test page at its last check, 0 if not (absent before, "
        "and for an engine without a self-check)",
        labels=["replica"],
    )
    served = GaugeMetricFamily(
        "ocrd_engine_replica_model",
        "1 for the OCR model each replica serves",
        labels=["replica", "model"],
    )
    numbers = [
        (
            field,
            (CounterMetricFamily if counter else GaugeMetricFamily)(
                name, help_text, labels=["replica"]
            ),
        )
        for field, name, help_text, counter in REPLICA_NUMBERS
    ]
    for replica in replicas:
        for value in ReplicaState:
            state.add_metric([replica.name, value.value], float(replica.state == value.value))
        for field, family in numbers:
            family.add_metric([replica.name], getattr(replica, field))
        if replica.self_check_passed is not None:
            checked.add_metric([replica.name], float(replica.self_check_passed))
        if replica.model is not None:
            served.add_metric([replica.name, replica.model], 1.0)
    yield state
    yield checked
    yield served
    yield from (family for _, family in numbers)


def _instance_metrics(report: StatusReport) -> Iterator[Metric]:
    """The daemons sharing each inbox, as this one saw their leases at its last renewal."""
    labels = ["inbox", "instance"]
    up = GaugeMetricFamily(
        "ocrd_instance_up",
        "1 while a daemon's lease on the inbox's work area is alive",
        labels=labels,
    )
    age = GaugeMetricFamily(
        "ocrd_instance_lease_age_seconds",
        "Age of a daemon's lease by the shared filesystem's clock (absent: it holds none)",
        labels=labels,
    )
    claims = GaugeMetricFamily(
        "ocrd_instance_claims", "Claims a daemon holds in the inbox's work area", labels=labels
    )
    taken = CounterMetricFamily(
        "ocrd_claims_taken_over",
        "Claims this daemon took over from another (that died) since it started",
        labels=["inbox", "from_instance"],
    )
    lost = CounterMetricFamily(
        "ocrd_leases_lost",
        "Leases this daemon lost (paused or cut off past half a lease)",
        labels=["inbox"],
    )
    for inbox in report.inboxes:
        for instance in inbox.instances:
            up.add_metric([inbox.path, instance.name], 1.0 if instance.alive else 0.0)
            if instance.lease_age_seconds is not None:
                age.add_metric([inbox.path, instance.name], instance.lease_age_seconds)
            claims.add_metric([inbox.path, instance.name], instance.claims)
            if not instance.this:
                taken.add_metric([inbox.path, instance.name], instance.taken_over)
            else:
                lost.add_metric([inbox.path], instance.leases_lost)
    yield from (up, age, claims, taken, lost)


class Metrics:
    def __init__(
        self,
        report: Callable[[], StatusReport],
        replica_metrics: Callable[[], Awaitable[str]] | None = None,
    ) -> None:
        """`replica_metrics`: the engine's replicas' own metrics (empty before there is
        an engine)."""
        self.registry = CollectorRegistry()
        registry = self.registry
        self.documents = Counter(
            "ocrd_documents_finished",
            "Documents settled, by inbox, outcome, failed stage and OCR model",
            ["inbox", "outcome", "stage", "model"],
            registry=registry,
        )
        self.document_seconds = Histogram(
            "ocrd_document_seconds",
            "Seconds from a document's start to its settlement",
            ["pages"],
            buckets=DOCUMENT_SECONDS,
            registry=registry,
        )
        self.pages = Counter(
            "ocrd_pages_recognised",
            "Pages done, by finish reason, prompt (text_layer, blank: not sent to the engine) "
            "and the OCR model that read them",
            ["finish_reason", "prompt", "model"],
            registry=registry,
        )
        self.page_seconds = Histogram(
            "ocrd_page_seconds",
            "Seconds a page spent in the engine (queue included)",
            buckets=PAGE_SECONDS,
            registry=registry,
        )
        self.retried = Counter(
            "ocrd_pages_retried",
            "Unfinished pages sent again with the plain-text prompt",
            registry=registry,
        )
        self.unfinished = Counter(
            "ocrd_pages_unfinished",
            "Pages left unfinished (length, repetition, a loop)",
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "ocrd_prompt_tokens", "Prompt tokens of recognised pages", registry=registry
        )
        self.completion_tokens = Counter(
            "ocrd_completion_tokens", "Completion tokens of recognised pages", registry=registry
        )
        self.without_text = Counter(
            "ocrd_pages_without_text",
            "Pages with content (ink, or a text layer) from which no text came",
            registry=registry,
        )
        self.storage_faults = Counter(
            "ocrd_storage_faults",
            "Storage errors met while settling (each retry counts)",
            registry=registry,
        )
        self.render_failures = Counter(
            "ocrd_render_failures",
            "Documents that failed to open or render, by reason",
            ["reason"],
            registry=registry,
        )
        self.hooks = Counter(
            "ocrd_hook_runs",
            "Hooks run after settling, by event, kind and result",
            ["event", "kind", "result"],
            registry=registry,
        )
        registry.register(_StateCollector(report))
        self.replica_metrics = replica_metrics

    def page_done(self, page: PageResult) -> None:
        prompt = page.prompt.value if page.source is PageSource.engine else page.source.value
        self.pages.labels(page.finish_reason, prompt, page.text.model or "").inc()
        self.page_seconds.observe(page.text.seconds)
        self.prompt_tokens.inc(page.text.prompt_tokens)
        self.completion_tokens.inc(page.text.completion_tokens)
        if page.retried:
            self.retried.inc()
        if page.unfinished:
            self.unfinished.inc()
        if page.no_text is not None:
            self.without_text.inc()

    def document_finished(self, summary: DocumentSummary) -> None:
        stage = summary.stage.value if summary.stage else ""
        self.documents.labels(
            summary.inbox, summary.outcome.value, stage, summary.model or ""
        ).inc()
        self.document_seconds.labels(size_class(summary.pages)).observe(summary.seconds)
        if summary.outcome is Outcome.failed and stage in ("detect", "render"):
            self.render_failures.labels(summary.code or stage).inc()

    def storage_fault(self, _: str) -> None:
        self.storage_faults.inc()

    async def exposition(self) -> bytes:
        """ocrd's metrics, then the process-wide registry's (vLLM's, the process's), then
        those of the engine's replica processes."""
        own = generate_latest(self.registry) + generate_latest(REGISTRY)
        if self.replica_metrics is None:
            return own
        # A family named twice makes the whole exposition unparseable: the replicas' are
        # left out where the daemon has one of the same name (vLLM's, in its process).
        names = _FAMILY.findall(own.decode())
        return own + without_families(await self.replica_metrics(), names).encode()
