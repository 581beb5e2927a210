"""I9: the lease store agrees with the attempts PostgreSQL says hold provider capacity."""

from __future__ import annotations

import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.audit import Invariant, check_invariants
from controlplane.leases import Dimension, LeaseRequest, MemoryLeaseStore
from controlplane.persistence.database import Database
from controlplane.persistence.tasks import TaskQueries
from tests.integration.audit.history import History, assert_only, build_history

I9 = Invariant.I9_LEASE_ACCOUNTING


@pytest_asyncio.fixture
async def leased(db: Database) -> tuple[History, MemoryLeaseStore]:
    """The clean history written with a lease store, leases taken and given back as in prod."""
    leases = MemoryLeaseStore()
    return await build_history(db, leases), leases


async def test_leases_matching_in_flight_attempts_hold(
    engine: AsyncEngine, leased: tuple[History, MemoryLeaseStore]
) -> None:
    """Leases held by the live, in-flight and ABANDONED attempts satisfy I9."""
    _, leases = leased
    report = await check_invariants(Database(engine), lease_store=leases)
    assert report.ok, report.render()
    assert report.counts["leases"] == 3  # running, unknown, abandoned


async def test_lease_of_a_finished_attempt_is_leaked(
    engine: AsyncEngine, db: Database, leased: tuple[History, MemoryLeaseStore]
) -> None:
    """A lease still held for a FAILED attempt is reported under I9."""
    history, leases = leased
    failed = await TaskQueries(db).get_attempt(history.attempts[("failed", 1)])
    assert failed is not None
    lease = await leases.acquire(
        LeaseRequest(
            attempt_id=failed.client_request_key,
            account=history.runway.lease_account,
            dimensions=(Dimension("account", 10), Dimension("model:gen4.5", 5)),
        )
    )
    assert lease is not None
    report = await check_invariants(Database(engine), lease_store=leases)
    assert_only(report, I9)
    assert any("leaked" in v.detail and "FAILED" in v.detail for v in report.violations)


async def test_lease_of_no_attempt_is_leaked(
    engine: AsyncEngine, leased: tuple[History, MemoryLeaseStore]
) -> None:
    """A lease no attempt in the database holds is reported under I9."""
    history, leases = leased
    await leases.acquire(
        LeaseRequest(
            attempt_id="ghost", account=history.veo.lease_account, dimensions=(Dimension("a", 1),)
        )
    )
    assert_only(await check_invariants(Database(engine), lease_store=leases), I9)


async def test_counter_drift_breaks_lease_accounting(
    engine: AsyncEngine, leased: tuple[History, MemoryLeaseStore]
) -> None:
    """A dimension counter above what the in-flight attempts hold is reported under I9."""
    history, leases = leased
    await leases.adjust_used(history.runway.lease_account, "model:gen4.5", 1)
    report = await check_invariants(Database(engine), lease_store=leases)
    assert_only(report, I9)
    assert [v.subject for v in report.violations] == [
        f"lease account {history.runway.lease_account} / model:gen4.5"
    ]


async def test_reclaimed_lease_of_an_in_flight_attempt_breaks_lease_accounting(
    engine: AsyncEngine, leased: tuple[History, MemoryLeaseStore]
) -> None:
    """In-flight attempts whose leases were reclaimed leave counters below usage, under I9."""
    _, leases = leased
    await leases.reclaim_expired(now_ms=2**62)
    report = await check_invariants(Database(engine), lease_store=leases)
    assert_only(report, I9)
    assert all("correction +" in v.detail for v in report.violations)
