"""Background upkeep of the scheduler: lease reconciliation and queue-message bookkeeping.

Leases (9.11.2): any distributed counter leaks (a worker dies before releasing, Redis fails
over, a release is lost). Every `interval_s` the leader
1. reclaims expired leases;
2. rebuilds (`lease_rebuild.restore_holders`) the lease of every attempt PostgreSQL says holds one
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from controlplane.capabilities.catalog import CapabilityCatalog
from controlplane.domain.outbox import Topic
from controlplane.leases.base import LeaseStore
from controlplane.leases.reconciler import Drift, reconcile
from controlplane.persistence.database import Database
from controlplane.persistence.records import LeaseDrift
from controlplane.scheduling.lease_rebuild import HOLDING_STATES, in_flight_facts, restore_holders
from controlplane.scheduling.windows import LimitsFor, no_limits

log = logging.getLogger(__name__)
QUEUE_TOPICS = (Topic.QUEUED, Topic.REQUEUE)
__all__ = ["HOLDING_STATES", "QUEUE_TOPICS", "Upkeep", "UpkeepConfig", "in_flight_facts"]


@dataclass(frozen=True, slots=True)
class UpkeepConfig:
    """`lease_ttl_ms` / `lease_max_term_ms` are those of rebuilt leases: the dispatcher's."""

    interval_s: float = 15.0
    default_concurrency: int = 4
    claim_lease_s: float = 30.0
    batch: int = 500
    lease_ttl_ms: int = 600_000
    lease_max_term_ms: int = 6 * 3_600_000
    # How far back a lost account's rolling windows are rebuilt from (the dispatcher's day span
    # plus its send allowance); the calendar month's spend always is.
    window_horizon_ms: int = 86_400_000 + 5_000


class Upkeep:
    """Runs lease reconciliation (leader only) and queue-message draining."""

    def __init__(
        self,
        *,
        db: Database,
        leases: LeaseStore,
        catalog: Callable[[], Awaitable[CapabilityCatalog]],
        is_leader: Callable[[], bool],
        wake: Callable[[], None],
        worker_id: str,
        config: UpkeepConfig | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        limits_for: LimitsFor = no_limits,
        on_drifts: Callable[[list[Drift]], None] | None = None,
    ) -> None:
        """`on_drifts` is told the drifts each reconciliation pass corrected (e.g. the
        metrics)."""
        self._db = db
        self._leases = leases
        self._catalog = catalog
        # The accounts document's limits (the dispatcher's `limits_for`): rebuilt leases and
        # reconciled counters have the dimensions the dispatcher's acquire gave them.
        self._limits_for = limits_for
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
        self._on_drifts = on_drifts

    async def drain_queue_messages(self) -> int:
        """Complete wake-up messages and wake the dispatcher if there were any."""
        done = 0
        for topic in QUEUE_TOPICS:
            async with self._db.unit(self._clock()) as u:
                claimed = await u.claim_messages(
                    topic,
                    self._worker,
                    limit=self.config.batch,
                    lease_seconds=self.config.claim_lease_s,
                )
                for message in claimed:
                    await u.complete_message(message.id, self._worker)
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
            facts = await in_flight_facts(self._db, catalog, dc, self._limits_for)
            drifts = await reconcile(
                self._leases,
                facts,
                self._audit,
                confirm=lambda: in_flight_facts(self._db, catalog, dc, self._limits_for),
            )
            self.drifts_corrected += len(drifts)
            if self._on_drifts is not None:
                self._on_drifts(drifts)
            return drifts

    async def _restore_holders(self, catalog: CapabilityCatalog) -> None:
        rebuild = await restore_holders(
            self._db,
            self._leases,
            catalog,
            default_concurrency=self.config.default_concurrency,
            ttl_ms=self.config.lease_ttl_ms,
            max_term_ms=self.config.lease_max_term_ms,
            window_horizon_ms=self.config.window_horizon_ms,
            limits_for=self._limits_for,
        )
        self.leases_restored += len(rebuild.restored)
        if rebuild.corrections:
            await self._audit(*rebuild.corrections)

    async def _audit(self, *drifts: Drift) -> None:
        """One `lease_audit_events` row per correction, all in one transaction."""
        for drift in drifts:
            log.warning("lease drift corrected: %s", drift)
        async with self._db.unit(self._clock()) as u:
            await u.record_lease_drifts(
                [
                    LeaseDrift(f"{d.account}/{d.dimension}", d.expected, d.actual, d.delta)
                    for d in drifts
                ]
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
