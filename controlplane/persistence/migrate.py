"""Run the schema migrations programmatically (no alembic.ini).

    await upgrade("postgresql+asyncpg://user@host/db")          # to head
    await downgrade("sqlite+aiosqlite:///./var/vidroute.db")     # to base

The Alembic `Config` is built in code with ``script_location`` pointing at this package's
``migrations`` folder, so it works from any working directory and from an installed wheel.
Each call runs the whole revision range inside one transaction of one async connection.
Also usable as ``python -m controlplane.persistence.migrate URL upgrade|downgrade [REVISION]``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.engine import URL, Connection

from controlplane.persistence.db import create_engine

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str | URL | None = None) -> Config:
    """An Alembic config for this package's migrations; `url` only matters for offline use."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        rendered = url.render_as_string(hide_password=False) if isinstance(url, URL) else url
        # Config values go through ConfigParser interpolation; escape '%' in passwords.
        config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return config


# Every replica migrates on start; on PostgreSQL they queue on this transaction-scoped
# advisory lock so exactly one applies a revision and the others then find nothing to do.
MIGRATION_LOCK_ID = 0x76696472  # "vidr"


async def _run(url: str | URL, action: Callable[[Config], None]) -> None:
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                await connection.execute(
                    text("SELECT pg_advisory_xact_lock(:id)"), {"id": MIGRATION_LOCK_ID}
                )

            def _in_connection(sync_connection: Connection) -> None:
                config = alembic_config()
                config.attributes["connection"] = sync_connection
                action(config)

            await connection.run_sync(_in_connection)
    finally:
        await engine.dispose()


async def upgrade(url: str | URL, revision: str = "head") -> None:
    """Upgrade the database at `url` to `revision`."""
    await _run(url, lambda config: command.upgrade(config, revision))


async def downgrade(url: str | URL, revision: str = "base") -> None:
    """Downgrade the database at `url` to `revision` (``base`` drops every table)."""
    await _run(url, lambda config: command.downgrade(config, revision))


async def current_revision(url: str | URL) -> str | None:
    """The revision the database at `url` is at, or None if it was never migrated."""
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(
                lambda sync: MigrationContext.configure(sync).get_current_revision()
            )
    finally:
        await engine.dispose()


def main(argv: list[str] | None = None) -> None:
    """Command-line entry: ``python -m controlplane.persistence.migrate URL upgrade [head]``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("url")
    parser.add_argument("action", choices=("upgrade", "downgrade"))
    parser.add_argument("revision", nargs="?")
    args = parser.parse_args(argv)
    if args.action == "upgrade":
        asyncio.run(upgrade(args.url, args.revision or "head"))
    else:
        asyncio.run(downgrade(args.url, args.revision or "base"))


if __name__ == "__main__":
    main()
