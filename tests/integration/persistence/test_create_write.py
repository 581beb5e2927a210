"""The CreateTask write (`persistence._create`): one statement on PostgreSQL, idempotent under
concurrent creators with reservations, and SQLite's engine settings and in-process writer queue."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event, func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.domain.money import BillingPolicy, InsufficientCredit, Reservation
from controlplane.persistence import ledger
from controlplane.persistence.database import Database
from controlplane.persistence.models import credit_ledger, generation_tasks, outbox, task_events
from tests.integration.persistence.builders import NOW, make_spec
from vidroute_core.exceptions import IdempotencyConflict

POSTPAID = BillingPolicy.parse("postpaid")
PREPAID = BillingPolicy.parse("prepaid")


async def _count(engine: AsyncEngine, table: Any) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


def _statements(engine: AsyncEngine) -> list[str]:
    seen: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _record(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append(statement)

    return seen


@pytest.mark.parametrize("backend", [pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_create_is_one_statement_on_postgresql(db: Database, engine: AsyncEngine) -> None:
    """On PostgreSQL a new task with a postpaid reservation is one statement (task, event,
    outbox, RESERVE); a replay of its key two (the insert that does nothing, the read)."""
    seen = _statements(engine)
    reservation = Reservation(1_500_000, "USD", POSTPAID)
    async with db.unit(NOW) as u:
        task, created = await u.create_task(
            make_spec(), idempotency_key="one", spec_hash="h", reservation=reservation
        )
    assert created
    assert len(seen) == 1, seen
    async with db.unit(NOW) as u:
        again, created_again = await u.create_task(
            make_spec(), idempotency_key="one", spec_hash="h", reservation=reservation
        )
    assert (again.id, created_again) == (task.id, False)
    assert len(seen) == 3, seen
    assert await _count(engine, task_events) == 1
    assert await _count(engine, outbox) == 1
    async with engine.connect() as conn:
        entry = await ledger.reservation_of(conn, task.id)
    assert entry is not None
    assert (entry.amount_micros, entry.currency, entry.tenant_id) == (1_500_000, "USD", "tenant-a")
    assert entry.idempotency_key == f"reserve:{task.id}"


async def test_created_record_equals_the_stored_row(db: Database) -> None:
    """The record CreateTask returns without reading the row back is the row as stored."""
    async with db.unit(NOW) as u:
        made, _ = await u.create_task(
            make_spec(), idempotency_key="same", spec_hash="h", trace_context="00-ab-cd-01"
        )
    async with db.unit(NOW) as u:
        stored = await u.task(made.id, lock=False)
    assert stored == made


async def test_concurrent_creators_with_reservations_reserve_once(
    database_url: str, engine: AsyncEngine
) -> None:
    """Twenty creators of one key on separate engines, each with a reservation (postpaid and
    prepaid with credit): one task, one event, one outbox message, one RESERVE entry; the ones
    with another spec hash get IdempotencyConflict, the rest the winner's task."""
    async with Database(engine).unit(NOW) as u:
        await ledger.append_credit(u.conn, "tenant-a", 10_000_000, "USD", "c1", "ops", "", NOW)
    dbs = [Database.from_url(database_url) for _ in range(20)]

    async def create(i: int, one: Database) -> object:
        policy = PREPAID if i % 2 else POSTPAID
        try:
            async with one.unit(NOW) as u:
                return await u.create_task(
                    make_spec(),
                    idempotency_key="race",
                    spec_hash="other" if i % 5 == 4 else "h",
                    reservation=Reservation(1_000_000, "USD", policy),
                )
        except IdempotencyConflict as exc:
            return exc

    try:
        results = await asyncio.gather(*(create(i, one) for i, one in enumerate(dbs)))
    finally:
        await asyncio.gather(*(one.dispose() for one in dbs))
    made = [r for r in results if isinstance(r, tuple)]
    conflicts = [r for r in results if isinstance(r, IdempotencyConflict)]
    assert len({task.id for task, _ in made}) == 1
    winner_hash = made[0][0].spec_hash
    assert sum(created for _, created in made) == 1
    # Whichever hash won, every creator with the other one conflicted.
    assert len(conflicts) == (16 if winner_hash == "other" else 4)
    for table in (generation_tasks, task_events, outbox):
        assert await _count(engine, table) == 1
    async with engine.connect() as conn:
        kinds = (await conn.execute(select(credit_ledger.c.kind))).scalars().all()
    assert sorted(kinds) == ["CREDIT", "RESERVE"]


async def test_prepaid_refusal_writes_nothing(db: Database, engine: AsyncEngine) -> None:
    """A prepaid tenant without the credit gets InsufficientCredit and no row is left."""
    with pytest.raises(InsufficientCredit):
        async with db.unit(NOW) as u:
            await u.create_task(
                make_spec(),
                idempotency_key="broke",
                spec_hash="h",
                reservation=Reservation(1, "USD", PREPAID),
            )
    for table in (generation_tasks, task_events, outbox, credit_ledger):
        assert await _count(engine, table) == 0


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_sqlite_connections_use_wal_and_a_busy_timeout(engine: AsyncEngine) -> None:
    """Every SQLite connection is in WAL mode with a busy timeout of 30 s."""
    async with engine.connect() as conn:
        assert (await conn.scalar(text("PRAGMA journal_mode"))) == "wal"
        assert (await conn.scalar(text("PRAGMA busy_timeout"))) == 30_000
        assert (await conn.scalar(text("PRAGMA foreign_keys"))) == 1


async def test_many_concurrent_writers_all_commit(
    database_url: str, db: Database, engine: AsyncEngine
) -> None:
    """Sixty concurrent CreateTasks on one Database plus a second Database on the same file
    (another process's view) all commit: writers queue, none fails with 'database is locked'."""
    other = Database.from_url(database_url)

    async def create(i: int) -> bool:
        target = other if i % 3 == 0 else db
        async with target.unit(NOW) as u:
            _, created = await u.create_task(make_spec(), idempotency_key=f"w{i}", spec_hash="h")
        return created

    try:
        results = await asyncio.gather(*(create(i) for i in range(60)))
    finally:
        await other.dispose()
    assert all(results)
    assert await _count(engine, generation_tasks) == 60
    assert await _count(engine, outbox) == 60


@pytest.mark.parametrize("backend", [pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_one_statement_unit_runs_outside_a_transaction(
    db: Database, engine: AsyncEngine
) -> None:
    """On PostgreSQL a `one_statement` unit sends its create without BEGIN/COMMIT: the task is
    visible to another connection before the block ends; in an ordinary unit it is not."""
    async with db.unit(NOW, one_statement=True) as u:
        await u.create_task(make_spec(), idempotency_key="auto", spec_hash="h")
        assert await _count(engine, generation_tasks) == 1
    async with db.unit(NOW) as u:
        await u.create_task(make_spec(), idempotency_key="tx", spec_hash="h")
        assert await _count(engine, generation_tasks) == 1
    assert await _count(engine, generation_tasks) == 2
