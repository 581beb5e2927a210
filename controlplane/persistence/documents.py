"""Versioned configuration documents in the database (design 9.6.4, 9.25.5): one shape, two uses.

A published document is a row of a *versions* table (version, the text as published, source,
active, published_at, activated_at; at most one active, by a partial unique index) and each
activation a row of an *activations* table (version, the version it replaced, PUBLISHED or
ROLLED_BACK, the caller, the time). Routing policies (`routing_policies`) and tenants documents
(`tenant_configs`) are both kept this way; `Documents` names a pair of tables and the advisory
lock that serialises their publications.

Writes take the connection of a transaction their caller opened (`Database.unit`'s ``u.conn``):
a publication deactivates the active version and inserts the new one active in one unit, and
records the activation in the same one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.persistence.advisory import xact_lock


@dataclass(frozen=True, slots=True)
class DocumentRow:
    version: str
    document: str
    source: str
    active: bool
    published_at: datetime
    activated_at: datetime | None


@dataclass(frozen=True, slots=True)
class ActivationRow:
    version: str
    previous_version: str | None
    action: str  # PUBLISHED or ROLLED_BACK
    actor: str
    at: datetime


def _row(r: Any) -> DocumentRow:
    return DocumentRow(
        r.version, r.document, r.source, bool(r.active), r.published_at, r.activated_at
    )


@dataclass(frozen=True)
class Documents:
    """One kind of versioned document: its versions and activations tables and its lock."""

    versions_table: Table
    activations_table: Table
    lock_name: str

    async def version(self, conn: AsyncConnection, name: str) -> DocumentRow | None:
        V = self.versions_table
        row = (await conn.execute(select(V).where(V.c.version == name))).first()
        return None if row is None else _row(row)

    async def versions(self, conn: AsyncConnection) -> list[DocumentRow]:
        """Every published version, newest first."""
        V = self.versions_table
        return [_row(r) for r in await conn.execute(select(V).order_by(V.c.id.desc()))]

    async def active(self, conn: AsyncConnection, *, lock: bool = False) -> DocumentRow | None:
        V = self.versions_table
        query = select(V).where(V.c.active.is_(True))
        row = (await conn.execute(query.with_for_update() if lock else query)).first()
        return None if row is None else _row(row)

    async def active_version(self, conn: AsyncConnection) -> str | None:
        """The active version's name only (a cheap per-round read); None before any publish."""
        V = self.versions_table
        return (await conn.execute(select(V.c.version).where(V.c.active.is_(True)))).scalar()

    async def before(self, conn: AsyncConnection, name: str) -> DocumentRow | None:
        """The version published just before `name` (the rollback target of an empty version)."""
        V = self.versions_table
        below = select(V.c.id).where(V.c.version == name).scalar_subquery()
        query = select(V).where(V.c.id < below).order_by(V.c.id.desc()).limit(1)
        row = (await conn.execute(query)).first()
        return None if row is None else _row(row)

    async def lock_publication(self, conn: AsyncConnection) -> None:
        """Serialise this transaction's publish or rollback with every other one of this kind:
        PostgreSQL, a transaction-scoped advisory lock; SQLite's ``BEGIN IMMEDIATE`` already
        serialises writers. Without it two publications at once both deactivate the active
        version and insert theirs, and the second breaks the one-active index."""
        await xact_lock(conn, self.lock_name)

    async def activations(self, conn: AsyncConnection) -> list[ActivationRow]:
        """Every activation, oldest first."""
        P = self.activations_table
        rows = await conn.execute(select(P).order_by(P.c.id))
        return [ActivationRow(r.version, r.previous_version, r.action, r.actor, r.at) for r in rows]

    async def _switch(
        self, conn: AsyncConnection, name: str, action: str, actor: str, now: datetime
    ) -> None:
        """Deactivate the active version and record `name`'s activation (it replaced that one)."""
        V, P = self.versions_table, self.activations_table
        previous = (
            await conn.execute(
                update(V).where(V.c.active.is_(True)).values(active=False).returning(V.c.version)
            )
        ).scalar()
        await conn.execute(
            P.insert().values(
                version=name, previous_version=previous, action=action, actor=actor, at=now
            )
        )

    async def insert_active(
        self,
        conn: AsyncConnection,
        name: str,
        document: str,
        source: str,
        now: datetime,
        *,
        actor: str = "",
    ) -> DocumentRow:
        """Insert `name` as the active version (the previous one stays, inactive), recorded."""
        await self._switch(conn, name, "PUBLISHED", actor, now)
        await conn.execute(
            self.versions_table.insert().values(
                version=name,
                document=document,
                source=source,
                active=True,
                published_at=now,
                activated_at=now,
            )
        )
        return DocumentRow(name, document, source, True, now, now)

    async def activate(
        self, conn: AsyncConnection, name: str, now: datetime, *, actor: str = ""
    ) -> None:
        """Make the published `name` active again (a rollback), recorded."""
        V = self.versions_table
        await self._switch(conn, name, "ROLLED_BACK", actor, now)
        await conn.execute(
            update(V).where(V.c.version == name).values(active=True, activated_at=now)
        )
