"""Ledger properties on real PostgreSQL, several connections at once (issue 11, Done when).

For random task outcomes (attempts that are rejected, accepted and failed, abandoned after an
unknown submit, duplicated; the task SUCCEEDED through one of them, FAILED or CANCELLED) and
concurrent reserve and settle calls (``asyncio.gather`` over separate pooled connections):

* every tenant is charged at most once per task (and reserved at most once);
* the sum of the entries equals the derived balance, and the cached balance equals both;
* no prepaid tenant's available balance goes below zero; a postpaid one stays above its overdraft;
* platform loss equals the cost of the platform-caused duplicates and unknown submits the model
  predicts, attempt by attempt, and a delivery's cost beyond its charge (capped by the
  reservation) is booked on the delivered attempt;
* a charge the bill then confirms for an attempt (issue 23: a cost after an unknown submit, a
  duplicate at the provider), booked as a loss by two racing admins, is one dispute and adds
  only what settlement had not booked: the attempt's loss becomes max(booked, billed); its
  dispute moves to written off or refunded (at most the confirmed loss), each move an event.

Example count: ``VIDROUTE_MONEY_EXAMPLES`` (default 12; a soak takes e.g. 500).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from controlplane.domain.disputes import DisputeState, IllegalDisputeMove
from controlplane.domain.money import (
    BillingMode,
    BillingPolicy,
    CreditKind,
    InsufficientCredit,
    Reservation,
    UsageKind,
)
from controlplane.domain.reconciliation import Discrepancy, DiscrepancyKind
from controlplane.domain.states import AttemptState, TaskState
from controlplane.persistence import ledger, reconciliation_store
from controlplane.persistence.database import Database
from controlplane.persistence.db import create_engine
from controlplane.persistence.migrate import upgrade
from controlplane.persistence.models import credit_ledger as C
from controlplane.persistence.models import loss_dispute_events as DE
from controlplane.persistence.models import loss_disputes as D
from controlplane.persistence.models import provider_usage_ledger as U
from controlplane.persistence.models import reconciliation_discrepancies as RD
from controlplane.persistence.records import (
    AttemptChanges,
    NewAttempt,
    NewProviderJob,
    NewRouteDecision,
)
from controlplane.reconciliation.disputes import book_loss, move_dispute
from tests.conftest import PostgresServer
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

pytestmark = pytest.mark.postgres
EXAMPLES = int(os.environ.get("VIDROUTE_MONEY_EXAMPLES") or 12)
NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)

# How an attempt ends: REJECTED (no job, definite), UNKNOWN (abandoned submit, maybe billed),
# JOB_FAILED (a job that failed), JOB_SUCCEEDED (a job with a result).
ATTEMPT_FATES = ("REJECTED", "UNKNOWN", "JOB_FAILED", "JOB_SUCCEEDED")


@dataclass(frozen=True)
class AttemptPlan:
    fate: str
    estimate: int
    actual: int | None  # the provider's reported cost, if any
    bill: int | None = None  # an extra charge the bill confirms for the attempt, if any
    refunded: bool = False  # its dispute ends refunded (else written off)


@dataclass(frozen=True)
class TaskPlan:
    reservation: int
    attempts: tuple[AttemptPlan, ...]
    outcome: TaskState  # SUCCEEDED uses the last JOB_SUCCEEDED attempt
    settle_racers: int  # concurrent settle calls after the terminal move


@dataclass
class Expected:
    loss: dict[int, int] = field(default_factory=dict)  # attempt id -> loss micros
    charged: dict[int, int] = field(default_factory=dict)  # task id -> charge micros
    ended: list[tuple[int, int, AttemptPlan]] = field(default_factory=list)  # task, attempt
    # delivered attempt id -> its cost beyond the charge (capped by the reservation)
    underpriced: dict[int, int] = field(default_factory=dict)


attempt_plans = st.builds(
    AttemptPlan,
    fate=st.sampled_from(ATTEMPT_FATES),
    estimate=st.integers(0, 5_000_000),
    actual=st.one_of(st.none(), st.integers(0, 5_000_000)),
    bill=st.one_of(st.none(), st.integers(1, 6_000_000)),
    refunded=st.booleans(),
)
task_plans = st.builds(
    TaskPlan,
    reservation=st.integers(0, 4_000_000),
    attempts=st.lists(attempt_plans, min_size=1, max_size=3).map(tuple),
    outcome=st.sampled_from([TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED]),
    settle_racers=st.integers(1, 3),
)
tenant_plans = st.tuples(
    st.sampled_from(["prepaid", "postpaid:2000000"]),
    st.integers(0, 8_000_000),  # initial credit
    st.lists(task_plans, min_size=1, max_size=5),
)


def _spec(tenant: str) -> GenerationSpec:
    return GenerationSpec(
        tenant_id=tenant,
        prompt="a kite",
        mode=Mode.TEXT_TO_VIDEO,
        output=OutputSpec(width=1280, height=720, duration_ms=4000),
    )


@pytest.fixture(scope="module")
def money_url(postgres_server: PostgresServer) -> Iterator[str]:
    """One migrated PostgreSQL database for the module; tenants are unique per example."""
    name = asyncio.run(postgres_server.create_database("money" + secrets.token_hex(3)))
    url = postgres_server.url_for(name)
    asyncio.run(upgrade(url))
    try:
        yield url
    finally:
        asyncio.run(postgres_server.drop_database(name))


async def _account(db: Database) -> int:
    async with db.unit(NOW) as u:
        return await u.create_provider_account(
            provider="runway",
            account_name=f"acct-{secrets.token_hex(4)}",
            region="us",
            credential_ref="kms://x",
        )


def _new_attempt(account_id: int, plan: AttemptPlan) -> NewAttempt:
    return NewAttempt(
        provider_account_id=account_id,
        provider_model="gen4.5",
        provider_model_version="v1",
        capability_version="cap-v1",
        price_version="runway-2026-06",
        routing_policy_version="router-v1",
        client_request_key=f"crk-{secrets.token_hex(6)}",
        normalized_spec_hash="h",
        compile_plan={},
        estimated_cost_micros=plan.estimate,
        currency="USD",
    )


def _decision() -> NewRouteDecision:
    return NewRouteDecision(
        policy_version="router-v1", reason_code="BEST_SCORE", candidate_snapshot={}
    )


async def _reserve(
    db: Database, tenant: str, policy: BillingPolicy, plan: TaskPlan, key: str
) -> int | None:
    """CreateTask's transaction: a task and its reservation, or InsufficientCredit and nothing."""
    try:
        async with db.unit(NOW) as u:
            task, _ = await u.create_task(
                _spec(tenant),
                idempotency_key=key,
                spec_hash=key,
                reservation=Reservation(plan.reservation, "USD", policy),
            )
            return task.id
    except InsufficientCredit:
        return None


