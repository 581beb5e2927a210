"""Routing score normalisation, weights, anti-oscillation and canary rules (design 9.13)."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from controlplane.domain.scoring import (
    CanaryAction,
    CanaryConfig,
    CanaryMetrics,
    CanaryPlan,
    DecayedQuantiles,
    Ewma,
    HealthWindows,
    Penalty,
    RoutingPolicy,
    ScoreComponents,
    ScoreWeights,
    Window,
    admit_to_canary,
    bucket,
    capacity_score,
    choose_with_hysteresis,
    cost_score,
    example_policy,
    latency_score,
    preference_score,
    region_score,
    relative_cost_score,
    rendezvous,
    routing_success,
    score,
    wilson_lower_bound,
)
from tests.support.sizes import examples

unit = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)
GOOD_METRICS = CanaryMetrics(
    samples=500,
    success_rate=0.98,
    p95_latency_s=120.0,
    safety_failure_rate=0.0,
    cost_per_success_micros=900_000,
    quality_pass_rate=0.95,
)


@pytest.mark.parametrize(
    ("successes", "total", "expected"),
    [
        (1, 1, 0.2065),
        (2, 2, 0.3424),
        (5, 10, 0.2366),
        (10, 10, 0.7225),
        (50, 100, 0.4038),
        (95, 100, 0.8882),
        (0, 10, 0.0),
        (0, 0, 0.0),
    ],
)
def test_wilson_lower_bound_known_values(successes: int, total: int, expected: float) -> None:
    """The Wilson lower bound matches published values at z=1.96 and is 0 without data."""
    assert wilson_lower_bound(successes, total) == pytest.approx(expected, abs=1e-4)


def test_wilson_prefers_evidence_over_lucky_streaks() -> None:
    """Two successes out of two score below 95 out of 100 (the 9.13.2 rationale)."""
    assert wilson_lower_bound(2, 2) < wilson_lower_bound(95, 100)


@given(st.integers(0, 10_000), st.integers(1, 10_000))
def test_wilson_bounded_by_observed_rate(successes: int, total: int) -> None:
    """The lower bound lies in [0, observed success rate] for every count."""
    successes = min(successes, total)
    assert 0.0 <= wilson_lower_bound(successes, total) <= successes / total + 1e-12


def test_linear_scores_clamp() -> None:
    """Latency and cost scores are 1 at the good end, 0 past the bad end, linear between."""
    assert latency_score(30, good=60, bad=300) == 1.0
    assert latency_score(180, good=60, bad=300) == pytest.approx(0.5)
    assert latency_score(900, good=60, bad=300) == 0.0
    assert cost_score(100, min_candidate=100, max_acceptable=300) == 1.0
    assert cost_score(200, min_candidate=100, max_acceptable=300) == pytest.approx(0.5)
    assert cost_score(500, min_candidate=100, max_acceptable=300) == 0.0
    assert cost_score(100, min_candidate=100, max_acceptable=100) == 1.0


def test_relative_cost_is_in_proportion_to_price() -> None:
    """With no maximum acceptable cost, the score is the cheapest price over this one's."""
    assert relative_cost_score(100, min_candidate=100) == 1.0
    assert relative_cost_score(4000, min_candidate=100) == pytest.approx(1 / 40)
    assert relative_cost_score(200, min_candidate=0) == 0.0
    assert relative_cost_score(0, min_candidate=0) == 1.0


def test_capacity_score_is_squared() -> None:
    """Capacity is the squared free share, so half-full scores 0.25 and full scores 0."""
    assert capacity_score(5, 10) == pytest.approx(0.25)
    assert capacity_score(10, 10) == 1.0
    assert capacity_score(0, 10) == 0.0
    assert capacity_score(3, 0) == 0.0


def test_region_and_preference_scores() -> None:
    """Region ranks by preference order; preference is 1/0.5/0 for preferred/neutral/avoided."""
    assert region_score("eu-west", ["eu-west", "eu-north"]) == 1.0
    assert region_score("eu-north", ["eu-west", "eu-north"]) == 0.5
    assert region_score("us-east", ["eu-west"]) == 0.0
    assert region_score("us-east", []) == 1.0
    assert preference_score("kling", {"kling"}) == 1.0
    assert preference_score("veo", {"kling"}) == 0.5
    assert preference_score("veo", {"kling"}, avoided={"veo"}) == 0.0


