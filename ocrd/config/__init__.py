"""Configuration: the YAML file, validated into typed models.

Relative paths in the file are resolved against the folder that holds the file, so a
config can live beside its data folder and be started from anywhere.
"""

from __future__ import annotations

import fnmatch
import os
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(Exception):
    """The configuration cannot be used; the message says which key and what is expected."""


class PromptMode(StrEnum):
    layout = "layout"  # grounded Markdown with layout blocks
    text = "text"  # plain text ("Free OCR."), faster, loops less on dense pages


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


UPLOADS_FOLDER = "uploads"  # under an inbox with `uploads: true`: `uploads/<id>/<name>`

DEFAULT_TEMPORARY_SUFFIXES = (".part", ".filepart", ".tmp", ".crdownload", ".partial", ".download")


class WebhookConfig(Strict):
    """POST of the document's summary as JSON, retried with backoff."""

    url: Annotated[str, Field(pattern=r"^https?://")]
    secret_env: str | None = None  # environment variable holding a shared secret
    secret_header: str = "X-Ocrd-Secret"
    timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    retries: Annotated[int, Field(ge=0)] = 5


class HookConfig(Strict):
    """What to run when a document settles: a command, a webhook, or both."""

    command: Annotated[tuple[str, ...], Field(min_length=1)] | None = None  # never a shell
    webhook: WebhookConfig | None = None
    timeout_seconds: Annotated[float, Field(gt=0)] = 60.0  # for the command


class HooksConfig(Strict):
    on_done: HookConfig | None = None
    on_failed: HookConfig | None = None


class PdfText(StrEnum):
    """Whether a PDF page's own text layer stands in for recognising its pixels."""

    auto = "auto"  # prefer on the CPU engine, ocr on the GPU engines
    ocr = "ocr"  # never
    prefer = "prefer"  # where the layer is good


class BlankPages(StrEnum):
    keep = "keep"  # recognise them like any page
    drop = "drop"  # leave the page empty
    mark = "mark"  # write a visible marker


class UnfinishedPages(StrEnum):
    """Where a document with pages the engine stopped before their end goes."""

    done = "done"
    failed = "failed"


class TableFormat(StrEnum):
    markdown = "markdown"  # pipe tables where simple enough
    html = "html"  # as the model wrote them


class OutputKind(StrEnum):
    markdown = "markdown"  # always written: it marks a document complete
    pdf = "pdf"  # the original pages with the recognised text invisible over them


class SeparatorSheet(StrEnum):
    """A kind of page that separates documents in a batch scan."""

    patch_t = "patch_t"  # a PATCH-T sheet
    barcode = "barcode"  # a barcode whose whole text matches `split_barcode`
    blank = "blank"  # a blank page


@dataclass(frozen=True)
class RenderSettings:
    """How one document's pages are rasterised: resolution is what the engine pays for."""

    dpi: int = 144
    max_image_side: int = 2048
    passwords: tuple[str, ...] = ()  # tried in turn on an encrypted PDF


