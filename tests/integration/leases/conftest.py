"""Fixtures for the lease store suites: a real Redis and a key namespace unique to each test.

Redis comes from `VIDROUTE_TEST_REDIS_URL`, or redis://127.0.0.1:6379/0 by default. If it cannot
be reached, the tests skip with the reason. Under `CI=true` they fail instead, so CI cannot go green
without testing Redis.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import RedisError

REDIS_URL = os.environ.get("VIDROUTE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def redis_unavailable(reason: str) -> None:
    """Fail loudly in CI, skip with the reason elsewhere."""
    message = f"Redis unreachable at {REDIS_URL}: {reason}"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true requires Redis for the lease suites)", pytrace=False)
    pytest.skip(f"{message}; start Redis or set VIDROUTE_TEST_REDIS_URL")


@pytest.fixture
def redis_url() -> str:
    """The URL the suites and their worker processes connect to."""
    return REDIS_URL


@pytest.fixture
async def redis_client() -> AsyncIterator[Redis]:
    """A connected client on the test Redis, closed after the test."""
    client = Redis.from_url(REDIS_URL, socket_connect_timeout=2, socket_timeout=5)
    try:
        await client.ping()
    except (RedisError, OSError) as exc:
        await client.aclose()
        redis_unavailable(f"{type(exc).__name__}: {exc}")
    yield client
    await client.aclose()


@pytest.fixture
async def redis_namespace(redis_client: Redis) -> AsyncIterator[str]:
    """A key prefix no other test or run shares; only keys under it are deleted afterwards."""
    namespace = f"vrtest:{uuid.uuid4().hex[:12]}:"
    yield namespace
    keys = [key async for key in redis_client.scan_iter(match=f"{namespace}*", count=500)]
    if keys:
        await redis_client.delete(*keys)
