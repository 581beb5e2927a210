"""The scheduler rebuilds the leases of PostgreSQL's holders before admitting work (9.11.2).

The dispatcher and upkeep run over a real Redis lease store (fail closed) and a real database;
"Redis lost its data" is every key of the test's namespace deleted, as FLUSHALL would.
"""

from __future__ import annotations

from collections import Counter

import pytest
from redis.asyncio import Redis
from sqlalchemy import select

from controlplane.capabilities.catalog import CapabilityCatalog
from controlplane.domain.states import IN_FLIGHT_ATTEMPT_STATES, AttemptState, TaskState
from controlplane.execution.leasing import LeaseKeeper
from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.persistence.database import Database
from controlplane.persistence.models import lease_audit_events
from controlplane.persistence.records import AttemptRecord
from controlplane.persistence.tasks import TaskQueries
from controlplane.scheduling.dispatcher import Dispatcher
from controlplane.scheduling.upkeep import Upkeep
from tests.integration.scheduling.conftest import (
    DispatcherFactory,
    adapter,
    catalogs,
    make_dispatcher,
    monitor,
    published,
)
from tests.integration.scheduling.support import NOW, make_spec, strict
from tests.integration.scheduling.test_dispatcher import new_task

__all__ = [
    "adapter",
    "catalogs",
    "make_dispatcher",
    "monitor",
    "published",
]

pytestmark = pytest.mark.redis
GEN45_CAPACITY = 2  # runway gen4.5 max_concurrency in the shipped capability file


@pytest.fixture
def leases(redis_client: Redis, redis_namespace: str) -> RedisLeaseStore:
    """The Redis lease store as the scheduling runtime runs it: fail closed."""
    return RedisLeaseStore(redis_client, namespace=redis_namespace, fail_closed=True)


async def _flush(redis_client: Redis, namespace: str) -> None:
    keys = [key async for key in redis_client.scan_iter(match=f"{namespace}*")]
    assert keys, "the namespace should hold lease keys before the flush"
    await redis_client.delete(*keys)


def wired(
    db: Database,
    leases: RedisLeaseStore,
    make_dispatcher: DispatcherFactory,
    *,
    rebuild_first: bool = True,
) -> tuple[Dispatcher, Upkeep]:
    """A dispatcher and an upkeep over `leases`, the upkeep's rebuild run before each round
    (unless not `rebuild_first`) as the runtime wires them: both whole when built."""
    built: list[Dispatcher] = []

    async def catalog() -> CapabilityCatalog:
        return await built[0].catalog()

    def wake() -> None:
        built[0].wake()

    upkeep = Upkeep(
        db=db,
        leases=leases,
        catalog=catalog,
        is_leader=lambda: True,
        wake=wake,
        worker_id="rebuild-test",
        clock=lambda: NOW,
    )
    built.append(make_dispatcher(before_admit=upkeep.ensure_leases_live if rebuild_first else None))
    return built[0], upkeep


async def _attempts(db: Database, task_ids: list[int]) -> list[AttemptRecord]:
    out: list[AttemptRecord] = []
    for task_id in task_ids:
        detail = await TaskQueries(db).get_task(task_id)
        assert detail is not None
        out.extend(detail.attempts)
    return out


async def _move(db: Database, attempt: AttemptRecord, *states: AttemptState) -> AttemptRecord:
    for state in states:
        async with db.unit(NOW) as u:
            moved = await u.move_attempt(attempt, state)
        assert moved is not None, f"attempt {attempt.id} -> {state}"
        attempt = moved
    return attempt


def _in_flight_per_model(attempts: list[AttemptRecord]) -> Counter[str]:
    return Counter(a.provider_model for a in attempts if a.state in IN_FLIGHT_ATTEMPT_STATES)


async def test_flush_then_rebuild_keeps_in_flight_within_capacity(
    db: Database,
    leases: RedisLeaseStore,
    make_dispatcher: DispatcherFactory,
    redis_client: Redis,
    redis_namespace: str,
) -> None:
    """After a flush the next round rebuilds the holders' leases first and admits nothing over."""
    dispatcher, upkeep = wired(db, leases, make_dispatcher)
    first = [(await new_task(db, make_spec(**strict("gen4.5")), f"k{i}")).id for i in range(2)]
    assert await dispatcher.tick() == 2
    running, unknown = await _attempts(db, first)
    running = await _move(db, running, AttemptState.SUBMITTING, AttemptState.RUNNING)
    unknown = await _move(db, unknown, AttemptState.SUBMITTING, AttemptState.SUBMIT_UNKNOWN)
    later = [(await new_task(db, make_spec(**strict("gen4.5")), f"l{i}")).id for i in range(3)]

    assert (upkeep.rebuilds, upkeep.leases_restored) == (1, 0)  # the first round, fresh store

    await _flush(redis_client, redis_namespace)
    await dispatcher.tick()

    assert (upkeep.rebuilds, upkeep.leases_restored) == (2, 2)
    attempts = await _attempts(db, first + later)
    assert _in_flight_per_model(attempts) == {"gen4.5": 2}
    assert len(attempts) == 2  # nothing admitted over the rebuilt holders
    for task_id in later:
        detail = await TaskQueries(db).get_task(task_id)
        assert detail is not None
        assert detail.task.state is TaskState.QUEUED
    (account,) = {lease.account for lease in (await leases.snapshot("runway:prod-us")).leases}
    assert await leases.used(account, "model:gen4.5") == GEN45_CAPACITY
    assert await leases.unknown_used(account) == 1
    async with db.reading() as conn:
        audited = {
            (row.dimension, row.delta) for row in await conn.execute(select(lease_audit_events))
        }
    assert (f"{account}/model:gen4.5 (rebuilt leases)", 2) in audited
    assert (f"{account}/unknown_submission_slots (rebuilt leases)", 1) in audited

    # The rebuilt leases carry the attempts' own tokens: the holder's release finds its lease.
    finished = await _move(db, running, AttemptState.SUCCEEDED)
    assert await LeaseKeeper(leases).release(finished) is True
    assert await dispatcher.tick() >= 1
    attempts = await _attempts(db, first + later)
    assert _in_flight_per_model(attempts) + Counter(
        a.provider_model for a in attempts if a.state is AttemptState.READY_TO_SUBMIT
    ) == {"gen4.5": 2}
    assert unknown.state is AttemptState.SUBMIT_UNKNOWN


async def test_fail_closed_store_admits_nothing_until_rebuilt(
    db: Database,
    leases: RedisLeaseStore,
    make_dispatcher: DispatcherFactory,
    redis_client: Redis,
    redis_namespace: str,
) -> None:
    """Without the rebuild, a round after the flush leases nothing and the tasks stay queued."""
    dispatcher, upkeep = wired(db, leases, make_dispatcher, rebuild_first=False)
    await upkeep.ensure_leases_live()
    first = [(await new_task(db, make_spec(**strict("gen4.5")), f"k{i}")).id for i in range(2)]
    assert await dispatcher.tick() == 2
    for attempt in await _attempts(db, first):
        await _move(db, attempt, AttemptState.SUBMITTING, AttemptState.RUNNING)
    # Both run at the provider; after the flush the store would read gen4.5 as free.
    await _flush(redis_client, redis_namespace)
    later = (await new_task(db, make_spec(**strict("gen4.5")), "later")).id

    await dispatcher.tick()

    detail = await TaskQueries(db).get_task(later)
    assert detail is not None
    assert detail.attempts == ()
    assert detail.task.state is TaskState.QUEUED
    assert leases.metrics.rejected_not_live >= 1
    assert await leases.accounts() != []  # the refused acquire registered the account again
