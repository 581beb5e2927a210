"""Alembic environment, async-aware, for PostgreSQL (asyncpg) and SQLite (aiosqlite).

`controlplane.persistence.migrate` normally runs Alembic *inside* an open async connection and
hands the synchronous facade over in ``config.attributes["connection"]``; the revision then runs
in that connection's transaction. Without one (for example ``alembic`` pointed at this folder with
``sqlalchemy.url`` set), the environment opens its own async engine.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection

from controlplane.persistence.db import create_engine
from controlplane.persistence.models import Base

config = context.config
target_metadata = Base.metadata


def _include_name(name: str | None, type_: str, _parents: object) -> bool:
    return not (type_ == "table" and name == "alembic_version")


def _configure(connection: Connection | None = None, url: str | None = None) -> None:
    dialect = connection.dialect.name if connection is not None else (url or "").split(":")[0]
    context.configure(
        connection=connection,
        url=url if connection is None else None,
        target_metadata=target_metadata,
        include_name=_include_name,
        compare_type=True,
        # SQLite can only ALTER by copying the table; batch mode does that transparently.
        render_as_batch=dialect.startswith("sqlite"),
        literal_binds=connection is None,
    )


def run_migrations_offline() -> None:
    _configure(url=config.get_main_option("sqlalchemy.url"))
    with context.begin_transaction():
        context.run_migrations()


def _run_sync(connection: Connection) -> None:
    _configure(connection)
    with context.begin_transaction():
        context.run_migrations()


async def _run_with_own_engine(url: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_run_sync)
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_sync(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no connection in config.attributes and no sqlalchemy.url set")
    asyncio.run(_run_with_own_engine(url))


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
