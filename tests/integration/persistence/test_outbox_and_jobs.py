"""The outbox hands each message to one worker at a time; provider jobs are never overwritten."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest

from controlplane.domain.states import AttemptState
from controlplane.persistence.database import Database
from controlplane.persistence.errors import DuplicateRecord
from controlplane.persistence.records import (
    NewOutboxMessage,
    NewProviderJob,
    OutboxRecord,
    ProviderJobRecord,
)
from controlplane.persistence.tasks import TaskQueries
from tests.integration.persistence.builders import NOW, Scenario
from vidroute_core.exceptions import NotFound


async def _enqueue(db: Database, message: NewOutboxMessage) -> int:
    async with db.unit(NOW) as u:
        return await u.enqueue(message)


async def _claim(
    db: Database, topic: str, worker: str, now: datetime, limit: int = 10
) -> list[OutboxRecord]:
    async with db.unit(now) as u:
        return await u.claim_messages(topic, worker, limit=limit, lease_seconds=30)


async def _complete(db: Database, message_id: int, worker: str, now: datetime) -> bool:
    async with db.unit(now) as u:
        return await u.complete_message(message_id, worker)


async def _record_job(
    db: Database, job: NewProviderJob, now: datetime
) -> tuple[ProviderJobRecord, bool]:
    async with db.unit(now) as u:
        return await u.insert_job(job)


async def test_claim_complete_and_expiry(db: Database) -> None:
    """A claimed message is hidden until its lease expires, and a completed one never returns."""
    first = await _enqueue(db, NewOutboxMessage("t", "1", {"n": 1}))
    second = await _enqueue(db, NewOutboxMessage("t", "2", {"n": 2}))
    later = await _enqueue(db, NewOutboxMessage("t", "3", available_at=NOW + timedelta(hours=1)))
    claimed = await _claim(db, "t", "w1", NOW)
    assert [(m.id, m.claimed_by, m.attempts) for m in claimed] == [
        (first, "w1", 1),
        (second, "w1", 1),
    ]
    assert await _claim(db, "t", "w2", NOW) == []

    assert await _complete(db, first, "w1", NOW)
    assert not await _complete(db, second, "w2", NOW)  # not w2's claim
    expired = NOW + timedelta(seconds=31)
    reclaimed = await _claim(db, "t", "w2", expired)
    assert [(m.id, m.attempts) for m in reclaimed] == [(second, 2)]
    assert not await _complete(db, second, "w1", expired)  # w1 lost it
    async with db.unit(expired) as u:
        assert await u.retry_message(second, "w2", available_at=expired + timedelta(hours=2))

    due_later = await _claim(db, "t", "w3", NOW + timedelta(hours=1))
    assert [m.id for m in due_later] == [later]


async def test_concurrent_claimers_never_share_a_message(database_url: str, db: Database) -> None:
    """Two workers claiming in parallel on separate engines get disjoint sets covering all."""
    ids = {await _enqueue(db, NewOutboxMessage("jobs", str(i))) for i in range(60)}
    dbs = [Database.from_url(database_url) for _ in range(2)]
    claimed: dict[str, list[int]] = {"a": [], "b": []}

    async def worker(name: str, worker_db: Database) -> None:
        while True:
            batch = await _claim(worker_db, "jobs", name, NOW, limit=7)
            if not batch:
                return
            claimed[name].extend(m.id for m in batch)

    try:
        await asyncio.gather(worker("a", dbs[0]), worker("b", dbs[1]))
    finally:
        await asyncio.gather(*(one.dispose() for one in dbs))
    assert set(claimed["a"]).isdisjoint(claimed["b"])
    assert sorted(claimed["a"] + claimed["b"]) == sorted(ids)


async def test_insert_job_is_idempotent(
    db: Database, tasks: TaskQueries, scenario: Scenario
) -> None:
    """Recording the same job twice returns the stored row; the second call creates nothing."""
    attempt = await scenario.attempt()
    job = NewProviderJob(
        attempt_id=attempt.id,
        provider_account_id=attempt.provider_account_id,
        provider_job_id="rw-123",
        normalized_status=AttemptState.ACCEPTED,
        submitted_at=NOW,
        raw_status="PENDING",
    )
    first, created = await _record_job(db, job, NOW)
    again, created_again = await _record_job(db, job, NOW + timedelta(seconds=1))
    assert (created, created_again) == (True, False)
    assert again == first
    detail = await tasks.get_task(attempt.task_id)
    assert detail is not None
    assert detail.provider_jobs == (first,)


async def test_provider_job_is_never_overwritten(db: Database, scenario: Scenario) -> None:
    """Another job id for the attempt, or the job id on another attempt, raises DuplicateRecord."""
    account = await scenario.account()
    a1 = await scenario.attempt(account)
    a2 = await scenario.attempt(account)

    def job(attempt_id: int, job_id: str) -> NewProviderJob:
        return NewProviderJob(attempt_id, account, job_id, AttemptState.ACCEPTED, NOW)

    await _record_job(db, job(a1.id, "rw-1"), NOW)
    with pytest.raises(DuplicateRecord):
        await _record_job(db, job(a1.id, "rw-2"), NOW)
    with pytest.raises(DuplicateRecord):
        await _record_job(db, job(a2.id, "rw-1"), NOW)
    with pytest.raises(NotFound):
        await _record_job(db, job(10_000, "rw-9"), NOW)


async def test_ping(db: Database) -> None:
    """ping round-trips to a reachable database without raising."""
    await db.ping()
