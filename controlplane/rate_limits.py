"""CreateTask rate limits per tenant: one seam, in process or shared through Redis (issue 21).

`RateLimiter.take(key, per_second, burst)` takes one token of `key`'s bucket (the token bucket of
`controlplane.domain.ratelimit`) and says whether the request may go, or in how long to retry.

* `InProcessRateLimiter`: this process's buckets. The embedded stack (one process) and any
  deployment without Redis: with N API replicas a tenant may create up to N times its rate.
* `RedisRateLimiter`: one bucket per tenant in Redis, shared by every replica that shares the
  Redis of the leases, updated atomically by a Lua script on the server's clock (TIME), so
  replicas whose clocks drift agree. A bucket key lives as long as it takes to refill, then
  vanishes (a full bucket). If Redis does not answer within `timeout_s`, the limiter falls
  back to its own in-process buckets for `retry_s` before it asks Redis again, and says so once
  in the log: a Redis outage must neither stop nor slow task creation (PostgreSQL is what
  CreateTask needs), and a per-replica limit is still a limit. A refusal is remembered for
  its retry time (per key and rate): a bucket cannot refill sooner, whichever replica takes
  from it, so a flooding tenant's next calls are refused in process, without a Redis round
  trip, and the flood costs the server as little as it can.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from controlplane.domain.ratelimit import TokenBuckets, Verdict

log = logging.getLogger(__name__)

MAX_REMEMBERED = 10_000  # refusals remembered at once (RedisRateLimiter)


class RateLimiter(Protocol):
    async def take(self, key: str, per_second: float, burst: int) -> Verdict: ...


class InProcessRateLimiter:
    """Token buckets in this process (`domain.ratelimit.TokenBuckets`) on a monotonic clock."""

    def __init__(
        self, buckets: TokenBuckets | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._buckets, self._clock = buckets or TokenBuckets(), clock

    async def take(self, key: str, per_second: float, burst: int) -> Verdict:
        return self._buckets.take(key, per_second, burst, self._clock())


# KEYS[1] the bucket hash {tokens, at}; ARGV per_second, burst, ttl_ms. Returns {allowed, wait_s}
# (wait as a string: Lua numbers become integers in a reply). Same rule as TokenBuckets.take.
_TAKE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rate, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens, at = tonumber(b[1]), tonumber(b[2])
if tokens == nil or at == nil then tokens, at = burst, now end
local elapsed = now - at
if elapsed < 0 then elapsed = 0 end
tokens = math.min(burst, tokens + elapsed * rate)
if now > at then at = now end
local allowed, wait = 0, 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(at))
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {allowed, tostring(wait)}
"""


class RedisRateLimiter:
    """Buckets shared by every replica on `client`, under ``<namespace>ratelimit:``."""

    def __init__(
        self,
        client: Redis,
        *,
        namespace: str = "vidroute:",
        fallback: InProcessRateLimiter | None = None,
        timeout_s: float = 0.25,
        retry_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._script: Any = client.register_script(_TAKE)
        self._prefix = f"{namespace}ratelimit:"
        self._fallback = fallback or InProcessRateLimiter()
        self._timeout_s, self._retry_s, self._clock = timeout_s, retry_s, clock
        self._degraded = False
        self._retry_at = -math.inf
        # (key, per_second, burst) -> when its bucket can next hold a token (this clock); a
        # changed rate is a new key, so a republished limit applies at once.
        self._refused: dict[tuple[str, float, int], float] = {}

    async def take(self, key: str, per_second: float, burst: int) -> Verdict:
        if per_second <= 0 or burst < 1:
            raise ValueError("per_second must be positive and burst at least 1")
        # Kept until refilled, a second more: an expired bucket reads as a full one.
        ttl_ms = math.ceil(burst / per_second * 1000) + 1000
        now = self._clock()
        if self._degraded and now < self._retry_at:
            return await self._fallback.take(key, per_second, burst)
        refused = (key, per_second, burst)
        until = self._refused.get(refused)
        if until is not None:
            if now < until:
                return Verdict(False, until - now)
            del self._refused[refused]
        try:
            allowed, wait = await asyncio.wait_for(
                self._script(
                    keys=[f"{self._prefix}{{{key}}}"], args=[repr(per_second), burst, ttl_ms]
                ),
                self._timeout_s,
            )
        except (RedisError, OSError, TimeoutError) as exc:
            self._retry_at = self._clock() + self._retry_s
            if not self._degraded:
                log.warning(
                    "rate limits fall back to this process's buckets: Redis does not answer"
                    " (%s: %s)",
                    type(exc).__name__,
                    exc,
                )
                self._degraded = True
            return await self._fallback.take(key, per_second, burst)
        if self._degraded:
            log.info("rate limits are shared through Redis again")
            self._degraded = False
        verdict = Verdict(bool(int(allowed)), float(wait))
        if not verdict.allowed:
            # From `now`, taken before the call: never later than the refill Redis computed.
            self._remember(refused, now + verdict.retry_after_s, now)
        return verdict

    def _remember(self, refused: tuple[str, float, int], until: float, now: float) -> None:
        if len(self._refused) >= MAX_REMEMBERED:
            self._refused = {k: t for k, t in self._refused.items() if t > now}
            if len(self._refused) >= MAX_REMEMBERED:
                return  # that many tenants refused at once: ask Redis for the rest
        self._refused[refused] = until
