"""Global breaker health state shared by every replica (design 9.15.4).

Each replica keeps its own `BreakerRegistry` (fast, local); what one replica learns is
published here so the others stop routing to a failing endpoint too. A record carries a
monotonically increasing ``version`` per key, so a replica applies each change once.

`RedisSharedState` keeps one hash per key plus a set of all keys; `InProcessSharedState` is
the embedded default (one replica) and the fake beside it. PostgreSQL stays the audit record:
every transition and operator action is also written to ``provider_health_events``.

The probe ledger (9.15.2 "HALF_OPEN 只允许少量探测") makes half-open admission global: the
replica that dispatches a probe and the one whose submit worker learns its result may differ,
so the slots (one per admitted call, named by its holder, expiring after the probe TTL) and the
phase's probe-success count live here, not in one replica's breaker. The replica that moves a
breaker out of HALF_OPEN clears its ledger, so a later half-open phase starts empty.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from controlplane.domain.breaker import BreakerKey, BreakerState, Operation
from vidroute_core.exceptions import Unavailable


@dataclass(frozen=True, slots=True)
class SharedRecord:
    """The last published state of one breaker key."""

    key: BreakerKey
    state: BreakerState
    until: float | None  # wall-clock seconds an OPEN breaker refuses calls until
    forced: bool
    reason: str
    version: int
    level: int = -1  # the cooldown step of the last open (`CircuitBreaker.level`)


@dataclass(frozen=True, slots=True)
class ProbeFinish:
    """What the ledger knew of a finished call: was it an admitted probe, and how many probes
    of this half-open phase have succeeded so far (including it)."""

    was_probe: bool
    successes: int


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
        self,
        key: BreakerKey,
        state: BreakerState,
        until: float | None,
        forced: bool,
        reason: str,
        *,
        level: int = -1,
    ) -> SharedRecord:
        """Store a new state for `key`, bumping its version."""
        ...

    async def read_all(self) -> list[SharedRecord]:
        """Every published record."""
        ...

    async def read(self, key: BreakerKey) -> SharedRecord | None:
        """The published record of one key, if any."""
        ...

    async def acquire_probe(self, key: BreakerKey, holder: str, limit: int, ttl_s: float) -> bool:
        """Take one of `limit` probe slots for `holder` (idempotent per holder), if one is free."""
        ...

    async def probes_free(self, key: BreakerKey, limit: int) -> int:
        """How many of `limit` probe slots are free now (a hint; `acquire_probe` decides)."""
        ...

    async def finish_probe(
        self, key: BreakerKey, holder: str, succeeded: bool, ttl_s: float
    ) -> ProbeFinish:
        """Free `holder`'s slot; when it held one and `succeeded`, count a probe success (the
        count expires `ttl_s` after the last one, like a slot)."""
        ...

    async def clear_probes(self, key: BreakerKey) -> None:
        """Forget the half-open phase of `key` (slots and success count)."""
        ...

    async def add_observations(self, observations: list[Observation]) -> None:
        """Append health-window observations for every replica to read (9.13.3)."""
        ...

    async def read_observations(self, after: str | None) -> tuple[list[Observation], str | None]:
        """Observations appended after cursor `after` (None: all kept), and the new cursor."""
        ...

    async def put_incumbent(self, group: str, candidate_id: str, since_s: float) -> None:
        """The candidate a routing group uses now (9.13 hysteresis), for every replica."""
        ...

    async def read_incumbents(self) -> dict[str, tuple[str, float]]:
        """Every routing group's incumbent: group -> (candidate id, since)."""
        ...


@dataclass(frozen=True, slots=True)
class Observation:
    """One health-window sample (`HealthWindows.observe`), named by the replica that saw it."""

    candidate_id: str
    succeeded: bool
    latency_s: float | None
    cost_micros: int
    at: float
    origin: str

    def encode(self) -> str:
        return json.dumps(
            [
                self.candidate_id,
                self.succeeded,
                self.latency_s,
                self.cost_micros,
                self.at,
                self.origin,
            ],
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, raw: str) -> Observation:
        cid, ok, latency, cost, at, origin = json.loads(raw)
        return cls(
            str(cid),
            bool(ok),
            None if latency is None else float(latency),
            int(cost),
            float(at),
            str(origin),
        )


# How many observations the shared stream keeps (approximately): a replica that starts or
# takes over a shard rebuilds its windows from these; older samples weigh ~nothing anyway.
OBSERVATIONS_KEPT = 50_000


@dataclass
class _Ledger:
    slots: dict[str, float] = field(default_factory=dict)  # holder -> expires at
    successes: int = 0


