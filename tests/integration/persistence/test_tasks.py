"""Creating tasks through the unit of work; reading and listing them through `TaskQueries`."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.domain.outbox import Topic
from controlplane.domain.states import TaskState
from controlplane.persistence.database import Database
from controlplane.persistence.errors import InvalidPageToken
from controlplane.persistence.models import generation_tasks, outbox, task_events
from controlplane.persistence.tasks import TaskQueries
from tests.integration.persistence.builders import NOW, Scenario, make_spec
from vidroute_core.exceptions import IdempotencyConflict


async def _count(engine: AsyncEngine, table: object) -> int:
    async with engine.connect() as conn:
        return int(await conn.scalar(select(func.count()).select_from(table)))  # type: ignore[arg-type]  # table is a Table typed object here


async def test_create_task_writes_task_event_and_outbox(db: Database, tasks: TaskQueries) -> None:
    """A new task is QUEUED at version 0 with one 'task.queued' event and one outbox message."""
    spec = make_spec()
    async with db.unit(NOW) as u:
        task, created = await u.create_task(spec, idempotency_key="k", spec_hash="h")
    assert created
    assert (task.state, task.status_version, task.spec, task.spec_hash) == (
        TaskState.QUEUED,
        0,
        spec,
        "h",
    )
    assert task.created_at == NOW
    events = await tasks.task_events(task.id)
    assert [(e.seq, e.kind) for e in events] == [(1, "task.queued")]
    async with db.unit(NOW) as u:
        claimed = await u.claim_messages(Topic.QUEUED, "w", limit=10, lease_seconds=30)
    assert [m.payload["task_id"] for m in claimed] == [task.id]


async def test_same_key_same_spec_returns_existing_task(db: Database, engine: AsyncEngine) -> None:
    """Replaying (tenant, key) with the same spec hash returns the first task, created=False."""
    async with db.unit(NOW) as u:
        first, _ = await u.create_task(make_spec(), idempotency_key="k", spec_hash="h")
    async with db.unit(NOW + timedelta(seconds=5)) as u:
        again, created = await u.create_task(make_spec(), idempotency_key="k", spec_hash="h")
    assert not created
    assert again == first
    assert await _count(engine, generation_tasks) == 1
    assert await _count(engine, outbox) == 1


async def test_same_key_different_spec_conflicts(db: Database) -> None:
    """Replaying (tenant, key) with a different spec hash raises IdempotencyConflict."""
    async with db.unit(NOW) as u:
        await u.create_task(make_spec(), idempotency_key="k", spec_hash="h1")
    with pytest.raises(IdempotencyConflict) as info:
        async with db.unit(NOW) as u:
            await u.create_task(make_spec(prompt="other"), idempotency_key="k", spec_hash="h2")
    assert (info.value.existing_spec_hash, info.value.requested_spec_hash) == ("h1", "h2")


async def test_same_key_in_another_tenant_is_a_new_task(db: Database) -> None:
    """Idempotency keys are scoped to the tenant."""
    async with db.unit(NOW) as u:
        a, _ = await u.create_task(make_spec("t-a"), idempotency_key="k", spec_hash="h")
    async with db.unit(NOW) as u:
        b, created = await u.create_task(make_spec("t-b"), idempotency_key="k", spec_hash="h")
    assert created
    assert a.id != b.id


async def test_concurrent_creators_with_one_key_make_one_task(
    database_url: str, engine: AsyncEngine
) -> None:
    """Ten concurrent creators with one key (separate engines) leave one row; all get its id."""
    dbs = [Database.from_url(database_url) for _ in range(10)]

    async def create(one: Database) -> tuple[object, bool]:
        async with one.unit(NOW) as u:
            return await u.create_task(make_spec(), idempotency_key="race", spec_hash="h")

    try:
        results = await asyncio.gather(*(create(one) for one in dbs))
    finally:
        await asyncio.gather(*(one.dispose() for one in dbs))
    assert len({task.id for task, _ in results}) == 1  # type: ignore[attr-defined]  # gather's results are the (task, created) pairs
    assert sum(created for _, created in results) == 1
    assert await _count(engine, generation_tasks) == 1
    assert await _count(engine, task_events) == 1
    assert await _count(engine, outbox) == 1


async def test_task_survives_engine_restart(database_url: str) -> None:
    """A created task is read back by a brand-new engine after the first one is disposed."""
    first = Database.from_url(database_url)
    async with first.unit(NOW) as u:
        task, _ = await u.create_task(make_spec(), idempotency_key="k", spec_hash="h")
    await first.dispose()
    second = Database.from_url(database_url)
    try:
        detail = await TaskQueries(second).get_task(task.id)
    finally:
        await second.dispose()
    assert detail is not None
    assert detail.task == task


async def test_get_task_returns_history(tasks: TaskQueries, scenario: Scenario) -> None:
    """get_task returns the task with its attempts, provider jobs and route decisions."""
    attempt = await scenario.attempt()
    detail = await tasks.get_task(attempt.task_id)
    assert detail is not None
    assert detail.task.state is TaskState.SUBMITTING
    assert [a.id for a in detail.attempts] == [attempt.id]
    assert [d.id for d in detail.route_decisions] == [attempt.route_decision_id]
    assert detail.provider_jobs == ()
    assert await tasks.get_task(10_000) is None


async def test_list_tasks_pages_newest_first(tasks: TaskQueries, scenario: Scenario) -> None:
    """Pages walk all tasks newest first without repeats, and the last page has no token."""
    ids = [(await scenario.task()).id for _ in range(7)]
    seen: list[int] = []
    token: str | None = None
    pages = 0
    while True:
        page, token = await tasks.list_tasks(page_size=3, page_token=token)
        seen.extend(t.id for t in page)
        pages += 1
        if token is None:
            break
    assert seen == sorted(ids, reverse=True)
    assert pages == 3


async def test_list_tasks_filters_by_tenant_and_state(
    tasks: TaskQueries, scenario: Scenario
) -> None:
    """Filters narrow the listing, and a token cannot be reused with other filters."""
    a1 = await scenario.task("tenant-a")
    await scenario.task("tenant-b")
    a2 = await scenario.scheduling_task()  # tenant-a, SCHEDULING
    page, token = await tasks.list_tasks(tenant_id="tenant-a", page_size=1)
    assert [t.id for t in page] == [a2.id]
    assert token is not None
    with pytest.raises(InvalidPageToken):
        await tasks.list_tasks(tenant_id="tenant-b", page_token=token)
    with pytest.raises(InvalidPageToken):
        await tasks.list_tasks(page_token="not-a-token")
    queued, _ = await tasks.list_tasks(tenant_id="tenant-a", state=TaskState.QUEUED)
    assert [t.id for t in queued] == [a1.id]
