"""Scheduler upkeep: leases are repaired towards PostgreSQL and audited; wake-ups are drained."""

from __future__ import annotations

from sqlalchemy import select

from controlplane.domain.outbox import Topic
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.persistence.database import Database
from controlplane.persistence.models import lease_audit_events, outbox
from controlplane.persistence.tasks import TaskQueries
from controlplane.scheduling.dispatcher import Dispatcher
from controlplane.scheduling.upkeep import Upkeep
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import NOW, make_spec
from tests.integration.scheduling.test_dispatcher import new_task


def _upkeep(
    db: Database, leases: MemoryLeaseStore, dispatcher: Dispatcher, woken: list[int]
) -> Upkeep:
    return Upkeep(
        db=db,
        leases=leases,
        catalog=dispatcher.catalog,
        is_leader=lambda: True,
        wake=lambda: woken.append(1),
        worker_id="upkeep-test",
        clock=lambda: NOW,
    )


async def _audit_rows(db: Database) -> list[tuple[str, int, int, int]]:
    async with db.reading() as conn:
        rows = await conn.execute(
            select(
                lease_audit_events.c.dimension,
                lease_audit_events.c.expected,
                lease_audit_events.c.actual,
                lease_audit_events.c.delta,
            )
        )
        return [tuple(r) for r in rows]


async def test_counters_lost_by_the_lease_store_are_rebuilt_from_postgres(
    db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory
) -> None:
    """After the store forgets a live attempt's slots, upkeep restores them and audits it."""
    await new_task(db, make_spec())
    dispatcher = make_dispatcher()
    assert await dispatcher.tick() == 1
    detail = await TaskQueries(db).get_task(1)
    assert detail is not None
    (attempt,) = detail.attempts
    async with db.unit(NOW) as u:
        await u.move_attempt(attempt, type(attempt.state).SUBMITTING)
    (account,) = await leases.accounts()
    before = await leases.snapshot(account)
    for dimension in before.used:
        await leases.set_used(account, dimension, 0)

    drifts = await _upkeep(db, leases, dispatcher, []).reconcile_leases()

    assert drifts
    assert all(d.delta == 1 for d in drifts)
    after = await leases.snapshot(account)
    assert after.used == before.used
    audited = await _audit_rows(db)
    assert {(row[1], row[2], row[3]) for row in audited} == {(1, 0, 1)}


async def test_consistent_leases_need_no_correction(
    db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory
) -> None:
    """When the store matches PostgreSQL, reconciliation changes nothing and writes no audit."""
    await new_task(db, make_spec())
    dispatcher = make_dispatcher()
    assert await dispatcher.tick() == 1
    assert await _upkeep(db, leases, dispatcher, []).reconcile_leases() == []
    assert await _audit_rows(db) == []


async def test_queue_wakeups_are_completed_and_wake_the_dispatcher(
    db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory
) -> None:
    """task.queued messages are marked done once and the dispatcher is woken."""
    await new_task(db, make_spec(), "a")
    await new_task(db, make_spec(), "b")
    woken: list[int] = []
    upkeep = _upkeep(db, leases, make_dispatcher(), woken)
    assert await upkeep.drain_queue_messages() == 2
    assert await upkeep.drain_queue_messages() == 0
    assert woken == [1]
    async with db.reading() as conn:
        pending = await conn.execute(
            select(outbox.c.id).where(outbox.c.topic == Topic.QUEUED, outbox.c.done_at.is_(None))
        )
        assert pending.all() == []
