"""Global breaker health state shared by every replica (design 9.15.4).

Each replica keeps its own `BreakerRegistry` (fast, local); what one replica learns is
published here so the others stop routing to a failing endpoint too. A record carries a
monotonically increasing ``version`` per key, so a replica applies each change once.

`RedisSharedState` keeps one hash per key plus a set of all keys; `InProcessSharedState` is
the embedded default (one replica) and the fake beside it. PostgreSQL stays the audit record:
every transition and operator action is also written to ``provider_health_events``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from controlplane.domain.breaker import BreakerKey, BreakerState, Operation


@dataclass(frozen=True, slots=True)
class SharedRecord:
    """The last published state of one breaker key."""

    key: BreakerKey
    state: BreakerState
    until: float | None  # wall-clock seconds an OPEN breaker refuses calls until
    forced: bool
    reason: str
    version: int


def key_text(key: BreakerKey) -> str:
    return json.dumps(
        [key.provider, key.account, key.region, key.model, key.operation.value],
        separators=(",", ":"),
    )


def key_from_text(raw: str) -> BreakerKey:
    provider, account, region, model, operation = json.loads(raw)
    return BreakerKey(provider, account, region, model, Operation(operation))


class SharedBreakerState(Protocol):
    async def publish(
        self, key: BreakerKey, state: BreakerState, until: float | None, forced: bool, reason: str
    ) -> SharedRecord:
        """Store a new state for `key`, bumping its version."""
        ...

    async def read_all(self) -> list[SharedRecord]:
        """Every published record."""
        ...


class InProcessSharedState:
    """Shared state for a single replica (no Redis)."""

    def __init__(self) -> None:
        self._records: dict[BreakerKey, SharedRecord] = {}

    async def publish(
        self, key: BreakerKey, state: BreakerState, until: float | None, forced: bool, reason: str
    ) -> SharedRecord:
        previous = self._records.get(key)
        record = SharedRecord(
            key, state, until, forced, reason, (previous.version if previous else 0) + 1
        )
        self._records[key] = record
        return record

    async def read_all(self) -> list[SharedRecord]:
        return list(self._records.values())


class RedisSharedState:
    """Shared state in Redis: ``{prefix}:breakers`` (set of keys) and one hash per key."""

    def __init__(self, client: Any, prefix: str = "vidroute") -> None:
        self._redis = client  # redis.asyncio.Redis; typed loosely to keep redis out of imports
        self._prefix = prefix

    def _hash(self, raw: str) -> str:
        return f"{self._prefix}:breaker:{raw}"

    async def publish(
        self, key: BreakerKey, state: BreakerState, until: float | None, forced: bool, reason: str
    ) -> SharedRecord:
        raw = key_text(key)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(f"{self._prefix}:breakers", raw)
            pipe.hset(
                self._hash(raw),
                mapping={
                    "state": state.value,
                    "until": "" if until is None else repr(until),
                    "forced": "1" if forced else "0",
                    "reason": reason,
                },
            )
            pipe.hincrby(self._hash(raw), "version", 1)
            results = await pipe.execute()
        return SharedRecord(key, state, until, forced, reason, int(results[-1]))

    async def read_all(self) -> list[SharedRecord]:
        keys = sorted(_text(k) for k in await self._redis.smembers(f"{self._prefix}:breakers"))
        if not keys:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for raw in keys:
                pipe.hgetall(self._hash(raw))
            rows = await pipe.execute()
        out = []
        for raw, row in zip(keys, rows, strict=True):
            data = {_text(k): _text(v) for k, v in row.items()}
            if "state" not in data:
                continue
            out.append(
                SharedRecord(
                    key_from_text(raw),
                    BreakerState(data["state"]),
                    float(data["until"]) if data.get("until") else None,
                    data.get("forced") == "1",
                    data.get("reason", ""),
                    int(data.get("version", "0")),
                )
            )
        return out


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
