"""Breakers fed by execution outcomes, forced by operators, shared by replicas, all audited."""

from __future__ import annotations

import secrets
import time

import pytest
import redis.asyncio as aioredis

from controlplane.api import provider_views
from controlplane.domain.breaker import BreakerConfig, BreakerKey, BreakerRegistry, BreakerState
from controlplane.domain.breaker import Operation as Op
from controlplane.domain.exceptions import InvalidSpec
from controlplane.persistence.catalog_store import CatalogStore
from controlplane.persistence.repository import Store
from controlplane.scheduling.health import HealthMonitor
from controlplane.scheduling.shared_state import InProcessSharedState, RedisSharedState
from controlplane.service.providers import ForceBreakerInput, ProviderAdminService
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import make_spec
from tests.integration.scheduling.test_dispatcher import new_task

GEN45 = BreakerKey("runway", "prod-us", "us", "gen4.5", Op.SUBMIT)


def force(state: BreakerState | None, reason: str = "incident 42") -> ForceBreakerInput:
    return ForceBreakerInput("runway", "prod-us", "us", "gen4.5", "SUBMIT", state, reason)


async def test_force_breaker_is_recorded_and_blocks_routing(
    store: Store,
    catalog_store: CatalogStore,
    monitor: HealthMonitor,
    make_dispatcher: DispatcherFactory,
) -> None:
    """ForceBreaker OPEN is persisted, shown as forced, and makes the candidate CIRCUIT_OPEN."""
    dispatcher = make_dispatcher()
    await dispatcher.catalog()
    admin = ProviderAdminService(catalog_store, monitor)
    status = await admin.force_breaker(force(BreakerState.OPEN))
    assert status.state is BreakerState.OPEN
    assert status.forced
    (event,) = await catalog_store.health_events()
    assert (event.operation, event.old_state, event.new_state) == ("SUBMIT", "CLOSED", "OPEN")
    assert event.reason == "forced:incident 42"
    assert event.model == "gen4.5"
    task = await new_task(store, make_spec())
    result = await dispatcher.dispatch(task)
    assert result.decision is not None
    assert result.decision.verdict("runway/gen4.5/prod-us").reason == "CIRCUIT_OPEN"
    released = await admin.force_breaker(force(None, "fixed"))
    assert released.state is BreakerState.HALF_OPEN
    assert not released.forced
    assert next(e.reason for e in await catalog_store.health_events()) == "forced:released:fixed"
    health = await admin.provider_health("runway")
    assert provider_views.breaker(health[0]).state == provider_views.breaker_state(
        BreakerState.HALF_OPEN
    )


async def test_force_breaker_validates_its_input(
    catalog_store: CatalogStore, monitor: HealthMonitor
) -> None:
    """A missing reason or an unknown operation is rejected before anything changes."""
    admin = ProviderAdminService(catalog_store, monitor)
    with pytest.raises(InvalidSpec):
        await admin.force_breaker(force(BreakerState.OPEN, reason=" "))
    assert await catalog_store.health_events() == []


async def test_outcomes_trip_the_breaker_and_replicas_adopt_it(
    catalog_store: CatalogStore, make_dispatcher: DispatcherFactory
) -> None:
    """Consecutive retryable failures open the breaker, persist it, and a peer replica follows."""
    await make_dispatcher().catalog()
    shared = InProcessSharedState()
    config = BreakerConfig(consecutive_failures=3)
    mine = HealthMonitor(BreakerRegistry(config, time.time), events=catalog_store, shared=shared)
    peer = HealthMonitor(BreakerRegistry(config, time.time), events=catalog_store, shared=shared)
    for _ in range(3):
        await mine.record_outcome(GEN45, "PROVIDER_OVERLOADED", 1.5)
    await mine.record_outcome(GEN45, "INVALID_INPUT", 0.1)  # not endpoint evidence
    assert mine.open_reason(GEN45) is not None
    events = await catalog_store.health_events()
    assert [(e.new_state, e.reason) for e in events] == [("OPEN", "consecutive_failures")]
    await peer.sync()
    assert peer.open_reason(GEN45) is not None
    assert len(await catalog_store.health_events()) == 1  # mirrors are not re-audited
    health = mine.health_view("runway/gen4.5/prod-us")
    assert health is not None
    assert health.success_lower_bound == 0.0


@pytest.mark.redis
async def test_redis_shared_state_carries_forced_overrides(
    catalog_store: CatalogStore, redis_server_url: str, make_dispatcher: DispatcherFactory
) -> None:
    """An override forced on one replica pins the same breaker on another through Redis."""
    await make_dispatcher().catalog()
    client = aioredis.Redis.from_url(redis_server_url)
    prefix = f"test-{secrets.token_hex(4)}"
    try:
        replicas = [
            HealthMonitor(
                BreakerRegistry(BreakerConfig(), time.time),
                events=catalog_store,
                shared=RedisSharedState(client, prefix),
            )
            for _ in range(2)
        ]
        await replicas[0].force(GEN45, BreakerState.OPEN, "maintenance")
        await replicas[1].sync()
        (status,) = replicas[1].statuses("runway")
        assert status.state is BreakerState.OPEN
        assert status.forced
    finally:
        keys = [k async for k in client.scan_iter(f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


async def test_generation_outcomes_feed_the_health_windows() -> None:
    """Finished jobs set the candidate's success bound and mean latency; refused submits count
    as failures without a latency."""
    monitor = HealthMonitor(BreakerRegistry(BreakerConfig(), time.time))
    candidate = "runway/gen4.5/prod-us"
    assert monitor.health_view(candidate) is None
    for _ in range(8):
        monitor.observe_generation(GEN45, succeeded=True, duration_s=40.0)
    healthy = monitor.health_view(candidate)
    assert healthy is not None
    assert healthy.mean_latency_s == pytest.approx(40.0)
    for _ in range(8):
        await monitor.record_outcome(GEN45, "PROVIDER_OVERLOADED", 0.2)
    degraded = monitor.health_view(candidate)
    assert degraded is not None
    assert degraded.success_lower_bound < healthy.success_lower_bound
    assert degraded.mean_latency_s == pytest.approx(40.0)