async def _run_attempts(
    db: Database, account_id: int, task_id: int, plan: TaskPlan, expected: Expected
) -> int | None:
    """Play the attempts; returns the delivered attempt id (SUCCEEDED tasks only)."""
    ended: list[tuple[int, AttemptPlan]] = []
    for i, ap in enumerate(plan.attempts):
        async with db.unit(NOW) as u:
            task = await u.task(task_id)
            assert task is not None
            if task.state is not TaskState.SCHEDULING:
                assert await u.move_task(task, TaskState.SCHEDULING) is not None
                task = await u.task(task_id)
                assert task is not None
            attempt, _ = await u.create_attempt(
                task_id, task.status_version, _new_attempt(account_id, ap), _decision()
            )
            submitting = await u.move_attempt(attempt, AttemptState.SUBMITTING)
            assert submitting is not None
            attempt = submitting
            if ap.fate == "REJECTED":
                final = AttemptState.FAILED
            elif ap.fate == "UNKNOWN":
                moved = await u.move_attempt(attempt, AttemptState.SUBMIT_UNKNOWN)
                assert moved is not None
                attempt, final = moved, AttemptState.ABANDONED
            else:
                await u.insert_job(
                    NewProviderJob(
                        attempt_id=attempt.id,
                        provider_account_id=account_id,
                        provider_job_id=f"job-{attempt.id}",
                        normalized_status=AttemptState.ACCEPTED,
                        submitted_at=NOW,
                    )
                )
                moved = await u.move_attempt(attempt, AttemptState.ACCEPTED)
                assert moved is not None
                attempt = moved
                final = (
                    AttemptState.SUCCEEDED if ap.fate == "JOB_SUCCEEDED" else AttemptState.FAILED
                )
            done = await u.move_attempt(
                attempt, final, changes=AttemptChanges(actual_cost_micros=ap.actual)
            )
            assert done is not None
            ended.append((done.id, ap))
            expected.ended.append((task_id, done.id, ap))
            if i < len(plan.attempts) - 1:
                # Back to the scheduler for the next attempt (the task is SUBMITTING/RUNNING).
                task = await u.task(task_id)
                assert task is not None
                if task.state is TaskState.SUBMITTING:
                    assert await u.move_task(task, TaskState.SCHEDULING) is not None
    delivered = None
    if plan.outcome is TaskState.SUCCEEDED:
        delivered = next((aid for aid, ap in reversed(ended) if ap.fate == "JOB_SUCCEEDED"), None)
    for aid, ap in ended:
        billed = ap.fate in ("JOB_FAILED", "JOB_SUCCEEDED") or ap.fate == "UNKNOWN"
        if aid != delivered and billed:
            expected.loss[aid] = ap.actual if ap.actual is not None else ap.estimate
    if delivered is not None:
        ap = dict(ended)[delivered]
        cost = ap.actual if ap.actual is not None else ap.estimate
        expected.charged[task_id] = min(cost, plan.reservation)
        if cost > plan.reservation:
            expected.underpriced[delivered] = cost - plan.reservation
    return delivered


