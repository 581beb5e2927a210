"""In-process `LeaseStore`: the embedded default without Redis, and the fake beside the Redis store.

It follows the same rules as `RedisLeaseStore`. The shared contract suite proves this. One
asyncio.Lock stands in for Lua atomicity, and the clock is injectable, so tests move time forward
instead of sleeping. Its state lives in one process, so it gives no protection across processes.
A restart of that process loses every lease while PostgreSQL still has attempts in flight: with
`fail_closed=True` it refuses acquires until `restore` has rebuilt an account, like the Redis store
after a flush. `forget_everything` is that loss on purpose, for the shared contract tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections.abc import Callable, Sequence

from controlplane.leases.base import (
    AccountSnapshot,
    HeldLease,
    InvalidLeaseRequest,
    Lease,
    LeaseLostError,
    LeaseMetrics,
    LeaseRequest,
    UnknownSlotsFullHook,
    validate_account,
    validate_restore,
)
from controlplane.leases.memory_windows import MemoryWindows
from controlplane.leases.windows import WindowEntry, WindowRefusal, WindowUse

__all__ = ["MemoryLeaseStore", "wall_clock_ms"]


def wall_clock_ms() -> int:
    """Wall-clock milliseconds, the same kind of clock as Redis TIME, so lease times read alike."""
    return time.time_ns() // 1_000_000


class MemoryLeaseStore:
    """Lease store held in this process's memory. Every operation runs under one lock."""

    def __init__(
        self,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        on_unknown_slots_full: UnknownSlotsFullHook | None = None,
        fail_closed: bool = False,
        on_not_live: Callable[[str], None] | None = None,
        on_freed: Callable[[str], None] | None = None,
    ) -> None:
        self.metrics = LeaseMetrics()
        self._clock = clock
        self._on_unknown_slots_full = on_unknown_slots_full
        self.fail_closed = fail_closed  # `base.LeaseStoreFactory` says what the three are
        self._on_not_live = on_not_live
        self._on_freed = on_freed
        self._lock = asyncio.Lock()
        self._windows = MemoryWindows()
        self.forget_everything()

    def forget_everything(self) -> None:
        """Drop every lease, counter and live mark: as FLUSHALL does to the Redis store."""
        self._used: dict[tuple[str, str], int] = {}
        self._capacity: dict[tuple[str, str], int] = {}
        self._leases: dict[tuple[str, str], Lease] = {}
        self._fence: dict[str, int] = {}
        self._unknown_used: dict[str, int] = {}
        self._unknown_cap: dict[str, int] = {}
        # Accounts where a mark_unknown was refused. The flag clears when the unknown budget drains.
        self._unknown_refused: set[str] = set()
        self._accounts: set[str] = set()
        self._live: set[str] = set()
        self._windows.forget()

    async def now_ms(self) -> int:
        """Return the injected clock."""
        return self._clock()

    async def acquire(self, req: LeaseRequest) -> Lease | None:
        """Reserve every dimension or none. See `LeaseStore.acquire`."""
        async with self._lock:
            got = self._acquire(req)
        return got if isinstance(got, Lease) else None

    async def acquire_many(self, requests: Sequence[LeaseRequest]) -> list[Lease | None]:
        """`admit_many` with every refusal as None. See `LeaseStore.acquire_many`."""
        return [g if isinstance(g, Lease) else None for g in await self.admit_many(requests)]

    async def admit_many(
        self, requests: Sequence[LeaseRequest]
    ) -> list[Lease | WindowRefusal | None]:
        """Every request in order under one hold of the lock. See `LeaseStore.admit_many`."""
        async with self._lock:
            return [self._acquire(req) for req in requests]

    async def release_many(self, leases: Sequence[Lease], *, unsent: bool = False) -> list[bool]:
        """Every release under one hold of the lock. See `LeaseStore.release_many`."""
        async with self._lock:
            return [self._release(lease, unsent=unsent) for lease in leases]

    async def stamp_send(self, req: LeaseRequest) -> WindowRefusal | None:
        """The attempt is sent now. See `LeaseStore.stamp_send`."""
        if req.windows is None:
            return None
        async with self._lock:
            refusal = self._windows.stamp(req.account, req.attempt_id, req.windows, self._clock())
        if refusal is not None:
            self.metrics.rejected_window += 1
        return refusal

    async def window_usage(self, account: str) -> list[WindowUse]:
        """Each window's use now. See `LeaseStore.window_usage`."""
        async with self._lock:
            return self._windows.usage(account, self._clock())

    def _acquire(self, req: LeaseRequest) -> Lease | WindowRefusal | None:
        now = self._clock()
        self._accounts.add(req.account)
        if self.fail_closed and req.account not in self._live:
            self.metrics.rejected_not_live += 1
            if self._on_not_live is not None:
                self._on_not_live(req.account)
            return None
        reclaimed = 0
        for lease in [v for (a, _), v in self._leases.items() if a == req.account]:
            if lease.expires_at_ms <= now:  # a dead holder's slots come back on acquire
                self._drop(lease)
                self.metrics.reclaimed += 1
                reclaimed += 1
        if reclaimed:
            self._freed(req.account)
        existing = self._leases.get((req.account, req.attempt_id))
        if existing is not None:
            self.metrics.reacquired += 1
            return existing
        if req.windows is not None:
            refusal = self._windows.admit(req.account, req.attempt_id, req.windows, now)
            if refusal is not None:
                self.metrics.rejected_window += 1
                return refusal
        for dim in req.dimensions:
            if self._used.get((req.account, dim.key), 0) + req.slots > dim.capacity:
                self.metrics.rejected_no_capacity += 1
                return None
        for dim in req.dimensions:
            ref = (req.account, dim.key)
            self._used[ref] = self._used.get(ref, 0) + req.slots
            self._capacity[ref] = dim.capacity
        if req.windows is not None:
            self._windows.take(req.account, req.attempt_id, req.windows, now)
        self._fence[req.account] = self._fence.get(req.account, 0) + 1
        lease = Lease(
            attempt_id=req.attempt_id,
            account=req.account,
            token=secrets.token_hex(16),
            fencing_token=self._fence[req.account],
            dimensions=req.dimensions,
            slots=req.slots,
            acquired_at_ms=now,
            expires_at_ms=now + req.ttl_ms,
            ttl_ms=req.ttl_ms,
            max_term_ms=req.max_term_ms,
        )
        self._leases[(req.account, req.attempt_id)] = lease
        self.metrics.acquired += 1
        return lease

    async def renew(self, lease: Lease) -> Lease | None:
        """Extend the expiry, capped at the max term. See `LeaseStore.renew`."""
        async with self._lock:
            now = self._clock()
            record = self._held(lease, now)
            if record is None:
                self.metrics.renew_failed += 1
                return None
            target = min(now + record.ttl_ms, record.term_ends_at_ms)
            renewed = dataclasses.replace(record, expires_at_ms=max(record.expires_at_ms, target))
            self._leases[(record.account, record.attempt_id)] = renewed
            self.metrics.renewed += 1
            return renewed

    async def release(self, lease: Lease) -> bool:
        """Return the slots once, if the token matches. See `LeaseStore.release`."""
        async with self._lock:
            return self._release(lease)

    def _release(self, lease: Lease, *, unsent: bool = False) -> bool:
        record = self._leases.get((lease.account, lease.attempt_id))
        if record is None or not _same_holder(record, lease):
            return False
        if record.dimensions != lease.dimensions:
            raise InvalidLeaseRequest("release: lease dimensions differ from the record")
        self._drop(record, unsent=unsent)
        self.metrics.released += 1
        self._freed(record.account)
        return True

    def _freed(self, account: str) -> None:
        if self._on_freed is not None:
            self._on_freed(account)

    async def mark_unknown(self, lease: Lease, unknown_cap: int) -> bool:
        """Move the slots into the unknown budget unless full. See `LeaseStore.mark_unknown`."""
        if unknown_cap < 0:
            raise InvalidLeaseRequest(f"unknown_cap must be >= 0, got {unknown_cap}")
        async with self._lock:
            record = self._held(lease, self._clock())
            if record is None:
                raise LeaseLostError(f"lease for {lease.attempt_id} in {lease.account} is not held")
            account = record.account
            self._unknown_cap[account] = unknown_cap
            accepted = True
            if not record.unknown:
                if self._unknown_used.get(account, 0) + record.slots > unknown_cap:
                    self._unknown_refused.add(account)
                    accepted = False
                else:
                    self._unknown_used[account] = self._unknown_used.get(account, 0) + record.slots
                    self._leases[(account, record.attempt_id)] = dataclasses.replace(
                        record, unknown=True
                    )
                    self.metrics.unknown_marked += 1
            full = not self._accepting(account)
        if full:
            self._report_full(account)
        return accepted

    async def resolve_unknown(self, lease: Lease) -> bool:
        """Move an unknown lease back to confirmed. See `LeaseStore.resolve_unknown`."""
        async with self._lock:
            record = self._held(lease, self._clock())
            if record is None:
                raise LeaseLostError(f"lease for {lease.attempt_id} in {lease.account} is not held")
            if not record.unknown:
                return False
            self._add_unknown(record.account, -record.slots)
            self._leases[(record.account, record.attempt_id)] = dataclasses.replace(
                record, unknown=False
            )
            return True

    async def accepting_new(self, account: str) -> bool:
        """False while the unknown budget is full. See `LeaseStore.accepting_new`."""
        async with self._lock:
            return self._accepting(account)

    async def reclaim_expired(self, now_ms: int | None = None) -> list[str]:
        """Return expired leases' slots, oldest first. See `LeaseStore.reclaim_expired`."""
        async with self._lock:
            now = self._clock() if now_ms is None else now_ms
            expired = sorted(
                (lease for lease in self._leases.values() if lease.expires_at_ms <= now),
                key=lambda lease: lease.expires_at_ms,
            )
            for lease in expired:
                self._drop(lease)
            self.metrics.reclaimed += len(expired)
            for account in sorted({lease.account for lease in expired}):
                self._freed(account)
            return [lease.attempt_id for lease in expired]

    async def is_live(self, account: str) -> bool:
        """Whether `restore` ran for the account since the last loss."""
        async with self._lock:
            return account in self._live

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
        async with self._lock:
            now = self._clock()
            self._accounts.add(account)
            restored: list[str] = []
            was_live = account in self._live
            if not was_live:
                self._windows.restore(account, list(windows), now)
            for h in holders:
                if h.account != account:
                    raise InvalidLeaseRequest(f"holder {h.attempt_id} is in {h.account}")
                self._fence[account] = max(self._fence.get(account, 0), h.fencing_token)
                if (account, h.attempt_id) in self._leases or (was_live and not h.sent):
                    continue
                for dim in h.dimensions:
                    ref = (account, dim.key)
                    self._used[ref] = self._used.get(ref, 0) + h.slots
                    self._capacity[ref] = dim.capacity
                if h.unknown:
                    self._add_unknown(account, h.slots)
                self._leases[(account, h.attempt_id)] = Lease(
                    attempt_id=h.attempt_id,
                    account=account,
                    token=h.token,
                    fencing_token=h.fencing_token,
                    dimensions=h.dimensions,
                    slots=h.slots,
                    acquired_at_ms=now,
                    expires_at_ms=now + ttl_ms,
                    ttl_ms=ttl_ms,
                    max_term_ms=max_term_ms,
                    unknown=h.unknown,
                )
                restored.append(h.attempt_id)
            if unknown_cap is not None:
                self._unknown_cap[account] = unknown_cap
            self._live.add(account)
            self.metrics.restored += len(restored)
            return restored

    async def used(self, account: str, dimension_key: str) -> int:
        """Slots counted in one dimension."""
        async with self._lock:
            return self._used.get((account, dimension_key), 0)

    async def unknown_used(self, account: str) -> int:
        """Slots counted in the unknown budget."""
        async with self._lock:
            return self._unknown_used.get(account, 0)

    async def snapshot(self, account: str) -> AccountSnapshot:
        """Read every counter and lease record of an account under the lock."""
        async with self._lock:
            return AccountSnapshot(
                account=account,
                used={k: v for (a, k), v in self._used.items() if a == account},
                capacity={k: v for (a, k), v in self._capacity.items() if a == account},
                unknown_used=self._unknown_used.get(account, 0),
                unknown_cap=self._unknown_cap.get(account),
                accepting_new=self._accepting(account),
                leases=tuple(v for (a, _), v in self._leases.items() if a == account),
            )

    async def lease_of(self, account: str, attempt_id: str) -> Lease | None:
        """The stored record of one lease (point read; `LeaseKeeper`'s fast path)."""
        async with self._lock:
            return self._leases.get((account, attempt_id))

    async def accounts(self) -> list[str]:
        """Accounts seen by this store."""
        async with self._lock:
            return sorted(self._accounts)

    async def set_used(self, account: str, dimension_key: str, value: int) -> None:
        """Overwrite a dimension counter."""
        validate_account(account)
        if value < 0:
            raise InvalidLeaseRequest(f"used must be >= 0, got {value}")
        async with self._lock:
            self._accounts.add(account)
            self._used[(account, dimension_key)] = value
            self.metrics.counters_adjusted += 1

    async def adjust_used(self, account: str, dimension_key: str, delta: int) -> int:
        """Add `delta` to a dimension counter, clamped at 0."""
        validate_account(account)
        async with self._lock:
            self._accounts.add(account)
            ref = (account, dimension_key)
            self._used[ref] = max(0, self._used.get(ref, 0) + delta)
            self.metrics.counters_adjusted += 1
            return self._used[ref]

    async def set_unknown_used(self, account: str, value: int) -> None:
        """Overwrite the unknown budget counter."""
        validate_account(account)
        if value < 0:
            raise InvalidLeaseRequest(f"unknown used must be >= 0, got {value}")
        async with self._lock:
            self._accounts.add(account)
            self._add_unknown(account, value - self._unknown_used.get(account, 0))
            self.metrics.counters_adjusted += 1

    async def adjust_unknown_used(self, account: str, delta: int) -> int:
        """Add `delta` to the unknown budget counter, clamped at 0."""
        validate_account(account)
        async with self._lock:
            self._accounts.add(account)
            self._add_unknown(account, delta)
            self.metrics.counters_adjusted += 1
            return self._unknown_used[account]

    def _held(self, lease: Lease, now: int) -> Lease | None:
        record = self._leases.get((lease.account, lease.attempt_id))
        if record is None or not _same_holder(record, lease) or record.expires_at_ms <= now:
            return None
        return record

    def _drop(self, record: Lease, *, unsent: bool = False) -> None:
        self._windows.dropped(record.account, record.attempt_id, unsent=unsent)
        for dim in record.dimensions:
            ref = (record.account, dim.key)
            self._used[ref] = max(0, self._used.get(ref, 0) - record.slots)
        if record.unknown:
            self._add_unknown(record.account, -record.slots)
        del self._leases[(record.account, record.attempt_id)]

    def _add_unknown(self, account: str, delta: int) -> None:
        self._unknown_used[account] = max(0, self._unknown_used.get(account, 0) + delta)
        if delta < 0:
            self._unknown_refused.discard(account)

    def _accepting(self, account: str) -> bool:
        if account in self._unknown_refused:
            return False
        cap = self._unknown_cap.get(account)
        return cap is None or self._unknown_used.get(account, 0) < cap

    def _report_full(self, account: str) -> None:
        self.metrics.unknown_slots_full += 1
        if self._on_unknown_slots_full is not None:
            self._on_unknown_slots_full(account)


def _same_holder(record: Lease, lease: Lease) -> bool:
    """The caller holds the record: same token and same fencing token (a stale holder does not)."""
    return record.token == lease.token and record.fencing_token == lease.fencing_token
