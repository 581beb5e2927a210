"""Batched dispatch (issue 10, design 9.10/9.12/9.20): parked capacity waits, two dispatchers
on one PostgreSQL, and a batch whose transaction fails."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Sequence
from typing import Any

import pytest
from redis.asyncio import Redis
from sqlalchemy import func, select, text

from controlplane.domain.breaker import (
    BreakerConfig,
    BreakerKey,
    BreakerRegistry,
    BreakerState,
)
from controlplane.domain.breaker import Operation as Op
from controlplane.leases.base import Lease, LeaseRequest
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.leases.windows import WindowRefusal
from controlplane.persistence.database import Database
from controlplane.persistence.models import generation_tasks, route_decisions, task_attempts
from controlplane.persistence.models import task_events as events_table
from controlplane.scheduling.dispatcher import Dispatcher, DispatcherConfig, DispatchOutcome
from controlplane.scheduling.gather import lease_dimensions
from controlplane.scheduling.health import HealthMonitor
from tests.integration.scheduling.conftest import DispatcherFactory
from tests.integration.scheduling.support import CompilingAdapter, make_spec, strict
from tests.integration.scheduling.test_dispatcher import new_task
from tests.integration.scheduling.test_fair_dispatch import POSTGRES_ONLY, bulk_queue

WAIT_S = 10.0  # deadline for a condition, never a sleep
GEN45 = BreakerKey("runway", "prod-us", "us", "gen4.5", Op.SUBMIT)
QUIET = DispatcherConfig(poll_interval_s=3_600.0, park_recheck_s=3_600.0)


async def count(db: Database, table: Any, task_id: int | None = None) -> int:
    query = select(func.count()).select_from(table)
    if task_id is not None:
        query = query.where(table.c.task_id == task_id)
    async with db.reading() as conn:
        return int(await conn.scalar(query) or 0)


async def state_of(db: Database, task_id: int) -> str:
    async with db.reading() as conn:
        found = await conn.scalar(
            select(generation_tasks.c.status).where(generation_tasks.c.id == task_id)
        )
    return str(found)


async def until(check: Any, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not await check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def fill(leases: MemoryLeaseStore, dispatcher: Dispatcher, model: str) -> list[Lease]:
    """Hold every slot of `model`'s candidates with real leases (other holders' attempts)."""
    held: list[Lease] = []
    for c in (await dispatcher.catalog()).candidates:
        if c.model != model:
            continue
        dims = lease_dimensions(c, dispatcher.config.default_concurrency)
        for i in range(dims[-1].capacity):
            lease = await leases.acquire(
                LeaseRequest(f"holder-{c.id}-{i}", c.lease_account, dims, ttl_ms=600_000)
            )
            assert lease is not None
            held.append(lease)
    return held


async def test_a_parked_task_writes_nothing_until_a_lease_is_released(
    db: Database,
    adapter: CompilingAdapter,
    make_dispatcher: DispatcherFactory,
) -> None:
    """A task whose only model is full gets one NO_CAPACITY decision; further rounds route,
    compile and write nothing (no decision, no event); when one holder releases its lease the
    dispatcher, sleeping an hour-long poll interval, is woken and dispatches it at once."""
    # The store tells the dispatcher (built next) of freed slots, as `build_scheduling` wires it.
    leases = MemoryLeaseStore(
        on_freed=lambda account: dispatcher.capacity_freed(account)  # noqa: PLW0108 - built next
    )
    dispatcher = make_dispatcher(config=QUIET, leases=leases)
    held = await fill(leases, dispatcher, "gen4.5")
    task = await new_task(db, make_spec(**strict("gen4.5")))
    assert await dispatcher.tick() == 1
    assert await state_of(db, task.id) == "QUEUED"
    decisions, events = await count(db, route_decisions, task.id), await count(db, events_table)
    calls = len(adapter.compile_calls)
    assert decisions == 1
    for _ in range(4):
        assert await dispatcher.tick() == 0  # passed over: parked
    assert await count(db, route_decisions, task.id) == decisions
    assert await count(db, events_table) == events
    assert len(adapter.compile_calls) == calls

    rounds = 0
    original = dispatcher.tick

    async def counted() -> int:
        nonlocal rounds
        done = await original()
        rounds += 1
        return done

    dispatcher.tick = counted  # type: ignore[method-assign]  # the test swaps in a recording or failing double

    async def paused() -> bool:  # its first round is over: next it sleeps the poll interval
        return rounds >= 1

    stop = asyncio.Event()
    runner = asyncio.create_task(dispatcher.run(stop))
    try:
        await until(paused, "the loop's first round")
        assert await state_of(db, task.id) == "QUEUED"
        assert await leases.release(held[0])

        async def dispatched() -> bool:
            return await state_of(db, task.id) == "SUBMITTING"

        await until(dispatched, "the woken task's attempt")
    finally:
        stop.set()
        dispatcher.wake()
        await asyncio.wait_for(runner, WAIT_S)
    assert await count(db, task_attempts, task.id) == 1
    assert await count(db, route_decisions, task.id) == 2


async def test_a_woken_task_finding_the_same_wait_stores_no_second_decision(
    db: Database, leases: MemoryLeaseStore, make_dispatcher: DispatcherFactory
) -> None:
    """A parked task woken by a release that frees nothing it can use (another holder took
    the slot first) routes again but stores no second decision: the outcome did not change."""
    dispatcher = make_dispatcher(config=QUIET)
    held = await fill(leases, dispatcher, "gen4.5")
    task = await new_task(db, make_spec(**strict("gen4.5")))
    await dispatcher.tick()
    assert await leases.release(held[0])
    dispatcher.capacity_freed(held[0].account)
    again = await leases.acquire(
        LeaseRequest("someone-else", held[0].account, held[0].dimensions, ttl_ms=600_000)
    )
    assert again is not None
    assert await dispatcher.tick() == 1  # woken and routed again
    assert await count(db, route_decisions, task.id) == 1
    assert await state_of(db, task.id) == "QUEUED"


async def test_a_task_parked_on_an_open_breaker_is_woken_when_it_closes(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """A task pinned to a model whose breaker is forced OPEN waits parked (rounds pass it
    over); closing the breaker wakes it through the monitor's hook and the next round
    dispatches it."""
    # The monitor tells the dispatcher (built next) of recovered breakers, as `build_scheduling`
    # wires it.
    monitor = HealthMonitor(
        BreakerRegistry(BreakerConfig(), clock=time.time),
        db=db,
        on_recovered=lambda key: dispatcher.breaker_recovered(key),  # noqa: PLW0108 - built next
    )
    dispatcher = make_dispatcher(config=QUIET, monitor=monitor)
    await dispatcher.catalog()
    await monitor.force(GEN45, BreakerState.OPEN, "incident")
    task = await new_task(db, make_spec(**strict("gen4.5")))
    assert await dispatcher.tick() == 1
    assert task.id in dispatcher.parking
    assert await dispatcher.tick() == 0
    await monitor.force(GEN45, BreakerState.CLOSED, "fixed")
    assert task.id not in dispatcher.parking
    assert await dispatcher.tick() == 1
    assert await state_of(db, task.id) == "SUBMITTING"


class SlowLeases(MemoryLeaseStore):
    """A lease store whose batch acquire waits for a gate: a slow old leader's round."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def admit_many(
        self, requests: Sequence[LeaseRequest]
    ) -> list[Lease | WindowRefusal | None]:
        self.entered.set()
        await self.gate.wait()
        return await super().admit_many(requests)


