"""Reconciliation storage (revision 0007) on both backends: a raw import stored once and never
changed, its records normalized once, runs idempotent by result and superseded visibly."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import pytest
import pytest_asyncio
from sqlalchemy import bindparam, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from controlplane.domain.reconciliation import Discrepancy, DiscrepancyKind
from controlplane.persistence import reconciliation_store as store
from controlplane.persistence.coltypes import UtcDateTime
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import upgrade
from controlplane.persistence.models import provider_jobs as PJ
from controlplane.persistence.models import provider_usage_ledger as PUL
from tests.integration.persistence.builders import Scenario

NOW = datetime(2026, 11, 30, 12, tzinfo=UTC)
START, END = datetime(2026, 11, 30, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC)
LINE = store.NewRecord(
    model="veo",
    usage_time=NOW,
    provider_milliunits=4000,
    provider_unit="billed_seconds",
    cost_micros=1_600_000,
    currency="USD",
    raw_json='{"operation":"op-1"}',
    provider_job_id="op-1",
)


@pytest_asyncio.fixture
async def own_db(empty_database_url: str) -> AsyncIterator[Database]:
    """A database of this test's own: the raw imports it writes can never be deleted, so they
    must not land in the session database other tests empty with DELETE."""
    await upgrade(empty_database_url)
    db = Database.from_url(empty_database_url)
    try:
        yield db
    finally:
        await db.dispose()


async def _import(db: Database, payload: str, lines: list[store.NewRecord]) -> store.StoredImport:
    async with db.unit(NOW) as unit:
        return await store.store_import(
            unit.conn,
            provider="google",
            account="main",
            window_start=START,
            window_end=END,
            payload=payload,
            payload_sha256=hashlib.sha256(payload.encode()).hexdigest(),
            records=lines,
            now=NOW,
        )


async def test_the_same_payload_is_stored_once(own_db: Database) -> None:
    first = await _import(own_db, '{"records":[1]}', [LINE])
    again = await _import(own_db, '{"records":[1]}', [LINE])
    other = await _import(own_db, '{"records":[2]}', [LINE, LINE])
    assert first.created
    assert not again.created
    assert again.id == first.id
    assert again.records == first.records
    assert [r.provider_job_id for r in first.records] == ["op-1"]
    assert other.id != first.id
    assert len(other.records) == 2
    async with own_db.reading() as conn:
        counts = (
            await conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM raw_usage_imports),"
                    " (SELECT count(*) FROM provider_usage_records)"
                )
            )
        ).one()
    assert tuple(counts) == (2, 3)


@pytest.mark.parametrize(
    "statement",
    ["UPDATE raw_usage_imports SET payload = 'forged'", "DELETE FROM raw_usage_imports"],
)
async def test_a_raw_import_cannot_be_changed_or_deleted(own_db: Database, statement: str) -> None:
    await _import(own_db, '{"records":[1]}', [LINE])
    with pytest.raises((DBAPIError, IntegrityError), match="immutable"):
        async with own_db.unit(NOW) as unit:
            await unit.conn.execute(text(statement))
    async with own_db.reading() as conn:
        payload = (await conn.execute(text("SELECT payload FROM raw_usage_imports"))).scalar_one()
    assert payload == '{"records":[1]}'


def _row(billed: int) -> Discrepancy:
    return Discrepancy(
        kind=DiscrepancyKind.CHARGE_WITHOUT_LOCAL_JOB,
        provider="google",
        account="main",
        model="veo",
        billed_micros=billed,
        expected_micros=0,
        currency="USD",
        record_ids=(1,),
        evidence={"matched_by": "none"},
    )


async def _save(db: Database, digest: str, rows: list[Discrepancy]) -> tuple[store.RunRow, bool]:
    async with db.unit(NOW) as unit:
        return await store.save_run(
            unit.conn,
            day="2026-11-30",
            provider="google",
            account="main",
            import_id=None,
            result_sha256=digest,
            record_count=1,
            billed_micros=sum(r.billed_micros for r in rows),
            expected_micros=0,
            currency="USD",
            statuses={"1": "unmatched"},
            rows=rows,
            now=NOW,
        )


async def test_runs_are_idempotent_by_result_and_superseded_visibly(own_db: Database) -> None:
    first, created = await _save(own_db, "a" * 64, [_row(5)])
    assert created
    same, created_again = await _save(own_db, "a" * 64, [_row(5)])
    assert (same.id, created_again) == (first.id, False)
    changed, created_new = await _save(own_db, "b" * 64, [_row(5), _row(7)])
    assert created_new
    assert changed.id != first.id
    async with own_db.reading() as conn:
        current = await store.current_runs(conn, "2026-11-30")
        rows = await store.discrepancies_of(conn, [first.id, changed.id])
        marks: dict[int, int | None] = dict(
            (await conn.execute(text("SELECT id, superseded_by FROM reconciliation_runs"))).all()
        )
    assert [r.id for r in current] == [changed.id]
    assert marks == {first.id: changed.id, changed.id: None}
    assert [d.billed_micros for d in rows[first.id]] == [5]
    assert [d.billed_micros for d in rows[changed.id]] == [5, 7]
    assert current[0].delta_micros == 12


async def test_expectations_read_attempts_jobs_and_the_usage_ledger(
    db: Database, scenario: Scenario
) -> None:
    """Both backends: a succeeded attempt with its job and ACTUAL ledger entry (whole credits
    read as thousandths), an ABANDONED one without a job (in the day by its send), and one sent
    the day before (a neighbour: matched, never reported missing); another account's attempt
    stays out."""
    account = await scenario.account("main")
    other = await scenario.account("other")
    names = {}
    async with db.reading() as conn:
        for pid, name in (
            await conn.execute(text("SELECT id, account_name FROM provider_accounts"))
        ).all():
            names[int(pid)] = str(name)
    done, lost, yesterday, foreign = (
        await scenario.attempt(account),
        await scenario.attempt(account),
        await scenario.attempt(account),
        await scenario.attempt(other),
    )
    sent = {done.id: NOW, lost.id: NOW, yesterday.id: START - timedelta(hours=1), foreign.id: NOW}
    state = {done.id: "SUCCEEDED", lost.id: "ABANDONED", yesterday.id: "SUCCEEDED"}
    async with db.unit(NOW) as unit:
        for attempt_id, at in sent.items():
            await unit.conn.execute(
                text(
                    "UPDATE task_attempts SET status = :s, request_started_at = :at WHERE id = :i"
                ).bindparams(bindparam("at", type_=UtcDateTime)),
                {"s": state.get(attempt_id, "SUCCEEDED"), "at": at, "i": attempt_id},
            )
        for attempt_id, completed in (
            (done.id, NOW + timedelta(minutes=2)),
            (yesterday.id, START - timedelta(minutes=5)),
        ):
            await unit.conn.execute(
                PJ.insert().values(
                    attempt_id=attempt_id,
                    provider_account_id=account,
                    provider_job_id=f"job-{attempt_id}",
                    provider_request_id=f"req-{attempt_id}",
                    normalized_status="SUCCEEDED",
                    submitted_at=sent[attempt_id],
                    completed_at=completed,
                )
            )
        await unit.conn.execute(
            PUL.insert().values(
                attempt_id=done.id,
                task_id=done.task_id,
                provider="runway",
                provider_account_id=account,
                model="gen4.5",
                provider_job_id=f"job-{done.id}",
                kind="ACTUAL",
                amount_micros=480_000,
                currency="USD",
                provider_units=48,
                provider_unit_name="credits",
                price_version="runway-2026-06",
                conversion_rate_version="runway-2026-06",
                idempotency_key=f"actual:{done.id}",
            )
        )
    async with db.reading() as conn:
        got = await store.expectations(
            conn,
            provider="runway",
            account=names[account],
            start=START,
            end=END,
            window=timedelta(hours=6),
        )
    by_id = {e.attempt_id: e for e in got}
    assert set(by_id) == {done.id, lost.id, yesterday.id}
    ok = by_id[done.id]
    assert (ok.state, ok.in_day, ok.provider_job_id, ok.provider_request_id) == (
        "SUCCEEDED",
        True,
        f"job-{done.id}",
        f"req-{done.id}",
    )
    assert (ok.expected_micros, ok.expected_milliunits, ok.unit) == (480_000, 48_000, "credits")
    assert ok.conversion_rate_version == "runway-2026-06"
    gone = by_id[lost.id]
    assert (gone.state, gone.in_day, gone.provider_job_id, gone.expected_micros) == (
        "ABANDONED",
        True,
        "",
        250_000,
    )
    assert by_id[yesterday.id].in_day is False
