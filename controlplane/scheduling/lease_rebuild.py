"""Rebuilding the lease store from PostgreSQL's facts (design 9.11.2), for `Upkeep`.

A flush, a restart without persistence or a failover to an empty replica takes every lease and
counter with it while PostgreSQL still has attempts holding provider capacity. `restore_holders`
gives each of them its lease back (`LeaseStore.restore`: its own token and fencing token, its
slots counted, the account marked live again) and returns the counter corrections it made for the
audit. PostgreSQL is read before the store is written, so an attempt that ends in between would
get a lease nobody releases: `restore_holders` reads the rebuilt attempts again afterwards and
releases the leases of those that ended (their worker's release, if it came first, found none).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.capabilities.catalog import CapabilityCatalog
from controlplane.domain.states import IN_FLIGHT_ATTEMPT_STATES, AttemptState
from controlplane.leases.base import HeldLease, LeaseStore, unknown_slot_cap
from controlplane.leases.reconciler import UNKNOWN_BUDGET, Drift, InFlightAttempt
from controlplane.persistence.models import task_attempts
from controlplane.scheduling.gather import lease_dimensions

__all__ = ["HOLDING_STATES", "Rebuild", "in_flight_facts", "restore_holders"]

log = logging.getLogger(__name__)

HOLDING_STATES: frozenset[str] = frozenset(
    s.value
    for s in IN_FLIGHT_ATTEMPT_STATES
    | {AttemptState.CREATED, AttemptState.RESERVING, AttemptState.READY_TO_SUBMIT}
)
"""Attempts whose lease must survive a loss of the store: the in-flight ones of 9.11.2, plus the
ones not sent yet, which hold the lease the dispatcher took and will send under it. ABANDONED is
not among them (9.11.2 does not count it); its unrenewed lease would only have lived to its TTL.
The unsent ones are rebuilt only in an account the store lost (`HeldLease.sent`)."""
_IN_FLIGHT = frozenset(s.value for s in IN_FLIGHT_ATTEMPT_STATES)


@dataclass(frozen=True, slots=True)
class Rebuild:
    """What one `restore_holders` pass did: attempt ids given a lease again, counter changes."""

    restored: tuple[str, ...]
    corrections: tuple[Drift, ...]


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


async def restore_holders(
    engine: AsyncEngine,
    leases: LeaseStore,
    catalog: CapabilityCatalog,
    *,
    default_concurrency: int,
    ttl_ms: int,
    max_term_ms: int,
) -> Rebuild:
    """Give every holder the store lacks its lease back and mark each catalog account live."""
    dc = default_concurrency
    by_account_model = {(c.account_id, c.model): c for c in catalog.candidates}
    holders: dict[str, list[HeldLease]] = {c.lease_account: [] for c in catalog.candidates}
    capacity: dict[str, int] = {}
    for c in catalog.candidates:
        total = lease_dimensions(c, dc)[0].capacity
        capacity[c.lease_account] = max(capacity.get(c.lease_account, 0), total)
    for key, account_id, model, status, token, fence in await _holding_rows(engine):
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
                sent=status in _IN_FLIGHT,
            )
        )
    restored: list[str] = []
    corrections: list[Drift] = []
    # Every account live first, the audit after (the caller's): admission waits for the former.
    for account, held in sorted(holders.items()):
        before = await leases.snapshot(account)
        ids = await leases.restore(
            account,
            held,
            ttl_ms=ttl_ms,
            max_term_ms=max_term_ms,
            unknown_cap=unknown_slot_cap(capacity[account]),
        )
        if ids:
            log.warning("lease store rebuilt %d leases of %s from PostgreSQL", len(ids), account)
            corrections += _rebuilt(before.used, before.unknown_used, held, set(ids))
            restored += ids
    if restored:
        await _release_ended(engine, leases, restored)
    return Rebuild(tuple(restored), tuple(corrections))


async def _release_ended(engine: AsyncEngine, leases: LeaseStore, restored: list[str]) -> None:
    """Release rebuilt leases whose attempt ended after it was read (ABANDONED keeps its
    lease, as without a rebuild: its job may still run)."""
    ended = {
        key
        for key, _a, _m, status, _t, _f in await _holding_rows(engine, keys=restored)
        if status not in HOLDING_STATES and status != AttemptState.ABANDONED.value
    }
    if not ended:
        return
    for account in await leases.accounts():
        for lease in (await leases.snapshot(account)).leases:
            if lease.attempt_id in ended:
                await leases.release(lease)


def _rebuilt(
    used: Mapping[str, int], unknown_used: int, held: list[HeldLease], ids: set[str]
) -> list[Drift]:
    """The counter corrections a restore of `ids` made, as audit entries ("rebuilt leases")."""
    added: Counter[str] = Counter()
    account = ""
    for h in held:
        if h.attempt_id in ids:
            account = h.account
            for dim in h.dimensions:
                added[dim.key] += h.slots
            if h.unknown:
                added[UNKNOWN_BUDGET] += h.slots
    out = []
    for key, delta in sorted(added.items()):
        actual = unknown_used if key == UNKNOWN_BUDGET else used.get(key, 0)
        out.append(Drift(account, f"{key} (rebuilt leases)", actual + delta, actual, delta))
    return out
