"""The execution engine's use of capacity leases (design 9.11, 9.11.3).

An attempt row stores only its lease token; the lease record (account, dimensions) lives in the
`LeaseStore`, so `LeaseKeeper` finds it by token (random and unique; the scheduler may have
acquired it under a provisional attempt id), and holds it only if the record's fencing token is
the one the attempt row stored: a lease rebuilt or re-granted under another fence is not this
attempt's to renew or release (9.11.1). Every call here happens AFTER
the database transaction that justified it committed, and never raises: PostgreSQL is the source
of truth and the lease reconciler (9.11.2) repairs any counter a lost call leaves wrong.

* terminal attempt          -> `release` (idempotent: a second call finds nothing)
* SUBMIT_UNKNOWN            -> `mark_unknown` into the account's unknown budget
* unknown resolved (found)  -> `resolve_unknown`
* in flight (poll/recovery) -> `renew` (heartbeat)
* waiting to be sent        -> `renew` too (`WaitingLeases`): a backlog of READY_TO_SUBMIT
                               attempts longer than the lease TTL must not lose its leases
* right before a submit      -> `secure`: renew, and say whether the lease is still this
                               attempt's; when it is not (expired, lost with Redis's data), take
                               a new one for the same attempt through `LeaseSource` (the
                               dispatcher's request for its candidate), which the attempt records
                               in the transition that starts the send. No lease to be had: the
                               attempt waits, unsent; it is never failed for it. Then, where its
                               account has rate windows, `stamp_send`: they count the submit from
                               now (9.11); a full window makes it wait unsent the same way
* ABANDONED                 -> nothing: the slot stays counted until the reconciler or the
                               lease's max term says otherwise (the job may still be running)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from controlplane.leases.base import (
    Lease,
    LeaseError,
    LeaseRequest,
    LeaseStore,
    unknown_slot_cap,
)
from controlplane.persistence.records import AttemptRecord

__all__ = ["LeaseKeeper", "LeaseSource", "Secured"]

LeaseSource = Callable[[AttemptRecord], Awaitable[LeaseRequest | None]]
"""The lease the dispatcher would request for `attempt`'s candidate (account, dimensions, terms,
keyed by the attempt's client request key), or None when its candidate left the catalog."""


@dataclass(frozen=True, slots=True)
class Secured:
    """What `LeaseKeeper.secure` found: may the submit go out, and under which new lease.

    `new` is a lease the attempt did not hold before (its token and fencing token must be
    recorded with the move to SUBMITTING); None with `ok` means the attempt's own lease holds.
    """

    ok: bool
    new: Lease | None = None


_MAX_HINTS = 100_000  # token -> where hints kept (bounded; a cleared hint costs one scan)

log = logging.getLogger(__name__)