class InProcessSharedState:
    """Shared state for a single replica (no Redis)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._records: dict[BreakerKey, SharedRecord] = {}
        self._ledgers: dict[BreakerKey, _Ledger] = {}
        self._clock = clock
        self._observations: list[Observation] = []
        self._observed = 0  # appended in all (the cursor)
        self._incumbents: dict[str, tuple[str, float]] = {}

    async def publish(
        self,
        key: BreakerKey,
        state: BreakerState,
        until: float | None,
        forced: bool,
        reason: str,
        *,
        level: int = -1,
    ) -> SharedRecord:
        previous = self._records.get(key)
        record = SharedRecord(
            key, state, until, forced, reason, (previous.version if previous else 0) + 1, level
        )
        self._records[key] = record
        return record

    async def read_all(self) -> list[SharedRecord]:
        return list(self._records.values())

    async def read(self, key: BreakerKey) -> SharedRecord | None:
        return self._records.get(key)

    def _ledger(self, key: BreakerKey) -> _Ledger:
        ledger = self._ledgers.setdefault(key, _Ledger())
        now = self._clock()
        ledger.slots = {h: until for h, until in ledger.slots.items() if until > now}
        return ledger

    async def acquire_probe(self, key: BreakerKey, holder: str, limit: int, ttl_s: float) -> bool:
        ledger = self._ledger(key)
        if holder not in ledger.slots and len(ledger.slots) >= limit:
            return False
        ledger.slots[holder] = self._clock() + ttl_s
        return True

    async def probes_free(self, key: BreakerKey, limit: int) -> int:
        return max(0, limit - len(self._ledger(key).slots))

    async def finish_probe(
        self, key: BreakerKey, holder: str, succeeded: bool, ttl_s: float
    ) -> ProbeFinish:
        ledger = self._ledger(key)
        was_probe = ledger.slots.pop(holder, None) is not None
        if was_probe and succeeded:
            ledger.successes += 1
        return ProbeFinish(was_probe, ledger.successes)

    async def clear_probes(self, key: BreakerKey) -> None:
        self._ledgers.pop(key, None)

    async def add_observations(self, observations: list[Observation]) -> None:
        self._observations.extend(observations)
        del self._observations[:-OBSERVATIONS_KEPT]
        self._observed += len(observations)

    async def read_observations(self, after: str | None) -> tuple[list[Observation], str | None]:
        start = int(after) if after else 0
        kept_from = self._observed - len(self._observations)
        new = self._observations[max(0, start - kept_from) :]
        return new, str(self._observed)

    async def put_incumbent(self, group: str, candidate_id: str, since_s: float) -> None:
        self._incumbents[group] = (candidate_id, since_s)

    async def read_incumbents(self) -> dict[str, tuple[str, float]]:
        return dict(self._incumbents)


# KEYS[1] slots (zset holder -> expiry, Redis TIME seconds); ARGV holder, limit, ttl_s.
_ACQUIRE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) and
   redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[3]) * 1000))
return 1
"""
# KEYS[1] slots, KEYS[2] success counter; ARGV holder, succeeded ("1"/"0"), ttl_s.
_FINISH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local was = redis.call('ZREM', KEYS[1], ARGV[1])
local successes = tonumber(redis.call('GET', KEYS[2]) or '0')
if was == 1 and ARGV[2] == '1' then
  successes = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], math.ceil(tonumber(ARGV[3]) * 1000))
