"""Scale-out: control-plane replicas on one PostgreSQL split the dispatcher shards.

Each replica is `build_scheduling` with ``shard_count=4`` (in process, its own leadership
session); tenants hash to shards (`scoring.bucket`), each task is dispatched once, by the
leader of its tenant's shard, and a replica that stops hands its shards to the other.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from controlplane.domain.scoring import bucket, example_policy
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.database import Database
from controlplane.scheduling.dispatcher import DispatcherConfig
from controlplane.scheduling.runtime import SchedulingRuntime, build_scheduling
from controlplane.scheduling.upkeep import UpkeepConfig
from tests.integration.scheduling.observe import AttemptWatch, attempt_counts, eventually
from tests.integration.scheduling.support import NOW, CompilingAdapter, make_spec
from tests.integration.scheduling.test_dispatcher import new_task

pytestmark = pytest.mark.postgres

SHARDS = 4


# PostgreSQL only (shard leadership is PostgreSQL advisory locks): the tests that take
# `pg_url` run on that backend alone
# (`ON_POSTGRES`) instead of being collected on SQLite and skipped.
ON_POSTGRES = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)


@pytest.fixture
def pg_url(database_url: str) -> str:
    assert database_url.startswith("postgresql"), database_url
    return database_url


def tenants_covering_every_shard(per_shard: int = 2) -> list[str]:
    found: dict[int, list[str]] = {s: [] for s in range(SHARDS)}
    n = 0
    while any(len(v) < per_shard for v in found.values()):
        tenant = f"tenant-{n}"
        shard = bucket(tenant, SHARDS)
        if len(found[shard]) < per_shard:
            found[shard].append(tenant)
        n += 1
    return [t for ts in found.values() for t in ts]


def replica(
    name: str, db: Database, pg_url: str, leases: MemoryLeaseStore, adapter: CompilingAdapter
) -> SchedulingRuntime:
    """One control-plane replica's scheduling, as `bootstrap` wires it (in process), on the
    replicas' one shared `leases` (as two processes on one Redis; built fail closed like the
    runtime's own, whose wake-up hooks are each process's and not modelled here)."""
    runtime = build_scheduling(
        db=db,
        database_url=pg_url,
        leases=lambda **_hooks: leases,
        adapters=adapter.for_providers(["runway", "google", "self_hosted"]),  # type: ignore[arg-type]  # a compile-only double of AdapterClient
        policy=example_policy("router-v17"),
        config=DispatcherConfig(shard_count=SHARDS, poll_interval_s=0.05, leader_retry_s=0.1),
        upkeep_config=UpkeepConfig(interval_s=3600),  # leases are freed by AttemptWatch here
        worker_id=name,
    )
    for d in runtime.dispatchers:
        d._clock = lambda: NOW  # the suite's tasks and catalog live at NOW
    return runtime


def led(runtime: SchedulingRuntime) -> set[int]:
    return set(runtime.led_shards)


def taken(runtime: SchedulingRuntime) -> dict[int, int]:
    """shard -> tasks this replica's dispatcher of that shard took off the queue."""
    return {d.config.shard: d.dispatched for d in runtime.dispatchers}


@ON_POSTGRES
async def test_two_replicas_split_the_shards_and_dispatch_each_task_once_by_its_leader(
    pg_url: str, db: Database, published: None, adapter: CompilingAdapter
) -> None:
    leases = MemoryLeaseStore(fail_closed=True)
    a = replica("a", db, pg_url, leases, adapter)
    b = replica("b", db, pg_url, leases, adapter)
    try:
        a.start()
        await eventually(lambda: led(a) == set(range(SHARDS)))  # alone: A leads every shard
        b.start()
        await eventually(lambda: len(led(a)) == 2 and len(led(b)) == 2)  # B joins: 2 and 2
        a_shards, b_shards = led(a), led(b)
        assert a_shards.isdisjoint(b_shards)

        tenants = tenants_covering_every_shard()
        async with AttemptWatch(db, leases) as watch:
            tasks = [
                await new_task(db, make_spec(t), key=f"{t}-{i}") for i in range(3) for t in tenants
            ]
            a.wake()
            b.wake()
            await eventually(lambda: {t.id for t in tasks} <= set(watch.counts))
        # A dispatcher counts what it took after its round's transaction committed: the
        # attempts can be seen a moment before the counters.
        await eventually(lambda: sum(taken(a).values()) + sum(taken(b).values()) >= len(tasks))
        counts = await attempt_counts(db)
        assert all(counts[t.id] == 1 for t in tasks), counts  # each task dispatched once
        assert led(a) == a_shards
        assert led(b) == b_shards
        per_shard = {
            s: sum(1 for t in tasks if bucket(t.tenant_id, SHARDS) == s) for s in range(SHARDS)
        }
        for mine, other in ((a, b), (b, a)):
            for shard in led(mine):
                # Only the leader of a tenant's shard takes its tasks off the queue.
                assert taken(mine)[shard] >= per_shard[shard] > 0
                assert taken(other)[shard] == 0

        # A stops: its session ends, its advisory locks go, and B leads every shard.
        before, before_b = taken(a), taken(b)
        await a.stop()
        await eventually(lambda: led(b) == set(range(SHARDS)))
        async with AttemptWatch(db, leases) as watch:
            late = [
                await new_task(db, make_spec(t), key=f"{t}-late")
                for t in tenants
                if bucket(t, SHARDS) in a_shards
            ]
            b.wake()
            await eventually(lambda: {t.id for t in late} <= set(watch.counts))
        await eventually(lambda: sum(taken(b).values()) - sum(before_b.values()) >= len(late))
        counts = await attempt_counts(db)
        assert all(counts[t.id] == 1 for t in late)
        assert taken(a) == before
        assert all(taken(b)[s] > 0 for s in a_shards)  # B's dispatchers of A's shards did them
    finally:
        await a.stop()
        await b.stop()


