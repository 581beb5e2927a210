"""CreateTask rate limits shared through Redis (controlplane.rate_limits): two replicas draw on
one bucket per tenant, other tenants are untouched, refills follow the server's clock, and a
Redis that does not answer falls back to each replica's own buckets."""

from __future__ import annotations

import asyncio
import time
from typing import Any, cast

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from controlplane.rate_limits import InProcessRateLimiter, RedisRateLimiter

pytestmark = pytest.mark.timeout(60)


async def test_two_replicas_share_one_bucket_per_tenant(
    redis_client: Redis, redis_namespace: str
) -> None:
    """Burst 4 at 2/s: replicas a and b together get 4 creates for greedy, then a refusal whose
    retry delay is about half a second; honest's bucket is full; after the delay greedy goes."""
    a = RedisRateLimiter(redis_client, namespace=redis_namespace)
    b = RedisRateLimiter(redis_client, namespace=redis_namespace)
    allowed = [(await (a if i % 2 else b).take("greedy", 2.0, 4)).allowed for i in range(6)]
    assert allowed == [True, True, True, True, False, False]
    refused = await a.take("greedy", 2.0, 4)
    assert not refused.allowed
    assert 0.0 < refused.retry_after_s <= 0.5
    assert all([(await b.take("honest", 2.0, 4)).allowed for _ in range(4)])
    deadline = time.monotonic() + 5
    while not (await b.take("greedy", 2.0, 4)).allowed:
        assert time.monotonic() < deadline, "greedy's bucket never refilled"
        await asyncio.sleep(0.05)
    ttl = await redis_client.pttl(f"{redis_namespace}ratelimit:{{greedy}}")
    assert 0 < ttl <= 3000  # gone once it would be full again


class DownRedis:
    """A Redis whose every script call fails to connect, counting the calls."""

    def __init__(self) -> None:
        self.calls = 0

    def register_script(self, _: str) -> Any:
        async def call(**_: object) -> object:
            self.calls += 1
            raise RedisConnectionError("Connection refused")

        return call


async def test_an_unreachable_redis_falls_back_to_this_replicas_buckets() -> None:
    """With Redis down the limit still holds, per replica: burst 2, the third create waits;
    Redis is asked again only after the retry interval, so creates are not slowed meanwhile."""
    down = DownRedis()
    clock = [0.0]
    limiter = RedisRateLimiter(
        cast(Redis, down),
        fallback=InProcessRateLimiter(clock=lambda: clock[0]),
        retry_s=5.0,
        clock=lambda: clock[0],
    )
    verdicts = [await limiter.take("t", 1.0, 2) for _ in range(3)]
    assert [v.allowed for v in verdicts] == [True, True, False]
    assert verdicts[2].retry_after_s == pytest.approx(1.0)
    assert down.calls == 1
    clock[0] = 5.0
    assert (await limiter.take("t", 1.0, 2)).allowed
    assert down.calls == 2


async def test_a_redis_that_never_answers_costs_a_create_at_most_the_timeout() -> None:
    """A real client pointed at a closed port: the take is answered by the fallback in well
    under a second, whatever the client's own retries would take."""
    client = Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=5)
    try:
        limiter = RedisRateLimiter(client, timeout_s=0.25)
        started = time.monotonic()
        assert (await limiter.take("t", 1.0, 1)).allowed
        assert time.monotonic() - started < 1.0
    finally:
        await client.aclose()


class CountingRedis:
    """The real client, counting the calls of its registered scripts."""

    def __init__(self, client: Redis) -> None:
        self.client, self.calls = client, 0

    def register_script(self, source: str) -> Any:
        script = self.client.register_script(source)

        async def call(**kwargs: Any) -> Any:
            self.calls += 1
            return await script(**kwargs)

        return call


async def test_a_refusal_is_answered_in_process_until_its_bucket_can_refill(
    redis_client: Redis, redis_namespace: str
) -> None:
    """Once Redis refused a tenant, its next creates before the retry time are refused without
    a Redis call, with the remaining delay; a changed rate asks Redis at once; once the retry
    time passed, Redis is asked again and lets the create through."""
    counting = CountingRedis(redis_client)
    clock = [0.0]
    limiter = RedisRateLimiter(
        cast(Redis, counting), namespace=redis_namespace, clock=lambda: clock[0]
    )
    assert (await limiter.take("flood", 0.5, 1)).allowed
    first = await limiter.take("flood", 0.5, 1)
    assert not first.allowed
    assert 0.0 < first.retry_after_s <= 2.0
    assert counting.calls == 2
    clock[0] = first.retry_after_s / 2
    again = [await limiter.take("flood", 0.5, 1) for _ in range(50)]
    assert not any(v.allowed for v in again)
    assert again[0].retry_after_s == pytest.approx(first.retry_after_s / 2)
    assert counting.calls == 2, "a remembered refusal went to Redis"
    await limiter.take("flood", 1.0, 1)  # a republished rate: Redis decides
    assert counting.calls == 3
    await asyncio.sleep(first.retry_after_s)  # Redis's own clock refills the bucket
    clock[0] = first.retry_after_s
    assert (await limiter.take("flood", 0.5, 1)).allowed
    assert counting.calls == 4
