"""Background upkeep of the scheduler: lease reconciliation and queue-message bookkeeping.

Leases (9.11.2): any distributed counter leaks (a worker dies before releasing, Redis fails
over, a release is lost). Every `interval_s` the leader
1. reclaims expired leases;
2. rebuilds (`LeaseStore.restore`) the lease of every attempt PostgreSQL says holds one
   (`HOLDING_STATES`) that the store lacks, with the attempt's own token and fencing token, and
   marks each catalog account live; a lease rebuilt for an attempt that ended meanwhile is
   released again right after (its worker's release may have found nothing to release);
3. recomputes the true in-flight count per dimension from PostgreSQL (the attempts in
   `IN_FLIGHT_ATTEMPT_STATES`) and corrects the store's counters.
Each correction, rebuilt leases included, writes one `lease_audit_events` row. PostgreSQL is the
source of truth; the store is only ever adjusted towards it.

Redis loss: a flush, a restart without persistence or a failover to an empty replica removes the
accounts' live markers with the data, and the fail-closed store then refuses every acquire. The
dispatcher calls `ensure_leases_live` before each round, which runs the pass above at once when
any catalog account is not live, and a refused acquire in a lost account `kick`s the next round
of upkeep at once: no new work is admitted before the holders are back, so in flight never
exceeds capacity, and capacity returns well within one period.

Queue messages: `task.queued` and `task.requeue` outbox rows are wake-ups for the dispatcher
(which reads the queue facts from the tasks themselves), so upkeep completes them and wakes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.capabilities.catalog import CapabilityCatalog
from controlplane.domain.states import IN_FLIGHT_ATTEMPT_STATES, AttemptState
from controlplane.leases.base import HeldLease, LeaseStore, unknown_slot_cap
from controlplane.leases.reconciler import UNKNOWN_BUDGET, Drift, InFlightAttempt, reconcile
from controlplane.persistence.models import lease_audit_events, task_attempts
from controlplane.persistence.repository import Store
from controlplane.scheduling.gather import lease_dimensions

log = logging.getLogger(__name__)
QUEUE_TOPICS = ("task.queued", "task.requeue")

HOLDING_STATES: frozenset[str] = frozenset(
    s.value
    for s in IN_FLIGHT_ATTEMPT_STATES
    | {AttemptState.CREATED, AttemptState.RESERVING, AttemptState.READY_TO_SUBMIT}
)
"""Attempts whose lease must survive a loss of the store: the in-flight ones of 9.11.2, plus the
ones not sent yet, which hold the lease the dispatcher took and will send under it. ABANDONED is
not among them (9.11.2 does not count it); its unrenewed lease would only have lived to its TTL."""


@dataclass(frozen=True, slots=True)
class UpkeepConfig:
    """`lease_ttl_ms` / `lease_max_term_ms` are those of rebuilt leases: the dispatcher's."""

    interval_s: float = 15.0
    default_concurrency: int = 4
    claim_lease_s: float = 30.0
    batch: int = 500
    lease_ttl_ms: int = 600_000
    lease_max_term_ms: int = 6 * 3_600_000


async def _holding_rows(
    engine: AsyncEngine, *, keys: list[str] | None = None
) -> list[tuple[str, int, str, str, str | None, int | None]]:
    """(key, account id, model, status, lease token, fencing token) of holding attempts, or of
    the attempts with `keys` whatever their state."""
    c = task_attempts.c
    query = select(
        c.client_request_key,
        c.provider_account_id,
        c.provider_model,
        c.status,
        c.lease_token,
        c.fencing_token,
    )
    if keys is None:
        query = query.where(c.status.in_(sorted(HOLDING_STATES)))
    else:
        query = query.where(c.client_request_key.in_(keys))
    async with engine.connect() as conn:
        return [tuple(row) for row in (await conn.execute(query)).all()]


async def in_flight_facts(
    engine: AsyncEngine, catalog: CapabilityCatalog, default_concurrency: int
) -> list[InFlightAttempt]:
    """The attempts PostgreSQL says hold capacity, as lease facts (dimensions from the catalog)."""
    by_account_model = {(c.account_id, c.model): c for c in catalog.candidates}
    query = select(
        task_attempts.c.client_request_key,
        task_attempts.c.provider_account_id,
        task_attempts.c.provider_model,
        task_attempts.c.status,
    ).where(task_attempts.c.status.in_(sorted(s.value for s in IN_FLIGHT_ATTEMPT_STATES)))
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).all()
    facts: list[InFlightAttempt] = []
    for key, account_id, model, status in rows:
        candidate = by_account_model.get((account_id, model))
        if candidate is None:
            log.warning("in-flight attempt %s has no catalog candidate; not reconciled", key)
            continue
        fact = InFlightAttempt.from_state(
            attempt_id=key,
            account=candidate.lease_account,
            dimensions=lease_dimensions(candidate, default_concurrency),
            slots=1,
            state=status,
        )
        if fact is not None:
            facts.append(fact)
    return facts


