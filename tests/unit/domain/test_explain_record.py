"""The explain record (design 9.10.2, issue 26 "visible decisions"): every score component of a
stored decision reads back with its inputs, the health window and burst window's figures,
quality's prior against its evidence in the task's bucket, the cost line's ends, the call
baselines and why a breaker opened."""

from __future__ import annotations

import json

from controlplane.domain.breaker import (
    SLOW_CALLS,
    BreakerConfig,
    BreakerKey,
    BreakerState,
    CallOutcome,
    CircuitBreaker,
    FailureKind,
    Operation,
    open_detail,
    opened_for_in,
    opened_on_slow_calls,
)
from controlplane.domain.quality import (
    QualityCounts,
    QualityEvidence,
    QualityTable,
    bucket_key,
)
from controlplane.domain.routing.candidates import (
    BurstView,
    CapacityView,
    HealthView,
    RoutingContext,
)
from controlplane.domain.routing.decision import (
    DecisionFacts,
    candidate_explain,
    candidate_inputs,
    quality_bucket,
)
from tests.unit.domain.test_routing import CFG, NOW, decide, make_spec

STEADY = "runway/gen4.5/prod-us"
VEO = "google/veo-3.1-generate-preview/veo-prod-us"


def _stored() -> dict[str, object]:
    spec = make_spec()
    health = HealthView(
        0.41,
        12.0,
        120.0,
        0.9,
        150.0,
        window="24h",
        burst=BurstView(4.0, 0.25, 0.05, applied=True),
        baselines_s=(("POLL", 0.3), ("SUBMIT", 1.25)),
        breaker_opened_for="remote:slow_calls",
    )
    ctx = RoutingContext(
        now=NOW,
        health={STEADY: health},
        quality={STEADY: 0.62},
        quality_evidence={
            STEADY: QualityEvidence(0.8, True, 7, 5, 0.62),
            VEO: QualityEvidence(0.5, False, 0, 0, 0.5),
        },
        quality_bucket=bucket_key(spec),
        capacity={STEADY: CapacityView(3, 4), VEO: CapacityView(1, 8)},
    )
    # Through JSON, as the database keeps it.
    stored: dict[str, object] = json.loads(json.dumps(decide(spec, ctx).to_json()))
    return stored


def test_a_stored_decision_shows_every_components_inputs() -> None:
    """The inputs of a scored candidate name its routing window's figures, the burst window's,
    quality's prior against its evidence and the shrunk score, the cost line's ends, the
    latency line's ends and its lease slots; the quality score shown is the component."""
    stored = _stored()
    [steady] = [c for c in stored["candidates"] if c["id"] == STEADY]  # type: ignore[attr-defined]  # the stored JSON's list of candidate dicts
    scored = [c for c in stored["candidates"] if "score" in c]  # type: ignore[attr-defined]  # the stored JSON's list of candidate dicts
    inputs = candidate_inputs(stored, STEADY)
    assert inputs == {
        "success_lower_bound": 0.41,
        "window_samples": 12.0,
        "mean_latency_s": 120.0,
        "success_rate": 0.9,
        "p95_latency_s": 150.0,
        "burst_samples": 4.0,
        "burst_success_rate": 0.25,
        "burst_success_lower_bound": 0.05,
        "burst_applied": 1.0,
        "quality_prior": 0.8,
        "quality_checks": 7.0,
        "quality_verdicts": 5.0,
        "quality_evidence": 12.0,
        "quality_shrunk": 0.62,
        "cost_estimate_micros": float(steady["estimated_cost_micros"]),
        "cost_cheapest_micros": float(min(c["estimated_cost_micros"] for c in scored)),
        "latency_good_s": CFG.latency_good_s,
        "latency_bad_s": CFG.latency_bad_s,
        "capacity_available": 3.0,
        "capacity_maximum": 4.0,
    }
    assert steady["components"]["quality"] == inputs["quality_shrunk"]
    assert "cost_budget_micros" not in inputs  # no budget: the cost is relative to the cheapest


def test_the_window_prior_source_baselines_and_slow_breaker_read_back() -> None:
    """The non-numeric half: which window, where the prior came from, the call baselines per
    operation and a breaker opened on slow calls (here adopted from another replica)."""
    stored = _stored()
    explained = candidate_explain(stored, STEADY)
    assert explained.window == "24h"
    assert explained.quality_prior_source == "capability_document"
    assert explained.baselines_s == {"POLL": 0.3, "SUBMIT": 1.25}
    assert explained.breaker_opened_for == "remote:slow_calls"
    assert explained.opened_on_slow_calls
    veo = candidate_explain(stored, VEO)
    assert (veo.window, veo.quality_prior_source, veo.baselines_s) == ("", "default", {})
    assert candidate_inputs(stored, VEO)["quality_evidence"] == 0.0
    assert quality_bucket(stored) == bucket_key(make_spec())


