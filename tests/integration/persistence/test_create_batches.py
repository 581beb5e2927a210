"""Group commit of CreateTask (`persistence.creates`): concurrent creates written together give
each caller what it would get alone, on PostgreSQL in one statement per batch."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.domain.money import BillingPolicies, BillingPolicy
from controlplane.persistence.database import Database
from controlplane.persistence.models import credit_ledger, generation_tasks, outbox, task_events
from controlplane.service.tasks import CreateTaskInput, TaskService
from tests.integration.persistence.builders import NOW, make_spec
from vidroute_core.exceptions import IdempotencyConflict

POSTPAID = BillingPolicies(BillingPolicy.parse("postpaid"))


async def _count(engine: AsyncEngine, table: Any) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


def _service(db: Database) -> TaskService:
    return TaskService(db, clock=lambda: NOW, billing=POSTPAID)


async def test_concurrent_creates_get_what_they_would_alone(
    backend: str, db: Database, engine: AsyncEngine
) -> None:
    """Thirty concurrent creates: 24 new keys, 3 repeats of one key with its spec, 3 with
    another spec, and a key stored before. Each new key is created once with its event,
    outbox message and RESERVE entry; repeats return that task, other specs conflict; on
    PostgreSQL the batch is one statement, plus one read for the key stored before; on SQLite
    one transaction of four INSERTs and that read."""
    service = _service(db)
    before, _ = await service.create_task(CreateTaskInput(make_spec(), "stored"))
    statements: list[str] = []

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def _seen(_c: Any, _cur: Any, statement: str, *_rest: Any) -> None:
        statements.append(statement)

    other = dataclasses.replace(make_spec(), prompt="something else entirely")
    inputs = [CreateTaskInput(make_spec(), f"new-{i}") for i in range(24)]
    inputs += [CreateTaskInput(make_spec(), "new-0") for _ in range(3)]
    inputs += [CreateTaskInput(other, "new-1") for _ in range(2)]
    inputs += [CreateTaskInput(make_spec(), "stored")]
    results = await asyncio.gather(
        *(service.create_task(one) for one in inputs), return_exceptions=True
    )
    sent = list(statements)
    made = results[:24]
    assert all(isinstance(r, tuple) and r[1] for r in made)
    ids = [r[0].id for r in made]  # type: ignore[index]  # the assert above proved each is a tuple
    assert len(set(ids)) == 24
    for repeat in results[24:27]:
        assert isinstance(repeat, tuple)
        assert (repeat[0].id, repeat[1]) == (ids[0], False)
    assert all(isinstance(r, IdempotencyConflict) for r in results[27:29])
    assert isinstance(results[29], tuple)
    assert (results[29][0].id, results[29][1]) == (before.id, False)
    for table in (generation_tasks, task_events, outbox, credit_ledger):
        assert await _count(engine, table) == 25
    if backend == "postgresql":
        assert len(sent) == 2, sent  # the batch, and the read of the key stored before
    else:  # BEGIN IMMEDIATE, tasks, events, outbox, RESERVE entries, the read
        assert len(sent) == 6, sent


@pytest.mark.parametrize("backend", [pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_one_bad_create_fails_only_itself(db: Database, engine: AsyncEngine) -> None:
    """A create PostgreSQL refuses (a NUL in the prompt; the API's validation never lets one
    through) fails its own call; the other creates batched with it are written."""
    service = _service(db)
    bad = dataclasses.replace(make_spec(), prompt="nul \x00 inside")
    inputs = [CreateTaskInput(make_spec(), f"ok-{i}") for i in range(5)]
    inputs.insert(2, CreateTaskInput(bad, "bad"))
    results = await asyncio.gather(
        *(service.create_task(one) for one in inputs), return_exceptions=True
    )
    assert isinstance(results[2], Exception)
    assert all(isinstance(r, tuple) and r[1] for i, r in enumerate(results) if i != 2)
    assert await _count(engine, generation_tasks) == 5
    assert await _count(engine, outbox) == 5


@pytest.mark.parametrize("backend", [pytest.param("postgresql", marks=pytest.mark.postgres)])
async def test_creates_racing_on_engines_of_two_replicas(
    database_url: str, engine: AsyncEngine
) -> None:
    """Two replicas' services batching the same 40 keys at once store each key once, and both
    get the same task for it, one of them created=True."""
    a, b = Database.from_url(database_url), Database.from_url(database_url)
    try:
        first, second = _service(a), _service(b)
        keys = [f"race-{i}" for i in range(40)]
        results = await asyncio.gather(
            *(s.create_task(CreateTaskInput(make_spec(), k)) for k in keys for s in (first, second))
        )
    finally:
        await a.dispose()
        await b.dispose()
    for i in range(40):
        (one, made_one), (two, made_two) = results[2 * i], results[2 * i + 1]
        assert one.id == two.id
        assert made_one + made_two == 1
    assert await _count(engine, generation_tasks) == 40
    assert await _count(engine, credit_ledger) == 40