async def doubled(db: Database) -> list[tuple[int, int]]:
    async with db.reading() as conn:
        rows = await conn.execute(
            select(task_attempts.c.task_id, func.count())
            .group_by(task_attempts.c.task_id)
            .having(func.count() > 1)
        )
        return [(int(t), int(n)) for t, n in rows]


@POSTGRES_ONLY
async def test_a_slow_old_leader_cannot_dispatch_what_the_new_one_did(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """The old leader routes a batch and stalls before leasing; the new leader dispatches the
    same tasks; the old one's commit then claims nothing, writes nothing and releases every
    lease it took: one attempt per task (by SQL)."""
    await bulk_queue(db, "A", 12)
    slow = SlowLeases()
    old = make_dispatcher(leases=slow)
    new = make_dispatcher(leases=MemoryLeaseStore())
    stalled = asyncio.create_task(old.tick())
    await asyncio.wait_for(slow.entered.wait(), WAIT_S)
    assert await new.tick() > 0
    attempts = await count(db, task_attempts)
    assert attempts > 0
    slow.gate.set()
    await asyncio.wait_for(stalled, WAIT_S)
    assert await count(db, task_attempts) == attempts
    assert await doubled(db) == []
    for c in (await old.catalog()).candidates:
        for d in lease_dimensions(c, old.config.default_concurrency):
            assert await slow.used(c.lease_account, d.key) == 0


@POSTGRES_ONLY
async def test_two_dispatchers_running_rounds_together_never_dispatch_a_task_twice(
    db: Database, make_dispatcher: DispatcherFactory
) -> None:
    """Two leaders by force, each with its own lease store, run rounds concurrently over one
    backlog (capacity freed between rounds): no task ever gets two attempts (by SQL), and every
    SUBMITTING task has exactly one."""
    await bulk_queue(db, "A", 150, users=3)
    await bulk_queue(db, "B", 150, users=3)
    stores = [MemoryLeaseStore(), MemoryLeaseStore()]
    pair = [make_dispatcher(leases=s, config=DispatcherConfig(batch_size=32)) for s in stores]
    outcomes: list[DispatchOutcome] = []
    for d in pair:
        original = d.dispatch_batch

        async def counting(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            results = await _original(*args, **kwargs)
            outcomes.extend(r.outcome for r in results)
            return results

        d.dispatch_batch = counting  # type: ignore[method-assign]  # the test swaps in a recording or failing double
    for _ in range(6):
        await asyncio.gather(*(d.tick() for d in pair))
        for store in stores:  # the providers finished: every slot is free again
            store.forget_everything()
    assert await doubled(db) == []
    async with db.reading() as conn:
        submitting = await conn.scalar(
            select(func.count())
            .select_from(generation_tasks)
            .where(generation_tasks.c.status == "SUBMITTING")
        )
    assert submitting == await count(db, task_attempts)
    assert DispatchOutcome.SELECTED in outcomes


@pytest.mark.redis
async def test_a_batch_whose_transaction_fails_releases_every_lease_it_took(
    db: Database,
    backend: str,
    redis_server_url: str,
    make_dispatcher: DispatcherFactory,
) -> None:
    """A trigger refuses one attempt row of the batch: the round raises, nothing of the batch
    is written, every task is still QUEUED, and every Redis counter is back at zero."""
    tasks = [await new_task(db, make_spec(), key=f"k{i}") for i in range(6)]
    victim = tasks[3].id
    async with db.unit(tasks[0].created_at) as u:
        if backend == "postgresql":
            await u.conn.execute(
                text(
                    "CREATE FUNCTION refuse_attempt() RETURNS trigger LANGUAGE plpgsql AS $$ "
                    f"BEGIN IF NEW.task_id = {victim} THEN RAISE EXCEPTION 'injected'; END IF; "
                    "RETURN NEW; END $$"
                )
            )
            await u.conn.execute(
                text(
                    "CREATE TRIGGER refuse BEFORE INSERT ON task_attempts FOR EACH ROW "
                    "EXECUTE FUNCTION refuse_attempt()"
                )
            )
        else:
            await u.conn.execute(
                text(
                    "CREATE TRIGGER refuse BEFORE INSERT ON task_attempts "
                    f"WHEN NEW.task_id = {victim} BEGIN SELECT RAISE(ABORT, 'injected'); END"
                )
            )
    client = Redis.from_url(redis_server_url)
    namespace = f"vrtest:{secrets.token_hex(6)}:"
    store = RedisLeaseStore(client, namespace=namespace)
    try:
        dispatcher = make_dispatcher(leases=store)
        taken: list[int] = []
        original = store.admit_many

        async def spying(requests: Sequence[LeaseRequest]) -> list[Lease | WindowRefusal | None]:
            got = await original(requests)
            taken.append(sum(1 for g in got if isinstance(g, Lease)))
            return got

        store.admit_many = spying  # type: ignore[method-assign]  # the test swaps in a recording or failing double
        with pytest.raises(Exception, match="injected"):
            await dispatcher.tick()
        assert sum(taken) == len(tasks)  # the whole batch was leased before the write
        counters = 0
        for c in (await dispatcher.catalog()).candidates:
            for d in lease_dimensions(c, dispatcher.config.default_concurrency):
                counters += 1
                assert await store.used(c.lease_account, d.key) == 0
        assert counters > 0
        assert await count(db, task_attempts) == 0
        for t in tasks:
            assert await state_of(db, t.id) == "QUEUED"
            assert await count(db, route_decisions, t.id) == 0
    finally:
        keys = [k async for k in client.scan_iter(match=f"{namespace}*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
