"""Recorded route decisions for route replay (design 9.25.4), read-only, one page at a time.

A page is a keyset page on ``(route_decisions.created_at, id)`` (oldest first) of the decisions
written in ``[since, until)``, optionally of one tenant (joined to its task), so a replay over a
week of traffic holds one page of snapshots at a time, never the whole window. The key is the
index ``ix_route_decisions_created_at_id`` (revision 0014): each page starts where the last
one ended on it and reads its rows off one range, however many decisions came before the window
or after it (ids alone do not order decisions by time: one batch shares its clock, and
concurrent batches interleave).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, literal, select, tuple_
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.persistence.coltypes import UtcDateTime
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import route_decisions as D

__all__ = ["Cursor", "RecordedRow", "decision_page", "page_query"]

Cursor = tuple[datetime, int]  # (created_at, id) of the last decision of the previous page


@dataclass(frozen=True, slots=True)
class RecordedRow:
    id: int
    task_id: int
    decision_no: int
    created_at: datetime
    snapshot: dict[str, Any]

    @property
    def cursor(self) -> Cursor:
        return self.created_at, self.id


def page_query(
    *, since: datetime | None, until: datetime, tenant_id: str, after: Cursor | None, limit: int
) -> Select[Any]:
    """The statement of one page (`decision_page`)."""
    stmt = select(
        D.c.id, D.c.task_id, D.c.decision_no, D.c.created_at, D.c.candidate_snapshot
    ).where(D.c.created_at < until)
    if after is not None:
        at, last_id = after
        # The plain bound lets both databases start the index range scan at `at`.
        stmt = stmt.where(
            D.c.created_at >= at,
            tuple_(D.c.created_at, D.c.id) > tuple_(literal(at, UtcDateTime()), literal(last_id)),
        )
    elif since is not None:
        stmt = stmt.where(D.c.created_at >= since)
    if tenant_id:
        stmt = stmt.join(T, T.c.id == D.c.task_id).where(T.c.tenant_id == tenant_id)
    return stmt.order_by(D.c.created_at, D.c.id).limit(limit)


async def decision_page(
    conn: AsyncConnection,
    *,
    since: datetime | None,
    until: datetime,
    tenant_id: str = "",
    after: Cursor | None = None,
    limit: int = 500,
) -> list[RecordedRow]:
    """Up to `limit` decisions written in ``[since, until)`` after `after`, by (time, id)."""
    query = page_query(since=since, until=until, tenant_id=tenant_id, after=after, limit=limit)
    rows = await conn.execute(query)
    return [
        RecordedRow(r.id, r.task_id, r.decision_no, r.created_at, dict(r.candidate_snapshot))
        for r in rows
    ]
