"""One canary gate evaluation (design 9.13.5): hold, advance, promote, roll back, and what it
records."""

from __future__ import annotations

import math

from controlplane.domain.routing.canary import evaluate
from controlplane.domain.routing.policy_document import CanarySpec, IncumbentGates
from controlplane.domain.scoring import CanaryAction, CanaryConfig, CanaryGates, CanaryMetrics

SPEC = CanarySpec(
    "p/m/a",
    CanaryConfig(shares=(0.01, 0.05), gates=CanaryGates(min_samples=5, min_success_rate=0.9)),
    IncumbentGates(
        max_success_drop=0.05, max_p95_latency_ratio=2.0, max_cost_per_success_ratio=1.5
    ),
)


def metrics(samples: int = 10, success: float = 1.0, p95: float = 60.0, cost: float = 1000.0,
            quality: float | None = None) -> CanaryMetrics:  # fmt: skip
    return CanaryMetrics(samples, success, p95, 0.0, cost, quality)


def test_too_few_samples_hold_whatever_the_figures() -> None:
    """Below min_samples nothing moves, even with every gate failing (the gates are noted)."""
    verdict = evaluate(SPEC, 0, metrics(samples=4, success=0.0, cost=math.inf))
    assert (verdict.action, verdict.next_stage) == (CanaryAction.HOLD, 0)
    assert verdict.gates["success_rate"] is False
    assert "cost_per_success_micros" not in verdict.observed  # no infinity recorded


def test_passing_gates_advance_then_promote() -> None:
    """All gates pass: the next stage, and after the last one a promotion."""
    assert evaluate(SPEC, 0, metrics()).next_stage == 1
    assert evaluate(SPEC, 0, metrics()).action is CanaryAction.ADVANCE
    assert evaluate(SPEC, 1, metrics()).action is CanaryAction.PROMOTE


def test_each_breached_gate_rolls_back_and_is_named() -> None:
    """Absolute gates, the gates against the incumbent and the quality gate (once measured)."""
    incumbent = metrics(success=1.0, p95=20.0, cost=500.0)
    verdict = evaluate(SPEC, 1, metrics(success=0.8, p95=50.0, cost=1000.0), incumbent)
    assert verdict.action is CanaryAction.ROLLBACK
    assert verdict.next_stage is None
    assert verdict.reason == (
        "gate failed: success_rate, success_vs_incumbent, p95_vs_incumbent, "
        "cost_per_success_vs_incumbent"
    )
    assert verdict.observed["incumbent_cost_per_success_micros"] == 500.0
    bad_quality = evaluate(SPEC, 0, metrics(quality=0.5))
    assert bad_quality.reason == "gate failed: quality_pass_rate"


def test_without_quality_evidence_the_quality_gate_is_not_applied() -> None:
    """No spot check yet: the quality gate is absent rather than holding the canary for ever."""
    verdict = evaluate(SPEC, 0, metrics(quality=None))
    assert "quality_pass_rate" not in verdict.gates
    assert verdict.action is CanaryAction.ADVANCE


def test_relative_gates_off_or_without_an_incumbent_are_not_applied() -> None:
    """None switches a relative gate off; with no incumbent data only absolute gates count."""
    off = CanarySpec(SPEC.candidate_id, SPEC.config, IncumbentGates(None, None, None))
    incumbent = metrics(cost=10.0)
    assert evaluate(off, 0, metrics(), incumbent).action is CanaryAction.ADVANCE
    assert evaluate(SPEC, 0, metrics(), None).action is CanaryAction.ADVANCE
    assert evaluate(SPEC, 0, metrics(), incumbent).action is CanaryAction.ROLLBACK
