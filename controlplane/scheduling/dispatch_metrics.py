"""What one dispatch round tells the metrics (9.24): decisions, no-candidate reasons, failovers.

Kept beside the dispatcher so its loop makes one call per task; the labels are the candidate's
provider and model and bounded reason codes, never the task id.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime

from controlplane.capabilities.catalog import CapabilityCatalog
from controlplane.domain.requeue import RequeueFacts
from controlplane.domain.routing.decision import Outcome, RouteDecisionSnapshot
from controlplane.domain.routing.filters import Reason
from controlplane.metrics import ControlPlaneMetrics
from controlplane.persistence.records import TaskRecord


def count_decision(
    metrics: ControlPlaneMetrics,
    decision: RouteDecisionSnapshot | None,
    facts: RequeueFacts,
    catalog: CapabilityCatalog,
    throttled: Counter[tuple[str, str]],
) -> None:
    """Count one routed task; `throttled` gathers the round's capacity refusals."""
    if decision is None:
        return
    chosen = decision.selected
    if chosen is not None:
        c = catalog.by_id(chosen)
        if c is None:
            return
        score = decision.verdict(chosen).score
        metrics.decision(c.provider, c.model, decision.selection_reason or "selected", score)
        if facts.attempts_so_far > 0:  # a requeued task routed again: a failover (9.16)
            metrics.failover(_previous(facts, catalog), c.provider, facts.error_class)
        return
    refused = Counter(v.reason for v in decision.verdicts if not v.eligible and v.reason)
    metrics.no_candidate_decision(
        refused.most_common(1)[0][0] if refused else decision.outcome.value
    )
    if decision.outcome is Outcome.NO_CAPACITY:
        for v in decision.verdicts:
            if v.reason == Reason.NO_CAPACITY.value:
                throttled[(v.candidate.provider, v.candidate.model)] += 1


def _previous(facts: RequeueFacts, catalog: CapabilityCatalog) -> str:
    """The provider(s) the task failed on: those of its excluded candidates."""
    keys = set(facts.excluded) | set(facts.soft_excluded)
    providers = sorted({c.provider for c in catalog.candidates if (c.account_id, c.model) in keys})
    return ",".join(providers) or "unknown"


def oldest_by_class(queued: Iterable[TaskRecord], now: datetime) -> Mapping[str, float]:
    """Seconds the oldest queued task of each service class has waited."""
    out: dict[str, float] = {}
    for t in queued:
        cls = t.spec.service_class.value
        out[cls] = max(out.get(cls, 0.0), (now - t.created_at).total_seconds())
    return out
