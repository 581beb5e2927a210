"""Routing policy versions in the database (design 9.25.5); their canaries: `canaries`.

Writes take the connection of a transaction their caller opened (`Database.unit`'s ``u.conn``):
a publication deactivates the active version and inserts the new one active in one unit, with
the canaries it starts; every activation (publication or rollback) is a row of
``routing_policy_activations`` with the version it replaced, the caller and the time.

`active_snapshot` is the dispatcher's per-round read: ONE statement, the active version and
every canary's stage (a handful of rows), whatever the traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, true, update
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.routing.canary import CanaryStatus
from controlplane.persistence.advisory import xact_lock
from controlplane.persistence.models import canary_states as C
from controlplane.persistence.models import routing_policy_activations as P
from controlplane.persistence.models import routing_policy_versions as V


@dataclass(frozen=True, slots=True)
class PolicyRow:
    version: str
    document: str
    source: str
    active: bool
    published_at: datetime
    activated_at: datetime | None


@dataclass(frozen=True, slots=True)
class ActiveSnapshot:
    """What a dispatch round needs: the active version and each canary's (stage, status)."""

    version: str
    canaries: tuple[tuple[str, int, CanaryStatus], ...]


def _policy(r: Any) -> PolicyRow:
    return PolicyRow(
        r.version, r.document, r.source, bool(r.active), r.published_at, r.activated_at
    )


async def active_snapshot(conn: AsyncConnection) -> ActiveSnapshot | None:
    """The active version and every canary state, in one statement; None before any publish."""
    rows = (
        await conn.execute(
            select(V.c.version, C.c.candidate_id, C.c.stage, C.c.status)
            .select_from(V.outerjoin(C, true()))
            .where(V.c.active.is_(True))
        )
    ).all()
    if not rows:
        return None
    canaries = tuple(
        (r.candidate_id, r.stage, CanaryStatus(r.status))
        for r in rows
        if r.candidate_id is not None
    )
    return ActiveSnapshot(rows[0].version, canaries)


async def version(conn: AsyncConnection, name: str) -> PolicyRow | None:
    row = (await conn.execute(select(V).where(V.c.version == name))).first()
    return None if row is None else _policy(row)


async def versions(conn: AsyncConnection) -> list[PolicyRow]:
    """Every published version, newest first."""
    return [_policy(r) for r in await conn.execute(select(V).order_by(V.c.id.desc()))]


async def active(conn: AsyncConnection, *, lock: bool = False) -> PolicyRow | None:
    query = select(V).where(V.c.active.is_(True))
    row = (await conn.execute(query.with_for_update() if lock else query)).first()
    return None if row is None else _policy(row)


async def before(conn: AsyncConnection, name: str) -> PolicyRow | None:
    """The version published just before `name` (the rollback target of an empty version)."""
    below = select(V.c.id).where(V.c.version == name).scalar_subquery()
    row = (
        await conn.execute(select(V).where(V.c.id < below).order_by(V.c.id.desc()).limit(1))
    ).first()
    return None if row is None else _policy(row)


async def lock_publication(conn: AsyncConnection) -> None:
    """Serialise this transaction's publish or rollback with every other one: PostgreSQL, a
    transaction-scoped advisory lock; SQLite's ``BEGIN IMMEDIATE`` already serialises writers.
    Without it two publications at once both deactivate the active version and insert theirs,
    and the second breaks the one-active index (or the version's unique key)."""
    await xact_lock(conn, "routing-policy-publication")


@dataclass(frozen=True, slots=True)
class ActivationRow:
    version: str
    previous_version: str | None
    action: str  # PUBLISHED or ROLLED_BACK
    actor: str
    at: datetime


async def _switch(conn: AsyncConnection, name: str, action: str, actor: str, now: datetime) -> None:
    """Deactivate the active version and record `name`'s activation (it replaced that one)."""
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


async def activations(conn: AsyncConnection) -> list[ActivationRow]:
    """Every activation, oldest first."""
    rows = await conn.execute(select(P).order_by(P.c.id))
    return [ActivationRow(r.version, r.previous_version, r.action, r.actor, r.at) for r in rows]


async def insert_active(
    conn: AsyncConnection,
    name: str,
    document: str,
    source: str,
    now: datetime,
    *,
    actor: str = "",
) -> PolicyRow:
    """Insert `name` as the active version (the previous one stays, inactive), recorded."""
    await _switch(conn, name, "PUBLISHED", actor, now)
    await conn.execute(
        V.insert().values(
            version=name,
            document=document,
            source=source,
            active=True,
            published_at=now,
            activated_at=now,
        )
    )
    return PolicyRow(name, document, source, True, now, now)


async def activate(conn: AsyncConnection, name: str, now: datetime, *, actor: str = "") -> None:
    """Make the published `name` active again (a rollback), recorded."""
    await _switch(conn, name, "ROLLED_BACK", actor, now)
    await conn.execute(update(V).where(V.c.version == name).values(active=True, activated_at=now))
