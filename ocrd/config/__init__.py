"""Configuration: the YAML file (`loading`), validated into typed models: the engine
(`engine`), the inboxes (`inboxes`), the service (`service`); checks against the machine
(`checks`, `sandbox`) and what a reload may change (`reload`)."""

from __future__ import annotations

from ocrd.config.base import ConfigError, Strict
from ocrd.config.engine import (
    EngineConfig,
    LayoutConfig,
    OpenAiConfig,
    PromptMode,
    RapidOcrConfig,
    SamplingConfig,
    SimulatedConfig,
    SupervisionConfig,
    VllmConfig,
)
from ocrd.config.inboxes import (
    DEFAULT_TEMPORARY_SUFFIXES,
    UPLOADS_FOLDER,
    BlankPages,
    DocumentOptions,
    HookConfig,
    HooksConfig,
    InboxConfig,
    InboxEntry,
    OutputKind,
    PdfLines,
    PdfText,
    RenderSettings,
    SeparatorSheet,
    TableFormat,
    UnfinishedPages,
    WebhookConfig,
)
from ocrd.config.loading import (
    Config,
    ConfigFile,
    describe_validation_error,
    load_config,
    parse_config,
)
from ocrd.config.service import (
    DoclingApiConfig,
    HttpConfig,
    InstancesConfig,
    PipelineConfig,
    available_cpus,
)

__all__ = [
    "DEFAULT_TEMPORARY_SUFFIXES",
    "UPLOADS_FOLDER",
    "BlankPages",
    "Config",
    "ConfigError",
    "ConfigFile",
    "DoclingApiConfig",
    "DocumentOptions",
    "EngineConfig",
    "HookConfig",
    "HooksConfig",
    "HttpConfig",
    "InboxConfig",
    "InboxEntry",
    "InstancesConfig",
    "LayoutConfig",
    "OpenAiConfig",
    "OutputKind",
    "PdfLines",
    "PdfText",
    "PipelineConfig",
    "PromptMode",
    "RapidOcrConfig",
    "RenderSettings",
    "SamplingConfig",
    "SeparatorSheet",
    "SimulatedConfig",
    "Strict",
    "SupervisionConfig",
    "TableFormat",
    "UnfinishedPages",
    "VllmConfig",
    "WebhookConfig",
    "available_cpus",
    "describe_validation_error",
    "load_config",
    "parse_config",
]
