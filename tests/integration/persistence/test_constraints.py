"""The database itself enforces the design's UNIQUE constraints, enums, money and time types."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from sqlalchemy import BigInteger, Float, Numeric, Table, insert, select
from sqlalchemy.exc import IntegrityError, StatementError
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.persistence.models import (
    Base,
    generation_tasks,
    outbox,
    provider_jobs,
    provider_price_versions,
    route_decisions,
    task_attempts,
)
from tests.integration.persistence.builders import NOW, Scenario


async def _insert(engine: AsyncEngine, table: Table, values: Mapping[str, Any]) -> None:
    async with engine.begin() as conn:
        await conn.execute(insert(table).values(dict(values)))


async def _row(engine: AsyncEngine, table: Table, row_id: int) -> dict[str, Any]:
    async with engine.connect() as conn:
        row = (await conn.execute(select(table).where(table.c.id == row_id))).mappings().one()
    return dict(row)


def _copy(row: Mapping[str, Any], **changes: Any) -> dict[str, Any]:
    values = {k: v for k, v in row.items() if k != "id"}
    values.update(changes)
    return values


async def test_task_idempotency_key_is_unique_per_tenant(
    engine: AsyncEngine, scenario: Scenario
) -> None:
    """A second task row with the same (tenant_id, idempotency_key) is rejected."""
    task = await scenario.task(key="k1")
    row = await _row(engine, generation_tasks, task.id)
    await _insert(engine, generation_tasks, _copy(row, tenant_id="other-tenant"))
    with pytest.raises(IntegrityError):
        await _insert(engine, generation_tasks, _copy(row))


async def test_attempt_number_is_unique_per_task(engine: AsyncEngine, scenario: Scenario) -> None:
    """A second attempt row with the same (task_id, attempt_no) is rejected."""
    attempt = await scenario.attempt()
    row = await _row(engine, task_attempts, attempt.id)
    with pytest.raises(IntegrityError):
        await _insert(engine, task_attempts, _copy(row, client_request_key="fresh-key"))


async def test_client_request_key_is_unique_per_account(
    engine: AsyncEngine, scenario: Scenario
) -> None:
    """A second attempt row with the same (provider_account_id, client_request_key) is rejected."""
    attempt = await scenario.attempt()
    row = await _row(engine, task_attempts, attempt.id)
    with pytest.raises(IntegrityError):
        await _insert(engine, task_attempts, _copy(row, attempt_no=2))


async def test_provider_job_id_is_unique_per_account(
    engine: AsyncEngine, scenario: Scenario
) -> None:
    """A second provider job with the same (provider_account_id, provider_job_id) is rejected."""
    account = await scenario.account()
    first = await scenario.attempt(account)
    second = await scenario.attempt(account)
    job = {
        "attempt_id": first.id,
        "provider_account_id": account,
        "provider_job_id": "job-1",
        "normalized_status": "ACCEPTED",
        "submitted_at": NOW,
    }
    await _insert(engine, provider_jobs, job)
    with pytest.raises(IntegrityError):
        await _insert(engine, provider_jobs, {**job, "attempt_id": second.id})


async def test_attempt_has_at_most_one_provider_job(
    engine: AsyncEngine, scenario: Scenario
) -> None:
    """A second provider job for the same attempt_id is rejected."""
    attempt = await scenario.attempt()
    job = {
        "attempt_id": attempt.id,
        "provider_account_id": attempt.provider_account_id,
        "provider_job_id": "job-1",
        "normalized_status": "ACCEPTED",
        "submitted_at": NOW,
    }
    await _insert(engine, provider_jobs, job)
    with pytest.raises(IntegrityError):
        await _insert(engine, provider_jobs, {**job, "provider_job_id": "job-2"})


async def test_decision_number_is_unique_per_task(engine: AsyncEngine, scenario: Scenario) -> None:
    """A second route decision with the same (task_id, decision_no) is rejected."""
    attempt = await scenario.attempt()
    assert attempt.route_decision_id is not None
    row = await _row(engine, route_decisions, attempt.route_decision_id)
    with pytest.raises(IntegrityError):
        await _insert(engine, route_decisions, _copy(row))


async def test_status_outside_the_enum_is_rejected(engine: AsyncEngine, scenario: Scenario) -> None:
    """A task status that is not a TaskState value violates the CHECK constraint."""
    task = await scenario.task()
    row = await _row(engine, generation_tasks, task.id)
    with pytest.raises(IntegrityError):
        await _insert(engine, generation_tasks, _copy(row, idempotency_key="x", status="DONE"))


def test_no_float_or_numeric_column_and_money_is_bigint() -> None:
    """No column anywhere is a float or decimal, and every money column is a BIGINT."""
    for table in Base.metadata.sorted_tables:
        for column in table.columns:
            assert not isinstance(column.type, Float | Numeric), f"{table.name}.{column.name}"
            if "micros" in column.name:
                assert isinstance(column.type, BigInteger), f"{table.name}.{column.name}"


async def test_money_round_trips_as_exact_integers(engine: AsyncEngine, scenario: Scenario) -> None:
    """Micros above 2**53 (where a float would round) come back as the identical int."""
    account = await scenario.account()
    price = 2**62 + 1
    async with engine.begin() as conn:
        row_id = await conn.scalar(
            insert(provider_price_versions)
            .values(
                provider_account_id=account,
                model="gen4.5",
                price_version="p1",
                unit="second",
                price_micros_per_unit=price,
                currency="USD",
                effective_from=NOW,
            )
            .returning(provider_price_versions.c.id)
        )
    row = await _row(engine, provider_price_versions, int(row_id))
    assert type(row["price_micros_per_unit"]) is int
    assert row["price_micros_per_unit"] == price


async def test_timestamps_round_trip_as_aware_utc(engine: AsyncEngine) -> None:
    """A timestamp written with any offset is read back as the same instant in UTC."""
    at = datetime(2026, 6, 24, 18, 30, 15, 123456, tzinfo=timezone(timedelta(hours=8)))
    async with engine.begin() as conn:
        row_id = await conn.scalar(
            insert(outbox)
            .values(topic="t", aggregate_id="1", payload={}, available_at=at, created_at=at)
            .returning(outbox.c.id)
        )
    row = await _row(engine, outbox, int(row_id))
    assert row["available_at"] == at
    assert row["available_at"].tzinfo == UTC


async def test_naive_timestamps_are_refused(engine: AsyncEngine) -> None:
    """Writing a naive datetime fails instead of storing an ambiguous wall-clock time."""
    naive = {"topic": "t", "aggregate_id": "1", "payload": {}, "available_at": datetime(2026, 1, 1)}
    with pytest.raises(StatementError, match="naive datetime"):
        await _insert(engine, outbox, naive)
