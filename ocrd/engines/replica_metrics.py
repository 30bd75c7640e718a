"""The replicas' own Prometheus metrics (vLLM's `vllm:*`), each sample labelled with its
replica, in one exposition."""

from __future__ import annotations

import asyncio
import re

from ocrd.engines.base import ReplicaState
from ocrd.engines.link import LinkError
from ocrd.engines.replica import Replica

METRICS_TIMEOUT_SECONDS = 3.0
SERVING = (ReplicaState.ready, ReplicaState.garbled, ReplicaState.checking)


async def collect(replicas: list[Replica]) -> str:
    """The metrics of every replica that serves, merged."""
    serving = [r for r in replicas if r.state in SERVING]
    texts = await asyncio.gather(*(_metrics_of(r) for r in serving))
    return merge_metrics([(r.name, t) for r, t in zip(serving, texts, strict=True) if t])


async def _metrics_of(replica: Replica) -> str:
    try:
        answer = await replica.link.get("/metrics", METRICS_TIMEOUT_SECONDS, root=True)
    except LinkError:
        return ""
    return answer.text if answer.status == 200 else ""


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?(\s.*)$")


def merge_metrics(texts: list[tuple[str, str]], prefix: str = "vllm:") -> str:
    """The `prefix` families of several Prometheus expositions as one, each sample labelled
    `replica="<name>"`; HELP and TYPE once per family."""
    families: dict[str, list[str]] = {}
    headers: dict[str, list[str]] = {}
    for name, text in texts:
        label = 'replica="' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'
        family = ""
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split(" ", 3)[2]
                if family.startswith(prefix) and family not in headers:
                    headers[family] = []
                if family.startswith(prefix) and len(headers[family]) < 2:
                    headers[family].append(line)
                continue
            match = _SAMPLE.match(line)
            if match is None or not match.group(1).startswith(prefix):
                continue
            metric, labels, rest = match.groups()
            inner = labels[1:-1] if labels else ""
            merged = f"{{{label},{inner}}}" if inner else f"{{{label}}}"
            families.setdefault(family or metric, []).append(f"{metric}{merged}{rest}")
    lines: list[str] = []
    for family in sorted(set(families) | set(headers)):
        lines += headers.get(family, [])
        lines += families.get(family, [])
    return "\n".join(lines) + ("\n" if lines else "")