@given(finite, finite, finite, finite, finite, st.floats(0, 1e6), st.floats(0, 1e6))
def test_every_normaliser_lands_in_unit_interval(  # noqa: PLR0917 - one arg per strategy
    p95: float,
    cost: float,
    lo: float,
    hi: float,
    avail: float,
    cap: float,
    extra: float,
) -> None:
    """Every normalised component is within [0, 1] for any finite input."""
    good, bad = min(lo, hi), max(lo, hi) + 1.0
    values = [
        latency_score(p95, good, bad),
        cost_score(cost, lo, hi),
        relative_cost_score(cost, lo),
        capacity_score(avail, cap),
        wilson_lower_bound(min(extra, cap), cap),
    ]
    assert all(0.0 <= v <= 1.0 for v in values)


def test_example_weights_sum_to_one() -> None:
    """The 9.13 example weights (0.28/0.22/0.18/0.14/0.10/0.04/0.04) and every scenario sum to 1."""
    weights = ScoreWeights()
    assert (
        weights.quality,
        weights.success,
        weights.latency,
        weights.cost,
        weights.capacity,
        weights.region,
        weights.preference,
    ) == (0.28, 0.22, 0.18, 0.14, 0.10, 0.04, 0.04)
    policy = example_policy("v7")
    assert policy.version == "v7"
    for name, scenario in policy.weights.items():
        assert scenario.total == pytest.approx(1.0), name
    assert policy.weights_for("UNKNOWN") == ScoreWeights()


@given(st.lists(unit, min_size=7, max_size=7), st.lists(st.floats(0, 2), min_size=7, max_size=7))
def test_score_total_within_weight_sum(parts: list[float], raw_weights: list[float]) -> None:
    """Without penalties the total is in [0, sum(weights)] and equals the weighted parts' sum."""
    weights = ScoreWeights(*raw_weights)
    breakdown = score(ScoreComponents(*parts), weights)
    assert 0.0 <= breakdown.total <= weights.total
    assert breakdown.total == pytest.approx(math.fsum(breakdown.weighted.values()))


def test_penalties_subtract_and_are_explained() -> None:
    """Penalties lower the total and show up by code in the explainable breakdown."""
    components = ScoreComponents(1, 1, 1, 1, 1, 1, 1)
    breakdown = score(components, ScoreWeights(), [Penalty("recent_unknown_submit", 0.3)])
    assert breakdown.gross == pytest.approx(1.0)
    assert breakdown.total == pytest.approx(0.7)
    assert breakdown.as_dict()["penalties"] == {"recent_unknown_submit": 0.3}


def test_components_outside_unit_interval_rejected() -> None:
    """A component outside [0, 1] is a caller bug and is refused."""
    with pytest.raises(ValueError, match="latency"):
        ScoreComponents(0.5, 0.5, 1.5, 0.5, 0.5, 0.5, 0.5)


def test_ewma_decays_with_elapsed_time() -> None:
    """A fresh sample moves a short window far more than a long window after the same gap."""
    short, long = Ewma(60), Ewma(86_400)
    for ewma in (short, long):
        ewma.observe(1.0, at=0)
        ewma.observe(0.0, at=60)
    assert short.value == pytest.approx(math.exp(-1) / (math.exp(-1) + 1))
    assert long.value is not None
    assert long.value > 0.49
    assert short.value is not None
    assert short.value < long.value


def test_ewma_averages_simultaneous_samples() -> None:
    """Samples with the same timestamp are averaged, not dropped."""
    ewma = Ewma(60)
    for value in (1.0, 0.0, 1.0, 0.0):
        ewma.observe(value, at=5)
    assert ewma.value == pytest.approx(0.5)
    assert ewma.weight(5) == pytest.approx(4)