async def _finish(db: Database, task_id: int, plan: TaskPlan, delivered: int | None) -> None:
    """The terminal move (which settles), then racing settle calls on their own connections."""
    target = (
        plan.outcome
        if delivered is not None or plan.outcome is not TaskState.SUCCEEDED
        else (TaskState.FAILED)
    )
    async with db.unit(NOW) as u:
        task = await u.task(task_id)
        assert task is not None
        if target is TaskState.SUCCEEDED:
            if task.state is TaskState.SUBMITTING:
                task = await u.move_task(task, TaskState.RUNNING)
                assert task is not None
            task = await u.move_task(task, TaskState.OUTPUT_FETCHING)
            assert task is not None
            assert await u.move_task(task, target, adopted_attempt_id=delivered) is not None
        else:
            assert await u.move_task(task, target) is not None

    async def racer() -> None:
        async with db.unit(NOW) as u:
            await ledger.settle_task(u.conn, task_id, target, NOW)

    await asyncio.gather(*(racer() for _ in range(plan.settle_racers)))


async def _scenario(url: str, tenants: list[tuple[str, int, list[TaskPlan]]]) -> None:
    engine = create_engine(url, pool_size=8, max_overflow=4)
    db = Database(engine)
    try:
        account_id = await _account(db)
        names = [f"t-{secrets.token_hex(5)}" for _ in tenants]
        policies = {n: BillingPolicy.parse(p) for n, (p, _, _) in zip(names, tenants, strict=True)}
        for name, (_, credit, _) in zip(names, tenants, strict=True):
            async with db.unit(NOW) as u:
                await ledger.append_credit(u.conn, name, credit, "USD", "seed", "test", "", NOW)
        # Every tenant's reservations at once, over separate connections: the advisory lock
        # must serialise them or a prepaid tenant would overdraw.
        jobs = [
            (name, plan, f"k{i}")
            for name, (_, _, plans) in zip(names, tenants, strict=True)
            for i, plan in enumerate(plans)
        ]
        ids = await asyncio.gather(
            *(_reserve(db, name, policies[name], plan, key) for name, plan, key in jobs)
        )
        expected = Expected()
        for (name, plan, _), task_id in zip(jobs, ids, strict=True):
            await _check_balance(db, name, policies[name])
            if task_id is None:
                continue
            delivered = await _run_attempts(db, account_id, task_id, plan, expected)
            await _finish(db, task_id, plan, delivered)
        for name in names:
            await _check_balance(db, name, policies[name], settled=True)
        await _book_confirmed_losses(db, expected)
        await _check_charges_and_losses(db, [t for t in ids if t is not None], expected)
    finally:
        await engine.dispose()


async def _check_balance(
    db: Database, tenant: str, policy: BillingPolicy, *, settled: bool = False
) -> None:
    async with db.reading() as conn:
        got = await ledger.balance(conn, tenant, "USD")
        truth = await ledger.derived_balance(conn, tenant, "USD")
        entries = await ledger.list_entries(conn, tenant, 0, 10_000)
    assert got == truth  # the cached balance is the derived one, as of the newest entry
    assert got.as_of_entry_id == max(e.id for e in entries)
    assert got.balance_micros == sum(e.balance_effect_micros for e in entries)
    reserves = {e.task_id: e.amount_micros for e in entries if e.kind is CreditKind.RESERVE}
    settled_ids = {e.task_id for e in entries if e.kind in (CreditKind.CHARGE, CreditKind.RELEASE)}
    assert got.reserved_micros == sum(a for t, a in reserves.items() if t not in settled_ids)
    floor = policy.floor_micros()
    assert floor is not None
    assert got.available_micros >= floor, (got, policy)
    if policy.mode is BillingMode.PREPAID:
        assert got.balance_micros >= 0
    if settled:
        assert got.reserved_micros == 0
        assert settled_ids == set(reserves)


