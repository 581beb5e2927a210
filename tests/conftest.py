"""Fixtures shared by every tier: the real PostgreSQL and Redis servers.

A test that needs a server it cannot reach is skipped with the reason, except under
``CI=true``, where it fails: CI must never go green without PostgreSQL and Redis.
``--long`` (``make test-long``) draws the heaviest property tests at their long sizes
(tests/support/sizes.py).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import pytest
import redis
from sqlalchemy import text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from tests.support import sizes

DEFAULT_POSTGRES_URL = "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--long",
        action="store_true",
        help="property tests at their long sizes (tests/support/sizes.py; make test-long)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("long"):
        sizes.use_long_sizes()


def require_server(reason: str) -> None:
    """Fail under CI=true, skip elsewhere."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true requires it)", pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class PostgresServer:
    """A reachable PostgreSQL server on which this session may create throwaway databases."""

    maintenance_url: URL
    prefix: str

    def url_for(self, database: str) -> str:
        return self.maintenance_url.set(database=database).render_as_string(hide_password=False)

    async def _admin(self, sql: str) -> None:
        engine = create_async_engine(
            self.maintenance_url, isolation_level="AUTOCOMMIT", poolclass=NullPool
        )
        try:
            async with engine.connect() as conn:
                await conn.execute(text(sql))
        finally:
            await engine.dispose()

    async def create_database(self, suffix: str, template: str = "") -> str:
        """A new database; from `template` (a copy of its schema and rows) when given."""
        name = f"{self.prefix}_{suffix}"
        copy = f' TEMPLATE "{template}"' if template else ""
        await self._admin(f'CREATE DATABASE "{name}"{copy}')
        return name

    async def drop_database(self, name: str) -> None:
        await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _probe_postgres(url: URL) -> None:
    engine = create_async_engine(url, poolclass=NullPool)
    try:
        async with asyncio.timeout(5), engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    finally:
        await engine.dispose()


@pytest.fixture(scope="session")
def postgres_server() -> PostgresServer:
    """The PostgreSQL server (VIDROUTE_TEST_POSTGRES_URL or the local default)."""
    url = make_url(os.environ.get("VIDROUTE_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL))
    try:
        asyncio.run(_probe_postgres(url))
    except Exception as exc:  # any failure to connect means "unreachable"
        require_server(f"PostgreSQL at {url.render_as_string()} is unreachable: {exc!r}")
    return PostgresServer(url, f"vidroute_test_{secrets.token_hex(4)}")


def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="pg-copies")


@dataclass
class DatabaseCopies:
    """Throwaway databases made and dropped in background threads, off the tests' clock.

    Each DROP DATABASE waits for a checkpoint (about 2 s under load) and CREATE DATABASE writes
    the copy (about 1 s); done in each test's own setup and teardown they add up over hundreds
    of tests. Here the next copy is created while the current test runs, and used databases are
    dropped after their tests returned, all that piled up at once (concurrent drops share their
    checkpoints). Each test still gets a database nothing touched before it, and every
    database is dropped: `close` waits for the last drops.
    """

    server: PostgresServer
    template: str = ""  # "" for empty databases
    _creator: ThreadPoolExecutor = field(default_factory=_pool)
    _dropper: ThreadPoolExecutor = field(default_factory=_pool)
    _next: Future[str] | None = None
    _used: list[str] = field(default_factory=list)
    _drops: list[Future[None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _create(self) -> Future[str]:
        suffix = secrets.token_hex(4)
        return self._creator.submit(
            lambda: asyncio.run(self.server.create_database(suffix, template=self.template))
        )

    def take(self) -> str:
        """A new database's name; the one after it starts being created now."""
        name = (self._next or self._create()).result()
        self._next = self._create()
        return name

    def give_back(self, name: str) -> None:
        """Drop `name` in the background (its test is over)."""
        with self._lock:
            self._used.append(name)
        self._drops.append(self._dropper.submit(self._drop_used))

    def _drop_used(self) -> None:
        # At most 4 connections at once (the next jobs take the rest): make test's workers each
        # drop their own, and the server's 100 connections are shared with the tests themselves.
        with self._lock:
            names, self._used[:] = self._used[:4], self._used[4:]

        async def drop_all() -> None:
            await asyncio.gather(*(self.server.drop_database(name) for name in names))

        if names:
            asyncio.run(drop_all())

    def close(self) -> None:
        """Drop the prepared copy too and wait for every drop (a failed one fails here)."""
        try:
            if self._next is not None:
                self.give_back(self._next.result())
        finally:
            self._next = None
            self._creator.shutdown(wait=True)
            self._dropper.shutdown(wait=True)
        for drop in self._drops:
            drop.result()


@pytest.fixture(scope="session")
def empty_postgres_databases(postgres_server: PostgresServer) -> Iterator[DatabaseCopies]:
    """Where `fresh_postgres_url` takes its databases from."""
    copies = DatabaseCopies(postgres_server)
    try:
        yield copies
    finally:
        copies.close()


@pytest.fixture
def fresh_postgres_url(
    postgres_server: PostgresServer, empty_postgres_databases: DatabaseCopies
) -> Iterator[str]:
    """An empty throwaway database for one test, dropped afterwards."""
    name = empty_postgres_databases.take()
    try:
        yield postgres_server.url_for(name)
    finally:
        empty_postgres_databases.give_back(name)


@pytest.fixture(scope="session")
def migrated_postgres_template(postgres_server: PostgresServer) -> Iterator[str]:
    """A database migrated to head once per session, never connected to afterwards: tests copy
    it (`migrated_postgres_url`) instead of running every migration again."""
    from controlplane.persistence.migrate import upgrade

    name = asyncio.run(postgres_server.create_database("template"))
    try:
        asyncio.run(upgrade(postgres_server.url_for(name)))
        yield name
    finally:
        asyncio.run(postgres_server.drop_database(name))


@pytest.fixture(scope="session")
def migrated_postgres_copies(
    postgres_server: PostgresServer, migrated_postgres_template: str
) -> Iterator[DatabaseCopies]:
    """Where `migrated_postgres_url` takes its copies of the template from; closed before the
    template is dropped (it is created after it)."""
    copies = DatabaseCopies(postgres_server, migrated_postgres_template)
    try:
        yield copies
    finally:
        copies.close()


@pytest.fixture
def migrated_postgres_url(
    postgres_server: PostgresServer, migrated_postgres_copies: DatabaseCopies
) -> Iterator[str]:
    """A throwaway database at the head revision (a copy of the session's migrated template),
    dropped afterwards: the same schema `upgrade` writes, in one CREATE DATABASE."""
    name = migrated_postgres_copies.take()
    try:
        yield postgres_server.url_for(name)
    finally:
        migrated_postgres_copies.give_back(name)


@pytest.fixture(scope="session")
def redis_server_url() -> str:
    """The Redis URL (VIDROUTE_TEST_REDIS_URL or the local default), checked reachable."""
    url = os.environ.get("VIDROUTE_TEST_REDIS_URL", DEFAULT_REDIS_URL)
    try:
        client = redis.Redis.from_url(url, socket_connect_timeout=2)
        client.ping()
        client.close()
    except Exception as exc:  # any failure to connect means "unreachable"
        require_server(f"Redis at {url} is unreachable: {exc!r}")
    return url
