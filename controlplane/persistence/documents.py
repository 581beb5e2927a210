"""Versioned configuration documents in the database (design 9.6.4, 9.25.5): one shape, many uses.

A published document is a row of a *versions* table (version, the text as published, source,
active, published_at, activated_at; at most one active, by a partial unique index) and each
activation a row of an *activations* table (version, the version it replaced, the action, the
caller, when it was asked for and when it took effect, the operator's reason). Actions:
PUBLISHED (active on publication), SCHEDULED (published inactive, active from a later time),
ACTIVATED (a staged version made active), ROLLED_BACK.

A scheduled activation is a *pending* activations row whose ``at`` is the time asked for.
`apply_due` makes every due one effective, in order, under the kind's publication lock: the
``active`` flag stays the one thing readers look at (the dispatcher's per-round read is
unchanged), and replicas that race to apply it serialise on the lock and find nothing left.

Routing policies (`routing_policies`), tenants documents (`tenant_configs`) and accounts
documents (`account_configs`) are kept this way; `Documents` names a pair of tables and the
advisory lock that serialises their publications.

Writes take the connection of a transaction the unit of work opened; services reach them through
the unit as `OpenDocuments` (``u.documents(kind)``), never holding the connection themselves:
a publication deactivates the active version and inserts the new one active in one unit, and
records the activation in the same one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Table, and_, select, update
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
    action: str  # PUBLISHED, SCHEDULED, ACTIVATED or ROLLED_BACK
    actor: str
    at: datetime  # effective; while pending, the time asked for
    pending: bool = False
    requested_at: datetime | None = None  # None: the same as `at` (rows before revision 0018)
    reason: str = ""


def _activation(r: Any) -> ActivationRow:
    return ActivationRow(
        r.version,
        r.previous_version,
        r.action,
        r.actor,
        r.at,
        bool(r.pending),
        r.requested_at,
        r.reason or "",
    )


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
        """The version published just before `name` that was ever active (the rollback target
        of an empty version: a staged version never used is no way back)."""
        V = self.versions_table
        below = select(V.c.id).where(V.c.version == name).scalar_subquery()
        query = (
            select(V)
            .where(V.c.id < below, V.c.activated_at.is_not(None))
            .order_by(V.c.id.desc())
            .limit(1)
        )
        row = (await conn.execute(query)).first()
        return None if row is None else _row(row)

    async def lock_publication(self, conn: AsyncConnection) -> None:
        """Serialise this transaction's publish or rollback with every other one of this kind:
        PostgreSQL, a transaction-scoped advisory lock; SQLite's ``BEGIN IMMEDIATE`` already
        serialises writers. Without it two publications at once both deactivate the active
        version and insert theirs, and the second breaks the one-active index."""
        await xact_lock(conn, self.lock_name)

    async def activations(self, conn: AsyncConnection) -> list[ActivationRow]:
        """Every activation, pending ones included, oldest first."""
        P = self.activations_table
        rows = await conn.execute(select(P).order_by(P.c.id))
        return [_activation(r) for r in rows]

    async def pending(self, conn: AsyncConnection) -> list[ActivationRow]:
        """Scheduled activations not yet effective, soonest first."""
        P = self.activations_table
        rows = await conn.execute(select(P).where(P.c.pending.is_(True)).order_by(P.c.at, P.c.id))
        return [_activation(r) for r in rows]

    async def _deactivate(self, conn: AsyncConnection) -> str | None:
        """Deactivate the active version; the one it was (None: nothing was active)."""
        V = self.versions_table
        previous: str | None = (
            await conn.execute(
                update(V).where(V.c.active.is_(True)).values(active=False).returning(V.c.version)
            )
        ).scalar()
        return previous

    async def _record(
        self,
        conn: AsyncConnection,
        name: str,
        previous: str | None,
        action: str,
        *,
        actor: str,
        at: datetime,
        pending: bool = False,
        requested_at: datetime | None = None,
        reason: str = "",
    ) -> None:
        await conn.execute(
            self.activations_table.insert().values(
                version=name,
                previous_version=previous,
                action=action,
                actor=actor,
                at=at,
                pending=pending,
                requested_at=requested_at,
                reason=reason or None,
            )
        )

    async def insert(
        self,
        conn: AsyncConnection,
        name: str,
        document: str,
        source: str,
        now: datetime,
        *,
        active: bool = False,
    ) -> DocumentRow:
        """Insert `name`; inactive (staged or scheduled) unless `active` (the caller switched)."""
        await conn.execute(
            self.versions_table.insert().values(
                version=name,
                document=document,
                source=source,
                active=active,
                published_at=now,
                activated_at=now if active else None,
            )
        )
        return DocumentRow(name, document, source, active, now, now if active else None)

    async def insert_active(
        self,
        conn: AsyncConnection,
        name: str,
        document: str,
        source: str,
        now: datetime,
        *,
        actor: str = "",
        reason: str = "",
    ) -> DocumentRow:
        """Insert `name` as the active version (the previous one stays, inactive), recorded."""
        previous = await self._deactivate(conn)
        await self._record(conn, name, previous, "PUBLISHED", actor=actor, at=now, reason=reason)
        return await self.insert(conn, name, document, source, now, active=True)

    async def schedule(
        self,
        conn: AsyncConnection,
        name: str,
        at: datetime,
        now: datetime,
        *,
        actor: str = "",
        reason: str = "",
    ) -> None:
        """Record that the published `name` becomes active at `at` (`apply_due` does it)."""
        await self._record(
            conn,
            name,
            None,
            "SCHEDULED",
            actor=actor,
            at=at,
            pending=True,
            requested_at=now,
            reason=reason,
        )

    async def activate(
        self,
        conn: AsyncConnection,
        name: str,
        now: datetime,
        *,
        actor: str = "",
        action: str = "ROLLED_BACK",
        reason: str = "",
    ) -> None:
        """Make the published `name` active (a rollback, or a staged version's activation)."""
        previous = await self._deactivate(conn)
        await self._record(conn, name, previous, action, actor=actor, at=now, reason=reason)
        await self._set_active(conn, name, now)

    async def _set_active(self, conn: AsyncConnection, name: str, now: datetime) -> None:
        V = self.versions_table
        await conn.execute(
            update(V).where(V.c.version == name).values(active=True, activated_at=now)
        )

    async def apply_due(self, conn: AsyncConnection, now: datetime) -> list[ActivationRow]:
        """Make every scheduled activation due by `now` effective, soonest first, each recorded
        as it happened (effective `now`, replacing what was active). The caller holds the
        publication lock, so a replica racing this one finds nothing left to apply."""
        P = self.activations_table
        due = [a for a in await self.pending(conn) if a.at <= now]
        for a in due:
            previous = await self._deactivate(conn)
            await self._set_active(conn, a.version, now)
            await conn.execute(
                update(P)
                .where(and_(P.c.pending.is_(True), P.c.version == a.version, P.c.at == a.at))
                .values(pending=False, at=now, previous_version=previous)
            )
        return due


@dataclass(frozen=True, slots=True)
class OpenDocuments:
    """`Documents` of one kind inside one open unit (`SqlUnitOfWork.documents`): the same
    reads and writes on the unit's transaction, at the unit's clock, so a service above
    persistence never holds the connection."""

    kind: Documents
    conn: AsyncConnection
    now: datetime

    async def version(self, name: str) -> DocumentRow | None:
        return await self.kind.version(self.conn, name)

    async def active(self, *, lock: bool = False) -> DocumentRow | None:
        return await self.kind.active(self.conn, lock=lock)

    async def before(self, name: str) -> DocumentRow | None:
        return await self.kind.before(self.conn, name)

    async def lock_publication(self) -> None:
        await self.kind.lock_publication(self.conn)

    async def insert(self, name: str, document: str, source: str) -> DocumentRow:
        return await self.kind.insert(self.conn, name, document, source, self.now)

    async def insert_active(
        self, name: str, document: str, source: str, *, actor: str = "", reason: str = ""
    ) -> DocumentRow:
        return await self.kind.insert_active(
            self.conn, name, document, source, self.now, actor=actor, reason=reason
        )

    async def schedule(self, name: str, at: datetime, *, actor: str = "", reason: str = "") -> None:
        await self.kind.schedule(self.conn, name, at, self.now, actor=actor, reason=reason)

    async def activate(
        self, name: str, *, actor: str = "", action: str = "ROLLED_BACK", reason: str = ""
    ) -> None:
        await self.kind.activate(
            self.conn, name, self.now, actor=actor, action=action, reason=reason
        )

    async def apply_due(self) -> list[ActivationRow]:
        return await self.kind.apply_due(self.conn, self.now)
