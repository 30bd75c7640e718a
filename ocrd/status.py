"""The daemon's state as one report: what `/api/status`, the status page and `ocrd status`
show. Built on the event loop from what the daemon holds; no file is touched."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from ocrd.domain import DocumentSummary, Outcome
from ocrd.files.dropped import printable

WAITING_LISTED = 100  # waiting files listed per inbox; the count covers all of them


class WaitingFile(BaseModel):
    path: str  # relative to the inbox
    waiting_seconds: float
    ready: bool  # settled and queued for a document slot (else still settling)


class DocumentProgress(BaseModel):
    doc: str
    path: str
    pages: int | None  # known once the document is open
    pages_done: int
    seconds: float
    eta_seconds: float | None
    alone: bool = False
    model: str | None = None  # the OCR model reading it


class BlockedFile(BaseModel):
    """A ready file ocrd's user cannot move out of the inbox: it waits for a person."""

    path: str  # relative to the inbox
    reason: str
    fix: str
    since: float  # wall clock, when it was first found blocked


class InstanceStatus(BaseModel):
    """A daemon serving the same inbox (this one too), as its lease and folder show it."""

    name: str
    this: bool = False  # the daemon that reports
    alive: bool  # its lease is younger than a lease (by the share's clock)
    lease_age_seconds: float | None  # None: it holds no lease (stopped cleanly, taken over)
    claims: int  # claim folders in its folder
    host: str | None = None
    taken_over_by: str | None = None  # a daemon taking its claims over right now
    taken_over: int = 0  # claims this daemon took over from it since it started
    leases_lost: int = 0  # (this daemon) leases it lost since it started


class InboxStatus(BaseModel):
    path: str
    watching: bool
    waiting_count: int
    oldest_waiting_seconds: float | None
    waiting: list[WaitingFile]
    in_flight: list[DocumentProgress]
    blocked: list[BlockedFile] = []
    instances: list[InstanceStatus] = []  # the daemons sharing its work area
    uploads: bool = False  # it takes uploads
    uploads_problem: str | None = None  # why its uploads folder cannot be used
    model: str | None = None  # the OCR model its new documents are read by
    # Why its model's engine takes no pages now: its files wait (None: it converts).
    paused: str | None = None


class FinishedDocument(BaseModel):
    doc: str | None = None  # its id: /api/documents/<doc> while ocrd runs
    inbox: str
    path: str
    outcome: Outcome
    pages: int
    seconds: float
    finished_at: float  # wall clock
    stage: str | None = None
    reason: str | None = None
    error_report: str | None = None
    markdown: str | None = None
    pages_without_text: list[int] = []  # pages with content from which no text came
    model: str | None = None  # the OCR model that read it

    @classmethod
    def of(cls, summary: DocumentSummary) -> FinishedDocument:
        return cls(
            doc=summary.doc,
            inbox=summary.inbox,
            path=printable(summary.path),
            outcome=summary.outcome,
            pages=summary.pages,
            seconds=round(summary.seconds, 2),
            finished_at=summary.finished_at,
            stage=summary.stage.value if summary.stage else None,
            reason=printable(summary.reason) if summary.reason else None,
            error_report=printable(summary.error_report) if summary.error_report else None,
            markdown=printable(summary.markdown) if summary.markdown else None,
            pages_without_text=summary.pages_without_text,
            model=summary.model,
        )


class ReplicaStatus(BaseModel):
    """One engine replica (a process on a GPU, or a server of a fleet)."""

    name: str
    device: str | None  # the CUDA devices it is pinned to (None: a remote server)
    state: str
    since: float  # wall clock, its last change of state
    capacity: int
    in_flight: int
    pages_done: int
    pages_failed: int
    restarts: int
    deaths_with_pages: int
    self_check: str | None  # e.g. "read 38 of 40 words"; None before any check, or none
    # None until it passed or failed, and for an engine without one (self_check_state)
    self_check_passed: bool | None = None
    # "none" (this engine has no self-check, or engine.self_check is off), "pending",
    # "passed", "failed"
    self_check_state: Literal["none", "pending", "passed", "failed"] = "pending"

    def self_check_words(self) -> str:
        """Its self-check as it stands, in words."""
        if self.self_check_state == "none":
            return "none for this engine"
        if self.self_check_state == "pending" or self.self_check is None:
            return "not yet"
        return self.self_check + (" (failed)" if self.self_check_state == "failed" else "")

    problem: str | None
    pid: int | None
    model: str | None = None  # the OCR model it serves


class StatusReport(BaseModel):
    version: str
    instance: str | None = None  # this daemon's instance name
    engine: str
    engine_state: str
    engine_summary: str = ""  # e.g. "3 of 4 replicas ready, 1 down"
    degraded: str | None = None  # ready, but not every replica serves: which, and why
    replicas: list[ReplicaStatus] = []
    ready: bool
    problems: list[str]  # why not ready
    # The models whose engine takes no pages now, and why: only their inboxes wait.
    paused_models: dict[str, str] = {}
    attention: list[str] = []  # what needs a person although ocrd serves (blocked files)
    pages_per_second: float
    documents_in_flight: int
    pages_in_flight: int
    inboxes: list[InboxStatus]
    finished: list[FinishedDocument]  # the latest last
    history: list[tuple[float, float]]  # (minute start, pages a second) over the last hour

    @classmethod
    def loading(cls, version: str) -> StatusReport:
        """The report while the engine loads, before anything is served."""
        return cls(
            version=version,
            engine="loading",
            engine_state="loading",
            ready=False,
            problems=["the engine is loading"],
            pages_per_second=0.0,
            documents_in_flight=0,
            pages_in_flight=0,
            inboxes=[],
            finished=[],
            history=[],
        )


def eta(pages: int | None, done: int, seconds: float) -> float | None:
    """Seconds left at the document's own pace so far; None until a page is done."""
    if not pages or done <= 0 or seconds <= 0:
        return None
    return round((pages - done) * seconds / done, 1)
