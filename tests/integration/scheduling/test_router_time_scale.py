"""The router's own durations scale with the time factor, like every other timing (issue 26)."""

from __future__ import annotations

import pytest

from controlplane.adapters.fake import FakeAdapterClient
from controlplane.domain.routing.selection import RouterConfig
from controlplane.domain.scoring import example_policy
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.database import Database
from controlplane.scheduling.runtime import build_scheduling


@pytest.mark.parametrize("factor", [1.0, 0.1])
async def test_latency_thresholds_follow_the_time_scale(
    db: Database, database_url: str, factor: float
) -> None:
    """At factor f the latency score's good and bad bounds are f times the production ones,
    so a scaled deployment does not score every candidate's latency 1.00."""
    runtime = build_scheduling(
        db=db,
        database_url=database_url,
        leases=MemoryLeaseStore,
        adapters={"runway": FakeAdapterClient()},
        policy=example_policy("router-time-scale"),
        time_scale=factor,
    )
    shipped = RouterConfig(policy=example_policy("router-time-scale"))
    for dispatcher in runtime.dispatchers:
        assert dispatcher.router.latency_good_s == pytest.approx(shipped.latency_good_s * factor)
        assert dispatcher.router.latency_bad_s == pytest.approx(shipped.latency_bad_s * factor)