end
return {was, successes}
"""
_FREE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""


@contextmanager
def _redis_outage() -> Iterator[None]:
    """Redis unreachable (refused, reset, timed out, loading) -> the kernel's `Unavailable`, so
    an admin RPC that needs the shared state is UNAVAILABLE with a retry hint, not INTERNAL.
    By class name: this module keeps redis out of its imports."""
    try:
        yield
    except Exception as exc:
        names = {c.__name__ for c in type(exc).__mro__}
        if type(exc).__module__.startswith("redis") and names & {"ConnectionError", "TimeoutError"}:
            raise Unavailable("redis") from exc
        raise


class RedisSharedState:
    """Shared state in Redis: ``{prefix}:breakers`` (set of keys) and one hash per key."""

    def __init__(self, client: Any, prefix: str = "vidroute") -> None:
        self._redis = client  # redis.asyncio.Redis; typed loosely to keep redis out of imports
        self._prefix = prefix

    def _hash(self, raw: str) -> str:
        return f"{self._prefix}:breaker:{raw}"

    def _probe_keys(self, key: BreakerKey) -> list[str]:
        raw = key_text(key)
        return [f"{self._prefix}:probes:{raw}", f"{self._prefix}:probe-successes:{raw}"]

    async def publish(
        self,
        key: BreakerKey,
        state: BreakerState,
        until: float | None,
        forced: bool,
        reason: str,
        *,
        level: int = -1,
    ) -> SharedRecord:
        raw = key_text(key)
        with _redis_outage():
            return await self._publish(raw, key, state, until, forced, reason, level)

    async def _publish(  # noqa: PLR0917 - publish's fields, passed through
        self,
        raw: str,
        key: BreakerKey,
        state: BreakerState,
        until: float | None,
        forced: bool,
        reason: str,
        level: int,
    ) -> SharedRecord:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.sadd(f"{self._prefix}:breakers", raw)
            pipe.hset(
                self._hash(raw),
                mapping={
                    "state": state.value,
                    "until": "" if until is None else repr(until),
                    "forced": "1" if forced else "0",
                    "reason": reason,
                    "level": str(level),
                },
            )
            pipe.hincrby(self._hash(raw), "version", 1)
            results = await pipe.execute()
        return SharedRecord(key, state, until, forced, reason, int(results[-1]), level)

    async def read(self, key: BreakerKey) -> SharedRecord | None:
        raw = key_text(key)
        return _record(raw, await self._redis.hgetall(self._hash(raw)))

    async def acquire_probe(self, key: BreakerKey, holder: str, limit: int, ttl_s: float) -> bool:
        slots, _ = self._probe_keys(key)
        return bool(await self._redis.eval(_ACQUIRE, 1, slots, holder, limit, repr(ttl_s)))

    async def probes_free(self, key: BreakerKey, limit: int) -> int:
        slots, _ = self._probe_keys(key)
        return max(0, limit - int(await self._redis.eval(_FREE, 1, slots)))

    async def finish_probe(
        self, key: BreakerKey, holder: str, succeeded: bool, ttl_s: float
    ) -> ProbeFinish:
        was, successes = await self._redis.eval(
            _FINISH, 2, *self._probe_keys(key), holder, "1" if succeeded else "0", repr(ttl_s)
        )
        return ProbeFinish(bool(was), int(successes))

    async def clear_probes(self, key: BreakerKey) -> None:
        await self._redis.delete(*self._probe_keys(key))

    async def read_all(self) -> list[SharedRecord]:
        with _redis_outage():
            return await self._read_all()

    async def add_observations(self, observations: list[Observation]) -> None:
        if not observations:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for o in observations:
                pipe.xadd(
                    f"{self._prefix}:health-observations",
                    {"o": o.encode()},
                    maxlen=OBSERVATIONS_KEPT,
                    approximate=True,
                )
            await pipe.execute()

    async def read_observations(self, after: str | None) -> tuple[list[Observation], str | None]:
        stream = f"{self._prefix}:health-observations"
        # Exclusive start after the cursor; one bounded page per call (the next sync goes on).
        entries = await self._redis.xrange(
            stream, min=f"({after}" if after else "-", max="+", count=10_000
        )
        out = []
        for _entry_id, fields in entries:
            raw = fields.get(b"o", fields.get("o"))
            if raw is not None:
                out.append(Observation.decode(_text(raw)))
        return out, (_text(entries[-1][0]) if entries else after)

    async def put_incumbent(self, group: str, candidate_id: str, since_s: float) -> None:
        value = json.dumps([candidate_id, since_s], separators=(",", ":"))
        await self._redis.hset(f"{self._prefix}:incumbents", group, value)

    async def read_incumbents(self) -> dict[str, tuple[str, float]]:
        rows = await self._redis.hgetall(f"{self._prefix}:incumbents")
        out = {}
        for group, raw in rows.items():
            cid, since = json.loads(_text(raw))
            out[_text(group)] = (str(cid), float(since))
        return out

    async def _read_all(self) -> list[SharedRecord]:
        keys = sorted(_text(k) for k in await self._redis.smembers(f"{self._prefix}:breakers"))
        if not keys:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for raw in keys:
                pipe.hgetall(self._hash(raw))
            rows = await pipe.execute()
        return [r for raw, row in zip(keys, rows, strict=True) if (r := _record(raw, row))]


def _record(raw: str, row: Any) -> SharedRecord | None:
    data = {_text(k): _text(v) for k, v in row.items()}
    if "state" not in data:
        return None
    return SharedRecord(
        key_from_text(raw),
        BreakerState(data["state"]),
        float(data["until"]) if data.get("until") else None,
        data.get("forced") == "1",
        data.get("reason", ""),
        int(data.get("version", "0")),
        int(data.get("level", "-1")),
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
