"""Live canary gates (design 9.13.5): one evaluation of one candidate's stage, pure.

The leader measures the canary's attempts since its stage began and the incumbent's over the same
window (`CanaryMetrics`, the domain's), and `evaluate` says what happens next:

* fewer finished attempts than ``min_samples``: HOLD (not enough evidence either way);
* any gate breached: ROLLBACK, naming every breached gate;
* all pass: ADVANCE to the next stage, or PROMOTE after the last one.

Gates are the absolute thresholds of `scoring.CanaryGates` and the document's relative ones
(`IncumbentGates`: success drop, p95 and cost per success ratios) when an incumbent has finished
attempts in the window. The quality gate applies once quality evidence exists (``None`` until a
spot check or a technical check was recorded): without it the gate is reported as not measured
rather than holding the canary for ever. ``observed`` is what the transition records.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from controlplane.domain.routing.policy_document import CanarySpec, IncumbentGates
from controlplane.domain.scoring import CanaryAction, CanaryMetrics


class CanaryStatus(StrEnum):
    ACTIVE = "ACTIVE"
    PROMOTED = "PROMOTED"
    ROLLED_BACK = "ROLLED_BACK"


ROLLED_BACK_STAGE = -1  # ``RoutingContext.canary_stages`` value: no canary traffic at all


@dataclass(frozen=True, slots=True)
class GateVerdict:
    action: CanaryAction
    next_stage: int | None  # None after a rollback or a promotion
    gates: Mapping[str, bool]  # every gate evaluated: passed?
    reason: str
    observed: Mapping[str, float] = field(default_factory=dict)


def _relative(m: CanaryMetrics, inc: CanaryMetrics | None, vs: IncumbentGates) -> dict[str, bool]:
    if inc is None or inc.samples == 0:
        return {}
    out = {}
    if vs.max_success_drop is not None:
        out["success_vs_incumbent"] = inc.success_rate - m.success_rate <= vs.max_success_drop
    if vs.max_p95_latency_ratio is not None and inc.p95_latency_s > 0:
        out["p95_vs_incumbent"] = m.p95_latency_s <= inc.p95_latency_s * vs.max_p95_latency_ratio
    if vs.max_cost_per_success_ratio is not None and inc.cost_per_success_micros > 0:
        limit = inc.cost_per_success_micros * vs.max_cost_per_success_ratio
        out["cost_per_success_vs_incumbent"] = m.cost_per_success_micros <= limit
    return out


def _observed(m: CanaryMetrics, inc: CanaryMetrics | None) -> dict[str, float]:
    out = {
        "samples": float(m.samples),
        "success_rate": m.success_rate,
        "p95_latency_s": m.p95_latency_s,
        "cost_per_success_micros": float(m.cost_per_success_micros),
        "safety_failure_rate": m.safety_failure_rate,
    }
    if m.quality_pass_rate is not None:
        out["quality_pass_rate"] = m.quality_pass_rate
    if inc is not None:
        out["incumbent_samples"] = float(inc.samples)
        out["incumbent_success_rate"] = inc.success_rate
        out["incumbent_p95_latency_s"] = inc.p95_latency_s
        out["incumbent_cost_per_success_micros"] = float(inc.cost_per_success_micros)
    # JSON has no infinity: a cost per success without a success is left out, not stored.
    return {k: round(v, 6) for k, v in out.items() if math.isfinite(v)}


def evaluate(
    spec: CanarySpec, stage: int, metrics: CanaryMetrics, incumbent: CanaryMetrics | None = None
) -> GateVerdict:
    """The next step of `spec`'s canary at `stage` given the live metrics of its stage window."""
    g = spec.config.gates
    no_successes = metrics.cost_per_success_micros == float("inf")
    gates = {
        "success_rate": metrics.success_rate >= g.min_success_rate,
        "p95_latency": metrics.p95_latency_s <= g.max_p95_latency_s,
        "safety_failure_rate": metrics.safety_failure_rate <= g.max_safety_failure_rate,
        "cost_per_success": not no_successes
        and metrics.cost_per_success_micros <= g.max_cost_per_success_micros,
    }
    if metrics.quality_pass_rate is not None:
        gates["quality_pass_rate"] = metrics.quality_pass_rate >= g.min_quality_pass_rate
    gates.update(_relative(metrics, incumbent, spec.vs_incumbent))
    observed = _observed(metrics, incumbent)
    if metrics.samples < g.min_samples:
        why = f"{metrics.samples} of {g.min_samples} samples at stage {stage}"
        return GateVerdict(CanaryAction.HOLD, stage, gates, why, observed)
    failed = [name for name, ok in gates.items() if not ok]
    if failed:
        return GateVerdict(
            CanaryAction.ROLLBACK, None, gates, "gate failed: " + ", ".join(failed), observed
        )
    if stage + 1 >= len(spec.config.shares):
        return GateVerdict(CanaryAction.PROMOTE, None, gates, "every gate passed", observed)
    return GateVerdict(CanaryAction.ADVANCE, stage + 1, gates, "every gate passed", observed)
