"""The engine section: which engine reads the pages, and its settings."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from ocrd.config.base import Strict


class PromptMode(StrEnum):
    layout = "layout"  # grounded Markdown with layout blocks
    text = "text"  # plain text ("Free OCR."), faster, loops less on dense pages


class SamplingConfig(Strict):
    """DeepSeek-OCR-2's decoding settings, the same in-process and remote."""

    # at most 256k: a page's answer is read up to a limit derived from it (engines/sending.py)
    max_tokens: Annotated[int, Field(ge=1, le=262144)] = 8192
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
    # Run the Python files in the model's folder (its config and processor classes): models
    # that transformers does not know yet (PaddleOCR-VL on transformers 4) need it.
    trust_remote_code: bool = False

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
    # A router that keeps the fleet's list (vllm-router, SGLang's router): its workers are
    # read from `GET <router_url>/workers` every `router_poll_seconds` and each is sent
    # pages directly, as a listed server would be (docs/fleets.md, "Fleets behind vllm-router").
    router_url: str | None = None
    router_poll_seconds: Annotated[float, Field(gt=0)] = 5.0
    # Which of the router's workers get pages (and the API key): hosts, CIDR networks of
    # IP addresses, or host:port. Unset: the router's own host. A worker listed beyond
    # these is refused (no request at all). base_urls are trusted as listed.
    trusted_workers: tuple[str, ...] | None = None
    # Only https servers (base_urls, router and workers), their certificate checked
    # against the system's CAs or `tls_ca` (a PEM file), its name against the URL's host.
    require_tls: bool = False
    tls_ca: str | None = None
    # A server that serves is asked to read ocrd's test page again, unannounced, after a
    # random wait between half and one and a half times this (0: never).
    self_check_repeat_seconds: Annotated[float, Field(ge=0)] = 900.0

    @model_validator(mode="after")
    def _one_source_of_servers(self) -> OpenAiConfig:
        if self.router_url is not None and "base_urls" in self.model_fields_set:
            raise ValueError(
                "list the servers in base_urls or name the router that lists them in "
                "router_url, not both"
            )
        if self.trusted_workers is not None and self.router_url is None:
            raise ValueError("trusted_workers needs router_url (base_urls are trusted as listed)")
        for entry in self.trusted_workers or ():
            trusted_entry(entry)
        if self.require_tls:
            named = [*([self.router_url] if self.router_url else self.base_urls)]
            plain = [url for url in named if urlsplit(url).scheme != "https"]
            if plain:
                raise ValueError(f"require_tls: these are not https URLs: {', '.join(plain)}")
        return self


@dataclass(frozen=True)
class TrustedEntry:
    """One entry of `trusted_workers`: a network (of IP addresses), or a host name or IP
    address, with or without a port."""

    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None
    host: str | None
    port: int | None


