"""Reads and writers do not wait for each other: on SQLite a read connection begins DEFERRED
(WAL readers see the last commit without the write lock) while a unit of work still begins
IMMEDIATE, taking the write lock before its first statement; on PostgreSQL reads never lock."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest
from sqlalchemy import literal_column, select
from sqlalchemy.engine import make_url

from controlplane.persistence.database import Database
from controlplane.persistence.unit import SqlUnitOfWork
from tests.integration.persistence.builders import NOW

# Far below SQLite's 30 s busy timeout, far above what one read takes on a loaded CI machine:
# a read that waits for the write lock fails here instead of hanging the suite.
BOUND_S = 10.0


async def _balance(db: Database) -> int:
    async with asyncio.timeout(BOUND_S), db.reads() as r:
        return (await r.balance("t1", "USD")).balance_micros


async def _credit(u: SqlUnitOfWork, key: str) -> None:
    await u.append_credit("t1", 5_000_000, "USD", key, actor="test", reason="read test")


async def test_a_read_does_not_wait_for_an_open_unit(db: Database) -> None:
    """While a unit of work is open and has written, `reads()` answers at once with the last
    committed state (not the unit's rows); after the commit it sees them."""
    async with db.unit(NOW) as u:
        await _credit(u, "first")
        assert await _balance(db) == 0
    assert await _balance(db) == 5_000_000


async def test_a_unit_does_not_wait_for_an_open_read(db: Database) -> None:
    """A read transaction that has read and is still open does not keep a unit of work from
    committing."""
    async with db.reading() as conn:
        assert await conn.scalar(select(literal_column("1"))) == 1  # the transaction is begun
        async with asyncio.timeout(BOUND_S), db.unit(NOW) as u:
            await _credit(u, "during a read")
    assert await _balance(db) == 5_000_000


async def test_ping_does_not_wait_for_an_open_unit(db: Database) -> None:
    """The health ping answers while a unit of work holds the write lock."""
    async with db.unit(NOW) as u:
        await _credit(u, "first")
        async with asyncio.timeout(BOUND_S):
            await db.ping()


@pytest.mark.parametrize("backend", ["sqlite"])
async def test_a_sqlite_unit_takes_the_write_lock_when_it_begins(
    db: Database, database_url: str
) -> None:
    """On SQLite an open unit of work holds the file's write lock before its first statement
    (BEGIN IMMEDIATE): another writer is refused, a reader is not."""
    path = make_url(database_url).database
    assert path
    other = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        async with db.unit(NOW):
            with pytest.raises(sqlite3.OperationalError, match="locked"):
                other.execute("BEGIN IMMEDIATE")
            other.execute("BEGIN DEFERRED")
            assert other.execute("SELECT count(*) FROM credit_ledger").fetchone() == (0,)
            other.execute("ROLLBACK")
        other.execute("BEGIN IMMEDIATE")
        other.execute("ROLLBACK")
    finally:
        other.close()
