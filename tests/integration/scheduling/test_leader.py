"""Leader election on PostgreSQL: one dispatcher leads; another takes over when its session dies."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from controlplane.domain.states import TaskState
from controlplane.persistence.database import Database
from controlplane.persistence.tasks import TaskQueries
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig
from controlplane.scheduling.leader import PostgresAdvisoryLock
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import make_spec
from tests.integration.scheduling.test_dispatcher import new_task

pytestmark = pytest.mark.postgres


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 20.0) -> None:
    """Poll `check` until it holds or the deadline passes."""
    async with asyncio.timeout(timeout_s):
        while not await check():  # noqa: ASYNC110 - database state has no event to await
            await asyncio.sleep(0.05)


async def kill_session(url: str, pid: int) -> None:
    engine = create_async_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid})
    finally:
        await engine.dispose()


# PostgreSQL only (advisory locks are PostgreSQL's): the tests that take `pg_url` run
# on that backend alone
# (`ON_POSTGRES`) instead of being collected on SQLite and skipped.
ON_POSTGRES = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)


@pytest.fixture
def pg_url(database_url: str) -> str:
    assert database_url.startswith("postgresql"), database_url
    return database_url


@ON_POSTGRES
async def test_advisory_lock_has_one_holder_and_is_freed_by_a_dead_session(pg_url: str) -> None:
    """Only one lock holder at a time; terminating its session lets the other acquire."""
    first, second = PostgresAdvisoryLock(pg_url, "shard-x"), PostgresAdvisoryLock(pg_url, "shard-x")
    try:
        assert await first.try_acquire()
        assert not await second.try_acquire()
        assert first.backend_pid is not None
        await kill_session(pg_url, first.backend_pid)
        assert not await first.still_held()

        async def second_wins() -> bool:
            return await second.try_acquire()

        await eventually(second_wins)
        assert not await first.try_acquire()
    finally:
        await first.close()
        await second.close()


@ON_POSTGRES
async def test_only_the_leader_dispatches_and_a_standby_takes_over(
    pg_url: str, db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """Two dispatchers on one database: one dispatches; after its session dies the other does."""
    config = DispatcherConfig(poll_interval_s=0.05, leader_retry_s=0.05)
    one: Dispatcher = make_dispatcher(leader=PostgresAdvisoryLock(pg_url, "s0"), config=config)
    two: Dispatcher = make_dispatcher(leader=PostgresAdvisoryLock(pg_url, "s0"), config=config)
    for i in range(3):
        await new_task(db, make_spec(f"t{i}"), key=f"k{i}")
    stops = {id(one): asyncio.Event(), id(two): asyncio.Event()}
    runs = {id(d): asyncio.create_task(d.run(stops[id(d)])) for d in (one, two)}
    try:

        async def all_dispatched() -> bool:
            return one.dispatched + two.dispatched == 3

        await eventually(all_dispatched)
        leader, standby = (one, two) if one.leading else (two, one)
        assert not standby.leading
        assert leader.dispatched == 3
        assert standby.dispatched == 0
        # The leader "crashes": its session dies, and it neither unlocks nor comes back.
        lock = leader.leader
        assert isinstance(lock, PostgresAdvisoryLock)
        assert lock.backend_pid is not None

        async def never() -> bool:
            return False

        async def silently() -> None:
            return None

        lock.try_acquire = never  # type: ignore[method-assign]  # the test swaps in a recording or failing double
        lock.release = silently  # type: ignore[method-assign]  # the test swaps in a recording or failing double
        await kill_session(pg_url, lock.backend_pid)
        late = await new_task(db, make_spec("late"), key="late")

        async def standby_took_over() -> bool:
            detail = await TaskQueries(db).get_task(late.id)
            moved = detail is not None and detail.task.state is TaskState.SUBMITTING
            return moved and standby.dispatched == 1

        await eventually(standby_took_over)
        assert standby.leading
        assert not leader.leading
    finally:
        for event in stops.values():
            event.set()
        await asyncio.gather(*runs.values(), return_exceptions=True)
        for d in (one, two):
            await d.leader.close()  # type: ignore[attr-defined]  # a PostgresAdvisoryLock has close; LeaderLock does not
