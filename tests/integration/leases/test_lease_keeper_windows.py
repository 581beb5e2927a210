"""`LeaseKeeper.secure` stamps the account's rate windows right before a send (9.11), on the
memory store and on Redis: a held lease whose submit window is full at the send waits unsent,
and one with room is counted from the send."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from redis.asyncio import Redis

from controlplane.execution.leasing import LeaseKeeper
from controlplane.leases.base import Dimension, LeaseRequest, LeaseStore
from controlplane.leases.memory_store import MemoryLeaseStore
from controlplane.leases.redis_store import RedisLeaseStore
from controlplane.leases.windows import MINUTE, WindowRequest

SPAN = 60_000  # a whole minute: nothing leaves the window during the test


def _attempt(n: int, key: str, token: str, fence: int) -> Any:
    return SimpleNamespace(id=n, client_request_key=key, lease_token=token, fencing_token=fence)


def _request(key: str) -> LeaseRequest:
    windows = WindowRequest(submits_per_minute=1, minute_ms=SPAN, day_ms=SPAN)
    return LeaseRequest(key, "runway:a", (Dimension("all", 4),), ttl_ms=60_000, windows=windows)


async def test_in_memory() -> None:
    """The memory store, as `make up` runs it."""
    await _a_send_is_stamped_or_waits(MemoryLeaseStore())


@pytest.mark.redis
async def test_on_redis(redis_client: Redis, redis_namespace: str) -> None:
    """Redis, as the scheduling runtime runs it."""
    await _a_send_is_stamped_or_waits(RedisLeaseStore(redis_client, namespace=redis_namespace))


async def _a_send_is_stamped_or_waits(store: LeaseStore) -> None:
    first = await store.acquire(_request("crk-1"))
    assert first is not None

    async def source(attempt: Any) -> LeaseRequest:
        return _request(attempt.client_request_key)

    keeper = LeaseKeeper(store, source)
    assert (
        await keeper.secure(_attempt(1, "crk-1", first.token, first.fencing_token))
    ).ok  # counted at admission: stamped, sent
    # Another attempt's lease taken without windows (say, before the limit was configured):
    # at its send the minute, spent by crk-1, holds it back.
    second = await store.acquire(
        LeaseRequest("crk-2", "runway:a", (Dimension("all", 4),), ttl_ms=60_000)
    )
    assert second is not None
    assert not (await keeper.secure(_attempt(2, "crk-2", second.token, second.fencing_token))).ok
    assert keeper.window_waits == 1
    assert [u.used for u in await store.window_usage("runway:a") if u.window == MINUTE] == [1]
