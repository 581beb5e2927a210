"""I9: the lease store agrees with PostgreSQL about who holds provider capacity (9.11.2).

What the database stores about a lease is only the token on the attempt row; the account scope,
dimensions and slots live in the lease record. The checker therefore joins the two:

- A lease record's *holder* is the attempt whose ``lease_token`` equals the lease's token, else
  the attempt whose ``client_request_key`` equals the lease's ``attempt_id`` in the same lease
  account (the dispatcher leases under the client request key before the attempt row exists),
  else the attempt whose id is the lease's ``attempt_id``.
- An in-flight attempt (``IN_FLIGHT_ATTEMPT_STATES``) becomes an `InFlightAttempt` fact with its
  lease's account, dimensions and slots. If its lease record is gone (expired and reclaimed, or
  aged out of Redis), the scheduler's conventions stand in: account ``"{provider}:{account_name}"``
  (`Candidate.lease_account`) and dimensions ``account`` and ``model:{provider_model}``
  (`scheduling.gather.lease_dimensions`), one slot.
- A lease whose holder is not terminal (CREATED/RESERVING/READY_TO_SUBMIT already hold the lease
  the dispatcher took) or is ABANDONED (its job may still run; the lease's max term ends it) is
  legitimate usage. Any other lease, one held for a finished attempt or for no attempt at all,
  is a leaked lease and a violation.

Counters are compared with `compute_drift` against the facts plus only the legitimate leases: a
leaked record cannot justify its own slots. The checker is read-only. It reports what a correct
reconciliation pass would still have to correct, so soak and crash tests run `reconcile` (and
``reclaim_expired`` where they crashed a holder on purpose) and then expect no violation. Run it
when the system is quiet: a lease taken between the database read and the store read has no
holder in the snapshot yet.
"""

from __future__ import annotations

import dataclasses

from controlplane.audit.report import Invariant, Violation
from controlplane.domain.states import ATTEMPT_MACHINE, AttemptState
from controlplane.leases.base import Dimension, Lease, LeaseStore
from controlplane.leases.reconciler import InFlightAttempt, compute_drift
from controlplane.persistence.snapshot import AttemptRow, Snapshot

__all__ = ["check_leases", "lease_account_of"]

_TOLERATED_TERMINAL = frozenset({AttemptState.ABANDONED.value})
_TERMINAL = frozenset(s.value for s in ATTEMPT_MACHINE.terminal)


def lease_account_of(provider: str, account_name: str) -> str:
    """The lease store scope of a provider account, as `Candidate.lease_account` builds it."""
    return f"{provider}:{account_name}"


def _default_dimensions(attempt: AttemptRow) -> tuple[Dimension, ...]:
    # Capacities do not matter for the comparison, only the keys.
    return (Dimension("account", 0), Dimension(f"model:{attempt.provider_model}", 0))


@dataclasses.dataclass(slots=True)
class _Holders:
    """Attempt lookups for lease records."""

    by_token: dict[str, AttemptRow]
    by_request_key: dict[tuple[str, str], AttemptRow]
    by_id: dict[str, AttemptRow]

    def of(self, lease: Lease) -> AttemptRow | None:
        return (
            self.by_token.get(lease.token)
            or self.by_request_key.get((lease.account, lease.attempt_id))
            or self.by_id.get(lease.attempt_id)
        )


async def check_leases(snap: Snapshot, store: LeaseStore) -> tuple[list[Violation], int]:
    """Compare the store with the snapshot; return the violations and the lease count."""
    rule = Invariant.I9_LEASE_ACCOUNTING.value
    account_of = {a.id: lease_account_of(a.provider, a.account_name) for a in snap.accounts}
    holders = _Holders(
        by_token={a.lease_token: a for a in snap.attempts if a.lease_token},
        by_request_key={
            (account_of.get(a.provider_account_id or -1, ""), a.client_request_key): a
            for a in snap.attempts
        },
        by_id={str(a.id): a for a in snap.attempts},
    )
    snapshots = {name: await store.snapshot(name) for name in await store.accounts()}
    lease_of: dict[int, Lease] = {}
    found: list[Violation] = []
    kept: dict[str, list[Lease]] = {name: [] for name in snapshots}
    lease_count = 0
    for name, account_snapshot in snapshots.items():
        for lease in account_snapshot.leases:
            lease_count += 1
            holder = holders.of(lease)
            if holder is None:
                found.append(
                    Violation(rule, _lease_subject(lease), "leaked: no attempt holds this lease")
                )
            elif holder.status in _TERMINAL and holder.status not in _TOLERATED_TERMINAL:
                found.append(
                    Violation(
                        rule,
                        _lease_subject(lease),
                        f"leaked: attempt {holder.id} (task {holder.task_id}) is {holder.status}",
                    )
                )
            else:
                lease_of[holder.id] = lease
                kept[name].append(lease)
    facts: list[InFlightAttempt] = []
    for attempt in snap.attempts:
        held = lease_of.get(attempt.id)
        fact = InFlightAttempt.from_state(
            attempt_id=held.attempt_id if held else attempt.client_request_key,
            account=held.account if held else account_of.get(attempt.provider_account_id or -1, ""),
            dimensions=held.dimensions if held else _default_dimensions(attempt),
            slots=held.slots if held else 1,
            state=attempt.status,
        )
        if fact is not None and fact.account:  # no account at all is I1's finding
            facts.append(fact)
    for name in sorted({f.account for f in facts} - snapshots.keys()):
        snapshots[name] = await store.snapshot(name)
        kept[name] = []
    for name, account_snapshot in sorted(snapshots.items()):
        legitimate = dataclasses.replace(account_snapshot, leases=tuple(kept[name]))
        for drift in compute_drift(facts, legitimate):
            found.append(
                Violation(
                    rule,
                    f"lease account {drift.account} / {drift.dimension}",
                    f"used {drift.actual}, expected {drift.expected} from in-flight attempts "
                    f"and legitimate leases (correction {drift.delta:+d})",
                )
            )
    return found, lease_count


def _lease_subject(lease: Lease) -> str:
    return f"lease {lease.account}/{lease.attempt_id}"
