"""Failover history queries: a task's requeues and exclusions as rows (revision 0004).

`record_requeue` runs inside the transaction that failed the attempt and moved the task to
QUEUED (after that task compare-and-set, so writers of one task are already serialised by its
row): one ``task_requeues`` row, and each excluded candidate merged into its one
``task_exclusions`` row by `controlplane.domain.requeue.merge_exclusion` (hard beats soft, a
soft one keeps the latest ``retry_at``). ``UNIQUE (task, account, model)`` backs that up: an
exclusion written twice never doubles.

`load_facts` is the dispatcher's read: the `RequeueFacts` of many tasks in a fixed number of
queries per round (requeues, exclusions, attempts), never one per task. The attempt counts come
from ``task_attempts``, their truth, rather than being copied into the history.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import insert, select, update
from sqlalchemy.engine import RowMapping
from sqlalchemy.ext.asyncio import AsyncConnection

from controlplane.domain.requeue import (
    ExcludedCandidate,
    RequeueFacts,
    RequeueRequest,
    merge_exclusion,
    requeue_facts,
)
from controlplane.persistence.models import task_attempts as A
from controlplane.persistence.models import task_exclusions as E
from controlplane.persistence.models import task_requeues as R

__all__ = ["RequeueRow", "exclusions_of", "load_facts", "record_requeue", "requeues_of"]

# Bound parameters per IN list: far below SQLite's and PostgreSQL's limits.
_CHUNK = 500


@dataclass(frozen=True, slots=True)
class RequeueRow:
    """One stored hand-back of a task; `required_model` "" means any model."""

    id: int
    task_id: int
    failed_attempt_id: int
    reason: str
    error_class: str
    required_model: str
    not_before: datetime | None
    created_at: datetime
    platform_loss_micros: int = 0
    platform_loss_limit_micros: int = 0


def _requeue(m: RowMapping) -> RequeueRow:
    return RequeueRow(
        m["id"],
        m["task_id"],
        m["failed_attempt_id"],
        m["reason"],
        m["error_class"],
        m["required_model"] or "",
        m["not_before"],
        m["created_at"],
        m["estimated_platform_loss_micros"],
        m["platform_loss_limit_micros"],
    )


def _exclusion(m: RowMapping) -> ExcludedCandidate:
    return ExcludedCandidate(
        m["provider_account_id"],
        m["provider_model"],
        soft=bool(m["soft"]),
        retry_at=m["retry_at"],
        attempt_id=m["attempt_id"],
        error_class=m["error_class"],
    )


def _values(c: ExcludedCandidate) -> dict[str, object]:
    return {
        "soft": c.soft,
        "retry_at": c.retry_at if c.soft else None,
        "attempt_id": c.attempt_id,
        "error_class": c.error_class,
    }


async def record_requeue(conn: AsyncConnection, request: RequeueRequest, now: datetime) -> None:
    """Store `request`: its requeue row and its exclusions merged into the task's."""
    await conn.execute(
        insert(R).values(
            task_id=request.task_id,
            failed_attempt_id=request.failed_attempt_id,
            reason=request.reason,
            error_class=request.error_class,
            required_model=request.required_model if request.same_model_only else None,
            not_before=request.not_before,
            estimated_platform_loss_micros=request.platform_loss_micros,
            platform_loss_limit_micros=request.platform_loss_limit_micros,
            created_at=now,
        )
    )
    if not request.excluded_candidates:
        return
    rows = await conn.execute(select(E).where(E.c.task_id == request.task_id))
    known = {(m["provider_account_id"], m["provider_model"]): m for m in rows.mappings()}
    for c in request.excluded_candidates:
        row = known.get(c.key)
        before = _exclusion(row) if row is not None else None
        merged = merge_exclusion(before, c)
        if row is None:
            await conn.execute(
                insert(E).values(
                    task_id=request.task_id,
                    provider_account_id=c.provider_account_id,
                    provider_model=c.provider_model,
                    created_at=now,
                    updated_at=now,
                    **_values(merged),
                )
            )
        elif merged != before:
            await conn.execute(
                update(E).where(E.c.id == row["id"]).values(updated_at=now, **_values(merged))
            )


def _chunks(ids: Sequence[int]) -> Iterator[list[int]]:
    for i in range(0, len(ids), _CHUNK):
        yield list(ids[i : i + _CHUNK])


async def load_facts(conn: AsyncConnection, task_ids: Iterable[int]) -> dict[int, RequeueFacts]:
    """The `RequeueFacts` of every task among `task_ids` that was ever requeued."""
    ids = sorted(set(task_ids))
    latest: dict[int, RequeueRow] = {}
    excluded: dict[int, list[ExcludedCandidate]] = defaultdict(list)
    tried: dict[int, list[tuple[int, str]]] = defaultdict(list)
    for chunk in _chunks(ids):
        rows = await conn.execute(select(R).where(R.c.task_id.in_(chunk)).order_by(R.c.id))
        for m in rows.mappings():
            latest[m["task_id"]] = _requeue(m)  # ascending ids: the last one wins
        requeued = [i for i in chunk if i in latest]
        if not requeued:
            continue
        rows = await conn.execute(select(E).where(E.c.task_id.in_(requeued)))
        for m in rows.mappings():
            excluded[m["task_id"]].append(_exclusion(m))
        rows = await conn.execute(
            select(A.c.task_id, A.c.provider_account_id, A.c.provider_model)
            .where(A.c.task_id.in_(requeued))
            .order_by(A.c.task_id, A.c.attempt_no)
        )
        for task_id, account_id, model in rows:
            tried[task_id].append((account_id, model))
    return {
        task_id: requeue_facts(
            excluded[task_id],
            tried[task_id],
            required_model=row.required_model,
            not_before=row.not_before,
            error_class=row.error_class,
        )
        for task_id, row in latest.items()
    }


async def requeues_of(conn: AsyncConnection, task_id: int) -> list[RequeueRow]:
    """Every requeue of the task, oldest first."""
    rows = await conn.execute(select(R).where(R.c.task_id == task_id).order_by(R.c.id))
    return [_requeue(m) for m in rows.mappings()]


async def exclusions_of(conn: AsyncConnection, task_id: int) -> list[ExcludedCandidate]:
    """The task's excluded candidates, ordered by (account, model)."""
    rows = await conn.execute(
        select(E)
        .where(E.c.task_id == task_id)
        .order_by(E.c.provider_account_id, E.c.provider_model)
    )
    return [_exclusion(m) for m in rows.mappings()]
