"""What the database says after a run: a task's persisted history and the invariant report.

The e2e tests compare three views: GetTask, this (the control plane's own PostgreSQL/SQLite
rows, read directly) and the emulators' truth.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any


async def _task_events(database_url: str, task_id: str) -> list[tuple[str, dict[str, Any]]]:
    from sqlalchemy import text

    from controlplane.persistence.db import create_engine

    engine = create_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text("SELECT kind, payload FROM task_events WHERE task_id = :t ORDER BY seq"),
                {"t": int(task_id)},
            )
            return [
                (str(kind), payload if isinstance(payload, dict) else json.loads(payload))
                for kind, payload in rows
            ]
    finally:
        await engine.dispose()


def task_events(database_url: str, task_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The task's persisted history (kind, payload), in order."""
    return asyncio.run(_task_events(database_url, task_id))


def wait_for_a_refused_submit(database_url: str, task_id: str, timeout_s: float) -> None:
    """Until the task's history shows a refused submit: an attempt re-sent (SUBMITTING twice)
    or ended FAILED. A refusal window that must be hit is held open until this returns: the
    control plane's own CPU time from CreateTask to the first submit does not shrink with the
    time scale, so a window opened before CreateTask can close before any submit reaches it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states: dict[str, list[str]] = {}
        for kind, payload in task_events(database_url, task_id):
            if kind in ("attempt.created", "attempt.state_changed"):
                states.setdefault(str(payload["attempt_id"]), []).append(str(payload["state"]))
        if any(s.count("SUBMITTING") > 1 or "FAILED" in s for s in states.values()):
            return
        time.sleep(0.05)
    raise AssertionError(f"no submit of task {task_id} hit the refusal in {timeout_s} s")


async def _audit(database_url: str, redis_url: str | None, *, reclaim_ahead_ms: int | None) -> Any:
    from redis.asyncio import Redis

    from controlplane.audit.invariants import check_invariants
    from controlplane.leases.base import Dimension
    from controlplane.leases.reconciler import InFlightAttempt, reconcile
    from controlplane.leases.redis_store import RedisLeaseStore
    from controlplane.persistence.database import Database
    from controlplane.persistence.snapshot import read_snapshot

    db = Database.from_url(database_url)
    client = Redis.from_url(redis_url) if redis_url else None
    try:
        store = RedisLeaseStore(client) if client is not None else None
        if store is not None and reclaim_ahead_ms is not None:
            # A SIGKILLed holder never releases: its leases end when their TTL does. Jump the
            # store's clock past every TTL, then let the reconciler repair the counters.
            await store.reclaim_expired(now_ms=int(time.time() * 1000) + reclaim_ahead_ms)
            snap = await read_snapshot(db)
            names = {a.id: f"{a.provider}:{a.account_name}" for a in snap.accounts}
            facts = [
                fact
                for a in snap.attempts
                if (
                    fact := InFlightAttempt.from_state(
                        attempt_id=a.client_request_key,
                        account=names.get(a.provider_account_id or -1, ""),
                        dimensions=(
                            Dimension("account", 0),
                            Dimension(f"model:{a.provider_model}", 0),
                        ),
                        slots=1,
                        state=a.status,
                    )
                )
                is not None
            ]

            async def ignore(_drift: object) -> None:
                return None

            await reconcile(store, facts, ignore)
        return await check_invariants(db, lease_store=store, require_all_terminal=True)
    finally:
        if client is not None:
            await client.aclose()
        await db.dispose()


LEASE_SETTLE_S = 20.0
"""How long a report whose only findings are lease accounting (I9) is read again. A worker
releases a finished attempt's lease after the transaction that ended it committed (never in
it: 9.11.1), so a report read right after a task ended can find the release still on its way
on a loaded machine; a lease lost that way is reclaimed at its TTL by upkeep (9.11.2). Every
other invariant is judged on the first read."""


def audit(
    database_url: str,
    redis_url: str | None,
    *,
    reclaim_ahead_ms: int | None = None,
    settle_s: float = LEASE_SETTLE_S,
) -> Any:
    """The invariant report with every task required terminal and the Redis leases checked.

    `reclaim_ahead_ms` (crash tests only) first reclaims every lease whose TTL would have run
    out that far in the future and reconciles the counters, as production would after a crash.
    A report with lease findings only is read again until it is clean or `settle_s` passed
    (`LEASE_SETTLE_S`); the last one read is returned.
    """
    from controlplane.audit.report import Invariant

    leases = Invariant.I9_LEASE_ACCOUNTING.value
    deadline = time.monotonic() + settle_s
    while True:
        report = asyncio.run(_audit(database_url, redis_url, reclaim_ahead_ms=reclaim_ahead_ms))
        only_leases = all(v.invariant == leases for v in report.violations)
        if report.ok or not only_leases or time.monotonic() >= deadline:
            return report
        time.sleep(0.2)
