"""Rebuilding the lease store from PostgreSQL's facts (design 9.11.2), for `Upkeep`.

A flush, a restart without persistence or a failover to an empty replica takes every lease and
counter with it while PostgreSQL still has attempts holding provider capacity. `restore_holders`
gives each of them its lease back (`LeaseStore.restore`: its own token and fencing token, its
slots counted, the account marked live again) and returns the counter corrections it made for the
audit. PostgreSQL is read before the store is written, so an attempt that ends in between would
get a lease nobody releases: `restore_holders` reads the rebuilt attempts again afterwards and
releases the leases of those that ended (their worker's release, if it came first, found none).

The rate and budget windows (9.11) go with the same loss: an account the store lost gets, in the
same restore that marks it live, every attempt PostgreSQL admitted there in the last day (plus the
send allowance) and in this calendar month, so a Redis loss never admits a second budget.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from controlplane.capabilities.catalog import CapabilityCatalog
from controlplane.domain.states import (
    IN_FLIGHT_ATTEMPT_STATES,
    NOT_SENT_ATTEMPT_STATES,
    AttemptState,
)
from controlplane.leases.base import HeldLease, LeaseStore, unknown_slot_cap
from controlplane.leases.reconciler import UNKNOWN_BUDGET, Drift, InFlightAttempt
from controlplane.leases.windows import WindowEntry, month_bounds_ms
from controlplane.persistence import leases as lease_facts
from controlplane.persistence.database import Database
from controlplane.scheduling.gather import candidate_dimensions
from controlplane.scheduling.windows import LimitsFor, no_limits

__all__ = ["HOLDING_STATES", "Rebuild", "in_flight_facts", "restore_holders"]

log = logging.getLogger(__name__)

HOLDING_STATES: frozenset[str] = frozenset(
    s.value for s in IN_FLIGHT_ATTEMPT_STATES | NOT_SENT_ATTEMPT_STATES
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


async def in_flight_facts(
    db: Database,
    catalog: CapabilityCatalog,
    default_concurrency: int,
    limits_for: LimitsFor = no_limits,
) -> list[InFlightAttempt]:
    """The attempts PostgreSQL says hold capacity, as lease facts (dimensions from the catalog
    and the accounts document, the modality from the attempt's task, as the dispatcher's)."""
    by_account_model = {(c.account_id, c.model): c for c in catalog.candidates}
    facts: list[InFlightAttempt] = []
    for row in await lease_facts.attempts_in_states(db, _IN_FLIGHT):
        candidate = by_account_model.get((row.account_id, row.model))
        if candidate is None:
            log.warning("in-flight attempt %s has no catalog candidate; not reconciled", row.key)
            continue
        fact = InFlightAttempt.from_state(
            attempt_id=row.key,
            account=candidate.lease_account,
            dimensions=candidate_dimensions(candidate, default_concurrency, limits_for, row.mode),
            slots=1,
            state=row.status,
        )
        if fact is not None:
            facts.append(fact)
    return facts


async def restore_holders(
    db: Database,
    leases: LeaseStore,
    catalog: CapabilityCatalog,
    *,
    default_concurrency: int,
    ttl_ms: int,
    max_term_ms: int,
    window_horizon_ms: int = 86_400_000,
    limits_for: LimitsFor = no_limits,
) -> Rebuild:
    """Give every holder the store lacks its lease back and mark each catalog account live;
    a lost account gets its windows back too (the last `window_horizon_ms` and this month)."""
    dc = default_concurrency
    by_account_model = {(c.account_id, c.model): c for c in catalog.candidates}
    holders: dict[str, list[HeldLease]] = {c.lease_account: [] for c in catalog.candidates}
    capacity: dict[str, int] = {}
    for c in catalog.candidates:
        total = candidate_dimensions(c, dc, limits_for)[0].capacity
        capacity[c.lease_account] = max(capacity.get(c.lease_account, 0), total)
    for row in await lease_facts.attempts_in_states(db, HOLDING_STATES):
        candidate = by_account_model.get((row.account_id, row.model))
        if candidate is None or not row.lease_token or row.fencing_token is None:
            continue  # in_flight_facts logs the uncatalogued; no token: nothing to rebuild
        holders[candidate.lease_account].append(
            HeldLease(
                row.key,
                candidate.lease_account,
                row.lease_token,
                row.fencing_token,
                candidate_dimensions(candidate, dc, limits_for, row.mode),
                unknown=row.status == AttemptState.SUBMIT_UNKNOWN.value,
                sent=row.status in _IN_FLIGHT,
            )
        )
    lost = [a for a in sorted(holders) if not await leases.is_live(a)]
    windows = await _window_entries(db, leases, catalog, lost, window_horizon_ms) if lost else {}
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
            windows=windows.get(account, ()),
        )
        if ids:
            log.warning("lease store rebuilt %d leases of %s from PostgreSQL", len(ids), account)
            corrections += _rebuilt(before.used, before.unknown_used, held, set(ids))
            restored += ids
    if restored:
        await _release_ended(db, leases, restored)
    return Rebuild(tuple(restored), tuple(corrections))


async def _window_entries(
    db: Database,
    leases: LeaseStore,
    catalog: CapabilityCatalog,
    accounts: Sequence[str],
    horizon_ms: int,
) -> dict[str, list[WindowEntry]]:
    """What PostgreSQL says the lost `accounts` admitted in their windows, per lease account."""
    lease_account = {c.account_id: c.lease_account for c in catalog.candidates}
    now_ms = await leases.now_ms()  # the store's clock, which its windows run on
    since_ms = min(now_ms - horizon_ms, month_bounds_ms(now_ms)[0])
    wanted = set(accounts)
    out: dict[str, list[WindowEntry]] = {}
    for f in await lease_facts.window_facts(db, datetime.fromtimestamp(since_ms / 1000, UTC)):
        account = lease_account.get(f.account_id)
        if account in wanted:
            at_ms = int(f.at.timestamp() * 1000)
            entry = WindowEntry(f.key, at_ms, f.generations, f.cost_micros)
            out.setdefault(account, []).append(entry)
    return out


async def _release_ended(db: Database, leases: LeaseStore, restored: list[str]) -> None:
    """Release rebuilt leases whose attempt ended after it was read (ABANDONED keeps its
    lease, as without a rebuild: its job may still run)."""
    ended = {
        row.key
        for row in await lease_facts.attempts_with_keys(db, restored)
        if row.status not in HOLDING_STATES and row.status != AttemptState.ABANDONED.value
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
