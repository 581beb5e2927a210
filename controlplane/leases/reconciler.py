"""Reconciliation of lease counters against the attempt facts in PostgreSQL (design 9.11.2).

Distributed counters leak: a worker crashes before the provider's terminal state, a callback is
lost, Redis fails over, a release is duplicated or reordered, or someone edits an attempt by hand. A
periodic pass therefore recomputes the true slot usage, corrects the store and audits every
correction. It does not assume the store is right.

`compute_drift` is pure. `reconcile` applies the drifts to a `LeaseStore` and hands each one to an
audit callback. The caller persists the audit rows. This module does no other I/O.

The expected usage of an account is the union, by attempt id, of
- the in-flight attempts from the database (the source of truth wherever it knows the attempt), and
- the lease records the store still holds, including expired ones not yet reclaimed. A lease granted
  after the facts were read, or one that `reclaim_expired` is about to return, is real usage until
  it goes away. Leaving it out would let the next release or reclaim subtract it a second time.

Corrections are applied as atomic deltas rather than absolute writes. An acquire or release that
lands between the snapshot and the correction is then preserved, not overwritten.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from controlplane.domain.states import IN_FLIGHT_ATTEMPT_STATES, AttemptState
from controlplane.leases.base import AccountSnapshot, Dimension, LeaseStore

__all__ = [
    "IN_FLIGHT_STATES",
    "UNKNOWN_STATE",
    "CounterKind",
    "Drift",
    "InFlightAttempt",
    "compute_drift",
    "reconcile",
]

IN_FLIGHT_STATES: frozenset[str] = frozenset(s.value for s in IN_FLIGHT_ATTEMPT_STATES)
"""The stored values of the domain's `IN_FLIGHT_ATTEMPT_STATES`: attempts that hold provider
capacity (9.11.2). Attempt rows reach the reconciler with their stored status, so it compares
values."""

UNKNOWN_STATE = AttemptState.SUBMIT_UNKNOWN.value
"""The in-flight state whose slots also count in the unknown_submission_slots budget (9.11.3)."""

UNKNOWN_BUDGET = "unknown_submission_slots"


@dataclass(frozen=True, slots=True)
class InFlightAttempt:
    """An attempt the database says holds provider capacity; persistence maps its rows to this."""

    attempt_id: str
    account: str
    dimensions: tuple[Dimension, ...]
    slots: int = 1
    unknown: bool = False

    @classmethod
    def from_state(
        cls,
        *,
        attempt_id: str,
        account: str,
        dimensions: tuple[Dimension, ...],
        slots: int,
        state: str,
    ) -> InFlightAttempt | None:
        """Build the fact for an attempt whose stored status is `state`; None if that state holds no
        capacity."""
        if state not in IN_FLIGHT_STATES:
            return None
        return cls(attempt_id, account, dimensions, slots, unknown=state == UNKNOWN_STATE)


class CounterKind(enum.Enum):
    """Which counter a drift is about."""

    DIMENSION = "dimension"
    UNKNOWN_BUDGET = "unknown_budget"


@dataclass(frozen=True, slots=True)
class Drift:
    """A counter that disagreed with the facts. `delta` = expected - actual, the correction made.

    For `CounterKind.UNKNOWN_BUDGET`, `dimension` is "unknown_submission_slots".
    """

    account: str
    dimension: str
    expected: int
    actual: int
    delta: int
    kind: CounterKind = CounterKind.DIMENSION


def compute_drift(facts: Iterable[InFlightAttempt], snapshot: AccountSnapshot) -> list[Drift]:
    """Compare the usage implied by `facts` and the snapshot's leases with the snapshot's counters.

    Facts about other accounts are ignored. Drifts come back with dimensions in key order, then the
    unknown budget.
    """
    holders: dict[str, InFlightAttempt] = {
        lease.attempt_id: InFlightAttempt(
            lease.attempt_id, lease.account, lease.dimensions, lease.slots, lease.unknown
        )
        for lease in snapshot.leases
    }
    # Where the database knows the attempt, it wins over the store's record.
    holders.update({f.attempt_id: f for f in facts if f.account == snapshot.account})

    expected: Counter[str] = Counter()
    expected_unknown = 0
    for holder in holders.values():
        for dim in holder.dimensions:
            expected[dim.key] += holder.slots
        if holder.unknown:
            expected_unknown += holder.slots

    drifts = [
        Drift(snapshot.account, key, expected[key], actual, expected[key] - actual)
        for key in sorted(set(expected) | set(snapshot.used))
        if expected[key] != (actual := snapshot.used.get(key, 0))
    ]
    if expected_unknown != snapshot.unknown_used:
        drifts.append(
            Drift(
                snapshot.account,
                UNKNOWN_BUDGET,
                expected_unknown,
                snapshot.unknown_used,
                expected_unknown - snapshot.unknown_used,
                CounterKind.UNKNOWN_BUDGET,
            )
        )
    return drifts


async def reconcile(
    store: LeaseStore,
    facts: Iterable[InFlightAttempt],
    audit: Callable[[Drift], Awaitable[None]],
    *,
    confirm: Callable[[], Awaitable[Iterable[InFlightAttempt]]] | None = None,
) -> list[Drift]:
    """Correct each drifting counter in every account the store or facts know; audit each one.

    `confirm` re-reads the facts after the store's snapshots: an attempt that ended between the
    first read and its account's snapshot released its lease in between (the record and its
    slots are gone from the snapshot), so counting it from the first read would add back the
    slot its release just returned, a leak with no lease behind it. Only attempts in flight in
    both reads count. The audit runs after each correction has been applied. Returns the drifts.
    """
    fact_list = list(facts)
    accounts = sorted(set(await store.accounts()) | {f.account for f in fact_list})
    snapshots = [(account, await store.snapshot(account)) for account in accounts]
    if confirm is not None:
        still = {(f.account, f.attempt_id) for f in await confirm()}
        fact_list = [f for f in fact_list if (f.account, f.attempt_id) in still]
    found: list[Drift] = []
    for account, snapshot in snapshots:
        for drift in compute_drift(fact_list, snapshot):
            if drift.kind is CounterKind.DIMENSION:
                await store.adjust_used(account, drift.dimension, drift.delta)
            else:
                await store.adjust_unknown_used(account, drift.delta)
            await audit(drift)
            found.append(drift)
    return found