def test_replay_reads_a_record_with_the_explain_facts() -> None:
    """The explain-only facts do not change what replay re-reads: the five scored figures."""
    stored = _stored()
    facts = DecisionFacts.from_json(stored["facts"])  # type: ignore[arg-type]  # the stored JSON's facts dict
    assert facts.health[STEADY] == HealthView(0.41, 12.0, 120.0, 0.9, 150.0)


def test_a_budget_is_the_cost_lines_far_end() -> None:
    """Under a budget the cost inputs include it (9.13.2's max acceptable cost)."""
    stored = decide(make_spec(max_estimated_cost_micros=9_000_000)).to_json()
    scored = [c["id"] for c in stored["candidates"] if "score" in c]
    assert scored
    assert candidate_inputs(stored, scored[0])["cost_budget_micros"] == 9_000_000.0


def test_quality_evidence_is_what_the_scores_are_made_of() -> None:
    """`QualityTable.evidence` gives the same score as `scores`, with its prior and counts;
    a model without evidence in the bucket is at its prior with none."""
    counts = {("runway", "gen4.5", "TEXT_TO_VIDEO", "b"): QualityCounts(3, 2, 1, 10, 4)}
    table = QualityTable(counts)
    rows = [("r", "runway", "gen4.5", 0.7, True), ("g", "google", "veo", 0.5, False)]
    evidence = table.evidence(rows, "TEXT_TO_VIDEO", "b")
    scores = table.scores([r[:4] for r in rows], "TEXT_TO_VIDEO", "b")
    assert {cid: e.score for cid, e in evidence.items()} == scores
    assert evidence["r"] == QualityEvidence(0.7, True, 10, 6, scores["r"])
    assert evidence["g"] == QualityEvidence(0.5, False, 0, 0, 0.5)


def test_a_breaker_remembers_it_opened_on_slow_calls_until_it_closes() -> None:
    """A breaker opened by the slow-call rule says so while OPEN, HALF_OPEN and after a failed
    probe reopened it; a full close forgets it."""
    now = [0.0]
    config = BreakerConfig()
    breaker = CircuitBreaker(
        BreakerKey("runway", "prod", "us", "gen4.5", Operation.SUBMIT), config, lambda: now[0]
    )
    assert breaker.opened_for == ""
    for _ in range(40):
        breaker.record(CallOutcome.ok(1000))
    transition = None
    while transition is None:
        slow = CallOutcome.failed(FailureKind.TIMEOUT_OVER_BASELINE, 9000)
        transition = breaker.record(slow)
    assert transition.reason == SLOW_CALLS
    assert (breaker.state, breaker.opened_for) == (BreakerState.OPEN, SLOW_CALLS)
    now[0] += config.cooldowns_s[0]
    breaker.tick()
    assert (breaker.state, breaker.opened_for) == (BreakerState.HALF_OPEN, SLOW_CALLS)
    breaker.record_probe(CallOutcome.failed(FailureKind.GATEWAY_5XX, 10), None)
    assert (breaker.state, breaker.opened_for) == (BreakerState.OPEN, SLOW_CALLS)
    breaker.force(BreakerState.CLOSED, "operator")
    assert breaker.opened_for == ""
    assert opened_on_slow_calls("remote:slow_calls")
    assert not opened_on_slow_calls("failure_rate")


def test_a_candidate_refused_for_an_open_breaker_says_why_it_opened() -> None:
    """A candidate whose breaker is OPEN on slow calls is refused as CIRCUIT_OPEN with a
    detail naming the rule, which the explain view reads back as its breaker's reason."""
    detail = open_detail("breaker", SLOW_CALLS, 29.6)
    assert detail == "breaker OPEN on slow_calls for 30 s more"
    assert opened_for_in(detail) == SLOW_CALLS
    assert opened_for_in(open_detail("account breaker", "", 5)) == ""
    stored = decide(make_spec(), RoutingContext(now=NOW, circuit_open={VEO: detail})).to_json()
    [veo] = [c for c in stored["candidates"] if c["id"] == VEO]
    assert (veo["reason"], veo["detail"]) == ("CIRCUIT_OPEN", detail)
    explained = candidate_explain(stored, VEO)
    assert (explained.breaker_opened_for, explained.opened_on_slow_calls) == (SLOW_CALLS, True)