async def _check_charges_and_losses(db: Database, task_ids: list[int], expected: Expected) -> None:
    async with db.reading() as conn:
        per_task = (
            await conn.execute(
                select(C.c.task_id, C.c.kind, func.count(), func.sum(C.c.amount_micros))
                .where(C.c.task_id.in_(task_ids))
                .group_by(C.c.task_id, C.c.kind)
            )
        ).all()
        losses = (
            await conn.execute(
                select(U.c.attempt_id, U.c.amount_micros).where(
                    U.c.task_id.in_(task_ids), U.c.kind == UsageKind.PLATFORM_LOSS.value
                )
            )
        ).all()
    counts: dict[tuple[int, str], int] = {(t, k): n for t, k, n, _ in per_task}
    for task_id in task_ids:
        assert counts.get((task_id, "RESERVE"), 0) == 1
        settlements = counts.get((task_id, "CHARGE"), 0) + counts.get((task_id, "RELEASE"), 0)
        assert settlements == 1, f"task {task_id} settled {settlements} times"
    charged = {t: int(total) for t, k, _, total in per_task if k == "CHARGE"}
    assert charged == expected.charged
    per_attempt: dict[int, int] = {}
    for a, m in losses:
        per_attempt[a] = per_attempt.get(a, 0) + int(m)
    want = dict(expected.loss)
    for a, m in expected.underpriced.items():
        want[a] = want.get(a, 0) + m
    assert {a: m for a, m in per_attempt.items() if m} == {a: m for a, m in want.items() if m}


async def _book_confirmed_losses(db: Database, expected: Expected) -> None:
    """The bill confirms each planned extra charge: one reconciliation run of rows, each row
    booked by two racing admins, then its dispute moved to its end."""
    billed = [(t, a, ap) for t, a, ap in expected.ended if ap.bill is not None]
    if not billed:
        return
    account = f"acct-{secrets.token_hex(4)}"
    rows = [
        Discrepancy(
            kind=DiscrepancyKind.COST_AFTER_UNKNOWN
            if ap.fate == "UNKNOWN"
            else DiscrepancyKind.DUPLICATE_CHARGE,
            provider="runway",
            account=account,
            model="gen4.5",
            billed_micros=int(ap.bill or 0),
            expected_micros=0,
            currency="USD",
            attempt_id=a,
            task_id=t,
        )
        for t, a, ap in billed
    ]
    async with db.unit(NOW) as u:
        run, _ = await reconciliation_store.save_run(
            u.conn,
            day="2026-12-01",
            provider="runway",
            account=account,
            import_id=None,
            result_sha256=secrets.token_hex(8),
            record_count=0,
            billed_micros=sum(r.billed_micros for r in rows),
            expected_micros=0,
            currency="USD",
            statuses={},
            rows=rows,
            now=NOW,
        )
    async with db.reading() as conn:
        row_ids = list(
            (
                await conn.execute(select(RD.c.id).where(RD.c.run_id == run.id).order_by(RD.c.seq))
            ).scalars()
        )
    for row_id, (_, attempt_id, ap) in zip(row_ids, billed, strict=True):
        bill = int(ap.bill or 0)
        booked = await asyncio.gather(
            *(book_loss(db, row_id, actor=f"admin-{n}", reason="bill") for n in range(2))
        )
        assert sum(b.created for b in booked) == 1
        assert {b.dispute.id for b in booked} == {booked[0].dispute.id}
        dispute = booked[0].dispute
        before = expected.loss.get(attempt_id, 0)
        assert dispute.confirmed_micros == bill
        assert dispute.new_loss_micros == max(0, bill - before)
        expected.loss[attempt_id] = max(before, bill)
        moved = await move_dispute(
            db, dispute.id, DisputeState.DISPUTED, actor="admin", reason="claim sent"
        )
        if ap.refunded:
            moved = await move_dispute(
                db,
                dispute.id,
                DisputeState.REFUNDED,
                actor="admin",
                reason="credited",
                refunded_micros=bill,
            )
            assert moved.refunded_micros == bill
        else:
            moved = await move_dispute(
                db, dispute.id, DisputeState.WRITTEN_OFF, actor="admin", reason="kept"
            )
        with pytest.raises(IllegalDisputeMove):
            await move_dispute(db, dispute.id, DisputeState.OPEN, actor="admin", reason="again")
    async with db.reading() as conn:
        events = (
            await conn.execute(
                select(func.count())
                .select_from(DE)
                .where(DE.c.dispute_id.in_(select(D.c.id).where(D.c.discrepancy_id.in_(row_ids))))
            )
        ).scalar_one()
    assert events == 3 * len(row_ids)  # booked, disputed, ended: no event of a refused move


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(tenants=st.lists(tenant_plans, min_size=1, max_size=3))
def test_ledgers_hold_their_invariants_under_concurrency(
    money_url: str, tenants: list[tuple[str, int, list[TaskPlan]]]
) -> None:
    """Charged at most once per task, entries sum to the balance, no overdraw, exact loss."""
    asyncio.run(_scenario(money_url, tenants))
