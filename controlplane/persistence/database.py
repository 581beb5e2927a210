"""`Database`: the one handle on the control plane's database (PostgreSQL or SQLite).

It owns the engine and hands out the ways in: `unit(now)`, the one transaction every write goes
through (`unit.SqlUnitOfWork`), `reads()`, one connection behind the named reads of the services
(`reads.SqlReads`), and `reading()`, a plain connection for persistence's own query modules
(`tasks`, `catalog`, `execution`, `leases`, `snapshot`) and for tests; no module above
persistence calls it (``tests/unit/test_sql_boundary.py``). The read connections never write,
and on SQLite they begin without the write lock (`db.for_reads`): a reader does not wait for an
open unit of work, nor a unit for a reader. A decision read there and written in a later unit
must therefore be checked again by that unit's write (a version or state CAS), as it always had
to be on PostgreSQL, where reads never locked anything. All turn a database outage into
`errors.StoreUnavailable` (`errors.translate_outage`), so callers above see one exception for
"down, try again" whatever the driver.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime

from sqlalchemy import literal_column, select
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from controlplane.persistence.db import create_engine, for_reads
from controlplane.persistence.endings import log_endings
from controlplane.persistence.errors import translate_outage
from controlplane.persistence.reads import SqlReads
from controlplane.persistence.unit import SqlUnitOfWork

__all__ = ["Database"]


class Database:
    """The engine and its units of work; safe to share between tasks and coroutines."""

    def __init__(
        self, engine: AsyncEngine, *, after_commit: Callable[[set[str]], None] | None = None
    ) -> None:
        """`after_commit` is called with the outbox topics a unit wrote, once it committed (the
        wake-up relay, `controlplane.wakeups`); it must not raise. None: no one to wake."""
        self._engine = engine
        self._writer = asyncio.Lock() if engine.dialect.name == "sqlite" else None
        self._after_commit = after_commit

    @classmethod
    def from_url(
        cls, url: str, *, after_commit: Callable[[set[str]], None] | None = None
    ) -> Database:
        """A database on a new engine for `url` (the backend settings of `db.create_engine`)."""
        return cls(create_engine(url), after_commit=after_commit)

    def notifying(self, after_commit: Callable[[set[str]], None] | None) -> Database:
        """This database (its engine and SQLite writer queue) handing its commits' topics to
        `after_commit` instead: a second replica's writer in one process (tests)."""
        other = copy.copy(self)
        other._after_commit = after_commit
        return other

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    @asynccontextmanager
    async def unit(
        self, now: datetime, *, one_statement: bool = False
    ) -> AsyncIterator[SqlUnitOfWork]:
        """One transaction; commits when the block exits normally, rolls back otherwise.

        `one_statement`: the block writes with ONE statement, atomic by itself (reads after it
        allowed), so on PostgreSQL it runs without BEGIN and COMMIT, two round trips fewer
        (CreateTask, `_create`). Elsewhere it is an ordinary transaction."""
        with translate_outage():
            async with self._begin(one_statement) as conn:
                unit = SqlUnitOfWork(conn, now)
                yield unit
                await unit.flush_events()  # the unit's task events, in its own transaction
        if unit.endings:
            log_endings(unit.endings)
        if unit.topics and self._after_commit is not None:
            self._after_commit(unit.topics)

    @asynccontextmanager
    async def _begin(self, one_statement: bool = False) -> AsyncIterator[AsyncConnection]:
        if self._writer is None and one_statement:
            async with self._engine.connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                yield conn
            return
        if self._writer is None:
            async with self._engine.begin() as conn:
                yield conn
            return
        # SQLite has one write lock per file: writers of this process queue here, in order,
        # instead of polling it in the driver's busy handler (sleeps up to 100 ms each try).
        async with self._writer, self._engine.begin() as conn:
            yield conn

    @asynccontextmanager
    async def reads(self) -> AsyncIterator[SqlReads]:
        """Named reads on one connection, for the services (writers use `unit`)."""
        async with self.reading() as conn:
            yield SqlReads(conn)

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[AsyncConnection]:
        """A connection for reads, never writes (on SQLite its transactions begin DEFERRED):
        persistence's query modules and tests only (`reads` for the services above
        persistence; writers use `unit`)."""
        with translate_outage():
            async with self._engine.connect() as conn:
                yield await for_reads(conn)

    async def ping(self) -> None:
        """Round-trip ``SELECT 1``; raises whatever the driver raises when the database is down."""
        async with self._engine.connect() as conn:
            await for_reads(conn)
            await conn.execute(select(literal_column("1")))

    async def dispose(self) -> None:
        await self._engine.dispose()
