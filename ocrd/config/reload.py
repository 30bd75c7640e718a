"""Reloading the configuration (SIGHUP, `systemctl reload ocrd`) without reloading the model.

`plan_reload` compares the configuration in use with the one just read and says what can
take effect now: inboxes added, removed or changed (documents in flight finish under the
settings they started with), the HTTP server, and the pipeline settings that the running
parts read as they go. What would need new processes or a new engine (the `engine`
section, the page budget, the render workers and their limits) is refused with a line
saying a restart is needed, and the running value is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ocrd.config import Config, InboxConfig

LIVE_PIPELINE_SETTINGS = frozenset(
    {
        "max_documents_in_flight",
        "rescan_interval_seconds",
        "status_interval_seconds",
        "shutdown_grace_seconds",
        "page_retries",
        "page_retry_backoff_seconds",
    }
)


@dataclass
class ReloadPlan:
    config: Config  # the configuration to run with from now on
    added: list[InboxConfig] = field(default_factory=list)
    removed: list[Path] = field(default_factory=list)
    changed: list[InboxConfig] = field(default_factory=list)
    http_changed: bool = False
    refused: list[str] = field(default_factory=list)  # one line each, for the log


def _served_by(
    old: Config, inboxes: dict[Path, InboxConfig], refused: list[str]
) -> dict[Path, InboxConfig]:
    """The inboxes, each with a model the running engines serve: an inbox whose new model
    they do not serve keeps its old settings (a new one is not added), with a line why."""
    served = old.engine.served_models
    previous = {inbox.path: inbox for inbox in old.inboxes}
    kept: dict[Path, InboxConfig] = {}
    for path, inbox in inboxes.items():
        if inbox.model in served:
            kept[path] = inbox
            continue
        refused.append(
            f"inbox {path}: the model {inbox.model!r} is served by no running engine "
            f"(served: {', '.join(served)}); serving it needs a restart (systemctl restart "
            "ocrd); " + ("keeping the inbox's settings" if path in previous else "not adding it")
        )
        if path in previous:
            kept[path] = previous[path]
    return kept


def plan_reload(old: Config, new: Config) -> ReloadPlan:
    refused = []
    if new.engine != old.engine:
        refused.append(
            "engine: the engine section changed, which needs a restart "
            "(systemctl restart ocrd); the running engine keeps its settings"
        )
    if new.instances != old.instances:
        refused.append(
            "instances: the lease settings changed, which needs a restart of every daemon "
            f"sharing the inboxes; keeping lease_seconds {old.instances.lease_seconds:g}"
        )
    pipeline = dict(old.pipeline)
    for key, value in new.pipeline:
        if value == pipeline[key]:
            continue
        if key in LIVE_PIPELINE_SETTINGS:
            pipeline[key] = value
        else:
            refused.append(
                f"pipeline.{key}: changing it needs a restart (systemctl restart ocrd); "
                f"keeping {pipeline[key]!r}"
            )
    before = {inbox.path: inbox for inbox in old.inboxes}
    after = _served_by(old, {inbox.path: inbox for inbox in new.inboxes}, refused)
    applied = new.model_copy(
        update={
            "inboxes": tuple(after.values()),
            "engine": old.engine,
            "pipeline": old.pipeline.model_copy(update=pipeline),
            "instances": old.instances,
        }
    )
    return ReloadPlan(
        config=applied,
        added=[inbox for path, inbox in after.items() if path not in before],
        removed=[path for path in before if path not in after],
        changed=[inbox for path, inbox in after.items() if before.get(path, inbox) != inbox],
        http_changed=new.http != old.http,
        refused=refused,
    )