class LeaseKeeper:
    """Best-effort lease operations keyed by attempt; counts what it could not do."""

    def __init__(self, store: LeaseStore | None, source: LeaseSource | None = None) -> None:
        self._store = store
        self._source = source
        self.failures = 0
        self.relet = 0  # leases taken again for attempts that lost theirs before the send
        self.window_waits = 0  # sends held back because a rate window was full at the send
        # Where a token's lease was last seen: (account, the lease's key), so the next find is
        # one point read (`lease_of`) instead of a snapshot of every lease of every account.
        # Only a hint: the record read is verified exactly as a scan's, and a miss scans.
        self._where: dict[str, tuple[str, str]] = {}

    async def find(self, attempt: AttemptRecord) -> Lease | None:
        if self._store is None or not attempt.lease_token:
            return None
        token = attempt.lease_token
        point = getattr(self._store, "lease_of", None)
        hint = self._where.get(token)
        if point is not None and hint is not None:
            lease = await point(*hint)
            if lease is not None and lease.token == token:
                return self._verified(attempt, lease)
            self._where.pop(token, None)
        accounts = await self._store.accounts()
        if point is not None and attempt.client_request_key:
            # The scheduler keys a lease by the attempt's client request key: a point read per
            # account (there are few) finds it without reading every lease.
            # Both grant paths (the dispatcher, the rebuild from PostgreSQL) key by it, so a miss
            # is an ended lease: no scan (a released lease's second release would read them all).
            for account in accounts:
                lease = await point(account, attempt.client_request_key)
                if lease is not None and lease.token == token:
                    return self._verified(attempt, lease)
            return None
        for account in accounts:
            snapshot = await self._store.snapshot(account)
            for lease in snapshot.leases:
                if lease.token != token:
                    continue
                if len(self._where) >= _MAX_HINTS:
                    self._where.clear()
                self._where[token] = (lease.account, lease.attempt_id)
                return self._verified(attempt, lease)
        return None

    def _verified(self, attempt: AttemptRecord, lease: Lease) -> Lease | None:
        """`lease` if it is held under the attempt's fencing token (9.11.1), else None."""
        fence = attempt.fencing_token
        if fence is not None and lease.fencing_token != fence:
            log.warning(
                "attempt %s: lease fence %s is not the attempt's %s; not its lease",
                attempt.id,
                lease.fencing_token,
                fence,
            )
            return None
        return lease

    async def still_held(self, attempt: AttemptRecord) -> bool:
        """Renew the attempt's lease; True only if the store still has it under its fence.

        Without a store (no quota configured) there is nothing to fence and the answer is True.
        A store error is False: the caller must not act on a lease it cannot vouch for.
        """
        if self._store is None:
            return True
        try:
            lease = await self.find(attempt)
            return lease is not None and await self._store.renew(lease) is not None
        except LeaseError as exc:
            return self._failed("still_held", attempt, exc)

    @property
    def can_relet(self) -> bool:
        """Whether `secure` can replace a lost lease (a store and a `LeaseSource` are wired)."""
        return self._store is not None and self._source is not None

    async def secure(self, attempt: AttemptRecord) -> Secured:
        """Right before a send: the attempt's lease renewed (`still_held`), else a new one.

        Without a `LeaseSource` a lost lease cannot be replaced: not ok. A store error is not
        ok either (nothing is sent on a lease nobody can vouch for); the caller tries later.
        """
        if await self.still_held(attempt):
            return Secured(True) if await self._stamped(attempt) else Secured(False)
        if self._store is None or self._source is None:
            return Secured(False)
        try:
            request = await self._source(attempt)
            lease = None if request is None else await self._store.acquire(request)
        except LeaseError as exc:
            self._failed("secure", attempt, exc)
            return Secured(False)
        except Exception:
            log.warning("attempt %s: no lease request for it", attempt.id, exc_info=True)
            return Secured(False)
        if lease is None:
            return Secured(False)
        self.relet += 1
        if not await self._stamped(attempt):
            await self.release_lease(lease)  # not sent now: not held for nothing
            return Secured(False)
        return Secured(True, lease)

    async def _stamped(self, attempt: AttemptRecord) -> bool:
        """The account's rate windows count this send from now (`LeaseStore.stamp_send`); False
        when one is full (the attempt waits unsent) or the store fails (nothing is vouched for).
        Without a source or windows there is nothing to stamp."""
        if self._store is None or self._source is None:
            return True
        try:
            request = await self._source(attempt)
            if request is None or request.windows is None:
                return True
            refusal = await self._store.stamp_send(request)
        except LeaseError as exc:
            return self._failed("stamp_send", attempt, exc)
        except Exception:
            log.warning("attempt %s: no lease request for it", attempt.id, exc_info=True)
            return True  # its candidate left the catalog: no windows on terms nobody publishes
        if refusal is not None:
            log.info(
                "attempt %s: %s window of %s full; waiting unsent",
                attempt.id,
                refusal.window,
                refusal.account,
            )
            self.window_waits += 1
            return False
        return True

    async def release_lease(self, lease: Lease) -> bool:
        """Give back a lease `secure` took for an attempt that did not record it."""
        try:
            return await self._require().release(lease)
        except LeaseError as exc:
            self.failures += 1
            log.warning("lease release of %s failed: %r", lease.attempt_id, exc)
            return False

    async def release(self, attempt: AttemptRecord) -> bool:
        try:
            lease = await self.find(attempt)
            if attempt.lease_token:
                self._where.pop(attempt.lease_token, None)
            return lease is not None and await self._require().release(lease)
        except LeaseError as exc:
            return self._failed("release", attempt, exc)

    async def mark_unknown(self, attempt: AttemptRecord) -> bool:
        try:
            lease = await self.find(attempt)
            if lease is None:
                return False
            cap = unknown_slot_cap(lease.dimensions[0].capacity)
            return await self._require().mark_unknown(lease, cap)
        except LeaseError as exc:
            return self._failed("mark_unknown", attempt, exc)

    async def resolve_unknown(self, attempt: AttemptRecord) -> bool:
        try:
            lease = await self.find(attempt)
            return lease is not None and await self._require().resolve_unknown(lease)
        except LeaseError as exc:
            return self._failed("resolve_unknown", attempt, exc)

    async def renew(self, attempt: AttemptRecord) -> bool:
        try:
            lease = await self.find(attempt)
            return lease is not None and await self._require().renew(lease) is not None
        except LeaseError as exc:
            return self._failed("renew", attempt, exc)

    def _require(self) -> LeaseStore:
        assert self._store is not None
        return self._store

    def _failed(self, op: str, attempt: AttemptRecord, exc: Exception) -> bool:
        self.failures += 1
        log.warning("lease %s for attempt %s failed: %r", op, attempt.id, exc)
        return False
