"""Redis-backed `LeaseStore` (redis-py asyncio), shared by all control-plane processes (9.11.1).

Key layout, all keys of one account in one Redis Cluster hash slot (`{account}` is the hash tag)::

    {ns}capacity:{runway:prod-us}:all-video   hash  used, capacity (last seen)
    {ns}lease:{runway:prod-us}:attempt-123    hash  token, fence, dims, slots, ttl, max_term,
                                                    acquired_at, expires_at, unknown
                                                    (PX = expiry + retain_ms)
    {ns}leases:{runway:prod-us}               zset  attempt_id -> expires_at (reclaimer scans it)
    {ns}fence:{runway:prod-us}                int   INCR per grant: the fencing token
    {ns}dims:{runway:prod-us}                 set   dimension keys ever used (for snapshots)
    {ns}unknown:{runway:prod-us}              hash  used, cap, refused (unknown budget, 9.11.3)
    {ns}live:{runway:prod-us}                 str   set by `restore`: the leases were rebuilt
    {ns}win:{runway:prod-us}:minute           zset  attempt -> admitted at (`windows`)
    {ns}win:{runway:prod-us}:day              zset  attempt -> admitted at
    {ns}win:{runway:prod-us}                  hash  minute, day (weight sums), day:<attempt>
                                                    (a weight other than 1), limits, spans
    {ns}spend:{runway:prod-us}:<month start>  hash  attempt -> cost micros, _sum (one per month)
    {ns}accounts                              set   accounts in use (untagged, only iterated)

Nothing about Redis's contents is cached in this process: a flush, a restart without persistence or
a failover to an empty replica leaves every instance reading what Redis holds now. Every acquire,
restore and counter write adds the account to `{ns}accounts` again (a separate SADD: the set has no
hash tag, so it cannot join the account's scripts on Redis Cluster). With `fail_closed=True` the
`live` marker guards admission: it vanishes with the data, and until `restore` has rebuilt the
account from PostgreSQL every acquire there is refused.

Writes that must be atomic go through the Lua scripts in `_lua`. Redis errors are translated into
`LeaseBackendError` (`_redis_wire.translated`), so callers never see redis exception types.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoScriptError, WatchError

from controlplane.leases import _lua
from controlplane.leases import windows as win
from controlplane.leases._redis_wire import (
    RedisClientConfig,
    accepts_new,
    decode_dims,
    encode_dims,
    lease_from,
    record,
    redis_client,
    text,
    translated,
)
from controlplane.leases.base import (
    AccountSnapshot,
    Dimension,
    HeldLease,
    InvalidLeaseRequest,
    Lease,
    LeaseBackendError,
    LeaseLostError,
    LeaseMetrics,
    LeaseRequest,
    UnknownSlotsFullHook,
    validate_account,
    validate_restore,
)
from controlplane.leases.windows import WindowEntry, WindowRefusal, WindowUse

__all__ = ["RedisClientConfig", "RedisLeaseStore", "redis_client"]

_RECLAIM_BATCH = 200
# Requests of one account in one ACQUIRE_MANY call: a bigger round is several calls in the same
# pipeline, so no single script holds the server for long (about 0.1 ms per acquire).
_BATCH_PER_CALL = 256
_SNAPSHOT_ATTEMPTS = 32


class RedisLeaseStore:
    """Lease store on Redis. Every process sharing `namespace` shares the quota.

    `namespace` prefixes every key (tests use a unique one per run). `retain_ms` is how long an
    expired lease record stays readable for the reclaimer. Past it, the record vanishes and only the
    reconciler can repair its counters. `fail_closed` refuses acquires in an account that is not
    live (see the module docstring); the scheduling runtime turns it on.
    """

    def __init__(
        self,
        client: Redis,
        *,
        namespace: str = "vidroute:",
        retain_ms: int = 600_000,
        on_unknown_slots_full: UnknownSlotsFullHook | None = None,
        fail_closed: bool = False,
        on_not_live: Callable[[str], None] | None = None,
        on_freed: Callable[[str], None] | None = None,
    ) -> None:
        if "{" in namespace or "}" in namespace:
            raise InvalidLeaseRequest(
                "namespace must not contain braces: they would become the hash tag"
            )
        self.metrics = LeaseMetrics()
        self._redis = client
        self._ns = namespace
        self._retain_ms = retain_ms
        self._on_unknown_slots_full = on_unknown_slots_full
        self.fail_closed = fail_closed  # `base.LeaseStoreFactory` says what the three are
        self._on_not_live = on_not_live
        self._on_freed = on_freed
        self._acquire = client.register_script(_lua.ACQUIRE)
        self._acquire_many = client.register_script(_lua.ACQUIRE_MANY)
        self._drop = client.register_script(_lua.DROP)
        self._renew = client.register_script(_lua.RENEW)
        self._unknown = client.register_script(_lua.UNKNOWN)
        self._adjust = client.register_script(_lua.ADJUST)
        self._restore = client.register_script(_lua.RESTORE)
        self._usage = client.register_script(_lua.USAGE)
        self._stamp = client.register_script(_lua.STAMP)

    # -- key layout --

    def _key(self, kind: str, account: str, suffix: str | None = None) -> str:
        key = f"{self._ns}{kind}:{{{account}}}"
        return key if suffix is None else f"{key}:{suffix}"

    def _window_keys(self, account: str) -> list[str]:
        """The minute and day zsets and the window hash: declared keys of every script."""
        return [
            self._key("win", account, "minute"),
            self._key("win", account, "day"),
            self._key("win", account),
        ]

    def _account_keys(self, account: str) -> list[str]:
        """The account's own keys, declared first by the scripts that act on the whole account
        (ACQUIRE_MANY and the restore): its lease index, fence, dimensions, UNKNOWN holds, live
        mark and windows."""
        return [
            self._key("leases", account),
            self._key("fence", account),
            self._key("dims", account),
            self._key("unknown", account),
            self._key("live", account),
            *self._window_keys(account),
        ]

    def _capacity_keys(self, account: str, dims: Iterable[Dimension]) -> list[str]:
        return [self._key("capacity", account, d.key) for d in dims]

    async def _register(self, account: str) -> None:
        # Every time, never "once per process": after a flush the set is empty again.
        validate_account(account)
        await self._redis.sadd(f"{self._ns}accounts", account)

    # -- LeaseStore --

    async def now_ms(self) -> int:
        """Return Redis server TIME in milliseconds."""
        async with translated("now_ms"):
            seconds, micros = await self._redis.time()
        return int(seconds) * 1000 + int(micros) // 1000

    async def acquire(self, req: LeaseRequest) -> Lease | None:
        """Reserve every dimension or none in one script. See `LeaseStore.acquire`."""
        keys, args = self._acquire_call(req)
        async with translated("acquire"):
            await self._register(req.account)
            reply = await self._acquire(keys=keys, args=args)
        got = self._acquired(req, str(args[1]), reply)
        return got if isinstance(got, Lease) else None

    async def acquire_many(self, requests: Sequence[LeaseRequest]) -> list[Lease | None]:
        """`admit_many` with every refusal as None. See `LeaseStore.acquire_many`."""
        return [g if isinstance(g, Lease) else None for g in await self.admit_many(requests)]

    async def admit_many(
        self, requests: Sequence[LeaseRequest]
    ) -> list[Lease | WindowRefusal | None]:
        """One pipeline (one round trip): the accounts' registrations, then one ACQUIRE_MANY
        script call per account (at most `_BATCH_PER_CALL` requests each) with that account's
        requests in order. See `LeaseStore.admit_many`.

        ACQUIRE_MANY runs ACQUIRE's code per request (`_lua._ACQUIRE_ONE`), so the answers are
        those of one ACQUIRE per request in the same order; requests of different accounts
        touch no common key, so grouping them by account changes nothing. Each script is atomic
        per account (its keys share the hash tag), so the batch stays correct on Redis Cluster,
        where the pipeline is split per node.
        """
        if not requests:
            return []
        for req in requests:
            validate_account(req.account)
        tokens = [secrets.token_hex(16) for _ in requests]
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(req.account, []).append(i)
        chunks = [
            (account, indexes[at : at + _BATCH_PER_CALL])
            for account, indexes in groups.items()
            for at in range(0, len(indexes), _BATCH_PER_CALL)
        ]
        calls = [self._acquire_many_call(account, requests, tokens, idx) for account, idx in chunks]
        async with translated("acquire_many"):
            replies = await self._evalsha_batch(
                self._acquire_many,
                calls,
                prelude=[("SADD", f"{self._ns}accounts", *sorted(groups))],
            )
        answers: list[Any] = [None] * len(requests)
        for (_, indexes), reply in zip(chunks, replies, strict=True):
            for i, answer in zip(indexes, json.loads(reply), strict=True):
                answers[i] = answer
        return [
            self._acquired(req, token, answer)
            for req, token, answer in zip(requests, tokens, answers, strict=True)
        ]

    def _acquire_many_call(
        self,
        account: str,
        requests: Sequence[LeaseRequest],
        tokens: Sequence[str],
        indexes: Sequence[int],
    ) -> tuple[list[str], list[str | int]]:
        """ACQUIRE_MANY's keys and arguments for `account`'s requests at `indexes`."""
        keys = self._account_keys(account)
        args: list[str | int] = [
            self._retain_ms,
            account,
            "1" if self.fail_closed else "0",
            self._key("lease", account, ""),
            self._key("capacity", account, ""),
            _RECLAIM_BATCH,
            self._key("spend", account, ""),
        ]
        for i in indexes:
            req = requests[i]
            args += [
                req.attempt_id,
                tokens[i],
                req.slots,
                req.ttl_ms,
                req.max_term_ms,
                encode_dims(req.dimensions),
                "" if req.windows is None else json.dumps(req.windows.encode()),
            ]
        return keys, args

    async def release_many(self, leases: Sequence[Lease], *, unsent: bool = False) -> list[bool]:
        """One pipeline of DROP script calls. See `LeaseStore.release_many`."""
        if not leases:
            return []
        calls = [
            self._drop_call(
                lease.account,
                lease.attempt_id,
                lease.token,
                lease.dimensions,
                mode="release",
                now_ms=None,
                fence=str(lease.fencing_token),
                unsent=unsent,
            )
            for lease in leases
        ]
        async with translated("release_many"):
            replies = await self._evalsha_batch(self._drop, calls)
        done = [int(r) == 1 for r in replies]
        self.metrics.released += sum(done)
        for account in sorted(
            {lease.account for lease, ok in zip(leases, done, strict=True) if ok}
        ):
            self._freed(account)
        return done

    async def _evalsha_batch(
        self,
        script: Any,
        calls: Sequence[tuple[list[str], list[str | int]]],
        *,
        prelude: Sequence[tuple[Any, ...]] = (),
    ) -> list[Any]:
        """Run `script` once per (keys, args) in one non-transactional pipeline; the replies.

        EVALSHA by hand (redis-py's pipeline would add a SCRIPT EXISTS round trip per execute);
        a server that lost the script (restart, SCRIPT FLUSH) answers NOSCRIPT, which loads it
        and runs the batch again: a NOSCRIPT call did nothing, so nothing runs twice.
        """
        for _ in range(2):
            async with self._redis.pipeline(transaction=False) as pipe:
                for command in prelude:
                    pipe.execute_command(*command)
                for keys, args in calls:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                replies = await pipe.execute(raise_on_error=False)
            replies = replies[len(prelude) :]
            if not any(isinstance(r, NoScriptError) for r in replies):
                for reply in replies:
                    if isinstance(reply, Exception):
                        raise reply
                return list(replies)
            if not all(isinstance(r, NoScriptError) for r in replies):
                raise LeaseBackendError("scripts vanished in the middle of a batch")
            await self._redis.script_load(script.script)
        raise LeaseBackendError("the script could not be loaded")

    def _freed(self, account: str) -> None:
        if self._on_freed is not None:
            self._on_freed(account)

    def _acquire_call(self, req: LeaseRequest) -> tuple[list[str], list[str | int]]:
        keys = [
            self._key("lease", req.account, req.attempt_id),
            self._key("leases", req.account),
            self._key("fence", req.account),
            self._key("dims", req.account),
            self._key("unknown", req.account),
            self._key("live", req.account),
            *self._window_keys(req.account),
            *self._capacity_keys(req.account, req.dimensions),
        ]
        args: list[str | int] = [
            req.attempt_id,
            secrets.token_hex(16),
            req.slots,
            req.ttl_ms,
            req.max_term_ms,
            self._retain_ms,
            encode_dims(req.dimensions),
            req.account,
            "1" if self.fail_closed else "0",
            self._key("lease", req.account, ""),
            self._key("capacity", req.account, ""),
            _RECLAIM_BATCH,
            "" if req.windows is None else json.dumps(req.windows.encode()),
            self._key("spend", req.account, ""),
        ]
        for dim in req.dimensions:
            args += [dim.key, dim.capacity]
        return keys, args

    def _acquired(self, req: LeaseRequest, token: str, reply: Any) -> Lease | WindowRefusal | None:
        code = int(reply[0])
        self.metrics.reclaimed += int(reply[2])
        if int(reply[2]):
            self._freed(req.account)
        if code == 4:
            self.metrics.rejected_not_live += 1
            if self._on_not_live is not None:
                self._on_not_live(req.account)
            return None
        if code == 0:
            self.metrics.rejected_no_capacity += 1
            return None
        if code == 5:
            return self._refusal(req, reply[1])
        if code == 2:
            self.metrics.reacquired += 1
            return lease_from(record(reply[1]))
        self.metrics.acquired += 1
        fence, acquired_at, expires_at = (int(v) for v in reply[1])
        return Lease(
            attempt_id=req.attempt_id,
            account=req.account,
            token=token,
            fencing_token=fence,
            dimensions=tuple(req.dimensions),
            slots=req.slots,
            acquired_at_ms=acquired_at,
            expires_at_ms=expires_at,
            ttl_ms=req.ttl_ms,
            max_term_ms=req.max_term_ms,
        )

    def _refusal(self, req: LeaseRequest, raw: Any) -> WindowRefusal:
        self.metrics.rejected_window += 1
        name, limit, used, requested, reopens = raw
        return WindowRefusal(
            req.account,
            text(name),
            int(limit),
            int(used),
            int(requested),
            None if int(reopens) < 0 else int(reopens),
        )

    async def renew(self, lease: Lease) -> Lease | None:
        """Extend the expiry, capped at the max term. See `LeaseStore.renew`."""
        keys = [
            self._key("lease", lease.account, lease.attempt_id),
            self._key("leases", lease.account),
        ]
        async with translated("renew"):
            reply = await self._renew(
                keys=keys,
                args=[lease.token, lease.attempt_id, self._retain_ms, lease.fencing_token],
            )
        if int(reply[0]) == 0:
            self.metrics.renew_failed += 1
            return None
        self.metrics.renewed += 1
        return lease_from(record(reply[1]))

    async def release(self, lease: Lease) -> bool:
        """Return the slots once, if the token matches. See `LeaseStore.release`."""
        async with translated("release"):
            released = await self._drop_lease(
                lease.account,
                lease.attempt_id,
                lease.token,
                lease.dimensions,
                mode="release",
                now_ms=None,
                fence=str(lease.fencing_token),
            )
        if released:
            self.metrics.released += 1
            self._freed(lease.account)
        return released

    async def mark_unknown(self, lease: Lease, unknown_cap: int) -> bool:
        """Move the slots into the unknown budget unless full. See `LeaseStore.mark_unknown`."""
        if unknown_cap < 0:
            raise InvalidLeaseRequest(f"unknown_cap must be >= 0, got {unknown_cap}")
        code, accepting = await self._unknown_op(lease, "mark", unknown_cap)
        if code == 1:
            self.metrics.unknown_marked += 1
        if not accepting:
            self.metrics.unknown_slots_full += 1
            if self._on_unknown_slots_full is not None:
                self._on_unknown_slots_full(lease.account)
        return code == 1

    async def resolve_unknown(self, lease: Lease) -> bool:
        """Move an unknown lease back to confirmed. See `LeaseStore.resolve_unknown`."""
        code, _ = await self._unknown_op(lease, "resolve", 0)
        return code == 1

    async def accepting_new(self, account: str) -> bool:
        """False while the unknown budget is full. See `LeaseStore.accepting_new`."""
        async with translated("accepting_new"):
            used, cap, refused = await self._redis.hmget(
                self._key("unknown", account), ["used", "cap", "refused"]
            )
        return accepts_new(int(used or 0), None if cap is None else int(cap), refused is not None)

    async def reclaim_expired(self, now_ms: int | None = None) -> list[str]:
        """Return expired leases' slots, all accounts. See `LeaseStore.reclaim_expired`."""
        reclaimed: list[str] = []
        freed: set[str] = set()
        async with translated("reclaim_expired"):
            now = await self.now_ms() if now_ms is None else now_ms
            for account in await self.accounts():
                index = self._key("leases", account)
                while True:
                    due = await self._redis.zrangebyscore(
                        index, "-inf", now, start=0, num=_RECLAIM_BATCH
                    )
                    for raw_id in due:
                        attempt_id = text(raw_id)
                        if await self._reclaim_one(account, attempt_id, now_ms):
                            reclaimed.append(attempt_id)
                            freed.add(account)
                    if len(due) < _RECLAIM_BATCH:
                        break
        self.metrics.reclaimed += len(reclaimed)
        for account in sorted(freed):
            self._freed(account)
        return reclaimed

    async def is_live(self, account: str) -> bool:
        """Whether the account's live marker exists. See `LeaseStore.is_live`."""
        async with translated("is_live"):
            return bool(await self._redis.exists(self._key("live", account)))

    async def restore(
        self,
        account: str,
        holders: Sequence[HeldLease],
        *,
        ttl_ms: int,
        max_term_ms: int,
        unknown_cap: int | None = None,
        windows: Sequence[WindowEntry] = (),
    ) -> list[str]:
        """Rebuild missing holders' leases and mark the account live. See `LeaseStore.restore`."""
        validate_restore(account, ttl_ms, max_term_ms)
        keys = self._account_keys(account)
        rows: list[list[str]] = []
        for h in holders:
            if h.account != account:
                raise InvalidLeaseRequest(f"holder {h.attempt_id} is in {h.account}, not {account}")
            keys.append(self._key("lease", account, h.attempt_id))
            keys += self._capacity_keys(account, h.dimensions)
            rows.append(
                [
                    h.attempt_id,
                    h.token,
                    str(h.fencing_token),
                    encode_dims(h.dimensions),
                    str(h.slots),
                    "1" if h.unknown else "0",
                    "1" if h.sent else "0",
                ]
            )
        args: list[str | int] = [
            ttl_ms,
            max_term_ms,
            self._retain_ms,
            account,
            "" if unknown_cap is None else unknown_cap,
            json.dumps(rows, separators=(",", ":")),
            json.dumps(
                [[e.attempt_id, e.at_ms, e.generations, e.cost_micros] for e in windows],
                separators=(",", ":"),
            ),
            self._key("spend", account, ""),
        ]
        async with translated("restore"):
            await self._register(account)
            reply = await self._restore(keys=keys, args=args)
        restored = [text(r) for r in reply]
        self.metrics.restored += len(restored)
        return restored

    async def stamp_send(self, req: LeaseRequest) -> WindowRefusal | None:
        """The attempt is sent now: its windows count it from now. See `LeaseStore.stamp_send`."""
        if req.windows is None:
            return None
        async with translated("stamp_send"):
            reply = await self._stamp(
                keys=self._window_keys(req.account),
                args=[
                    req.attempt_id,
                    json.dumps(req.windows.encode()),
                    self._key("spend", req.account, ""),
                ],
            )
        if int(reply[0]) != 5:
            return None
        return self._refusal(req, reply[1])

    async def window_usage(self, account: str) -> list[WindowUse]:
        """Each window's use now and its last seen limit. See `LeaseStore.window_usage`."""
        validate_account(account)
        async with translated("window_usage"):
            reply = await self._usage(
                keys=self._window_keys(account), args=[self._key("spend", account, "")]
            )
        values = [int(v) for v in reply]
        return [
            WindowUse(name, values[i], None if values[3 + i] < 0 else values[3 + i])
            for i, name in enumerate(win.WINDOWS)
        ]

    async def used(self, account: str, dimension_key: str) -> int:
        """Slots counted in one dimension."""
        async with translated("used"):
            value = await self._redis.hget(self._key("capacity", account, dimension_key), "used")
        return int(value or 0)

    async def unknown_used(self, account: str) -> int:
        """Slots counted in the unknown budget."""
        async with translated("unknown_used"):
            value = await self._redis.hget(self._key("unknown", account), "used")
        return int(value or 0)

    async def snapshot(self, account: str) -> AccountSnapshot:
        """Read counters and leases in one MULTI, retried while the key set changes under it."""
        index, dims_set = self._key("leases", account), self._key("dims", account)
        async with translated("snapshot"), self._redis.pipeline(transaction=True) as pipe:
            for _ in range(_SNAPSHOT_ATTEMPTS):
                try:
                    # WATCH fails the EXEC if a lease or dimension came or went since listing.
                    await pipe.watch(index, dims_set)
                    attempt_ids = [text(a) for a in await pipe.zrange(index, 0, -1)]
                    dim_keys = sorted(text(d) for d in await pipe.smembers(dims_set))
                    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
                    for key in dim_keys:
                        pipe.hmget(self._key("capacity", account, key), ["used", "capacity"])
                    for attempt_id in attempt_ids:
                        pipe.hgetall(self._key("lease", account, attempt_id))
                    pipe.hmget(self._key("unknown", account), ["used", "cap", "refused"])
                    results = await pipe.execute()
                    break
                except WatchError:
                    continue
            else:
                raise LeaseBackendError(f"snapshot of {account} kept racing with writers")
        return self._build_snapshot(account, dim_keys, results)

    async def lease_of(self, account: str, attempt_id: str) -> Lease | None:
        """The stored record of one lease, one HGETALL (`LeaseKeeper`'s fast path; a snapshot
        reads every lease of the account)."""
        async with translated("lease_of"):
            raw = await self._redis.hgetall(self._key("lease", account, attempt_id))
        return lease_from(record(raw)) if raw else None

    async def accounts(self) -> list[str]:
        """Accounts ever used with this namespace."""
        async with translated("accounts"):
            members = await self._redis.smembers(f"{self._ns}accounts")
        return sorted(text(m) for m in members)

    async def set_used(self, account: str, dimension_key: str, value: int) -> None:
        """Overwrite a dimension counter."""
        if value < 0:
            raise InvalidLeaseRequest(f"used must be >= 0, got {value}")
        await self._adjust_counter(account, dimension_key, "set", value)

    async def adjust_used(self, account: str, dimension_key: str, delta: int) -> int:
        """Add `delta` to a dimension counter, clamped at 0."""
        return await self._adjust_counter(account, dimension_key, "add", delta)

    async def set_unknown_used(self, account: str, value: int) -> None:
        """Overwrite the unknown budget counter."""
        if value < 0:
            raise InvalidLeaseRequest(f"unknown used must be >= 0, got {value}")
        await self._adjust_counter(account, None, "set", value)

    async def adjust_unknown_used(self, account: str, delta: int) -> int:
        """Add `delta` to the unknown budget counter, clamped at 0."""
        return await self._adjust_counter(account, None, "add", delta)

    # -- helpers --

    async def _drop_lease(
        self,
        account: str,
        attempt_id: str,
        token: str,
        dims: Sequence[Dimension],
        *,
        mode: str,
        now_ms: int | None,
        fence: str = "",
    ) -> bool:
        keys, args = self._drop_call(
            account, attempt_id, token, dims, mode=mode, now_ms=now_ms, fence=fence
        )
        return int(await self._drop(keys=keys, args=args)) == 1

    def _drop_call(
        self,
        account: str,
        attempt_id: str,
        token: str,
        dims: Sequence[Dimension],
        *,
        mode: str,
        now_ms: int | None,
        fence: str = "",
        unsent: bool = False,
    ) -> tuple[list[str], list[str | int]]:
        keys = [
            self._key("lease", account, attempt_id),
            self._key("leases", account),
            self._key("unknown", account),
            *self._window_keys(account),
            *self._capacity_keys(account, dims),
        ]
        args: list[str | int] = [
            token,
            attempt_id,
            encode_dims(dims),
            mode,
            "" if now_ms is None else str(now_ms),
            fence,
            "1" if unsent else "0",
        ]
        return keys, args

    async def _reclaim_one(self, account: str, attempt_id: str, now_ms: int | None) -> bool:
        """Reclaim one expired lease; reading the record first lets the script declare its keys."""
        token, dims = await self._redis.hmget(
            self._key("lease", account, attempt_id), ["token", "dims"]
        )
        if token is None or dims is None:
            # The record outlived retain_ms and is gone. Its counters are the reconciler's job now.
            await self._redis.zrem(self._key("leases", account), attempt_id)
            return False
        return await self._drop_lease(
            account,
            attempt_id,
            text(token),
            decode_dims(text(dims)),
            mode="reclaim",
            now_ms=now_ms,
        )

    async def _unknown_op(self, lease: Lease, mode: str, cap: int) -> tuple[int, bool]:
        keys = [
            self._key("lease", lease.account, lease.attempt_id),
            self._key("unknown", lease.account),
        ]
        async with translated(f"{mode}_unknown"):
            code, accepting = await self._unknown(
                keys=keys, args=[lease.token, mode, cap, lease.fencing_token]
            )
        if int(code) == -1:
            raise LeaseLostError(f"lease for {lease.attempt_id} in {lease.account} is not held")
        return int(code), int(accepting) == 1

    async def _adjust_counter(
        self, account: str, dimension_key: str | None, mode: str, value: int
    ) -> int:
        args: list[str | int]
        if dimension_key is None:
            keys, args = [self._key("unknown", account)], [mode, value, "1", ""]
        else:
            keys = [self._key("capacity", account, dimension_key), self._key("dims", account)]
            args = [mode, value, "0", dimension_key]
        async with translated("adjust"):
            await self._register(account)
            new = int(await self._adjust(keys=keys, args=args))
        self.metrics.counters_adjusted += 1
        return new

    def _build_snapshot(
        self, account: str, dim_keys: list[str], results: list[Any]
    ) -> AccountSnapshot:
        used: dict[str, int] = {}
        capacity: dict[str, int] = {}
        for key, (raw_used, raw_cap) in zip(dim_keys, results[: len(dim_keys)], strict=True):
            used[key] = int(raw_used or 0)
            if raw_cap is not None:
                capacity[key] = int(raw_cap)
        leases = tuple(lease_from(record(raw)) for raw in results[len(dim_keys) : -1] if raw)
        unknown_used, unknown_cap, refused = results[-1]
        cap = None if unknown_cap is None else int(unknown_cap)
        return AccountSnapshot(
            account=account,
            used=used,
            capacity=capacity,
            unknown_used=int(unknown_used or 0),
            unknown_cap=cap,
            accepting_new=accepts_new(int(unknown_used or 0), cap, refused is not None),
            leases=leases,
        )
