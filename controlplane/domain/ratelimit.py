"""Token buckets per key (a tenant's CreateTask rate, design 9.12): pure, the clock is given.

A bucket holds at most `burst` tokens and gains `per_second` a second; a request takes one
token or is refused with the seconds until one is there. A key's bucket starts full, and a
changed rate (a tenants publication) applies from the next request on, keeping the tokens the
bucket had (capped at the new burst), so a republish neither refills nor drains anyone.

In-process: one replica's buckets. With N API replicas behind a balancer a tenant may create up
to N times its rate; the limit bounds one process's work, not a global quota.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

MAX_KEYS = 100_000  # buckets kept; the least recently used is dropped (it comes back full)


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass(frozen=True, slots=True)
class Verdict:
    """`allowed`, or refused with `retry_after_s` until the next token."""

    allowed: bool
    retry_after_s: float = 0.0


class TokenBuckets:
    """Buckets by key; `take` is the one operation."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._max_keys = max_keys

    def take(self, key: str, per_second: float, burst: int, now: float) -> Verdict:
        """Take one token from `key`'s bucket at time `now` (seconds, monotonic)."""
        if per_second <= 0 or burst < 1:
            raise ValueError("per_second must be positive and burst at least 1")
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(float(burst), now)
            while len(self._buckets) > self._max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
        elapsed = max(0.0, now - bucket.at)
        bucket.tokens = min(float(burst), bucket.tokens + elapsed * per_second)
        bucket.at = max(bucket.at, now)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return Verdict(True)
        return Verdict(False, (1.0 - bucket.tokens) / per_second)
