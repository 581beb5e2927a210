"""Route replay in the domain: recorded decisions re-run exactly under their own policy, a
changed policy never picks what a hard filter rejected, and the report's figures by hand."""

from __future__ import annotations

import dataclasses
import json
import tracemalloc
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.domain import scoring
from controlplane.domain.routing.candidates import (
    CapacityView,
    CompileResult,
    HealthView,
    Incumbent,
    RoutingContext,
)
from controlplane.domain.routing.decision import Outcome, RouteDecisionSnapshot
from controlplane.domain.routing.filters import screen
from controlplane.domain.routing.load import LoadView
from controlplane.domain.routing.replay import (
    Recorded,
    ReplayTally,
    replay_one,
    wilson_interval,
)
from controlplane.domain.routing.selection import RouterConfig, route
from tests.support.sizes import examples
from tests.unit.domain.test_fast_routing import SHADOW, decisions
from tests.unit.domain.test_routing import CATALOG, CFG, NOW, compile_for, make_spec
from vidroute_core.spec import GenerationSpec, RoutingMode, ServiceClass

Case = tuple[GenerationSpec, RoutingContext, dict[str, CompileResult]]


IDS = sorted(c.id for c in CATALOG)


loads = st.builds(
    LoadView,
    queue_length=st.integers(0, 9),
    warm=st.booleans(),
    cold_start_s=st.just(30.0),
    gpu_utilization=st.floats(0, 1),
    available_slots=st.integers(0, 4),
    ready_replicas=st.integers(1, 3),
    vram_free_mb=st.just(1000),
    vram_total_mb=st.just(8000),
    extra_s=st.floats(0, 600),
    free=st.floats(0, 1),
    penalty=st.floats(0, 0.1),
)


@st.composite
def selected_cases(draw: st.DrawFn) -> Case:
    """Decisions with several eligible candidates: health, capacity, quality, incumbents with
    and without dwell, near ties (equal components), canaries, PREFERRED pins, scenarios."""
    model = draw(st.sampled_from(sorted({c.model for c in CATALOG})))
    mode = draw(st.sampled_from([RoutingMode.AUTO, RoutingMode.AUTO, RoutingMode.PREFERRED]))
    spec = dataclasses.replace(
        make_spec(mode=mode, required_model=model if mode is RoutingMode.PREFERRED else ""),
        service_class=draw(st.sampled_from(list(ServiceClass))),
        tenant_id=draw(st.sampled_from(["tenant-a", "tenant-b", "t9"])),
    )
    grid = st.sampled_from([0.0, 0.25, 0.5, 0.9, 1.0])  # coarse values make near ties
    ctx = RoutingContext(
        now=NOW,
        capacity=draw(
            st.dictionaries(
                st.sampled_from(IDS), st.builds(CapacityView, st.integers(1, 4), st.just(4))
            )
        ),
        quality=draw(st.dictionaries(st.sampled_from(IDS), grid)),
        health=draw(
            st.dictionaries(
                st.sampled_from(IDS),
                st.builds(
                    HealthView, grid, st.floats(0, 500), st.sampled_from([None, 30.0, 400.0]), grid
                ),
            )
        ),
        incumbent=draw(
            st.sampled_from([None, *(Incumbent(i, NOW.timestamp() - 30) for i in IDS[:4])])
            | st.builds(Incumbent, st.sampled_from(IDS), st.just(NOW.timestamp() - 7200.0))
        ),
        canary_stages=draw(st.dictionaries(st.sampled_from(IDS), st.integers(0, 3), max_size=1)),
        # Model-server load: latency, capacity and a GPU penalty that adds to a deprecation's.
        load=draw(st.dictionaries(st.sampled_from(IDS), loads, max_size=3)),
    )
    survivors = screen(spec, CATALOG, ctx).survivors()
    return spec, ctx, {c.id: compile_for(spec, c) for c in survivors}


def _stored(decision: RouteDecisionSnapshot, refused: list[str]) -> dict[str, Any]:
    """The snapshot as the dispatcher stores it (lease outcome applied, through JSON)."""
    if decision.outcome is Outcome.SELECTED:
        left = [c for c in decision.ranked if c not in refused]
        decision = decision.after_leasing(left[0] if left else None, refused)
    data: dict[str, Any] = json.loads(json.dumps(decision.to_json()))
    return data


def _decide(case: Case, cfg: RouterConfig, refuse: int) -> dict[str, Any]:
    spec, ctx, compiled = case
    decision = route("42", spec, CATALOG, compiled, cfg=cfg, ctx=ctx, catalog_version="cat-x")
    return _stored(decision, list(decision.ranked[:refuse]))


