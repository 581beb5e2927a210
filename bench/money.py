"""Credit ledger benchmark (not a test): ``python -m bench.money [--entries N] [--rounds R]``.

What CreateTask adds for money, on PostgreSQL: `ledger.balance` served from the cached balance
against `ledger.derived_balance` (the sum over the tenant's entries), for a tenant whose ledger
holds `--entries` rows (bulk-loaded server side: credits, finished tasks' RESERVE + CHARGE), one
reserve transaction (`check_and_lock` + `reserve` + commit). Medians of `--rounds` calls, wall
clock, on whatever load the machine carries (printed).

Needs ``VIDROUTE_BENCH_POSTGRES_URL`` (maintenance database, default
``postgresql+asyncpg://postgres@127.0.0.1:5432/test``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import time
from datetime import UTC, datetime

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from controlplane.domain.money import BillingPolicy, Reservation
from controlplane.persistence import ledger
from controlplane.persistence.database import Database
from controlplane.persistence.migrate import upgrade
from vidroute_core.spec import GenerationSpec, Mode, OutputSpec

DEFAULT_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
NOW = datetime(2026, 12, 1, tzinfo=UTC)


async def _database(maintenance: str) -> str:
    name = f"bench_money_{secrets.token_hex(3)}"
    engine = create_async_engine(maintenance, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    async with engine.connect() as conn:
        await conn.execute(text(f'CREATE DATABASE "{name}"'))
    await engine.dispose()
    url = make_url(maintenance).set(database=name).render_as_string(hide_password=False)
    await upgrade(url)
    return url


async def _drop(maintenance: str, url: str) -> None:
    engine = create_async_engine(maintenance, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    async with engine.connect() as conn:
        await conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}"'))
    await engine.dispose()


async def _load(db: Database, tenant: str, entries: int) -> None:
    """About `entries` ledger rows for `tenant`: a third credits, and for the other two thirds
    finished tasks (SUCCEEDED) each with its RESERVE and CHARGE, all bulk-loaded server side;
    then one credit through the ledger so the cached balance is current."""
    third = max(1, entries // 3)
    async with db.unit(NOW) as u:
        await u.conn.execute(
            text(
                "INSERT INTO credit_ledger (tenant_id, kind, amount_micros, currency, task_id,"
                " idempotency_key, actor, reason, created_at)"
                " SELECT :t, 'CREDIT', 1000000, 'USD', NULL, 'c' || g, 'bench', '', now()"
                " FROM generate_series(1, :n) g"
            ),
            {"t": tenant, "n": third},
        )
        await u.conn.execute(
            text(
                "INSERT INTO generation_tasks (tenant_id, user_id, project_id, idempotency_key,"
                " spec, normalized_spec_hash, service_class, priority, status, status_version,"
                " last_event_seq, created_at, updated_at)"
                " SELECT :t, 'u', 'p', 'done' || g, '{}', 'h', 'STANDARD', 0, 'SUCCEEDED', 5, 5,"
                " now(), now() FROM generate_series(1, :n) g"
            ),
            {"t": tenant, "n": third},
        )
        for kind, key in (("RESERVE", "reserve:"), ("CHARGE", "settle:")):
            await u.conn.execute(
                text(
                    "INSERT INTO credit_ledger (tenant_id, kind, amount_micros, currency,"
                    " task_id, idempotency_key, actor, reason, created_at)"
                    f" SELECT :t, '{kind}', 480000, 'USD', id, '{key}' || id, 'system', '',"
                    " now() FROM generation_tasks WHERE tenant_id = :t"
                ),
                {"t": tenant},
            )
        await ledger.append_credit(u.conn, tenant, 1, "USD", "warm", "bench", "", NOW)
    async with db.engine.connect() as conn:
        await conn.execute(text("ANALYZE"))


async def _median_ms(rounds: int, fn: object) -> float:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        await fn()  # type: ignore[operator]  # fn is a bench step typed object; each is an async callable
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


async def main(entries: int, rounds: int) -> None:
    maintenance = os.environ.get("VIDROUTE_BENCH_POSTGRES_URL", DEFAULT_URL)
    url = await _database(maintenance)
    db = Database.from_url(url)
    tenant = "bench-tenant"
    try:
        await _load(db, tenant, entries)

        async def cached() -> None:
            async with db.reading() as conn:
                await ledger.balance(conn, tenant, "USD")

        async def derived() -> None:
            async with db.reading() as conn:
                await ledger.derived_balance(conn, tenant, "USD")

        n = [0]

        async def reserve() -> None:
            n[0] += 1
            spec = GenerationSpec(
                tenant_id=tenant,
                prompt="bench",
                mode=Mode.TEXT_TO_VIDEO,
                output=OutputSpec(width=1280, height=720, duration_ms=4000),
            )
            async with db.unit(NOW) as u:
                await u.create_task(
                    spec,
                    idempotency_key=f"r{n[0]}",
                    spec_hash="h",
                    reservation=Reservation(1, "USD", BillingPolicy()),
                )

        async def create_plain() -> None:
            n[0] += 1
            spec = GenerationSpec(
                tenant_id=tenant,
                prompt="bench",
                mode=Mode.TEXT_TO_VIDEO,
                output=OutputSpec(width=1280, height=720, duration_ms=4000),
            )
            async with db.unit(NOW) as u:
                await u.create_task(spec, idempotency_key=f"p{n[0]}", spec_hash="h")

        figures = {
            "balance (cached)": await _median_ms(rounds, cached),
            "balance (derived)": await _median_ms(max(3, rounds // 10), derived),
            "create_task with reservation": await _median_ms(rounds, reserve),
            "create_task without": await _median_ms(rounds, create_plain),
        }
        print(f"entries={entries} rounds={rounds} load={os.getloadavg()[0]:.1f}")
        for name, ms in figures.items():
            print(f"  {name:32s} {ms:8.3f} ms (median)")
    finally:
        await db.dispose()
        await _drop(maintenance, url)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main(args.entries, args.rounds))
