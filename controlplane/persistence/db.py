"""Engines and sessions for PostgreSQL (asyncpg) and SQLite (aiosqlite).

SQLite gets three connection-level settings, applied on every new connection:

* ``PRAGMA foreign_keys=ON`` (SQLite ignores REFERENCES otherwise),
* ``PRAGMA journal_mode=WAL`` (readers don't block the writer),
* SQLAlchemy emits the BEGIN itself instead of the sqlite3 driver's lazy one, so DDL is
  transactional too. A writing transaction (a unit of work, a migration) says ``BEGIN
  IMMEDIATE``: it takes the single write lock up front and waits for it (busy timeout) rather
  than failing with "database is locked" when it first writes after reading. A connection
  marked `for_reads` says ``BEGIN DEFERRED``: under WAL it reads the last committed state
  without the write lock, so periodic readers (gauges, books, health) neither wait behind a
  writer nor make writers wait behind them. Such a connection must not write: a deferred
  transaction that tries fails at once with "database is locked" when another writer committed
  since it began (no busy wait can help it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.ext.asyncio import create_async_engine as _create_async_engine

SQLITE_BUSY_TIMEOUT_SECONDS = 30.0
# The execution option `for_reads` sets; any other backend ignores it.
_READS_ONLY = "vidroute_reads_only"


def is_sqlite(url: str | URL) -> bool:
    """Whether the URL names a SQLite database."""
    return make_url(url).get_backend_name() == "sqlite"


def _ensure_sqlite_folder(url: URL) -> None:
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return
    Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)


def _install_sqlite_hooks(engine: AsyncEngine) -> None:
    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Hand transaction control to SQLAlchemy (see the module docstring).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine.sync_engine, "begin")
    def _on_begin(connection: Connection) -> None:
        reads_only = connection.get_execution_options().get(_READS_ONLY, False)
        connection.exec_driver_sql("BEGIN DEFERRED" if reads_only else "BEGIN IMMEDIATE")


async def for_reads(conn: AsyncConnection) -> AsyncConnection:
    """`conn` (changed in place) with its transactions marked read-only: on SQLite they begin
    DEFERRED, without the write lock (module docstring); nothing changes elsewhere. The mark
    lives on this `Connection` object, not on the pooled driver connection, so the next checkout
    of the same driver connection begins IMMEDIATE again."""
    return await conn.execution_options(**{_READS_ONLY: True})


def create_engine(url: str | URL, *, echo: bool = False, **kwargs: Any) -> AsyncEngine:
    """An async engine for `url` with the backend's settings applied.

    Accepts ``postgresql+asyncpg://...`` and ``sqlite+aiosqlite:///./var/vidroute.db`` style URLs;
    the folder of a SQLite file is created if missing. Extra keyword arguments go to
    `sqlalchemy.ext.asyncio.create_async_engine`.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        _ensure_sqlite_folder(parsed)
        connect_args = dict(kwargs.pop("connect_args", {}))
        connect_args.setdefault("timeout", SQLITE_BUSY_TIMEOUT_SECONDS)
        engine = _create_async_engine(parsed, echo=echo, connect_args=connect_args, **kwargs)
        _install_sqlite_hooks(engine)
        return engine
    # No pre-ping: it was a round trip before every checkout (every call of the API and every
    # unit of the workers). A connection the server dropped fails its first statement instead,
    # which `errors.translate_outage` turns into StoreUnavailable (UNAVAILABLE, retried), and the
    # disconnect invalidates the whole pool, so the next checkout connects afresh.
    kwargs.setdefault("pool_pre_ping", False)
    return _create_async_engine(parsed, echo=echo, **kwargs)


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions that keep loaded attributes after commit (callers read them after the block)."""
    return async_sessionmaker(engine, expire_on_commit=False)