def test_health_windows_one_minute_sees_burst_first() -> None:
    """After a burst of failures the 1-minute window drops far below the 7-day baseline."""
    health = HealthWindows()
    t = 0.0
    for _ in range(2_000):
        health.observe(True, latency_s=60, cost_micros=500_000, at=t)
        t += 30
    for _ in range(20):
        health.observe(False, latency_s=300, cost_micros=500_000, at=t)
        t += 1
    one_min, week = health.stats(Window.ONE_MINUTE, t), health.stats(Window.SEVEN_DAYS, t)
    assert one_min.success_rate is not None
    assert week.success_rate is not None
    assert one_min.success_rate < 0.3
    assert week.success_rate > 0.95
    assert week.cost_per_success_micros == pytest.approx(500_000 * 2020 / 2000, rel=0.02)
    assert 0 < week.success_lower_bound < week.success_rate


def test_health_windows_predict_the_p95_not_the_mean() -> None:
    """Two streams with the same mean latency, one steady and one with a 10% tail 6x as slow:
    the means agree, the predicted p95 of the tail is about 4x the steady one's."""
    steady, tailed = HealthWindows(), HealthWindows()
    for i in range(400):
        steady.observe(True, latency_s=100.0, cost_micros=0, at=float(i))
        tailed.observe(True, latency_s=400.0 if i % 10 == 0 else 200.0 / 3, cost_micros=0, at=i)
    a, b = steady.stats(Window.FIFTEEN_MINUTES, 400.0), tailed.stats(Window.FIFTEEN_MINUTES, 400.0)
    assert a.mean_latency_s == pytest.approx(100.0, rel=0.02)
    assert b.mean_latency_s == pytest.approx(100.0, rel=0.02)
    assert a.p95_latency_s == pytest.approx(100.0, rel=0.08)  # half a bucket
    assert b.p95_latency_s == pytest.approx(400.0, rel=0.08)


def test_a_decayed_p95_forgets_an_old_tail_like_its_window() -> None:
    """A slow spell ages out of the 1-minute quantiles within minutes and stays in the day's."""
    health = HealthWindows()
    for i in range(100):
        health.observe(True, latency_s=600.0, cost_micros=0, at=float(i))
    t = 100.0
    for _ in range(300):
        health.observe(True, latency_s=30.0, cost_micros=0, at=t)
        t += 1.0
    minute, day = health.stats(Window.ONE_MINUTE, t), health.stats(Window.ONE_DAY, t)
    assert minute.p95_latency_s == pytest.approx(30.0, rel=0.08)
    assert day.p95_latency_s == pytest.approx(600.0, rel=0.08)


@settings(max_examples=examples(60, long=300), deadline=None)
@given(
    samples=st.lists(st.floats(0.01, 1e6, allow_nan=False), min_size=1, max_size=200),
    q=st.floats(0.01, 0.99),
)
def test_decayed_quantiles_stay_within_a_bucket_of_the_exact_quantile(
    samples: list[float], q: float
) -> None:
    """Samples at one instant (no decay): the estimate lies within half a bucket of the
    exact order statistics around q (half a bucket), clamped to the histogram's range, and
    grows with q."""
    sketch = DecayedQuantiles(60.0)
    for x in samples:
        sketch.observe(x, 0.0)
    got = sketch.quantile(q)
    assert got is not None
    ordered = sorted(min(max(x, DecayedQuantiles.LOW), DecayedQuantiles.HIGH) for x in samples)
    rank = q * len(ordered)
    lo = ordered[max(0, math.ceil(rank) - 1)]
    hi = ordered[min(len(ordered) - 1, math.ceil(rank))]
    half = math.sqrt(DecayedQuantiles.RATIO)
    assert lo / half <= got * (1 + 1e-9)
    assert got <= hi * half * (1 + 1e-9)
    assert sketch.quantile(min(0.99, q + 0.005)) >= got  # type: ignore[operator]  # not None: samples exist


