"""Routing policy versions in the database (design 9.25.5); their canaries: `canaries`.

Writes take the connection of a transaction the unit of work opened (callers above persistence
reach them through the unit: ``u.documents(kind)``, ``u.start_changed_canaries``):
a publication deactivates the active version and inserts the new one active in one unit, with
the canaries it starts; every activation (publication or rollback) is a row of
``routing_policy_activations`` with the version it replaced, the caller and the time (the
versioned-document machinery shared with tenants documents: `documents.Documents`).

`active_snapshot` is the dispatcher's per-round read: ONE statement, the active version and
every canary's stage (a handful of rows), whatever the traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, true
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.routing.canary import CanaryStatus
from controlplane.persistence.documents import ActivationRow, Documents
from controlplane.persistence.documents import DocumentRow as PolicyRow
from controlplane.persistence.models import canary_states as C
from controlplane.persistence.models import routing_policy_activations as P
from controlplane.persistence.models import routing_policy_versions as V

__all__ = [
    "DOCUMENTS",
    "ActivationRow",
    "ActiveSnapshot",
    "PolicyRow",
    "activate",
    "activations",
    "active",
    "active_snapshot",
    "before",
    "insert_active",
    "lock_publication",
    "version",
    "versions",
]


@dataclass(frozen=True, slots=True)
class ActiveSnapshot:
    """What a dispatch round needs: the active version and each canary's (stage, status)."""

    version: str
    canaries: tuple[tuple[str, int, CanaryStatus], ...]


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


DOCUMENTS = _DOCS = Documents(V, P, "routing-policy-publication")


async def version(conn: AsyncConnection, name: str) -> PolicyRow | None:
    return await _DOCS.version(conn, name)


async def versions(conn: AsyncConnection) -> list[PolicyRow]:
    """Every published version, newest first."""
    return await _DOCS.versions(conn)


async def active(conn: AsyncConnection, *, lock: bool = False) -> PolicyRow | None:
    return await _DOCS.active(conn, lock=lock)


async def before(conn: AsyncConnection, name: str) -> PolicyRow | None:
    """The version published just before `name` (the rollback target of an empty version)."""
    return await _DOCS.before(conn, name)


async def lock_publication(conn: AsyncConnection) -> None:
    """Serialise this transaction's publish or rollback with every other one
    (`Documents.lock_publication`)."""
    await _DOCS.lock_publication(conn)


async def activations(conn: AsyncConnection) -> list[ActivationRow]:
    """Every activation, oldest first."""
    return await _DOCS.activations(conn)


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
    return await _DOCS.insert_active(conn, name, document, source, now, actor=actor)


async def activate(conn: AsyncConnection, name: str, now: datetime, *, actor: str = "") -> None:
    """Make the published `name` active again (a rollback), recorded."""
    await _DOCS.activate(conn, name, now, actor=actor)
