"""Fixtures every integration suite shares: the two database backends and a database on each.

A test that uses `backend` (directly or through `empty_url`/`database_url`/`engine`/`db`) runs
once on SQLite (a fresh file) and once on PostgreSQL (a throwaway database of its own, dropped
after it). `database_url` is at the head revision: a copy of a template migrated once per session
(`CREATE DATABASE ... TEMPLATE`, a file copy on SQLite), so migrations run once, not per test;
the migration tests themselves start from `empty_url`. A suite that keeps one database per
session (tests/integration/persistence) overrides `database_url`; the engine and the `Database`
on it are these. Query modules, builders and other suite-specific fixtures stay with their
suites.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.persistence.database import Database
from controlplane.persistence.db import create_engine
from controlplane.persistence.migrate import upgrade

BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgresql", id="postgresql", marks=pytest.mark.postgres),
]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The database backend under test."""
    return str(request.param)


# Synchronous on purpose: `fresh_postgres_url` runs asyncio.run, which must not happen inside
# the test's event loop, and it is requested lazily so a SQLite run never needs the server.
@pytest.fixture
def empty_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty database of the backend (no tables), removed after the test."""
    if backend == "postgresql":
        return str(request.getfixturevalue("fresh_postgres_url"))
    return f"sqlite+aiosqlite:///{tmp_path / 'vidroute.db'}"


@pytest.fixture(scope="session")
def migrated_sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session; tests get copies of it."""
    path = tmp_path_factory.mktemp("sqlite-template") / "vidroute.db"
    asyncio.run(upgrade(f"sqlite+aiosqlite:///{path}"))
    return path


# Synchronous for the same reason as `empty_url`.
@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The test's own database at the head revision: a copy of the session's migrated template
    (the schema `upgrade` writes, without running every migration per test)."""
    if backend == "postgresql":
        return str(request.getfixturevalue("migrated_postgres_url"))
    template: Path = request.getfixturevalue("migrated_sqlite_template")
    target = tmp_path / "vidroute.db"
    shutil.copyfile(template, target)
    return f"sqlite+aiosqlite:///{target}"


@pytest_asyncio.fixture
async def engine(database_url: str) -> AsyncIterator[AsyncEngine]:
    """An engine on the test's database, disposed afterwards."""
    eng = create_engine(database_url)
    try:
        yield eng
    finally:
        await eng.dispose()


@pytest.fixture
def db(engine: AsyncEngine) -> Database:
    """The test's database: its units of work write, its query modules read."""
    return Database(engine)
