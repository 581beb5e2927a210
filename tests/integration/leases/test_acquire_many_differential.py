"""A batch of acquires (`RedisLeaseStore.admit_many`: one ACQUIRE_MANY script per account) is the
sequence of its single acquires (`acquire`: one ACQUIRE script each), proven by running the same
requests both ways in two namespaces of the same Redis and comparing every answer, counter, lease
record, window and metric: grants, full dimensions, re-acquires, full windows, expired leases
reclaimed on the way, and a fail-closed account that is not live.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from redis.asyncio import Redis

from controlplane.leases import Dimension, Lease, LeaseRequest, WindowRequest
from controlplane.leases.redis_store import RedisLeaseStore
from tests.integration.leases.test_lease_store_contract import wait_for_server_clock

pytestmark = pytest.mark.redis

ACCOUNTS = ("runway:prod-us", "google:prod-eu", "kling:prod-ap")


def dims(account: str, model: str) -> tuple[Dimension, ...]:
    """Account total 3 (1 in the last account), model 2, as the dispatcher's first two."""
    total = 1 if account == ACCOUNTS[2] else 3
    return (Dimension("account", total), Dimension(f"model:{model}", 2))


@pytest.fixture
async def spaces(redis_client: Redis) -> AsyncIterator[tuple[str, str]]:
    """Two namespaces of the same Redis: the singles', then the batch's."""
    made = (f"vrtest:{uuid.uuid4().hex[:12]}:", f"vrtest:{uuid.uuid4().hex[:12]}:")
    yield made
    for space in made:
        keys = [k async for k in redis_client.scan_iter(match=f"{space}*", count=500)]
        if keys:
            await redis_client.delete(*keys)


def answer(got: Lease | None) -> Any:
    """What must be equal both ways: everything but the token and the server times."""
    if got is None:
        return None
    return (got.attempt_id, got.account, got.fencing_token, got.dimensions, got.slots, got.ttl_ms)


async def state(store: RedisLeaseStore) -> Any:
    """Every account's counters and lease records (tokens and times aside), windows, metrics."""
    out: list[Any] = []
    for account in ACCOUNTS:
        snap = await store.snapshot(account)
        leases = sorted(answer(lease) for lease in snap.leases)
        out.append(
            (dict(snap.used), dict(snap.capacity), snap.unknown_used, snap.accepting_new, leases)
        )
        out.append([(u.used, u.limit) for u in await store.window_usage(account)])
    return out, dataclasses.asdict(store.metrics)


async def both(
    single: RedisLeaseStore, batch: RedisLeaseStore, requests: Sequence[LeaseRequest]
) -> None:
    """The requests one by one in `single`, as one batch in `batch`: the same everywhere."""
    one_by_one = [answer(await single.acquire(r)) for r in requests]
    together = [answer(g) for g in await batch.acquire_many(requests)]
    assert together == one_by_one
    assert await state(batch) == await state(single)


async def test_a_batch_answers_and_stores_what_its_single_acquires_do(
    redis_client: Redis, spaces: tuple[str, str]
) -> None:
    """Random rounds over three accounts (interleaved, some full, repeats of held attempts),
    then a round with windows, one after some leases expired, answer and store the same."""
    single, batch = (RedisLeaseStore(redis_client, namespace=s) for s in spaces)
    rng = random.Random(22)
    attempts = [f"a{i}" for i in range(12)]
    for _ in range(4):
        round_ = []
        for _ in range(rng.randint(3, 9)):
            account = rng.choice(ACCOUNTS)
            model = rng.choice(("gen4", "veo3"))
            attempt = f"{rng.choice(attempts)}-{account}-{model}"
            round_.append(LeaseRequest(attempt, account, dims(account, model), ttl_ms=600_000))
        await both(single, batch, round_)
    limited = WindowRequest(submits_per_minute=2, generations=1, cost_micros=5)
    windowed = [
        LeaseRequest(f"w{i}", ACCOUNTS[1], (Dimension("all", 50),), windows=limited)
        for i in range(4)
    ]
    await both(single, batch, windowed)  # the third and fourth find the minute full
    short = [
        LeaseRequest(f"s{i}", ACCOUNTS[0], (Dimension("short", 9),), ttl_ms=30) for i in range(3)
    ]
    await both(single, batch, short)
    await wait_for_server_clock(single, await single.now_ms() + 60)
    later = [LeaseRequest("s0", ACCOUNTS[0], (Dimension("short", 9),), ttl_ms=30), short[1]]
    await both(single, batch, later)  # the expired ones are reclaimed, then granted afresh
    assert single.metrics.reclaimed > 0


async def test_a_fail_closed_batch_refuses_what_its_single_acquires_refuse(
    redis_client: Redis, spaces: tuple[str, str]
) -> None:
    """A fail-closed store whose account is not live refuses every request of it either way,
    and still grants in the account it restored."""
    single, batch = (RedisLeaseStore(redis_client, namespace=s, fail_closed=True) for s in spaces)
    for store in (single, batch):
        await store.restore(ACCOUNTS[1], [], ttl_ms=600_000, max_term_ms=600_000)
    requests = [
        LeaseRequest(f"f{i}", ACCOUNTS[i % 2], dims(ACCOUNTS[i % 2], "gen4")) for i in range(4)
    ]
    await both(single, batch, requests)
    assert single.metrics.rejected_not_live == 2
    assert single.metrics.acquired == 2
