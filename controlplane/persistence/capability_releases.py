"""Capability releases in the database (design 9.19.2, 9.25.5): the published documents and
every activation, beside the catalog rows they wrote.

A release is a published capability document (``capability_releases``, revision 0019): STAGED
(checked and kept, no catalog row written) or APPLIED (its capability and price versions are in
the catalog, effective from ``effective_from``, which may lie ahead: a scheduled release). Each
activation (``capability_release_activations``: PUBLISHED, SCHEDULED, ACTIVATED from staged, or
ROLLED_BACK to an earlier release) records who, when, from when it takes effect, the release
it replaced, the reason when it was forced and, per model, the versions it replaced. The
release *active* at an instant is the one of the latest activation in effect then.

Writes take the connection of a unit their caller opened, so the catalog rows, the release and
its activation land together; `lock` serialises releases with each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.persistence.advisory import xact_lock
from controlplane.persistence.models import capability_release_activations as A
from controlplane.persistence.models import capability_releases as R

LOCK_NAME = "capability-release"
STAGED, APPLIED = "STAGED", "APPLIED"


@dataclass(frozen=True, slots=True)
class ReleaseRow:
    version: str
    document: str
    source: str
    actor: str
    state: str
    published_at: datetime
    effective_from: datetime | None
    forced_reason: str | None
    changes: tuple[Mapping[str, Any], ...] = field(default=())


@dataclass(frozen=True, slots=True)
class ActivationRow:
    version: str
    previous_version: str | None
    action: str  # PUBLISHED, SCHEDULED, ACTIVATED or ROLLED_BACK
    actor: str
    at: datetime
    effective_from: datetime
    reason: str | None
    replaced: tuple[Mapping[str, Any], ...] = field(default=())


def _release(r: Any) -> ReleaseRow:
    return ReleaseRow(
        r.version,
        r.document,
        r.source,
        r.actor,
        r.state,
        r.published_at,
        r.effective_from,
        r.forced_reason,
        tuple(r.changes or ()),
    )


def _activation(r: Any) -> ActivationRow:
    return ActivationRow(
        r.version,
        r.previous_version,
        r.action,
        r.actor,
        r.at,
        r.effective_from,
        r.reason,
        tuple(r.replaced or ()),
    )


async def lock(conn: AsyncConnection) -> None:
    """Serialise this unit's release write with every other one (see `advisory.xact_lock`)."""
    await xact_lock(conn, LOCK_NAME)


async def release(conn: AsyncConnection, version: str) -> ReleaseRow | None:
    row = (await conn.execute(select(R).where(R.c.version == version))).first()
    return None if row is None else _release(row)


async def releases(conn: AsyncConnection) -> list[ReleaseRow]:
    """Every release, newest first."""
    return [_release(r) for r in await conn.execute(select(R).order_by(R.c.id.desc()))]


async def activations(conn: AsyncConnection) -> list[ActivationRow]:
    """Every activation, oldest first."""
    return [_activation(r) for r in await conn.execute(select(A).order_by(A.c.id))]


async def active_at(conn: AsyncConnection, at: datetime) -> ActivationRow | None:
    """The activation in effect at `at` (the latest one effective by then), if any."""
    query = (
        select(A)
        .where(A.c.effective_from <= at)
        .order_by(A.c.effective_from.desc(), A.c.id.desc())
        .limit(1)
    )
    row = (await conn.execute(query)).first()
    return None if row is None else _activation(row)


async def pending(conn: AsyncConnection, now: datetime) -> ActivationRow | None:
    """The first activation scheduled after `now`, if any. Only a SCHEDULED one: an immediate
    activation takes effect at its writer's clock, which a racing writer's earlier clock would
    otherwise read as the future."""
    query = (
        select(A)
        .where(A.c.action == "SCHEDULED", A.c.effective_from > now)
        .order_by(A.c.effective_from)
        .limit(1)
    )
    row = (await conn.execute(query)).first()
    return None if row is None else _activation(row)


async def insert_release(conn: AsyncConnection, row: ReleaseRow) -> None:
    await conn.execute(
        R.insert().values(
            version=row.version,
            document=row.document,
            source=row.source,
            actor=row.actor,
            state=row.state,
            published_at=row.published_at,
            effective_from=row.effective_from,
            forced_reason=row.forced_reason,
            changes=[dict(c) for c in row.changes],
        )
    )


async def mark_applied(
    conn: AsyncConnection, version: str, effective_from: datetime, forced_reason: str | None
) -> bool:
    """A staged release is activated: APPLIED from `effective_from`. False when it is no longer
    STAGED (another activation got there first): the caller's unit must not go on."""
    result = await conn.execute(
        update(R)
        .where(R.c.version == version, R.c.state == STAGED)
        .values(state=APPLIED, effective_from=effective_from, forced_reason=forced_reason)
    )
    return result.rowcount == 1


async def record_activation(conn: AsyncConnection, row: ActivationRow) -> None:
    await conn.execute(
        A.insert().values(
            version=row.version,
            previous_version=row.previous_version,
            action=row.action,
            actor=row.actor,
            at=row.at,
            effective_from=row.effective_from,
            reason=row.reason,
            replaced=[dict(r) for r in row.replaced],
        )
    )
