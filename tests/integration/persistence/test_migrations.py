"""The Alembic migration creates exactly the models' schema and can be undone and redone."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import MetaData, inspect, text
from sqlalchemy.engine import Connection

from controlplane.persistence.db import create_engine
from controlplane.persistence.migrate import alembic_config, current_revision, downgrade, upgrade
from controlplane.persistence.models import Base
from tests.conftest import PostgresServer


def _all_models() -> MetaData:
    """Every table the code defines (all of them in `models`)."""
    merged = MetaData()
    for table in Base.metadata.sorted_tables:
        table.to_metadata(merged)
    return merged


MODELS = _all_models()
ALL_TABLES = {t.name for t in MODELS.sorted_tables}
HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()


def _not_alembic_version(name: str | None, type_: str, _parents: Any) -> bool:
    return not (type_ == "table" and name == "alembic_version")


def _diff(sync_conn: Connection) -> list[Any]:
    context = MigrationContext.configure(
        sync_conn, opts={"compare_type": True, "include_name": _not_alembic_version}
    )
    return list(compare_metadata(context, MODELS))


async def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            names = await conn.run_sync(lambda sync: inspect(sync).get_table_names())
    finally:
        await engine.dispose()
    return set(names) - {"alembic_version"}


async def _model_diff(url: str) -> list[Any]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(_diff)
    finally:
        await engine.dispose()


async def test_upgrade_downgrade_upgrade_round_trip(empty_database_url: str) -> None:
    """Upgrading to head creates every table, downgrading to base drops them all, and it repeats."""
    await upgrade(empty_database_url)
    assert await _tables(empty_database_url) == ALL_TABLES
    assert await current_revision(empty_database_url) == HEAD

    await downgrade(empty_database_url)
    assert await _tables(empty_database_url) == set()
    assert await current_revision(empty_database_url) is None

    await upgrade(empty_database_url)
    assert await _tables(empty_database_url) == ALL_TABLES


async def test_models_match_migration(empty_database_url: str) -> None:
    """Autogenerate finds no difference between the migrated database and the models."""
    await upgrade(empty_database_url)
    assert await _model_diff(empty_database_url) == []


async def test_model_comparison_is_not_vacuous(empty_database_url: str) -> None:
    """The comparison does see differences: an unmigrated database differs by every table."""
    engine = create_engine(empty_database_url)
    try:
        async with engine.connect() as conn:
            diff = await conn.run_sync(_diff)
    finally:
        await engine.dispose()
    added = {op[1].name for op in diff if op[0] == "add_table"}
    assert added == ALL_TABLES


async def test_failover_history_revision_goes_down_and_up(empty_database_url: str) -> None:
    """Revision 0004 adds exactly the failover history tables; undone, only they are gone."""
    await upgrade(empty_database_url)
    await downgrade(empty_database_url, "0003_attempt_evidence")
    before = await _tables(empty_database_url)  # later revisions' tables are gone too
    assert not before & {"task_requeues", "task_exclusions"}
    await upgrade(empty_database_url, "0004_task_exclusions")
    assert await _tables(empty_database_url) - before == {"task_requeues", "task_exclusions"}
    await upgrade(empty_database_url)
    assert await _tables(empty_database_url) == ALL_TABLES
    assert await _model_diff(empty_database_url) == []


async def test_concurrent_upgrades_on_postgres_serialize(postgres_server: PostgresServer) -> None:
    """Replicas migrating one PostgreSQL database at the same moment all succeed, once."""
    name = await postgres_server.create_database(secrets.token_hex(4))
    url = postgres_server.url_for(name)
    try:
        await asyncio.gather(*(upgrade(url) for _ in range(4)))
        assert await current_revision(url) == HEAD
        assert await _tables(url) == ALL_TABLES
    finally:
        await postgres_server.drop_database(name)


async def test_quality_whole_mode_rows_go_and_come_back_as_sums(empty_database_url: str) -> None:
    """Revision 0015 deletes the stored whole-mode quality rows (bucket ''); undone, it writes
    them back as the sums of each model's buckets."""
    await upgrade(empty_database_url, "0014_route_decisions_created_at")
    columns = "provider, model, mode, bucket, accepted, rejected, regenerated"
    columns += ", technical_checks, technical_defects, updated_at"
    at = "'2026-12-01 00:00:00'"
    rows = [("a", 1, 0, 2, 1), ("b", 2, 1, 0, 0), ("", 9, 9, 9, 9)]
    engine = create_engine(empty_database_url)
    try:
        async with engine.begin() as conn:
            for bucket, *counts in rows:
                values = ", ".join(str(c) for c in counts)
                await conn.execute(
                    text(
                        f"INSERT INTO quality_aggregates ({columns}) VALUES"
                        f" ('p', 'm', 'T2V', '{bucket}', {values}, 0, {at})"
                    )
                )
        await upgrade(empty_database_url)
        async with engine.connect() as conn:
            buckets = (await conn.execute(text("SELECT bucket FROM quality_aggregates"))).all()
        assert sorted(b for (b,) in buckets) == ["a", "b"]
        await downgrade(empty_database_url, "0014_route_decisions_created_at")
        async with engine.connect() as conn:
            whole = (
                await conn.execute(
                    text(
                        "SELECT accepted, rejected, regenerated, technical_checks"
                        " FROM quality_aggregates WHERE bucket = ''"
                    )
                )
            ).all()
        assert [tuple(r) for r in whole] == [(3, 1, 2, 1)]
    finally:
        await engine.dispose()
