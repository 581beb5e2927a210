"""What `RedisLeaseStore` says to Redis and hears back, apart from the store's own logic: the
client with its retry policy, the translation of redis errors into ours, and the encodings of
lease records and dimensions (`Lease` <-> the lease hash, dimensions <-> JSON)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from controlplane.leases.base import (
    Dimension,
    InvalidLeaseRequest,
    Lease,
    LeaseBackendError,
    LeaseStoreUnavailable,
)

__all__ = [
    "RedisClientConfig",
    "accepts_new",
    "decode_dims",
    "encode_dims",
    "lease_from",
    "record",
    "redis_client",
    "text",
    "translated",
]


def text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def encode_dims(dims: Iterable[Dimension]) -> str:
    return json.dumps([[d.key, d.capacity] for d in dims], separators=(",", ":"))


def decode_dims(raw: str) -> tuple[Dimension, ...]:
    return tuple(Dimension(str(key), int(cap)) for key, cap in json.loads(raw))


def record(raw: Any) -> dict[str, str]:
    """Normalise an HGETALL answer (a flat list from Lua, or a dict from redis-py) to str -> str."""
    if isinstance(raw, Mapping):
        return {text(k): text(v) for k, v in raw.items()}
    items = [text(v) for v in raw]
    return dict(zip(items[::2], items[1::2], strict=True))


def lease_from(record: Mapping[str, str]) -> Lease:
    return Lease(
        attempt_id=record["attempt_id"],
        account=record["account"],
        token=record["token"],
        fencing_token=int(record["fence"]),
        dimensions=decode_dims(record["dims"]),
        slots=int(record["slots"]),
        acquired_at_ms=int(record["acquired_at"]),
        expires_at_ms=int(record["expires_at"]),
        ttl_ms=int(record["ttl"]),
        max_term_ms=int(record["max_term"]),
        unknown=record["unknown"] == "1",
    )


def accepts_new(used: int, cap: int | None, refused: bool) -> bool:
    return not refused and (cap is None or used < cap)


@asynccontextmanager
async def translated(operation: str) -> AsyncIterator[None]:
    """Turn redis exceptions into ours, keeping the cause."""
    try:
        yield
    except ResponseError as exc:
        if "LEASE_DIMENSIONS_MISMATCH" in str(exc):
            raise InvalidLeaseRequest(
                f"{operation}: lease dimensions differ from the record"
            ) from exc
        raise LeaseBackendError(f"{operation}: {exc}") from exc
    except (RedisConnectionError, RedisTimeoutError) as exc:
        # Redis down, restarting or cut off: the kernel's Unavailable (UNAVAILABLE at the edge).
        raise LeaseStoreUnavailable(f"{operation}: {exc}") from exc
    except RedisError as exc:
        raise LeaseBackendError(f"{operation}: {exc}") from exc


@dataclass(frozen=True, slots=True)
class RedisClientConfig:
    """How the Redis client retries a command whose connection failed: redis-py's defaults,
    named here so that the one time-scale factor compresses them with every other duration (a
    backoff of production length would outlast a compressed reconcile period after a restart)."""

    retries: int = 10
    retry_base_s: float = 0.01
    retry_cap_s: float = 1.0


def redis_client(url: str, config: RedisClientConfig | None = None) -> Redis:
    """A client for `url` that retries connection errors with `config`'s backoff."""
    cfg = config or RedisClientConfig()
    backoff = ExponentialWithJitterBackoff(cap=cfg.retry_cap_s, base=cfg.retry_base_s)
    return Redis.from_url(url, retry=Retry(backoff, cfg.retries))
