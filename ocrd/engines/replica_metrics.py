"""The replicas' own Prometheus metrics (vLLM's `vllm:*`), each sample labelled with its
replica, in one exposition.

A replica's metrics are another program's text (a remote worker may be anyone's), and they
end up inside ocrd's own `/metrics`: one bad line there would make the whole of it
unparseable for Prometheus. So each replica's body is read up to a limit, parsed family by
family with prometheus_client's parser (a family that does not parse is left out, the
others kept), duplicate samples and families of another type are dropped, and the result
is written by prometheus_client's own exposition, which escapes every name and value.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

from ocrd.engines.base import ReplicaState
from ocrd.engines.link import LinkError
from ocrd.engines.replica import Replica

METRICS_TIMEOUT_SECONDS = 3.0
# vLLM's own /metrics is some tens of kilobytes; ten times more is no vLLM's.
METRICS_LIMIT_BYTES = 1024 * 1024
SERVING = (ReplicaState.ready, ReplicaState.garbled, ReplicaState.checking)
REPLICA_LABEL = "replica"

_HEADER = re.compile(r"^#\s+(?:HELP|TYPE)\s+(\S+)")
_SAMPLE_NAME = re.compile(r"^\s*([^\s{#]+)")
_SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum", "_gsum", "_gcount", "_info")


async def collect(replicas: list[Replica]) -> str:
    """The metrics of every replica that serves, merged."""
    serving = [r for r in replicas if r.state in SERVING]
    texts = await asyncio.gather(*(_metrics_of(r) for r in serving))
    named = [(r.name, t) for r, t in zip(serving, texts, strict=True) if t]
    return merge_metrics(named)


async def _metrics_of(replica: Replica) -> str:
    try:
        answer = await replica.link.get(
            "/metrics", METRICS_TIMEOUT_SECONDS, root=True, limit=METRICS_LIMIT_BYTES
        )
    except LinkError:  # unreachable, too slow, or longer than the limit: none this time
        return ""
    return answer.text if answer.status == 200 else ""


@dataclass(eq=False)  # registered in a registry: hashed by identity
class _Merged(Collector):
    """Families by name, in the order first seen; each sample once per name and labels."""

    families: dict[str, Metric] = field(default_factory=dict)
    seen: set[tuple[str, frozenset[tuple[str, str]]]] = field(default_factory=set)

    def add(self, replica: str, family: Metric) -> None:
        merged = self.families.get(family.name)
        if merged is None:
            merged = Metric(family.name, family.documentation, family.type, family.unit)
            self.families[family.name] = merged
        elif merged.type != family.type:
            return  # the same name with another type: not one family, left out
        for sample in family.samples:
            labels = {**sample.labels, REPLICA_LABEL: replica}
            key = (sample.name, frozenset(labels.items()))
            if key in self.seen:
                continue
            self.seen.add(key)
            merged.add_sample(sample.name, labels, sample.value, sample.timestamp)

    def collect(self) -> Iterator[Metric]:
        return iter(self.families.values())


def merge_metrics(texts: list[tuple[str, str]], prefix: str = "vllm:") -> str:
    """The `prefix` families of several Prometheus expositions as one, each sample labelled
    `replica="<name>"`; what does not parse, or repeats, is left out."""
    merged = _Merged()
    for name, text in texts:
        for family in _families(text):
            if family.name.startswith(prefix):
                merged.add(name, family)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(merged)
    return generate_latest(registry).decode()


def _families(text: str) -> Iterator[Metric]:
    """The families of one exposition that parse, each parsed on its own."""
    for _, chunk in _family_chunks(text):
        try:
            parsed = list(text_string_to_metric_families(chunk))
        except Exception:  # whatever the parser chokes on: this family is left out
            continue
        yield from parsed


def _family_chunks(text: str) -> Iterator[tuple[str, str]]:
    """The exposition's lines in runs that belong to one family, with its name (from its
    HELP and TYPE lines, or its samples' name without a counter's or histogram's suffix)."""
    current, lines = "", list[str]()
    for line in text.splitlines():
        header = _HEADER.match(line)
        sample = None if header or line.startswith("#") else _SAMPLE_NAME.match(line)
        if header is None and sample is None:
            continue  # a blank line or another comment
        name = _family_name((header or sample).group(1))  # type: ignore[union-attr]
        if name != current:
            if lines:
                yield current, "\n".join(lines) + "\n"
            current, lines = name, []
        lines.append(line)
    if lines:
        yield current, "\n".join(lines) + "\n"


def without_families(text: str, names: Iterable[str]) -> str:
    """An exposition without the families of these names (e.g. the daemon's own ones)."""
    left_out = {_family_name(name) for name in names}
    return "".join(chunk for name, chunk in _family_chunks(text) if name not in left_out)


def _family_name(sample: str) -> str:
    for suffix in _SUFFIXES:
        if sample.endswith(suffix):
            return sample.removesuffix(suffix)
    return sample
