"""The outbox hands each message to one worker at a time; provider jobs are never overwritten."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from controlplane.domain.states import AttemptState
from controlplane.persistence.db import create_engine
from controlplane.persistence.errors import DuplicateRecord
from controlplane.persistence.records import NewOutboxMessage, NewProviderJob
from controlplane.persistence.repository import Store
from tests.integration.persistence.builders import NOW, Scenario
from vidroute_core.exceptions import NotFound


async def test_claim_complete_and_expiry(store: Store) -> None:
    """A claimed message is hidden until its lease expires, and a completed one never returns."""
    first = await store.enqueue(NewOutboxMessage("t", "1", {"n": 1}), now=NOW)
    second = await store.enqueue(NewOutboxMessage("t", "2", {"n": 2}), now=NOW)
    later = await store.enqueue(
        NewOutboxMessage("t", "3", available_at=NOW + timedelta(hours=1)), now=NOW
    )
    claimed = await store.claim("t", "w1", limit=10, lease_seconds=30, now=NOW)
    assert [(m.id, m.claimed_by, m.attempts) for m in claimed] == [
        (first, "w1", 1),
        (second, "w1", 1),
    ]
    assert await store.claim("t", "w2", limit=10, lease_seconds=30, now=NOW) == []

    assert await store.complete(first, "w1", now=NOW)
    assert not await store.complete(second, "w2", now=NOW)  # not w2's claim
    expired = NOW + timedelta(seconds=31)
    reclaimed = await store.claim("t", "w2", limit=10, lease_seconds=30, now=expired)
    assert [(m.id, m.attempts) for m in reclaimed] == [(second, 2)]
    assert not await store.complete(second, "w1", now=expired)  # w1 lost it
    assert await store.retry_later(second, "w2", available_at=expired + timedelta(hours=2))

    due_later = await store.claim(
        "t", "w3", limit=10, lease_seconds=30, now=NOW + timedelta(hours=1)
    )
    assert [m.id for m in due_later] == [later]


async def test_concurrent_claimers_never_share_a_message(database_url: str, store: Store) -> None:
    """Two workers claiming in parallel on separate engines get disjoint sets covering all."""
    ids = {await store.enqueue(NewOutboxMessage("jobs", str(i)), now=NOW) for i in range(60)}
    engines = [create_engine(database_url) for _ in range(2)]
    claimed: dict[str, list[int]] = {"a": [], "b": []}

    async def worker(name: str, worker_store: Store) -> None:
        while True:
            batch = await worker_store.claim("jobs", name, limit=7, lease_seconds=60, now=NOW)
            if not batch:
                return
            claimed[name].extend(m.id for m in batch)

    try:
        await asyncio.gather(worker("a", Store(engines[0])), worker("b", Store(engines[1])))
    finally:
        await asyncio.gather(*(e.dispose() for e in engines))
    assert set(claimed["a"]).isdisjoint(claimed["b"])
    assert sorted(claimed["a"] + claimed["b"]) == sorted(ids)


async def test_record_provider_job_is_idempotent(store: Store, scenario: Scenario) -> None:
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
    first, created = await store.record_provider_job(job, now=NOW)
    again, created_again = await store.record_provider_job(job, now=NOW + timedelta(seconds=1))
    assert (created, created_again) == (True, False)
    assert again == first
    detail = await store.get_task(attempt.task_id)
    assert detail is not None
    assert detail.provider_jobs == (first,)


async def test_provider_job_is_never_overwritten(store: Store, scenario: Scenario) -> None:
    """Another job id for the attempt, or the job id on another attempt, raises DuplicateRecord."""
    account = await scenario.account()
    a1 = await scenario.attempt(account)
    a2 = await scenario.attempt(account)

    def job(attempt_id: int, job_id: str) -> NewProviderJob:
        return NewProviderJob(attempt_id, account, job_id, AttemptState.ACCEPTED, NOW)

    await store.record_provider_job(job(a1.id, "rw-1"), now=NOW)
    with pytest.raises(DuplicateRecord):
        await store.record_provider_job(job(a1.id, "rw-2"), now=NOW)
    with pytest.raises(DuplicateRecord):
        await store.record_provider_job(job(a2.id, "rw-1"), now=NOW)
    with pytest.raises(NotFound):
        await store.record_provider_job(job(10_000, "rw-9"), now=NOW)


async def test_ping(store: Store) -> None:
    """ping round-trips to a reachable database without raising."""
    await store.ping()
