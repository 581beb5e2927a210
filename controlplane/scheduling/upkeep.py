"""Background upkeep of the scheduler: lease reconciliation and queue-message bookkeeping.

Leases (9.11.2): any distributed counter leaks (a worker dies before releasing, Redis fails
over, a release is lost). Every `interval_s` the leader reclaims expired leases, recomputes the
true in-flight count per dimension from PostgreSQL (the attempts in
`IN_FLIGHT_ATTEMPT_STATES`), corrects the lease store and writes one `lease_audit_events` row
per correction. PostgreSQL is the source of truth; the store is only ever adjusted towards it.

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

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.capabilities.catalog import CapabilityCatalog
from controlplane.domain.states import IN_FLIGHT_ATTEMPT_STATES
from controlplane.leases.base import LeaseStore
from controlplane.leases.reconciler import Drift, InFlightAttempt, reconcile
from controlplane.persistence.models import lease_audit_events, task_attempts
from controlplane.persistence.repository import Store
from controlplane.scheduling.gather import lease_dimensions

log = logging.getLogger(__name__)
QUEUE_TOPICS = ("task.queued", "task.requeue")


@dataclass(frozen=True, slots=True)
class UpkeepConfig:
    interval_s: float = 15.0
    default_concurrency: int = 4
    claim_lease_s: float = 30.0
    batch: int = 500


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
        self.drifts_corrected = 0

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

    async def reconcile_leases(self) -> list[Drift]:
        """Reclaim expired leases, then repair every counter towards PostgreSQL's facts."""
        catalog = await self._catalog()
        await self._leases.reclaim_expired()
        facts = await in_flight_facts(self._store.engine, catalog, self.config.default_concurrency)

        async def audit(drift: Drift) -> None:
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

        drifts = await reconcile(self._leases, facts, audit)
        self.drifts_corrected += len(drifts)
        return drifts

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.drain_queue_messages()
                if self._is_leader():
                    await self.reconcile_leases()
            except Exception:  # upkeep must outlive a bad round
                log.exception("scheduler upkeep round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.config.interval_s)