class Upkeep:
    """Runs lease reconciliation (leader only) and queue-message draining."""

    def __init__(
        self,
        *,
        store: Store,
        leases: LeaseStore,
        catalog: Callable[[], Awaitable[CapabilityCatalog]],
        is_leader: Callable[[], bool],
        wake: Callable[[], None],
        worker_id: str,
        config: UpkeepConfig | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._store = store
        self._leases = leases
        self._catalog = catalog
        self._is_leader = is_leader
        self._wake = wake
        self._worker = worker_id
        self.config = config or UpkeepConfig()
        self._clock = clock
        self._pass = asyncio.Lock()  # the period and the dispatcher may both ask for a pass
        self._kicked = asyncio.Event()
        self.drifts_corrected = 0
        self.leases_restored = 0
        self.rebuilds = 0

    async def drain_queue_messages(self) -> int:
        """Complete wake-up messages and wake the dispatcher if there were any."""
        done = 0
        for topic in QUEUE_TOPICS:
            now = self._clock()
            claimed = await self._store.claim(
                topic,
                self._worker,
                limit=self.config.batch,
                lease_seconds=self.config.claim_lease_s,
                now=now,
            )
            for message in claimed:
                await self._store.complete(message.id, self._worker, now=now)
            done += len(claimed)
        if done:
            self._wake()
        return done

    async def ensure_leases_live(self) -> bool:
        """Before admitting work: rebuild at once if the store lost any catalog account.

        Returns True if a rebuild ran. Raises what the store raises: the caller admits nothing.
        """
        catalog = await self._catalog()
        accounts = sorted({c.lease_account for c in catalog.candidates})
        lost = [a for a in accounts if not await self._leases.is_live(a)]
        if not lost:
            return False
        log.warning("lease store lost accounts %s; rebuilding from PostgreSQL", lost)
        await self.reconcile_leases()
        self.rebuilds += 1
        return True

    async def reconcile_leases(self) -> list[Drift]:
        """Reclaim expired leases, rebuild missing holders, repair counters towards PostgreSQL."""
        async with self._pass:
            catalog = await self._catalog()
            await self._leases.reclaim_expired()
            await self._restore_holders(catalog)
            dc = self.config.default_concurrency
            facts = await in_flight_facts(self._store.engine, catalog, dc)
            drifts = await reconcile(self._leases, facts, self._audit)
            self.drifts_corrected += len(drifts)
            return drifts

    async def _restore_holders(self, catalog: CapabilityCatalog) -> None:
        dc = self.config.default_concurrency
        by_account_model = {(c.account_id, c.model): c for c in catalog.candidates}
        holders: dict[str, list[HeldLease]] = {c.lease_account: [] for c in catalog.candidates}
        capacity: dict[str, int] = {}
        for c in catalog.candidates:
            total = lease_dimensions(c, dc)[0].capacity
            capacity[c.lease_account] = max(capacity.get(c.lease_account, 0), total)
        for key, account_id, model, status, token, fence in await _holding_rows(self._store.engine):
            candidate = by_account_model.get((account_id, model))
            if candidate is None or not token or fence is None:
                continue  # in_flight_facts logs the uncatalogued; no token: nothing to rebuild
            holders[candidate.lease_account].append(
                HeldLease(
                    key,
                    candidate.lease_account,
                    token,
                    fence,
                    lease_dimensions(candidate, dc),
                    unknown=status == AttemptState.SUBMIT_UNKNOWN.value,
                )
            )
        restored: list[str] = []
        for account, held in sorted(holders.items()):
            before = await self._leases.snapshot(account)
            ids = await self._leases.restore(
                account,
                held,
                ttl_ms=self.config.lease_ttl_ms,
                max_term_ms=self.config.lease_max_term_ms,
                unknown_cap=unknown_slot_cap(capacity[account]),
            )
            if ids:
                await self._audit_restored(account, before.used, before.unknown_used, held, ids)
                restored += ids
        self.leases_restored += len(restored)
        if restored:
            await self._release_ended(restored)

    async def _audit_restored(
        self,
        account: str,
        used: Mapping[str, int],
        unknown_used: int,
        held: list[HeldLease],
        ids: list[str],
    ) -> None:
        added: Counter[str] = Counter()
        for h in held:
            if h.attempt_id in ids:
                for dim in h.dimensions:
                    added[dim.key] += h.slots
                if h.unknown:
                    added[UNKNOWN_BUDGET] += h.slots
        log.warning("lease store rebuilt %d leases of %s from PostgreSQL", len(ids), account)
        for key, delta in sorted(added.items()):
            actual = unknown_used if key == UNKNOWN_BUDGET else used.get(key, 0)
            await self._audit(
                Drift(account, f"{key} (rebuilt leases)", actual + delta, actual, delta)
            )

    async def _release_ended(self, restored: list[str]) -> None:
        """Release rebuilt leases whose attempt ended after it was read (ABANDONED keeps its
        lease, as without a rebuild: its job may still run)."""
        ended = {
            key
            for key, _a, _m, status, _t, _f in await _holding_rows(
                self._store.engine, keys=restored
            )
            if status not in HOLDING_STATES and status != AttemptState.ABANDONED.value
        }
        if not ended:
            return
        for account in await self._leases.accounts():
            for lease in (await self._leases.snapshot(account)).leases:
                if lease.attempt_id in ended:
                    await self._leases.release(lease)

    async def _audit(self, drift: Drift) -> None:
        log.warning("lease drift corrected: %s", drift)
        async with self._store.engine.begin() as conn:
            await conn.execute(
                insert(lease_audit_events).values(
                    dimension=f"{drift.account}/{drift.dimension}",
                    expected=drift.expected,
                    actual=drift.actual,
                    delta=drift.delta,
                    at=self._clock(),
                )
            )

    def kick(self, account: str = "") -> None:
        """Run the next round now, e.g. because the store refused an acquire in a lost account."""
        self._kicked.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._kicked.clear()
            try:
                await self.drain_queue_messages()
                if self._is_leader():
                    await self.reconcile_leases()
            except Exception:  # upkeep must outlive a bad round
                log.exception("scheduler upkeep round failed")
            waiters = [
                asyncio.ensure_future(stop.wait()),
                asyncio.ensure_future(self._kicked.wait()),
            ]
            try:
                await asyncio.wait(
                    waiters, timeout=self.config.interval_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for waiter in waiters:
                    waiter.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await waiter
