"""Direct SQL for injecting violations: what a bug or a hand edit could leave behind.

Statements run on a plain engine of their own with foreign-key checks off (SQLite's default
without the control plane's PRAGMA; ``session_replication_role = replica`` on PostgreSQL), and
can drop the constraints that would otherwise make a violation impossible to store.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Executable, Table, func, insert, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.pool import NullPool

from controlplane.persistence.models import task_events


class Tamper:
    """Writes that bypass the unit of work; one transaction per call."""

    def __init__(self, url: str, backend: str) -> None:
        self.backend = backend
        self._engine = create_async_engine(url, poolclass=NullPool)

    async def close(self) -> None:
        await self._engine.dispose()

    async def _begin(self, conn: AsyncConnection, *, ignore_checks: bool) -> None:
        if self.backend == "postgresql":
            # Disables FK (and other) triggers for this transaction; the test role is superuser.
            await conn.execute(text("SET LOCAL session_replication_role = replica"))
        elif ignore_checks:
            await conn.execute(text("PRAGMA ignore_check_constraints = ON"))

    async def sql(
        self, statement: str | Executable, ignore_checks: bool = False, **params: Any
    ) -> None:
        """Run one statement (SQL text or Core) with foreign keys off, SQLite CHECKs if asked."""
        stmt = text(statement) if isinstance(statement, str) else statement
        async with self._engine.begin() as conn:
            await self._begin(conn, ignore_checks=ignore_checks)
            await conn.execute(stmt, params)

    async def copy_row(self, table: Table, row_id: int, **changes: Any) -> int:
        """Insert a copy of one row with `changes` applied; return the new id."""
        async with self._engine.connect() as conn:
            row = (await conn.execute(select(table).where(table.c.id == row_id))).mappings().one()
        values = {k: v for k, v in row.items() if k != "id"}
        values.update(changes)
        return await self.insert(table, values)

    async def insert(self, table: Table, values: Mapping[str, Any]) -> int:
        """Insert one row through Core (JSON columns encoded) and return its id."""
        async with self._engine.begin() as conn:
            await self._begin(conn, ignore_checks=False)
            return int(await conn.scalar(insert(table).values(dict(values)).returning(table.c.id)))

    async def scalar(self, statement: str, **params: Any) -> Any:
        async with self._engine.connect() as conn:
            return await conn.scalar(text(statement), params)

    async def append_event(self, task_id: int, kind: str, payload: Mapping[str, Any]) -> None:
        """Append an event after the task's last one, as a late writer would."""
        async with self._engine.begin() as conn:
            seq = await conn.scalar(
                select(func.coalesce(func.max(task_events.c.seq), 0) + 1).where(
                    task_events.c.task_id == task_id
                )
            )
            await conn.execute(
                insert(task_events).values(
                    task_id=task_id, seq=seq, kind=kind, payload=dict(payload)
                )
            )

    async def drop_constraint(self, table: str, name_suffix: str) -> None:
        """Drop the constraint of `table` whose name ends with `name_suffix`."""
        async with self._engine.begin() as conn:
            if self.backend == "postgresql":
                name = await conn.scalar(
                    text(
                        "SELECT conname FROM pg_constraint WHERE conrelid = CAST(:t AS regclass)"
                        " AND conname LIKE :pattern"
                    ),
                    {"t": table, "pattern": f"%{name_suffix}"},
                )
                assert name, f"no constraint *{name_suffix} on {table}"
                await conn.execute(text(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"'))
                return
            # SQLite cannot drop a table constraint: rebuild the table without it.
            ddl = await conn.scalar(
                text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = :t"),
                {"t": table},
            )
            rebuilt = _without_constraint(str(ddl), name_suffix)
            await conn.execute(text("PRAGMA legacy_alter_table = ON"))
            await conn.execute(text(f"ALTER TABLE {table} RENAME TO {table}__old"))
            await conn.execute(text(rebuilt))
            await conn.execute(text(f"INSERT INTO {table} SELECT * FROM {table}__old"))
            await conn.execute(text(f"DROP TABLE {table}__old"))


def _without_constraint(ddl: str, name_suffix: str) -> str:
    """`ddl` minus the one ``CONSTRAINT <...name_suffix>`` line SQLite printed for the table."""
    lines = ddl.split("\n")
    hits = [i for i, line in enumerate(lines) if re.search(rf"CONSTRAINT \w*{name_suffix} ", line)]
    assert len(hits) == 1, f"no single constraint *{name_suffix} in {ddl}"
    (i,) = hits
    removed = lines.pop(i)
    if not removed.rstrip().endswith(","):  # it was the last item: drop the comma before it
        lines[i - 1] = lines[i - 1].rstrip().removesuffix(",")
    return "\n".join(lines)
