"""Crash accounting: which document, if any, is to blame when the engine dies.

Only evidence counts. When the engine dies, every document with a page in it at that
moment records that page in its claim (`record`), before the daemon exits for systemd to
restart it. Such a document has a strike, but with several documents in the engine that
proves nothing, so from then on it runs alone (`runs_alone`): documents that were merely
beside the culprit convert. If the engine dies again with its page in it (it was alone),
it is set aside as poison (`verdict`): at most two deaths per poisonous page. A daemon
killed from outside (SIGKILL, the OOM killer, a power cut) leaves no evidence, so it
blames nothing: its documents simply resume.
"""

from __future__ import annotations

from ocrd.domain import DocumentFailed, Stage
from ocrd.engines import EngineDeadError
from ocrd.intake.claim import Claim

DEATHS_TO_SET_ASIDE = 2


def record(claim: Claim, error: EngineDeadError) -> bool:
    """Record the engine's death in `claim` if a page of it was in the engine; blocking."""
    if error.page is None:
        return False
    claim.record_engine_death(error.page)
    return True


def runs_alone(claim: Claim) -> bool:
    """Struck once: it runs with no other document in flight."""
    return bool(claim.state.engine_deaths)


def verdict(claim: Claim) -> DocumentFailed | None:
    """The failure of a document set aside as poison; None if it may run."""
    pages = claim.state.engine_deaths
    if len(pages) < DEATHS_TO_SET_ASIDE:
        return None
    if len(set(pages)) == 1:
        where = f"the engine crashed on page {pages[0]} twice"
    else:
        where = f"the engine crashed twice with this document's pages in it (pages {pages[0]} "
        where += f"and {pages[-1]}), the second time as the only document in flight"
    return DocumentFailed(
        Stage.crash,
        f"{where}, so it was set aside to keep other files moving; check the log around "
        "those crashes (and the engine's version), then drop it into the inbox again",
        page=pages[-1],
        error_type="PoisonDocument",
    )
