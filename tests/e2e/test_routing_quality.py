"""The routing-quality benchmark's scenario, small (`bench.routing_quality`; bench/RESULTS.md has
the full run): the whole stack, provider A (Runway) slowed 3x then failing 30% then recovered,
B (Veo) steady and dearer, the self-hosted model saturated; the shipped routing, cheapest-first
and lowest-latency-first side by side in one control plane, each policy a tenant.

It asserts orderings between the policies, never absolute figures: the machine's load moves
every latency, and a few tasks a phase give coarse percentiles.
"""

from __future__ import annotations

from typing import Any

import pytest

from bench import routing_quality
from tests.support.stack import RedisDb

pytestmark = [pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]

TASKS_PER_PHASE = 8  # per policy and variant: 48 tasks a phase, 192 in all
RATE = 1.0  # CreateTask calls a second: below what a control plane at load 20 gets through
TIME_SCALE = 0.05  # a phase is ~48 s, ~16 min of production time: the 15-min window moves


@pytest.mark.timeout(1200)
def test_shipped_routing_against_cheapest_first_under_degradation(
    migrated_postgres_url: str, redis_db: RedisDb
) -> None:
    """Every task of the scenario ends, and the shipped routing counts price: in both variants
    it pays less per success than lowest-latency-first, which pays at least what cheapest-first
    pays. Against cheapest-first itself the shipped routing's cost is not ordered here: Runway
    bills a failed task 0 and failed attempts fail over, so cheapest-first's failures cost it
    time, not money, and the two come within a few percent of each other on paid providers
    (either side, run to run; bench/RESULTS.md: why the 0.85x goal cannot be met here)."""
    figures: Any = routing_quality.run(
        TASKS_PER_PHASE,
        RATE,
        TIME_SCALE,
        redis_db.url,
        database_url=migrated_postgres_url,
        log=lambda *_: None,
    )
    assert figures["still_open"] == 0
    for variant in routing_quality.VARIANTS:
        section = figures[variant]
        for policy in routing_quality.POLICIES:
            assert section[policy]["tasks"] == 4 * TASKS_PER_PHASE, (variant, policy)
        cost = {p: section[p]["cost_per_success_micros"] for p in routing_quality.POLICIES}
        assert cost["cheapest"] <= cost["fastest"], (variant, section)
        assert cost["auto"] < cost["fastest"], (variant, section)
