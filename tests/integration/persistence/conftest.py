"""Fixtures for the persistence suite: one set of tests, two backends.

Every test that uses `backend` (directly or through `db`/`engine`/`database_url`) runs once on
SQLite (a fresh file per test) and once on PostgreSQL (a throwaway database per session, migrated
once and truncated before each test). `backend`, `engine` and `db` are
tests/integration/conftest.py's; this suite's `database_url` replaces the per-test PostgreSQL
database there by the session's one.

PostgreSQL is found at ``VIDROUTE_TEST_POSTGRES_URL`` or ``postgresql+asyncpg://postgres@127.0.0.1
:5432/test`` (used only as the maintenance connection). If it is unreachable the PostgreSQL cases
are skipped, unless ``CI=true``, where they fail: CI must never go green on SQLite alone.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy import text

from controlplane.persistence.database import Database
from controlplane.persistence.db import create_engine
from controlplane.persistence.migrate import upgrade
from controlplane.persistence.models import Base
from controlplane.persistence.tasks import TaskQueries
from tests.conftest import PostgresServer
from tests.integration.persistence.builders import Scenario


@pytest.fixture(scope="session")
def postgres_database(postgres_server: PostgresServer) -> Iterator[str]:
    """A throwaway database for this session, migrated to head and dropped at the end."""
    name = asyncio.run(postgres_server.create_database("main"))
    try:
        url = postgres_server.url_for(name)
        asyncio.run(upgrade(url))
        yield url
    finally:
        asyncio.run(postgres_server.drop_database(name))


# The PostgreSQL fixtures are requested lazily (a SQLite-only run never touches the server) and
# from these synchronous fixtures, because session setup uses asyncio.run and must not run inside
# a test's event loop.
@pytest.fixture
def server_for_backend(backend: str, request: pytest.FixtureRequest) -> PostgresServer | None:
    """The PostgreSQL server when the backend is PostgreSQL, else None."""
    if backend != "postgresql":
        return None
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server


@pytest.fixture
def session_database_for_backend(backend: str, request: pytest.FixtureRequest) -> str | None:
    """The session's migrated PostgreSQL database when the backend is PostgreSQL, else None."""
    if backend != "postgresql":
        return None
    return str(request.getfixturevalue("postgres_database"))


async def _empty_all_tables(url: str) -> None:
    # DELETE beats TRUNCATE ... CASCADE by far on tables this small; ids keep counting up.
    engine = create_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.execute(text("UPDATE generation_tasks SET adopted_attempt_id = NULL"))
            for table in reversed(Base.metadata.sorted_tables):
                await conn.execute(table.delete())
    finally:
        await engine.dispose()


@pytest.fixture
def sqlite_template_for_backend(backend: str, request: pytest.FixtureRequest) -> Path | None:
    """tests/integration/conftest.py's migrated SQLite file when the backend is SQLite."""
    if backend != "sqlite":
        return None
    template: Path = request.getfixturevalue("migrated_sqlite_template")
    return template


@pytest_asyncio.fixture
async def database_url(
    session_database_for_backend: str | None,
    sqlite_template_for_backend: Path | None,
    tmp_path: Path,
) -> str:
    """A migrated, empty database for one test: on SQLite a copy of the session's migrated
    file (what `upgrade` writes), not every migration again per test."""
    if session_database_for_backend is None:
        assert sqlite_template_for_backend is not None
        target = tmp_path / "var" / "vidroute.db"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(sqlite_template_for_backend, target)
        return f"sqlite+aiosqlite:///{target}"
    await _empty_all_tables(session_database_for_backend)
    return session_database_for_backend


# Synchronous: `fresh_postgres_url` (tests/conftest.py) must be requested outside the loop.
@pytest.fixture
def empty_database_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database with no tables at all (for migration tests), removed afterwards: on
    PostgreSQL tests/conftest.py's `fresh_postgres_url` (made and dropped off the test's clock)."""
    if backend != "postgresql":
        return f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
    return str(request.getfixturevalue("fresh_postgres_url"))


@pytest.fixture
def tasks(db: Database) -> TaskQueries:
    """Task reads on the test database."""
    return TaskQueries(db)


@pytest.fixture
def scenario(db: Database) -> Scenario:
    """Row builders bound to the test's database."""
    return Scenario(db)