def test_an_error_burst_moves_the_success_figure_before_the_routing_window_does() -> None:
    """An hour of successes, then six failures within 30 s: the 15-minute window's lower bound
    has barely moved, but `routing_success` reads the 1-minute window's and drops near 0; one
    failure among a few calls, or a quiet minute, leaves the routing window's figure."""
    health = HealthWindows()
    t = 0.0
    for _ in range(120):
        health.observe(True, latency_s=60, cost_micros=0, at=t)
        t += 30
    calm = routing_success(
        health.stats(Window.FIFTEEN_MINUTES, t), health.stats(Window.ONE_MINUTE, t)
    )
    assert calm == health.stats(Window.FIFTEEN_MINUTES, t).success_lower_bound
    one_off = HealthWindows()
    for i in range(60):
        one_off.observe(i != 59, latency_s=60, cost_micros=0, at=float(i))
    fifteen = one_off.stats(Window.FIFTEEN_MINUTES, 60.0)
    assert routing_success(fifteen, one_off.stats(Window.ONE_MINUTE, 60.0)) == (
        fifteen.success_lower_bound
    )
    for _ in range(6):
        t += 5
        health.observe(False, latency_s=None, cost_micros=0, at=t)
    fifteen, minute = health.stats(Window.FIFTEEN_MINUTES, t), health.stats(Window.ONE_MINUTE, t)
    assert fifteen.success_lower_bound > 0.6  # the routing window alone still trusts it
    assert routing_success(fifteen, minute) == minute.success_lower_bound
    assert routing_success(fifteen, minute) < 0.3


def test_hysteresis_keeps_incumbent_within_delta() -> None:
    """A rival better by less than delta keeps the incumbent; by delta or more it switches."""
    kw = {"delta": 0.05, "dwell_s": 60.0, "now": 1_000.0, "incumbent_since": 0.0}
    keep = choose_with_hysteresis([("a", 0.70), ("b", 0.74)], "a", **kw)
    assert (keep.chosen, keep.switched, keep.reason) == ("a", False, "within_hysteresis")
    switch = choose_with_hysteresis([("a", 0.70), ("b", 0.75)], "a", **kw)
    assert (switch.chosen, switch.switched) == ("b", True)


def test_hysteresis_respects_min_dwell() -> None:
    """During the dwell time even a much better rival waits."""
    decision = choose_with_hysteresis(
        [("a", 0.2), ("b", 0.9)], "a", delta=0.05, dwell_s=60, now=100, incumbent_since=50
    )
    assert (decision.chosen, decision.reason) == ("a", "min_dwell")


def test_hysteresis_drops_filtered_incumbent() -> None:
    """An incumbent removed by hard filters is replaced at once, dwell or not."""
    decision = choose_with_hysteresis(
        [("b", 0.4)], "a", delta=0.05, dwell_s=600, now=100, incumbent_since=90
    )
    assert (decision.chosen, decision.switched) == ("b", True)


def test_bucket_is_stable_and_spread() -> None:
    """Buckets come from sha256: fixed across runs and roughly uniform."""
    assert bucket("task-123", 10_000) == bucket("task-123", 10_000)
    expected = int.from_bytes(hashlib.sha256(b"tenant-a").digest()[:8], "big") % 100
    assert bucket("tenant-a", 100) == expected
    counts = [0] * 10
    for i in range(10_000):
        counts[bucket(f"task-{i}", 10)] += 1
    assert min(counts) > 900
    assert max(counts) < 1100


@given(st.text(max_size=40), st.integers(1, 1_000_000))
def test_bucket_in_range(key: str, buckets: int) -> None:
    """Every key maps into [0, buckets)."""
    assert 0 <= bucket(key, buckets) < buckets


_KEYS = [f"tenant-{i}" for i in range(10_000)]


@settings(max_examples=examples(20, long=100), deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=6, unique=True),
    st.text(min_size=1, max_size=12),
)
def test_a_near_tie_newcomer_takes_only_its_share_of_keys(band: list[str], newcomer: str) -> None:
    """Adding one candidate to a near-tie band of N moves about 1/(N+1) of 10,000 tenant keys,
    every one of them to the newcomer (a modulo over the band moved about N/(N+1))."""
    assume(newcomer not in band)
    before = [band[rendezvous(k, band)] for k in _KEYS]
    grown = [*band, newcomer]
    after = [grown[rendezvous(k, grown)] for k in _KEYS]
    moved = [(b, a) for b, a in zip(before, after, strict=True) if b != a]
    assert all(a == newcomer for _, a in moved)
    assert len(moved) / len(_KEYS) <= 1 / (len(band) + 1) + 0.03


