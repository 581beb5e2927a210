"""The SQL unit-cost aggregate agrees with the pure rules on random ledgers (PostgreSQL, SQLite).

`controlplane.persistence.cost_reads.unit_costs` folds the provider usage ledger in one grouped
statement; `controlplane.domain.unit_cost.unit_costs` states the same rules per attempt in
Python. For random attempts (state, delivered or not, any mix of EXPECTED / ACTUAL /
PLATFORM_LOSS entries, settlement's and bill-confirmed, several providers, models and
currencies) both give the same table.
Each example writes into its own day of one migrated database and reads only that day.
Example count: ``VIDROUTE_MONEY_EXAMPLES`` (default 12).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import update

from controlplane.domain.money import UsageKind
from controlplane.domain.unit_cost import JobUsage, unit_costs
from controlplane.persistence import cost_reads, ledger
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import upgrade
from controlplane.persistence.models import generation_tasks, task_attempts
from tests.integration.persistence.builders import Scenario

EXAMPLES = int(os.environ.get("VIDROUTE_MONEY_EXAMPLES") or 12)
T0 = datetime(2026, 1, 1, tzinfo=UTC)
_DAY = itertools.count()
STATES = ["SUCCEEDED", "FAILED", "CANCELLED", "ABANDONED", "SUBMIT_UNKNOWN", "RUNNING", "ACCEPTED"]
pytestmark = pytest.mark.timeout(600)


@dataclass(frozen=True)
class Plan:
    provider: str
    model: str
    currency: str
    state: str
    delivered: bool
    expected: int | None
    actual: int | None
    loss: int | None
    confirmed: int | None = None


amounts = st.one_of(st.none(), st.sampled_from([0, 1, 250_000]), st.integers(0, 10**9))
plans = st.builds(
    Plan,
    provider=st.sampled_from(["runway", "veo"]),
    model=st.sampled_from(["gen4_turbo", "m2"]),
    currency=st.sampled_from(["USD", "USD", "EUR"]),
    state=st.sampled_from(STATES),
    delivered=st.booleans(),
    expected=amounts,
    actual=amounts,
    loss=amounts,
    confirmed=amounts,
)


@pytest.fixture(scope="module")
def migrated_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    backend = request.param
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path_factory.mktemp('unitcost') / 'vidroute.db'}"
        asyncio.run(upgrade(url))
        yield url
        return
    server = request.getfixturevalue("postgres_server")
    name = asyncio.run(server.create_database("unitcost" + secrets.token_hex(3)))
    url = server.url_for(name)
    asyncio.run(upgrade(url))
    try:
        yield url
    finally:
        asyncio.run(server.drop_database(name))


async def _write(db: Database, day: datetime, attempts: list[Plan]) -> None:
    scenario = Scenario(db, secrets.randbelow(10**12))  # task keys unique across examples
    account = await scenario.account(f"acct-{secrets.token_hex(4)}")
    for plan in attempts:
        a = await scenario.attempt(account)
        async with db.unit(day) as u:
            await u.conn.execute(
                update(task_attempts)
                .where(task_attempts.c.id == a.id)
                .values(status=plan.state, provider_model=plan.model)
            )
            if plan.delivered:
                await u.conn.execute(
                    update(generation_tasks)
                    .where(generation_tasks.c.id == a.task_id)
                    .values(status="SUCCEEDED", adopted_attempt_id=a.id)
                )
            for kind, micros, key in (
                (UsageKind.EXPECTED, plan.expected, f"expected:{a.id}"),
                (UsageKind.ACTUAL, plan.actual, f"actual:{a.id}"),
                (UsageKind.PLATFORM_LOSS, plan.loss, f"loss:{a.id}"),
                # booked from a reconciliation row (`reconciliation.disputes.book_loss`)
                (UsageKind.PLATFORM_LOSS, plan.confirmed, f"confirmed-loss:{a.id}"),
            ):
                if micros is None:
                    continue
                await ledger.record_usage(
                    u.conn,
                    ledger.NewUsage(
                        attempt_id=a.id,
                        task_id=a.task_id,
                        provider=plan.provider,
                        provider_account_id=account,
                        model=plan.model,
                        kind=kind,
                        amount_micros=micros,
                        currency=plan.currency,
                        price_version="p1",
                        idempotency_key=key,
                    ),
                    day + timedelta(hours=1),
                )


async def _compare(url: str, attempts: list[Plan]) -> None:
    day = T0 + timedelta(days=next(_DAY))
    db = Database.from_url(url)
    try:
        await _write(db, day, attempts)
        async with db.reading() as conn:
            got = await cost_reads.unit_costs(conn, day, day + timedelta(days=1))
    finally:
        await db.dispose()
    expected = unit_costs(
        JobUsage(
            p.provider,
            p.model,
            p.currency,
            p.delivered,
            p.state,
            p.expected,
            p.actual,
            p.loss,
            p.confirmed,
        )
        for p in attempts
        # no entry: not in the ledger
        if (p.expected, p.actual, p.loss, p.confirmed) != (None, None, None, None)
    )
    assert got == expected


@pytest.mark.parametrize(
    "migrated_url",
    ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)],
    indirect=True,
)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(attempts=st.lists(plans, min_size=1, max_size=12))
def test_sql_aggregate_equals_the_pure_rules(migrated_url: str, attempts: list[Plan]) -> None:
    """cost_reads.unit_costs == domain.unit_cost.unit_costs for the same random ledger."""
    asyncio.run(_compare(migrated_url, attempts))
