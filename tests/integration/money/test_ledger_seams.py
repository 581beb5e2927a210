"""The ledger's read seams and its database guards, on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import insert
from sqlalchemy.exc import IntegrityError

from controlplane.domain.money import BillingMode, BillingPolicy, Reservation, UsageKind
from controlplane.domain.states import TaskState
from controlplane.persistence import ledger
from controlplane.persistence.database import Database
from controlplane.persistence.models import credit_ledger
from tests.integration.persistence.builders import NOW, Scenario

POSTPAID = BillingPolicy(BillingMode.POSTPAID, None)


async def test_credit_is_idempotent_by_key_and_conflicts_on_another_amount(db: Database) -> None:
    """A replayed credit key returns the stored entry; the key with another amount is refused."""
    async with db.unit(NOW) as u:
        first, created = await ledger.append_credit(
            u.conn, "acme", 5_000_000, "USD", "topup-1", "admin", "first", NOW
        )
    async with db.unit(NOW) as u:
        again, created_again = await ledger.append_credit(
            u.conn, "acme", 5_000_000, "USD", "topup-1", "admin", "first", NOW
        )
    assert (created, created_again) == (True, False)
    assert again == first
    with pytest.raises(ledger.CreditKeyConflict):
        async with db.unit(NOW) as u:
            await ledger.append_credit(
                u.conn, "acme", 6_000_000, "USD", "topup-1", "admin", "other", NOW
            )
    async with db.reading() as conn:
        got = await ledger.balance(conn, "acme", "USD")
    assert (got.balance_micros, got.reserved_micros, got.available_micros) == (
        5_000_000,
        0,
        5_000_000,
    )
    assert got.as_of_entry_id == first.id


async def test_balance_is_derived_through_reserve_and_settle(db: Database) -> None:
    """Reserve holds credit (available drops), CHARGE ends the hold and takes the charge."""
    scenario = Scenario(db)
    task = await scenario.task("acme")
    async with db.unit(NOW) as u:
        await ledger.append_credit(u.conn, "acme", 1_000_000, "USD", "k", "admin", "", NOW)
        await ledger.reserve(u.conn, task.id, "acme", Reservation(400_000, "USD", POSTPAID), NOW)
    async with db.reading() as conn:
        held = await ledger.balance(conn, "acme", "USD")
    assert (held.balance_micros, held.reserved_micros, held.available_micros) == (
        1_000_000,
        400_000,
        600_000,
    )
    async with db.unit(NOW) as u:
        # No adopted attempt: a SUCCEEDED without a delivered attempt releases.
        entry = await ledger.settle_task(u.conn, task.id, TaskState.FAILED, NOW)
    assert entry is not None
    assert entry.kind.value == "RELEASE"
    async with db.reading() as conn:
        after = await ledger.balance(conn, "acme", "USD")
        page = await ledger.list_entries(conn, "acme", after_id=0, limit=2)
        rest = await ledger.list_entries(conn, "acme", after_id=page[-1].id, limit=10)
    assert (after.balance_micros, after.reserved_micros, after.available_micros) == (
        1_000_000,
        0,
        1_000_000,
    )
    assert [e.kind.value for e in page + rest] == ["CREDIT", "RESERVE", "RELEASE"]
    assert len(page) == 2


async def test_database_refuses_second_reserve_and_second_settlement(db: Database) -> None:
    """Raw INSERTs that bypass every Python check still cannot reserve or settle a task twice."""
    scenario = Scenario(db)
    task = await scenario.task("acme")

    def row(kind: str, key: str) -> dict[str, object]:
        return {
            "tenant_id": "acme",
            "kind": kind,
            "amount_micros": 1,
            "currency": "USD",
            "task_id": task.id,
            "idempotency_key": key,
            "actor": "test",
            "reason": "",
            "created_at": NOW,
        }

    async with db.unit(NOW) as u:
        await ledger.append_credit(u.conn, "acme", 10, "USD", "c", "test", "", NOW)
        await u.conn.execute(insert(credit_ledger).values(row("RESERVE", "a")))
        await u.conn.execute(insert(credit_ledger).values(row("CHARGE", "b")))
    async with db.reading() as conn:
        # The raw rows bypassed the cached balance: the read derives it from the entries.
        assert await ledger.balance(conn, "acme", "USD") == await ledger.derived_balance(
            conn, "acme", "USD"
        )
        assert (await ledger.balance(conn, "acme", "USD")).balance_micros == 9
    for kind in ("RESERVE", "CHARGE", "RELEASE"):
        with pytest.raises(IntegrityError):
            async with db.unit(NOW) as u:
                await u.conn.execute(insert(credit_ledger).values(row(kind, f"other-{kind}")))


async def test_usage_entries_between_filters_by_time_and_provider(db: Database) -> None:
    """Usage entries are read back by creation window and provider."""
    scenario = Scenario(db)
    attempt = await scenario.attempt()
    for offset, kind in ((0, UsageKind.EXPECTED), (2, UsageKind.ACTUAL)):
        async with db.unit(NOW + timedelta(hours=offset)) as u:
            wrote = await ledger.record_usage(
                u.conn,
                ledger.NewUsage(
                    attempt_id=attempt.id,
                    task_id=attempt.task_id,
                    provider="runway",
                    provider_account_id=attempt.provider_account_id,
                    model=attempt.provider_model,
                    kind=kind,
                    amount_micros=250_000,
                    currency="USD",
                    price_version=attempt.price_version,
                    idempotency_key=f"{kind.value}:{attempt.id}",
                    provider_units=25_000,
                    provider_unit_name="credits_milli",
                    conversion_rate_version="runway-credits-v1",
                ),
                NOW + timedelta(hours=offset),
            )
            assert wrote
            assert not await ledger.record_usage(  # the key again: nothing written
                u.conn,
                ledger.NewUsage(
                    attempt_id=attempt.id,
                    task_id=attempt.task_id,
                    provider="runway",
                    provider_account_id=attempt.provider_account_id,
                    model=attempt.provider_model,
                    kind=kind,
                    amount_micros=1,
                    currency="USD",
                    price_version="x",
                    idempotency_key=f"{kind.value}:{attempt.id}",
                ),
                NOW,
            )
    async with db.reading() as conn:
        first_hour = await ledger.usage_entries_between(conn, NOW, NOW + timedelta(hours=1))
        both = await ledger.usage_entries_between(conn, NOW, NOW + timedelta(days=1), "runway")
        none = await ledger.usage_entries_between(conn, NOW, NOW + timedelta(days=1), "veo")
    assert [e.kind for e in first_hour] == [UsageKind.EXPECTED]
    assert [e.kind for e in both] == [UsageKind.EXPECTED, UsageKind.ACTUAL]
    assert both[0].provider_units == 25_000
    assert both[0].amount_micros == 250_000
    assert none == []