class DocumentOptions(Strict):
    """How an inbox's documents are recognised and written: the options each document
    takes with it when it starts (a reload changes them for documents not yet started)."""

    prompt: PromptMode = PromptMode.layout
    dpi: Annotated[int, Field(ge=36, le=600)] = 144
    figure_dpi: Annotated[int, Field(ge=36, le=1200)] | None = None  # None: twice `dpi`
    max_image_side: Annotated[int, Field(ge=256, le=10000)] = 2048
    passwords: tuple[str, ...] = ()
    page_separator: str = "\n\n<!-- page {page} -->\n\n"
    unfinished_pages: UnfinishedPages = UnfinishedPages.done
    retry_unfinished: bool = True
    tables: TableFormat = TableFormat.markdown
    figures: bool = True
    layout_file: bool = False
    keep_raw: bool = False
    strip_headers_footers: bool = False
    pdf_text: PdfText = PdfText.auto
    blank_pages: BlankPages = BlankPages.mark  # pages blank at engine resolution
    outputs: Annotated[tuple[OutputKind, ...], Field(min_length=1)] = (OutputKind.markdown,)
    pdf_archive: bool = False  # the searchable PDF as PDF/A-2b
    split_on: tuple[SeparatorSheet, ...] = ()
    split_barcode: str | None = None  # a regular expression a whole barcode text matches

    @model_validator(mode="after")
    def _consistent(self) -> DocumentOptions:
        if OutputKind.markdown not in self.outputs:
            raise ValueError(
                "outputs: 'markdown' is always written (it is what marks a document "
                "complete); list it, with 'pdf' beside it for a searchable PDF"
            )
        if self.pdf_archive and OutputKind.pdf not in self.outputs:
            raise ValueError("pdf_archive is true but outputs has no 'pdf': add it")
        barcode = SeparatorSheet.barcode in self.split_on
        if barcode and not self.split_barcode:
            raise ValueError(
                "split_on has 'barcode' but split_barcode is not set: give the regular "
                "expression that a separator barcode's whole text matches, e.g. 'SEPARATOR'"
            )
        if self.split_barcode and not barcode:
            raise ValueError(
                "split_barcode is set but split_on has no 'barcode': add it to split_on, or "
                "remove split_barcode"
            )
        if self.split_barcode:
            try:
                re.compile(self.split_barcode)
            except re.error as error:
                raise ValueError(
                    f"split_barcode {self.split_barcode!r} is no regular expression: {error}"
                ) from None
        return self

    @property
    def render(self) -> RenderSettings:
        return RenderSettings(self.dpi, self.max_image_side, self.passwords)

    @property
    def figure_resolution(self) -> int:
        """The DPI figures are cut at from a PDF page."""
        return self.figure_dpi or 2 * self.dpi

    def for_engine(self, engine: str | None) -> DocumentOptions:
        """These options with `auto` decided for the engine in use: DeepSeek-OCR-2 gives
        better structure than a text layer, RapidOCR does not."""
        if self.pdf_text is not PdfText.auto:
            return self
        chosen = PdfText.prefer if engine == "rapidocr" else PdfText.ocr
        return self.model_copy(update={"pdf_text": chosen})


class InboxEntry(DocumentOptions):
    """An inbox as the configuration file gives it: output folders may be left out."""

    path: Path
    outbox: Path | None = None
    done: Path | None = None
    failed: Path | None = None
    work: Path | None = Field(
        default=None, description="claimed files wait here; must be on the inbox's filesystem"
    )
    recursive: bool = True
    include: tuple[str, ...] = ("*",)
    ignore: tuple[str, ...] = ()
    # Folders whose name matches one of these are scan jobs: one document of their files.
    job_folders: tuple[str, ...] = ()
    # Duplex from a single-sided feeder: a file, then the next within the window, are the
    # fronts and the backs (in reverse) of one document.
    collate: bool = False
    collate_window_seconds: Annotated[float, Field(gt=0)] = 300.0
    settle_seconds: Annotated[float, Field(ge=0)] = 5.0  # quiet this long: ready to take
    max_settle_wait_seconds: Annotated[float, Field(gt=0)] = 3600.0
    # `auto`: polling where the inbox is on a network filesystem (NFS, SMB, FUSE), whose
    # files written by other machines inotify never reports; inotify elsewhere.
    polling: bool | Literal["auto"] = "auto"
    poll_interval_seconds: Annotated[float, Field(gt=0)] = 5.0
    hooks: HooksConfig = HooksConfig()
    # Files may be handed over by HTTP (`POST /api/documents`): each lands in
    # `uploads/<id>/` under the inbox and goes the way of a dropped file.
    uploads: bool = False

    @model_validator(mode="after")
    def _uploads_can_arrive(self) -> InboxEntry:
        if not self.uploads:
            return self
        if not self.recursive:
            raise ValueError(
                "uploads: true needs recursive: true (an upload lands in the subfolder "
                f"{UPLOADS_FOLDER}/<id>/ of the inbox)"
            )
        if self.collate:
            raise ValueError(
                "uploads: true cannot be combined with collate: true (an upload would be "
                "paired with the next file as its backs); use another inbox for uploads"
            )
        if any(fnmatch.fnmatch(UPLOADS_FOLDER, pattern) for pattern in self.job_folders):
            raise ValueError(
                f"uploads: true, but job_folders matches the folder {UPLOADS_FOLDER!r} that "
                "uploads land in: every upload would become part of one scan job"
            )
        return self

    @model_validator(mode="after")
    def _blank_separators_without_collating(self) -> InboxEntry:
        if self.collate and SeparatorSheet.blank in self.split_on:
            raise ValueError(
                "split_on: 'blank' cannot be used with collate: true, where the blank backs of "
                "one-sided sheets are normal and would split the document at every sheet; put "
                "PATCH-T or barcode sheets between documents and split on those instead"
            )
        return self

    def located(self, base: Path) -> InboxConfig:
        """Absolute paths, with output folders defaulting to siblings of the inbox."""
        inbox = _absolute(self.path, base)
        parent = inbox.parent

        def folder(value: Path | None, default: str) -> Path:
            return _absolute(value, base) if value is not None else parent / default

        return InboxConfig(
            **{
                **dict(self),
                "path": inbox,
                "outbox": folder(self.outbox, "outbox"),
                "done": folder(self.done, "done"),
                "failed": folder(self.failed, "failed"),
                "work": folder(self.work, "work"),
            }
        )


