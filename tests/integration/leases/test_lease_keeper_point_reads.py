"""`LeaseKeeper` finds an attempt's lease by a point read of the store (`lease_of`, keyed by
the client request key) on Redis and in memory, with the same checks a scan made: the token
must match and the fence be the attempt's; an ended lease is simply not found."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from redis.asyncio import Redis

from controlplane.execution.leasing import LeaseKeeper
from controlplane.leases.base import Dimension, LeaseRequest, LeaseStore
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.leases.redis_store import RedisLeaseStore

pytestmark = pytest.mark.asyncio


def _attempt(key: str, token: str | None, fence: int | None) -> Any:
    return SimpleNamespace(id=1, client_request_key=key, lease_token=token, fencing_token=fence)


async def _grant(store: LeaseStore, key: str, account: str = "runway:a") -> Any:
    lease = await store.acquire(
        LeaseRequest(key, account, (Dimension("all", 4),), ttl_ms=60_000, max_term_ms=120_000)
    )
    assert lease is not None
    return lease


async def test_in_memory() -> None:
    await _finds_renews_and_releases_only_the_attempts_lease(MemoryLeaseStore())


@pytest.mark.redis
async def test_on_redis(redis_client: Redis, redis_namespace: str) -> None:
    store = RedisLeaseStore(redis_client, namespace=redis_namespace)
    await _finds_renews_and_releases_only_the_attempts_lease(store)


async def _finds_renews_and_releases_only_the_attempts_lease(store: LeaseStore) -> None:
    await _grant(store, "crk-other", account="veo:b")  # another account's lease
    lease = await _grant(store, "crk-1")
    keeper = LeaseKeeper(store)
    mine = _attempt("crk-1", lease.token, lease.fencing_token)
    found = await keeper.find(mine)
    assert found is not None
    assert (found.token, found.fencing_token) == (lease.token, lease.fencing_token)
    assert await keeper.still_held(mine)
    # A wrong token or another fence under the same key is not the attempt's lease.
    assert await keeper.find(_attempt("crk-1", "not-the-token", lease.fencing_token)) is None
    assert await keeper.find(_attempt("crk-1", lease.token, lease.fencing_token + 7)) is None
    assert not await keeper.still_held(_attempt("crk-1", lease.token, lease.fencing_token + 7))
    assert await keeper.release(mine)
    assert await store.used("runway:a", "all") == 0
    # Released: not found, and a second release is a no-op.
    assert await keeper.find(mine) is None
    assert not await keeper.release(mine)
    assert not await keeper.still_held(mine)
    assert await store.used("veo:b", "all") == 1  # the other account's lease untouched
