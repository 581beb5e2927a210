"""The invariant checker: does the execution history in the database obey the design's rules?

    report = await check_invariants(db, lease_store=store, require_all_terminal=True)
    assert report.ok, report.render()

Soak and crash tests run it after (or during) a run; operators run it against a live database::

    python -m controlplane.audit.invariants postgresql+asyncpg://... [--redis redis://...]

It reads PostgreSQL or SQLite through one consistent snapshot of the 0001 tables
(`controlplane.persistence.snapshot`, the query that takes it; this package runs no SQL of its
own), and never writes. The rules, each with a stable id (`Invariant`):

==============================  =========================================================
I1_attempt_binding              9.3.4#1 account, model, compile plan fixed per attempt
I2_attempt_numbering            9.3.4#2 attempt_no is 1..n per task
I2b_one_job_per_attempt         9.3.4#2 at most one provider job per attempt
I3_job_never_overwritten        9.3.4#3 one recorded job per attempt; unique job ids
I4_single_adopted_output        9.3.4#4 one adopted SUCCEEDED attempt; output only on SUCCEEDED
I5_adoption_stable              9.3.4#5 adoption never changes or is undone
I6_cost_per_attempt             9.3.4#6 integer micros, ISO-4217 currency, no float columns
I7_route_decision_explained     9.3.4#7 every attempt has an explained decision of its task
I8_state_sanity                 9.8 valid states; no live attempt under a terminal task
I9_lease_accounting             9.11.2 lease counters match in-flight attempts (lease_store)
I10_quiescent                   every task terminal, outbox drained (require_all_terminal)
==============================  =========================================================

The rule modules document their judgement calls: `task_rules` (cancel racing success, ABANDONED
under a terminal task), `execution_rules` (actual cost not yet reported), `leases` (what holds a
lease, and the scheduler conventions used when a lease record is gone).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter

from controlplane.audit import execution_rules as xr
from controlplane.audit import task_rules as tr
from controlplane.audit.leases import check_leases
from controlplane.audit.report import InvariantReport, Violation
from controlplane.leases.base import LeaseStore
from controlplane.persistence.database import Database
from controlplane.persistence.snapshot import Snapshot, read_snapshot

__all__ = ["check_invariants", "check_snapshot", "main"]


def check_snapshot(snap: Snapshot, *, require_all_terminal: bool = False) -> InvariantReport:
    """Run every database rule (all but I9) over an already-read snapshot."""
    violations: list[Violation] = []
    violations += xr.check_attempt_binding(snap)
    violations += xr.check_attempt_numbering(snap)
    violations += xr.check_one_job_per_attempt(snap)
    violations += xr.check_job_never_overwritten(snap)
    violations += tr.check_adopted_output(snap)
    violations += tr.check_adoption_stable(snap)
    cost_violations, unsettled = xr.check_cost_accounting(snap)
    violations += cost_violations
    violations += xr.check_route_decisions(snap)
    violations += tr.check_state_sanity(snap, settled=require_all_terminal)
    if require_all_terminal:
        violations += tr.check_quiescent(snap)
    counts = {
        "tasks": len(snap.tasks),
        "attempts": len(snap.attempts),
        "provider_jobs": len(snap.jobs),
        "route_decisions": len(snap.decisions),
        "task_events_read": len(snap.events),
        "outbox_undone": len(snap.undone_outbox),
        "succeeded_attempts_without_actual_cost": unsettled,
    }
    for state, n in Counter(t.status for t in snap.tasks).items():
        counts[f"tasks_{state.lower()}"] = n
    return InvariantReport(violations=violations, counts=counts)


async def check_invariants(
    db: Database,
    *,
    lease_store: LeaseStore | None = None,
    require_all_terminal: bool = False,
) -> InvariantReport:
    """Read the database once and check every invariant; I9 only when `lease_store` is given.

    `require_all_terminal` adds I10 for the end of a soak run: every task terminal and no
    outbox message left undone except for terminal tasks. The lease store is read after the
    database, so call this while nothing is scheduling (see `controlplane.audit.leases`).
    """
    snap = await read_snapshot(db)
    report = check_snapshot(snap, require_all_terminal=require_all_terminal)
    if lease_store is not None:
        lease_violations, lease_count = await check_leases(snap, lease_store)
        report.violations.extend(lease_violations)
        report.counts["leases"] = lease_count
    return report


async def _run(url: str, redis_url: str | None, namespace: str, all_terminal: bool) -> int:
    db = Database.from_url(url)
    client = None
    try:
        store: LeaseStore | None = None
        if redis_url:
            from redis.asyncio import Redis

            from controlplane.leases.redis_store import RedisLeaseStore

            client = Redis.from_url(redis_url)
            store = RedisLeaseStore(client, namespace=namespace)
        report = await check_invariants(db, lease_store=store, require_all_terminal=all_terminal)
    finally:
        if client is not None:
            await client.aclose()
        await db.dispose()
    print(report.render())
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    """CLI: print the report; exit 0 when every invariant holds, 1 otherwise."""
    parser = argparse.ArgumentParser(
        prog="python -m controlplane.audit.invariants",
        description="Check the vidroute domain invariants (design 9.3.4, 9.8, 9.11.2).",
    )
    parser.add_argument("database_url", help="e.g. postgresql+asyncpg://user@host/db")
    parser.add_argument("--redis", metavar="URL", help="also check the Redis lease store")
    parser.add_argument(
        "--redis-namespace", default="vidroute:", help="lease key prefix (default vidroute:)"
    )
    parser.add_argument(
        "--require-all-terminal",
        action="store_true",
        help="also require every task terminal and the outbox drained (I10)",
    )
    args = parser.parse_args(argv)
    return asyncio.run(
        _run(args.database_url, args.redis, args.redis_namespace, args.require_all_terminal)
    )


if __name__ == "__main__":
    sys.exit(main())
