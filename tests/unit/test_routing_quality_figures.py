"""The routing-quality benchmark's figures (bench.routing_quality_figures): billing, switches,
oscillations and the oracle's plan, on hand-made task rows."""

from __future__ import annotations

import math

from bench.routing_quality_figures import (
    AttemptRow,
    CandidatePhase,
    TaskRow,
    oracle_phase,
    p95,
    policy_figures,
    switches_and_oscillations,
    weighted_p95,
)

A, B, S = "runway/gen4.5", "google/veo-fast", "self_hosted/wan"


def _task(
    seq: int, phase: str, *attempts: AttemptRow, state: str = "SUCCEEDED", lat: float = 1.0
) -> TaskRow:
    return TaskRow("auto", "all", phase, seq, state, lat, attempts)


def test_failures_cost_what_the_provider_bills() -> None:
    """A failed attempt with no settled cost is billed 0, a succeeded one without a settled
    cost its estimate, and a settled cost always wins."""
    assert AttemptRow(A, "FAILED", 480_000, None).billed_micros == 0
    assert AttemptRow(B, "SUCCEEDED", 600_000, None).billed_micros == 600_000
    assert AttemptRow(S, "FAILED", 11_200, 9_000).billed_micros == 9_000
    tasks = [
        _task(
            0, "p", AttemptRow(A, "FAILED", 480_000, 0), AttemptRow(B, "SUCCEEDED", 600_000, None)
        ),
        _task(1, "p", AttemptRow(A, "FAILED", 480_000, 0), state="FAILED", lat=9.0),
    ]
    figures = policy_figures(tasks, ["p"])
    assert (figures.successes, figures.failures) == (1, 1)
    assert figures.cost_per_success_micros == 600_000
    assert figures.p95_s == 9.0


def test_switches_count_bucket_changes_and_oscillations_returns() -> None:
    """A -> B -> A is two switches and one oscillation; staying put is none."""
    assert switches_and_oscillations([A, A, B, A, A]) == (2, 1)
    assert switches_and_oscillations([A, B, B, S]) == (2, 0)
    assert switches_and_oscillations([A] * 5) == (0, 0)


def test_bucket_choice_is_the_majority_first_candidate() -> None:
    """Each quarter of a phase is represented by the candidate most of its tasks started on."""
    rows = [_task(i, "p", AttemptRow(A if i % 4 else B, "SUCCEEDED", 1, 1)) for i in range(8)]
    figures = policy_figures(rows, ["p"], buckets_per_phase=2)
    assert figures.choices == (A, A)
    assert figures.switches == 0


def test_percentiles() -> None:
    """Nearest-rank p95, and its weighted form for the oracle's mixture."""
    assert p95([float(i) for i in range(1, 101)]) == 95.0
    assert p95([]) == 0.0
    assert weighted_p95([(1.0, 0.9), (10.0, 0.1)]) == 10.0
    assert weighted_p95([(1.0, 0.96), (10.0, 0.04)]) == 1.0


def _measured(name: str, cost: int, lat: float, served: float, tasks: int = 10) -> CandidatePhase:
    return CandidatePhase(name, tasks, tasks, cost * tasks, (lat,) * tasks, served)


def test_oracle_fills_the_cheapest_within_the_bound_up_to_what_it_served() -> None:
    """The saturated cheap candidate takes what it showed it can serve, the cheapest other
    candidate meeting the bound the rest; one over the bound takes nothing."""
    measured = [
        _measured(S, 10_000, 2.0, served=3),
        _measured(A, 480_000, 9.0, served=10),  # too slow for the bound
        _measured(B, 600_000, 3.0, served=10),
    ]
    plan = oracle_phase(measured, demand=10, bound_s=5.0)
    assert plan.shares == {S: 3, B: 7}
    assert math.isclose(plan.cost_micros, 3 * 10_000 + 7 * 600_000)
    assert plan.successes == 10
    paid = oracle_phase(measured, demand=10, bound_s=5.0, allowed=frozenset({"runway", "google"}))
    assert paid.shares == {B: 10}