weights = st.builds(
    scoring.ScoreWeights, *[st.floats(0, 1, allow_nan=False) for _ in range(7)]
).filter(lambda w: w.total > 0)
policies = st.builds(
    lambda w, delta, dwell: scoring.RoutingPolicy(
        "candidate", weights={"default": w}, hysteresis_delta=delta, min_dwell_s=dwell
    ),
    weights,
    st.floats(0, 0.5, allow_nan=False),
    st.sampled_from([0.0, 10.0, 60.0, 3600.0]),
)


@settings(
    max_examples=examples(50, long=150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    case=decisions() | selected_cases() | selected_cases(),
    cfg=st.sampled_from([CFG, SHADOW]),
    refuse=st.sampled_from([0, 0, 0, 1, 2]),
)
def test_replay_with_the_recorded_policy_reproduces_every_decision(
    case: Case, cfg: RouterConfig, refuse: int
) -> None:
    """Replaying a stored decision with the policy that made it gives every scored candidate
    its unrounded score to the last bit, the same pick, lease fall-through order and reason."""
    spec, ctx, compiled = case
    decision = route("42", spec, CATALOG, compiled, cfg=cfg, ctx=ctx, catalog_version="cat-x")
    snap = _stored(decision, list(decision.ranked[:refuse]))
    got = replay_one(Recorded("42", 1, snap), cfg.policy)
    assert got is not None
    made = {v.candidate.id: v.score for v in decision.verdicts if v.score is not None}
    assert dict(got.scores) == made
    assert got.selected == snap["selected"]
    if snap["outcome"] == Outcome.SELECTED.value or snap.get("lease_refused"):
        assert got.ranked == tuple(snap["ranked"])
        assert got.selection_reason == snap["selection_reason"]


@settings(
    max_examples=examples(50, long=150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    case=decisions() | selected_cases(), policy=policies, refuse=st.sampled_from([0, 0, 0, 1, 2])
)
def test_a_replayed_pick_is_never_one_the_record_refused(
    case: Case, policy: scoring.RoutingPolicy, refuse: int
) -> None:
    """Under any policy the replayed pick is a candidate the recorded decision found eligible
    and that did not refuse a lease: never one a hard filter rejected."""
    snap = _decide(case, CFG, refuse)
    tally = ReplayTally(policy)
    [got] = tally.add_page([Recorded("42", 1, snap)])
    report = tally.report()
    assert report.hard_filter_differences == {}
    if got.selected is None:
        return
    verdict = next(c for c in snap["candidates"] if c["id"] == got.selected)
    assert verdict["eligible"], verdict
    assert got.selected not in snap.get("lease_refused", [])


def _candidate(cid: str, cost: int, parts: list[float], **extra: Any) -> dict[str, Any]:
    return {"id": cid, "eligible": True, "estimated_cost_micros": cost, "raw_components": parts}


def _snapshot(health: dict[str, list[Any]]) -> dict[str, Any]:
    # a: better success/latency, dearer; b: cheap.
    return {
        "task_id": "7",
        "outcome": "SELECTED",
        "policy_version": "rec-v1",
        "selected": "p/a/x",
        "ranked": ["p/a/x", "p/b/x"],
        "selection_reason": "best_score",
        "candidates": [
            _candidate("p/a/x", 900_000, [0.5, 0.9, 0.8, 0.0, 1.0, 1.0, 0.5]),
            _candidate("p/b/x", 300_000, [0.5, 0.2, 0.3, 1.0, 1.0, 1.0, 0.5]),
            {"id": "p/c/x", "eligible": False, "reason": "MODE_UNSUPPORTED"},
        ],
        "shadow": {"policy_version": "sh", "selected": "p/b/x", "scores": {}},
        "facts": {
            "scenario": "STANDARD",
            "group_key": "t1",
            "mode": "AUTO",
            "now": datetime(2026, 12, 1, tzinfo=UTC).isoformat(),
            "incumbent": None,
            "pinned": [],
            "health": health,
        },
    }


def test_a_cost_only_policy_moves_to_the_cheap_candidate_with_the_figures_by_hand() -> None:
    """With all weight on cost the replay picks the cheaper candidate; the change, cost delta,
    expected success, latency and cost per success with Wilson bounds match a hand calculation."""
    health = {"p/a/x": [0.8, 100.0, 40.0, 0.9], "p/b/x": [0.1, 100.0, 200.0, 0.25]}
    snap = _snapshot(health)
    recorded = scoring.RoutingPolicy("rec-v1")
    cheap = scoring.RoutingPolicy(
        "cheap", weights={"default": scoring.ScoreWeights(0, 0, 0, 1, 0, 0, 0)}
    )
    same = ReplayTally(recorded)
    same.add_page([Recorded("7", 1, snap)])
    assert same.report().changed == 0
    tally = ReplayTally(cheap)
    tally.add_page([Recorded("7", 1, snap), Recorded("8", 1, dict(snap, shadow=None))])
    r = tally.report()
    assert (r.decisions, r.changed, r.shadow_recorded, r.shadow_agreements) == (2, 2, 1, 1)
    assert [(c.recorded_selected, c.replayed_selected, c.cost_delta_micros) for c in r.changes] == [
        ("p/a/x", "p/b/x", -600_000),
        ("p/a/x", "p/b/x", -600_000),
    ]
    assert r.recorded.estimated_cost_micros == 1_800_000
    assert r.replayed.estimated_cost_micros == 600_000
    assert r.recorded.expected_success == 0.9
    assert r.replayed.expected_success == 0.25
    assert r.recorded.expected_latency_s == 40.0
    assert r.replayed.expected_latency_s == 200.0
    # 600,000 micros over 2 x 0.25 expected successes.
    assert r.replayed.cost_per_success_micros == 1_200_000
    lo, hi = wilson_interval(0.25, 100.0)
    assert 0.17 < lo < 0.25 < hi < 0.35  # 25/100: Wilson 95 % is about [0.175, 0.343]
    assert r.replayed.cost_per_success_low_micros == round(600_000 / (2 * hi))
    assert r.replayed.cost_per_success_high_micros == round(600_000 / (2 * lo))
    assert r.recorded.cost_per_success_micros == round(1_800_000 / 1.8)


def test_no_health_means_an_even_chance_and_an_unbounded_interval() -> None:
    """A pick with no health samples counts 0.5 expected success and its cost per success has
    no upper bound (0), since zero successes cannot be excluded."""
    tally = ReplayTally(scoring.RoutingPolicy("rec-v1"))
    tally.add_page([Recorded("7", 1, _snapshot({}))])
    r = tally.report()
    assert r.recorded.expected_success == 0.5
    assert r.recorded.cost_per_success_micros == 1_800_000
    assert r.recorded.cost_per_success_low_micros == 900_000
    assert r.recorded.cost_per_success_high_micros == 0


def test_a_scored_decision_without_facts_is_skipped_not_guessed() -> None:
    """A decision recorded before the facts existed is counted as skipped, not re-decided."""
    snap = _snapshot({})
    del snap["facts"]
    tally = ReplayTally(scoring.RoutingPolicy("rec-v1"))
    assert tally.add_page([Recorded("7", 1, snap)]) == []
    assert (tally.report().decisions, tally.report().skipped) == (0, 1)


def test_the_recorded_policy_replays_a_recorded_incumbent_within_its_dwell() -> None:
    """An incumbent within its dwell time is kept by the recorded policy and dropped by one
    without dwell or hysteresis: the recorded incumbent and clock drive the replay."""
    snap = _snapshot({})
    now = datetime(2026, 12, 1, tzinfo=UTC)
    snap["facts"]["incumbent"] = ["p/b/x", now.timestamp() - 5]
    snap.update(selected="p/b/x", ranked=["p/b/x", "p/a/x"], selection_reason="min_dwell")
    kept = replay_one(Recorded("7", 1, snap), scoring.RoutingPolicy("rec-v1"))
    assert kept is not None
    assert (kept.selected, kept.selection_reason) == ("p/b/x", "min_dwell")
    free = dataclasses.replace(
        scoring.RoutingPolicy("rec-v1"), min_dwell_s=0.0, hysteresis_delta=0.0
    )
    moved = replay_one(Recorded("7", 1, snap), free)
    assert moved is not None
    assert moved.selected == "p/a/x"


def test_a_long_replay_keeps_running_totals_not_one_entry_per_decision() -> None:
    """Folding 20,000 decisions page by page retains under 1 MB (a list per figure would hold
    about 5 MB of floats; process-wide caches such as the rounding memo may grow by a few hundred
    KB meanwhile, 209 KB seen in CI), and the totals are those of a single decision."""
    health = {"p/a/x": [0.8, 100.0, 40.0, 0.9], "p/b/x": [0.1, 100.0, 200.0, 0.25]}
    snap = _snapshot(health)
    tally = ReplayTally(scoring.RoutingPolicy("rec-v1"))
    page = [Recorded("7", 1, snap)] * 100
    tally.add_page(page)  # warm up: whatever is allocated once
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(199):
            tally.add_page(page)
        retained = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert retained < 1_000_000, retained
    r = tally.report()
    assert (r.decisions, r.changed) == (20_000, 0)
    assert r.recorded.expected_success == pytest.approx(0.9)
    assert r.recorded.expected_latency_s == pytest.approx(40.0)
