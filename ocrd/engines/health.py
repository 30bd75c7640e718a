"""A fleet's health from its replicas' states.

`ready` while at least one replica reads; `degraded` names the ones that do not; `loading`
until the first replica is ready; `garbled` when every replica answers but none read the
test page (nothing is dispatched, files wait in the inbox); `unreachable` when none serves
after the start (restarting, or a fleet that does not answer).
"""

from __future__ import annotations

from ocrd.engines.base import EngineHealth, EngineState, ReplicaState
from ocrd.engines.replica import Replica

STARTING = (ReplicaState.loading, ReplicaState.checking)


def summary(replicas: list[Replica]) -> str:
    """The replicas in a few words, e.g. "2 of 4 replicas ready, 2 loading"."""
    counts: dict[str, int] = {}
    for replica in replicas:
        counts[replica.state.value] = counts.get(replica.state.value, 0) + 1
    ready = counts.pop(ReplicaState.ready.value, 0)
    rest = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
    return f"{ready} of {len(replicas)} replicas ready" + (f", {rest}" if rest else "")


def judge(health: EngineHealth, replicas: list[Replica], fleet_problem: str | None = None) -> None:
    """Set `health` from the replicas' states; `fleet_problem` is what is wrong with the
    fleet's list itself (a router that lists no worker, or does not answer)."""
    others = [r for r in replicas if r.state is not ReplicaState.ready]
    if any(r.state is ReplicaState.ready for r in replicas):
        problems = [f"{r.name} {r.state.value}: {r.problem or 'no problem told'}" for r in others]
        health.degraded = "; ".join([*problems, *filter(None, [fleet_problem])]) or None
        health.set(EngineState.ready)
        return
    health.degraded = None
    first_start = [r for r in replicas if r.started is None or not r.started.done()]
    garbled = [r for r in replicas if r.state is ReplicaState.garbled]
    if first_start and not any(r.ever_ready for r in replicas):
        health.set(EngineState.loading, summary(replicas))
    elif garbled:
        count = len(replicas)
        share = f"{len(garbled)} of {count} replicas garbled; " if count > 1 else ""
        health.set(EngineState.garbled, share + (garbled[0].problem or ""))
    else:
        problems = [f"{r.name}: {r.problem or r.state.value}" for r in replicas]
        health.set(EngineState.unreachable, "; ".join([*filter(None, [fleet_problem]), *problems]))
