"""Recorded route decisions for route replay (design 9.25.4), read-only, one page at a time.

A page is a keyset page on ``route_decisions.id`` (oldest first) of the decisions written in
``[since, until)``, optionally of one tenant (joined to its task), so a replay over a week of
traffic holds one page of snapshots at a time, never the whole window.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import route_decisions as D

__all__ = ["RecordedRow", "decision_page"]


@dataclass(frozen=True, slots=True)
class RecordedRow:
    id: int
    task_id: int
    decision_no: int
    snapshot: dict[str, Any]


async def decision_page(
    conn: AsyncConnection,
    *,
    since: datetime | None,
    until: datetime,
    tenant_id: str = "",
    after_id: int = 0,
    limit: int = 500,
) -> list[RecordedRow]:
    """Up to `limit` decisions with id > `after_id` written in ``[since, until)``, by id."""
    stmt = select(D.c.id, D.c.task_id, D.c.decision_no, D.c.candidate_snapshot).where(
        D.c.id > after_id, D.c.created_at < until
    )
    if since is not None:
        stmt = stmt.where(D.c.created_at >= since)
    if tenant_id:
        stmt = stmt.join(T, T.c.id == D.c.task_id).where(T.c.tenant_id == tenant_id)
    rows = await conn.execute(stmt.order_by(D.c.id).limit(limit))
    return [RecordedRow(r.id, r.task_id, r.decision_no, dict(r.candidate_snapshot)) for r in rows]