class InboxConfig(InboxEntry):
    """An inbox as the daemon serves it: every folder known, every path absolute."""

    outbox: Path
    done: Path
    failed: Path
    work: Path


class SamplingConfig(Strict):
    """DeepSeek-OCR-2's decoding settings, the same in-process and remote."""

    max_tokens: Annotated[int, Field(ge=1)] = 8192
    ngram_size: Annotated[int, Field(ge=0)] = 30
    ngram_window: Annotated[int, Field(ge=1)] = 90
    ngram_whitelist_token_ids: tuple[int, ...] = (128821, 128822)


class VllmConfig(Strict):
    # `auto`: one replica per CUDA GPU visible to the service (tensor_parallel_size GPUs
    # each); with none visible, one engine inside the daemon's process (vLLM's CPU backend).
    # A list: these device indices (as nvidia-smi numbers them), one replica per
    # tensor_parallel_size of them, each a `vllm serve` process of its own.
    gpus: (
        Literal["auto"] | Annotated[tuple[Annotated[int, Field(ge=0)], ...], Field(min_length=1)]
    ) = "auto"
    model: str = "deepseek-ai/DeepSeek-OCR-2"
    tokenizer: str | None = None
    max_num_seqs: Annotated[int, Field(ge=1)] = 128
    max_num_batched_tokens: Annotated[int, Field(ge=1)] = 16384
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    max_model_len: Annotated[int, Field(ge=1024)] = 8192
    tensor_parallel_size: Annotated[int, Field(ge=1)] = 1
    dtype: str = "auto"
    enforce_eager: bool = False
    load_format: str = "auto"
    kv_cache_memory_bytes: Annotated[int, Field(ge=1)] | None = None
    request_timeout_seconds: Annotated[float, Field(gt=0)] = 600.0

    @model_validator(mode="after")
    def _whole_replicas(self) -> VllmConfig:
        if self.gpus == "auto":
            return self
        if len(set(self.gpus)) != len(self.gpus):
            raise ValueError(f"gpus lists a device twice: {list(self.gpus)}")
        if len(self.gpus) % self.tensor_parallel_size:
            raise ValueError(
                f"{len(self.gpus)} gpus do not make whole replicas of tensor_parallel_size "
                f"{self.tensor_parallel_size}; list a multiple of it"
            )
        return self


class OpenAiConfig(Strict):
    """A remote OpenAI-compatible server (`vllm serve`), or a fleet of them."""

    base_urls: Annotated[tuple[str, ...], Field(min_length=1)] = ("http://127.0.0.1:8000/v1",)
    model: str = "deepseek-ai/DeepSeek-OCR-2"
    api_key_env: str = "OCRD_OPENAI_API_KEY"
    request_timeout_seconds: Annotated[float, Field(gt=0)] = 600.0
    max_concurrency: Annotated[int, Field(ge=1)] = 64  # per server
    retries: Annotated[int, Field(ge=0)] = 5
    retry_backoff_seconds: Annotated[float, Field(gt=0)] = 1.0


class RapidOcrConfig(Strict):
    threads: Annotated[int, Field(ge=1)] = 2
    concurrency: Annotated[int, Field(ge=1)] = 1