def trusted_entry(entry: str) -> TrustedEntry:
    """Parse one `trusted_workers` entry; ValueError naming it if it is none of a host, a
    CIDR network, host:port or a URL."""
    text = entry.strip()
    if "/" in text and "://" not in text:
        try:
            return TrustedEntry(ipaddress.ip_network(text, strict=False), None, None)
        except ValueError:
            raise ValueError(f"trusted_workers: {entry!r} is not a CIDR network") from None
    try:
        return TrustedEntry(None, str(ipaddress.ip_address(text)), None)  # also a bare IPv6
    except ValueError:
        pass
    parts = urlsplit(text if "://" in text else f"//{text}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"trusted_workers: {entry!r} has no valid port") from None
    host = parts.hostname
    if not host or parts.username is not None or parts.path not in ("", "/"):
        raise ValueError(
            f"trusted_workers: {entry!r} is not a host, host:port, CIDR network or URL"
        )
    return TrustedEntry(None, host.lower(), port)


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


EngineKind = Literal["auto", "vllm", "openai", "rapidocr", "simulated"]
DEFAULT_MODEL = "deepseek-ocr-2"  # ocrd.models.DEFAULT (config sits below the models)


PUBLISHED_DETECTOR = "published"  # layout.detector: the checkpoint the model's pipeline names


class LayoutConfig(Strict):
    """The layout stage of a model whose published pipeline has one (PaddleOCR-VL-1.5,
    GLM-OCR; ocrd/engines/layout.py): a detector finds the page's regions, each region
    goes to the model with its element's prompt. Off (whole pages) while `detector` is
    unset."""

    # A transformers object-detection checkpoint: a local folder, or a hub id (fetched by
    # transformers on start); `published`: the one the model's pipeline publishes.
    detector: str | None = None
    threshold: Annotated[float, Field(ge=0.0, le=1.0)] | None = None  # None: the model's
    # Where the detector runs: `auto` on the first GPU where one is seen, else the CPU.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    workers: Annotated[int, Field(ge=1, le=16)] = 1  # detector processes
    max_regions: Annotated[int, Field(ge=1, le=1000)] = 200  # per page, best scores first
    # Seconds a page may take in the detector (its first page includes loading it).
    timeout_seconds: Annotated[float, Field(gt=0)] = 300.0


class ModelServing(Strict):
    """How one more OCR model is served (`engine.models.<name>`): only what differs from
    the engine section's own settings, which are inherited (an in-process vLLM engine per
    model needs its own `vllm.gpu_memory_utilization` share, or its own `vllm.gpus`; a
    remote model its own `openai.base_urls` or `openai.router_url`)."""

    kind: EngineKind | None = None
    self_check: Literal["auto"] | bool | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)
    vllm: dict[str, Any] = Field(default_factory=dict)
    openai: dict[str, Any] = Field(default_factory=dict)
    simulated: dict[str, Any] = Field(default_factory=dict)
    layout: dict[str, Any] = Field(default_factory=dict)


class EngineConfig(Strict):
    kind: EngineKind = "auto"
    # The OCR model this section's own settings serve (ocrd.models' names); each entry of
    # `models` serves one more, with its settings given there.
    model: str = DEFAULT_MODEL
    models: dict[str, ModelServing] = Field(default_factory=dict)
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
    layout: LayoutConfig = LayoutConfig()

    def self_check_for(self, kind: str) -> bool:
        """Whether engine `kind` proves each replica reads before it gets work."""
        if self.self_check != "auto":
            return self.self_check
        if kind == "simulated" or kind == "rapidocr":
            return False
        return not (kind == "vllm" and self.vllm.load_format == "dummy")

    @model_validator(mode="after")
    def _models_make_engines(self) -> EngineConfig:
        for name in self.models:
            self.for_model(name)  # each model's merged settings must be valid
        return self

    @property
    def served_models(self) -> tuple[str, ...]:
        """The models some engine serves: this section's own, then those of `models`."""
        return (self.model, *(name for name in self.models if name != self.model))

    def for_model(self, name: str) -> EngineConfig:
        """The settings of the engine that serves model `name`: this section's, with its
        entry in `models` laid over them (settings not set there are inherited; a setting
        left unset stays unset, so that the model's own recipe decides it)."""
        if name == self.model and name not in self.models:
            return self.model_copy(update={"models": {}})
        serving = self.models[name]
        merged = self.model_dump(exclude_unset=True, exclude={"models", "model"})
        if serving.kind is not None:
            merged["kind"] = serving.kind
        if serving.self_check is not None:
            merged["self_check"] = serving.self_check
        for part in ("sampling", "vllm", "openai", "simulated", "layout"):
            inherited = dict(merged.get(part, {}))
            if part in ("vllm", "openai"):
                for own in ("model", "tokenizer"):  # another model's files: never inherited
                    inherited.pop(own, None)
                if part == "openai" and "router_url" in getattr(serving, part):
                    inherited.pop("base_urls", None)
            merged[part] = {**inherited, **getattr(serving, part)}
        try:
            return EngineConfig.model_validate({**merged, "model": name})
        except ValueError as error:
            raise ValueError(f"models.{name}: {error}") from None