@ON_POSTGRES
async def test_a_killed_replica_session_frees_its_shards(
    pg_url: str, db: Database, published: None, adapter: CompilingAdapter
) -> None:
    """A replica whose PostgreSQL session dies (crash, partition) loses every shard at once;
    the other replica takes them without any unlock."""
    from tests.integration.scheduling.test_leader import kill_session

    leases = MemoryLeaseStore(fail_closed=True)
    a = replica("a", db, pg_url, leases, adapter)
    b = replica("b", db, pg_url, leases, adapter)
    try:
        a.start()
        await eventually(lambda: led(a) == set(range(SHARDS)))
        leadership = a.leadership
        assert leadership is not None
        assert leadership.session.backend_pid is not None
        # A "crashes": it stops trying to lead, and its session is terminated under it.
        for d in a.dispatchers:

            async def never() -> bool:
                return False

            d.leader.try_acquire = never  # type: ignore[method-assign]  # the test swaps in a recording or failing double
        await kill_session(pg_url, leadership.session.backend_pid)
        b.start()
        await eventually(lambda: led(b) == set(range(SHARDS)))
        await eventually(lambda: not led(a))
    finally:
        await a.stop()
        await b.stop()


async def test_health_windows_and_incumbents_are_shared_through_redis(
    redis_server_url: str,
) -> None:
    """What one replica observes, another scores on; a replica started later rebuilds them."""
    import secrets
    import time

    from controlplane.domain.breaker import (
        BreakerConfig,
        BreakerKey,
        BreakerRegistry,
        Operation,
    )
    from controlplane.domain.routing.candidates import Incumbent
    from controlplane.scheduling.health import HealthMonitor
    from controlplane.scheduling.shared_state import RedisSharedState

    prefix = f"test-{secrets.token_hex(4)}"  # a private namespace on the shared server
    client = aioredis.from_url(redis_server_url)

    def monitor() -> HealthMonitor:
        return HealthMonitor(
            BreakerRegistry(BreakerConfig(), time.time),
            shared=RedisSharedState(client, prefix=prefix),
        )

    key = BreakerKey("runway", "prod-us", "us", "gen4_turbo", Operation.SUBMIT)
    cid = "runway/gen4_turbo/prod-us"
    one, two = monitor(), monitor()
    try:
        for n in range(30):
            one.observe_generation(key, succeeded=n % 3 != 0, duration_s=40.0, cost_micros=500)
        await one.flush_observations()
        assert two.health_view(cid) is None  # nothing seen locally
        await two.sync()  # its first: reads the shared state at once
        mine, theirs = one.health_view(cid), two.health_view(cid)
        assert mine is not None
        assert theirs is not None
        assert theirs.samples == pytest.approx(mine.samples, rel=1e-3)  # both decay with the clock
        assert theirs.success_lower_bound == pytest.approx(
            mine.success_lower_bound, rel=1e-3
        )  # both decay with the clock
        assert theirs.mean_latency_s == pytest.approx(40.0)

        group = ("tenant-a", "STANDARD", "TEXT_TO_VIDEO")
        one.incumbents[group] = Incumbent(cid, 1_000.0)
        await asyncio.gather(*one._pending)
        await two.sync_windows(force=True)
        assert two.incumbents.get(group) == Incumbent(cid, 1_000.0)

        # A replica that starts later (or takes a shard over) rebuilds from the stream.
        three = monitor()
        await three.sync_windows(force=True)
        rebuilt = three.health_view(cid)
        assert rebuilt is not None
        assert rebuilt.samples == pytest.approx(mine.samples, rel=1e-3)  # both decay with the clock
        assert three.incumbents.get(group) == Incumbent(cid, 1_000.0)
        # Its own echo is not counted twice: a second sync of `one` changes nothing.
        await one.sync_windows(force=True)
        again = one.health_view(cid)
        assert again is not None
        assert again.samples == pytest.approx(mine.samples, rel=1e-3)
    finally:
        keys = [k async for k in client.scan_iter(f"{prefix}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the embedded default
def test_on_sqlite_one_process_dispatches_every_tenant_whatever_the_shard_count(
    database_url: str, db: Database, adapter: CompilingAdapter
) -> None:
    runtime = build_scheduling(
        db=db,
        database_url=database_url,
        leases=MemoryLeaseStore,
        adapters=adapter.for_providers(["runway"]),  # type: ignore[arg-type]  # a compile-only double of AdapterClient
        policy=example_policy("router-v17"),
        config=DispatcherConfig(shard_count=SHARDS),
    )
    assert len(runtime.dispatchers) == 1
    assert runtime.leadership is None
    assert runtime.dispatcher.config.shard_count == 1  # no tenant filtered out