class SimulatedConfig(Strict):
    seconds_per_page: Annotated[float, Field(ge=0)] = 0.5
    capacity: Annotated[int, Field(ge=1)] = 16  # per replica
    tokens_per_page: Annotated[int, Field(ge=1)] = 400
    unfinished_every: Annotated[int, Field(ge=0)] = 0
    # A page whose centre pixel has this RGB colour kills the engine while it is in it, as
    # a page that crashes a real engine would (tests of crash accounting).
    fatal_colour: tuple[int, int, int] | None = None
    # 0: one engine inside the daemon's process; N: N replica processes behind the same
    # router and supervision as vLLM's, speaking the same HTTP as `vllm serve`.
    replicas: Annotated[int, Field(ge=0)] = 0
    # Tests of supervision: a replica process exits when it is sent a page whose top-left
    # corner is magenta (see ocrd/engines/simulated_server.py).
    exit_on_marked_pages: bool = False

    @model_validator(mode="after")
    def _marks_need_processes(self) -> SimulatedConfig:
        if self.exit_on_marked_pages and self.replicas == 0:
            raise ValueError("exit_on_marked_pages needs replicas of 1 or more (processes)")
        return self


class SupervisionConfig(Strict):
    """How ocrd keeps the engine processes it starts itself (vLLM per GPU, simulated
    replicas) running."""

    # A replica that has not answered /health this long after its start is restarted;
    # the first start may download the model.
    start_timeout_seconds: Annotated[float, Field(gt=0)] = 3600.0
    health_interval_seconds: Annotated[float, Field(gt=0)] = 5.0
    health_timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    # This many unanswered health checks in a row: the replica hangs; it is restarted.
    health_failures: Annotated[int, Field(ge=1)] = 3
    restart_backoff_seconds: Annotated[float, Field(gt=0)] = 2.0  # doubles, up to the max
    restart_backoff_max_seconds: Annotated[float, Field(gt=0)] = 120.0
    stop_grace_seconds: Annotated[float, Field(ge=0)] = 20.0  # SIGTERM, then SIGKILL


class EngineConfig(Strict):
    kind: Literal["auto", "vllm", "openai", "rapidocr", "simulated"] = "auto"
    # Every replica or server reads ocrd's test page before it gets pages (and after each
    # restart or reconnection). `auto`: on, except for the simulated engine and for
    # `vllm.load_format: dummy` (random weights read nothing).
    self_check: Literal["auto"] | bool = "auto"
    sampling: SamplingConfig = SamplingConfig()
    vllm: VllmConfig = VllmConfig()
    openai: OpenAiConfig = OpenAiConfig()
    rapidocr: RapidOcrConfig = RapidOcrConfig()
    simulated: SimulatedConfig = SimulatedConfig()
    supervision: SupervisionConfig = SupervisionConfig()

    def self_check_for(self, kind: str) -> bool:
        """Whether engine `kind` proves each replica reads before it gets work."""
        if self.self_check != "auto":
            return self.self_check
        if kind == "simulated" or kind == "rapidocr":
            return False
        return not (kind == "vllm" and self.vllm.load_format == "dummy")


Auto = Literal["auto"]


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class PipelineConfig(Strict):
    max_documents_in_flight: Annotated[int, Field(ge=1)] | Auto = "auto"
    max_pages_in_flight: Annotated[int, Field(ge=1)] | Auto = "auto"
    render_workers: Annotated[int, Field(ge=1)] | Auto = "auto"
    page_render_timeout_seconds: Annotated[float, Field(gt=0)] = 120.0
    page_retries: Annotated[int, Field(ge=0)] = 2
    page_retry_backoff_seconds: Annotated[float, Field(ge=0)] = 2.0
    render_memory_limit_mb: Annotated[int, Field(ge=256)] = 4096
    max_page_pixels: Annotated[int, Field(ge=1_000_000)] = 50_000_000
    rescan_interval_seconds: Annotated[float, Field(gt=0)] = 60.0
    shutdown_grace_seconds: Annotated[float, Field(ge=0)] = 30.0
    status_interval_seconds: Annotated[float, Field(gt=0)] = 5.0

    def pages_in_flight_for(self, engine_capacity: int) -> int:
        """`auto`: the engine's whole batch, plus a quarter more rendered and waiting, so a
        finished page's successor is already there (measured in BENCHMARKS.md)."""
        if self.max_pages_in_flight != "auto":
            return self.max_pages_in_flight
        return engine_capacity + max(4, engine_capacity // 4)

    def documents_in_flight_for(self, engine_capacity: int) -> int:
        """`auto`: enough that a small file is claimed while books are being read."""
        if self.max_documents_in_flight != "auto":
            return self.max_documents_in_flight
        return max(32, engine_capacity)

    def render_workers_for(self) -> int:
        """`auto`: one per CPU this process may run on."""
        return available_cpus() if self.render_workers == "auto" else self.render_workers


class HttpConfig(Strict):
    """The daemon's HTTP server: metrics, health, the status page, uploads."""

    enabled: bool = True
    listen: Annotated[str, Field(pattern=r"^(\[[0-9a-fA-F:.]+\]|[^:\s]+):\d{1,5}$")] = (
        "127.0.0.1:9464"
    )
    token_env: str = "OCRD_HTTP_TOKEN"  # bearer token for clients other than loopback
    # false behind a reverse proxy on the same host (every client looks like loopback there):
    # then loopback clients need the token too.
    trust_loopback: bool = True
    max_connections: Annotated[int, Field(ge=1, le=10000)] = 64  # more are answered 503
    header_timeout_seconds: Annotated[float, Field(gt=0)] = 10.0  # slower clients are dropped
    # Uploads (`POST /api/documents`): the largest file taken, and how long its body may take
    # in all (a client that sends nothing for header_timeout_seconds is dropped sooner).
    max_upload_mb: Annotated[float, Field(gt=0)] = 200.0
    upload_timeout_seconds: Annotated[float, Field(gt=0)] = 600.0

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)

    @property
    def host(self) -> str:
        return self.listen.rsplit(":", 1)[0].strip("[]")

    @property
    def port(self) -> int:
        return int(self.listen.rsplit(":", 1)[1])

    @property
    def url(self) -> str:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"


