"""Polling is driven by the due-time index (design 9.18.2, 9.20): a job not due is not polled,
due ones are claimed and polled earliest first, and two workers claiming batches on one
PostgreSQL at once never take one attempt twice (``FOR UPDATE SKIP LOCKED``)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from controlplane.domain.states import AttemptState
from controlplane.persistence.database import Database
from controlplane.persistence.models import attempt_runtime as R
from controlplane.persistence.models import task_attempts as A
from tests.integration.execution.exec_harness import Harness

pytestmark = pytest.mark.asyncio


async def _accepted(harness: Harness, count: int) -> list[int]:
    """`count` attempts submitted through the submit worker: ACCEPTED, job recorded."""
    account = await harness.account()
    ids = [(await harness.task_with_attempt(account_id=account)).id for _ in range(count)]
    engine = harness.engine(concurrency=1)
    while await engine.submitter.run_once():
        pass
    for attempt_id in ids:
        assert (await harness.attempt(attempt_id)).state is AttemptState.ACCEPTED
    return ids


async def _set_due(harness: Harness, due: dict[int, float | None]) -> None:
    """Set each attempt's next poll to now + seconds (None: nothing due)."""
    now = harness.clock()
    async with harness.db.unit(now) as u:
        for attempt_id, seconds in due.items():
            at = None if seconds is None else now + timedelta(seconds=seconds)
            task_id = (await u.attempt(attempt_id)).task_id  # type: ignore[union-attr]  # the attempt was just created, never None
            await u.set_runtime(attempt_id, task_id, next_poll_at=at)


async def _next_poll(harness: Harness, attempt_id: int) -> object:
    async with harness.db.reading() as conn:
        return await conn.scalar(select(R.c.next_poll_at).where(R.c.attempt_id == attempt_id))


async def test_claim_takes_only_due_polls_earliest_first(harness: Harness) -> None:
    a, b, c, d, e = await _accepted(harness, 5)
    await _set_due(harness, {a: 60.0, b: -10.0, c: -30.0, d: None, e: -20.0})
    # e is due but its attempt left the pollable states: the index row alone is not enough.
    async with harness.db.engine.begin() as conn:
        await conn.execute(update(A).where(A.c.id == e).values(status=AttemptState.SUCCEEDED.value))
    async with harness.db.unit(harness.clock()) as u:
        first = await u.claim_polls("w1", limit=1, lease_s=30.0)
    async with harness.db.unit(harness.clock()) as u:
        rest = await u.claim_polls("w1", limit=10, lease_s=30.0)
    assert first == [c]  # the earliest due
    assert rest == [b]  # then the next; a (not due), d (no due time), e (not pollable) never
    # The claim pushed the claimed rows' due time past the lease; the not-due one is untouched.
    assert await _next_poll(harness, c) == harness.clock() + timedelta(seconds=30)
    assert await _next_poll(harness, a) == harness.clock() + timedelta(seconds=60)


async def test_poller_polls_due_jobs_in_due_order_and_not_the_rest(harness: Harness) -> None:
    ids = await _accepted(harness, 4)
    late, early, middle, later = ids
    await _set_due(harness, {late: 120.0, early: -50.0, middle: -5.0, later: 300.0})
    jobs = {}
    for attempt_id in ids:
        snap = await harness.reads.snapshot(attempt_id)
        assert snap is not None
        assert snap[1] is not None
        jobs[snap[1].provider_job_id] = attempt_id
    engine = harness.engine(concurrency=1)
    harness.fake.get_job_calls.clear()
    assert await engine.poller.run_once() == 2
    assert [jobs[j.provider_job_id] for j in harness.fake.get_job_calls] == [early, middle]
    assert await engine.poller.run_once() == 0  # the others are not due yet
    # Past `late`'s time (and the polled ones' next, a few seconds on), never `later`'s.
    harness.clock.advance(121)
    harness.fake.get_job_calls.clear()
    assert await engine.poller.run_once() == 3
    polled = [jobs[j.provider_job_id] for j in harness.fake.get_job_calls]
    assert sorted(polled) == sorted([early, middle, late])
    assert polled[-1] == late  # due at +120 s, after the others' rescheduled polls


@pytest.mark.postgres
async def test_two_workers_batch_claims_never_take_one_attempt_twice(
    fresh_postgres_url: str,
) -> None:
    """Two workers (own pools) claim batches of 7 at once until nothing is due: every due
    attempt is claimed exactly once, and both workers got some."""
    from tests.integration.execution.exec_harness import _harness

    async with _harness(fresh_postgres_url) as harness:
        ids = [(await harness.task_with_attempt()).id for _ in range(120)]  # an account each
        async with harness.db.engine.begin() as conn:
            await conn.execute(
                update(A).where(A.c.id.in_(ids)).values(status=AttemptState.RUNNING.value)
            )
        await _set_due(harness, {attempt_id: -float(i % 13) for i, attempt_id in enumerate(ids)})
        workers = [Database.from_url(fresh_postgres_url) for _ in range(2)]
        claimed: list[list[int]] = [[], []]
        holding = [asyncio.Event(), asyncio.Event()]

        async def claim_all(n: int) -> None:
            while True:
                async with workers[n].unit(harness.clock()) as u:
                    got = await u.claim_polls(f"w{n}", limit=7, lease_s=600.0)
                    if not holding[n].is_set():
                        # The first batches overlap for sure: each worker keeps its row locks
                        # until the other one has claimed too (a loaded machine would otherwise
                        # let one worker take everything before the other starts).
                        holding[n].set()
                        await asyncio.wait_for(holding[1 - n].wait(), timeout=60)
                    await asyncio.sleep(0)  # hold the row locks while the other one claims
                if not got:
                    return
                claimed[n].extend(got)

        try:
            await asyncio.gather(claim_all(0), claim_all(1))
        finally:
            for db in workers:
                await db.dispose()
        every = claimed[0] + claimed[1]
        assert sorted(every) == sorted(ids)  # each exactly once
        assert claimed[0]
        assert claimed[1]