@given(st.text(max_size=40), st.lists(st.text(max_size=8), min_size=1, max_size=8, unique=True))
def test_rendezvous_ignores_the_order_of_the_band(key: str, band: list[str]) -> None:
    """The member a key goes to does not depend on how the band was ordered."""
    chosen = band[rendezvous(key, band)]
    assert list(reversed(band))[rendezvous(key, list(reversed(band)))] == chosen


def test_canary_shares_follow_ladder() -> None:
    """Canary shares step 0.5% → 2% → 5% → 10%."""
    plan = CanaryPlan()
    assert [plan.canary_share(s) for s in range(4)] == [0.005, 0.02, 0.05, 0.10]


@given(st.integers(0, 9_999), st.integers(0, 10**9), st.integers(0, 3))
def test_canary_never_admits_strict_or_high_value(bucket_no: int, value: int, stage: int) -> None:
    """STRICT tasks and tasks above the value threshold are never exploration samples."""
    share = CanaryPlan().canary_share(stage)
    assert not admit_to_canary(bucket_no, True, value, 5_000_000, share=share)
    if value > 5_000_000:
        assert not admit_to_canary(bucket_no, False, value, 5_000_000, share=share)


def test_canary_admits_about_its_share() -> None:
    """Ordinary tasks are admitted in proportion to the stage share."""
    plan = CanaryPlan()
    admitted = sum(plan.admits(f"t{i}", 1, is_strict=False, value_micros=1) for i in range(20_000))
    assert 300 <= admitted <= 500  # 2% of 20k = 400


def test_canary_advances_only_when_all_gates_pass() -> None:
    """Passing metrics advance a stage; the last stage promotes; thin evidence holds."""
    plan = CanaryPlan()
    assert plan.evaluate(0, GOOD_METRICS).stage == 1
    assert plan.evaluate(3, GOOD_METRICS).action is CanaryAction.PROMOTE
    thin = CanaryMetrics(10, 1.0, 10.0, 0.0, 1.0, 1.0)
    assert plan.evaluate(0, thin).action is CanaryAction.HOLD
    unsampled = CanaryMetrics(500, 1.0, 10.0, 0.0, 1.0, None)
    assert plan.evaluate(0, unsampled).action is CanaryAction.HOLD


@pytest.mark.parametrize(
    ("change", "gate"),
    [
        ({"success_rate": 0.90}, "success_rate"),
        ({"p95_latency_s": 900.0}, "p95_latency"),
        ({"cost_per_success_micros": 9_000_000}, "cost_per_success"),
        ({"safety_failure_rate": 0.1}, "safety_failure_rate"),
        ({"quality_pass_rate": 0.5}, "quality_pass_rate"),
    ],
)
def test_canary_rolls_back_on_any_breached_gate(change: dict[str, Any], gate: str) -> None:
    """Breaching any single gate rolls the canary back and names the gate."""
    metrics = dataclasses.replace(GOOD_METRICS, **change)
    decision = CanaryPlan().evaluate(2, metrics)
    assert decision.action is CanaryAction.ROLLBACK
    assert decision.failed_gates == (gate,)


def test_policy_carries_version_and_anti_oscillation_settings() -> None:
    """A routing policy is versioned and carries hysteresis, dwell and canary config."""
    policy = RoutingPolicy(
        version="2025-06-01.1",
        hysteresis_delta=0.04,
        min_dwell_s=120,
        canary=CanaryConfig(value_threshold_micros=1_000_000),
    )
    assert policy.version == "2025-06-01.1"
    assert policy.weights_for("default").total == pytest.approx(1.0)
    assert policy.canary.value_threshold_micros == 1_000_000