class InstancesConfig(Strict):
    """Several daemons on one shared inbox (`ocrd/instances.py`)."""

    # A daemon whose lease is this old (by the shared filesystem's clock) is taken to be
    # dead and its claims are taken over; a daemon stops writing for its claims after half
    # of it without a successful renewal. The same on every host (the same file).
    lease_seconds: Annotated[float, Field(ge=1)] = 90.0

    @property
    def renew_seconds(self) -> float:
        """How often a lease is renewed (and others' are looked at): nine times a lease."""
        return self.lease_seconds / 9


class ConfigFile(Strict):
    """The configuration file as written."""

    inboxes: Annotated[tuple[InboxEntry, ...], Field(min_length=1)] = ()
    engine: EngineConfig = EngineConfig()
    pipeline: PipelineConfig = PipelineConfig()
    http: HttpConfig = HttpConfig()
    instances: InstancesConfig = InstancesConfig()


class Config(ConfigFile):
    """The configuration as the daemon uses it: inboxes resolved against the file's folder."""

    inboxes: Annotated[tuple[InboxConfig, ...], Field(min_length=1)] = ()

    @model_validator(mode="after")
    def _distinct_work_folders(self) -> Config:
        seen: dict[Path, Path] = {}
        for inbox in self.inboxes:
            if inbox.work in seen:
                raise ValueError(
                    f"inboxes {seen[inbox.work]} and {inbox.path} share the work folder "
                    f"{inbox.work}; give each inbox its own 'work:' folder"
                )
            seen[inbox.work] = inbox.path
        return self


def _absolute(path: Path, base: Path) -> Path:
    path = Path(os.path.expanduser(path))
    return Path(os.path.normpath(path if path.is_absolute() else base / path))


def _location(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def describe_validation_error(error: ValidationError, source: str) -> str:
    lines = [f"{source}: invalid configuration"]
    problems = error.errors()
    inbox_problems = any(len(p["loc"]) > 1 and p["loc"][0] == "inboxes" for p in problems)
    for problem in problems:
        if inbox_problems and problem["type"] == "too_short" and problem["loc"] == ("inboxes",):
            continue  # an inbox with an error is left out of the count: nothing to add
        message = problem["msg"].removeprefix("Value error, ")
        if problem["type"] == "extra_forbidden":
            message = "unknown key (check its spelling and where it is nested)"
        lines.append(f"  {_location(problem['loc'])}: {message}")
    return "\n".join(lines)


def parse_config(data: Any, base: Path, source: str = "config") -> Config:
    """Validate raw YAML data; relative paths are taken relative to `base`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected a mapping at the top level, got {type(data).__name__}"
        )
    try:
        written = ConfigFile.model_validate(data)
        return Config(
            inboxes=tuple(entry.located(base) for entry in written.inboxes),
            engine=written.engine,
            pipeline=written.pipeline,
            http=written.http,
            instances=written.instances,
        )
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error, source)) from None


def load_config(path: Path) -> Config:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(
            f"{path}: cannot read the configuration file ({error.strerror})"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    return parse_config(data, path.resolve().parent, str(path))
