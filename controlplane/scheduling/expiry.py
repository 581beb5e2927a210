"""Queued tasks past their deadlines are FAILED, not dispatched (`controlplane.domain.deadlines`).

The dispatcher reads every QUEUED task each round anyway, so it settles the overdue ones before
building the fair queue: a task past ``deadline_at`` (TASK_DEADLINE_EXCEEDED), or one still
waiting for its first attempt past ``queue_deadline_at`` (QUEUE_DEADLINE_EXCEEDED). Each is a
compare-and-set on the task's version, so a concurrent cancel or dispatch wins cleanly and the
task is simply left to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from controlplane.domain.deadlines import QUEUE_DEADLINE_EXCEEDED, TASK_DEADLINE_EXCEEDED
from controlplane.domain.states import TaskState
from controlplane.persistence.catalog import CatalogQueries
from controlplane.persistence.database import Database
from controlplane.persistence.records import Failure, TaskRecord

__all__ = ["DEADLINE_FAILURE_CLASS", "overdue_reason", "settle_overdue"]

# Not a provider error class: the platform gave up waiting, no provider refused anything.
DEADLINE_FAILURE_CLASS = "DEADLINE_EXCEEDED"


def overdue_reason(task: TaskRecord, now: datetime, *, has_attempt: bool) -> str | None:
    """Why the queued `task` must fail now, or None while it may still be dispatched."""
    if task.deadline_at is not None and now >= task.deadline_at:
        return TASK_DEADLINE_EXCEEDED
    if task.queue_deadline_at is not None and now >= task.queue_deadline_at and not has_attempt:
        return QUEUE_DEADLINE_EXCEEDED
    return None


async def settle_overdue(
    db: Database, catalogs: CatalogQueries, queued: Sequence[TaskRecord], now: datetime
) -> list[TaskRecord]:
    """FAIL the overdue tasks among `queued`; returns the others, in order."""
    keep: list[TaskRecord] = []
    for task in queued:
        past_queue = task.queue_deadline_at is not None and now >= task.queue_deadline_at
        past_task = task.deadline_at is not None and now >= task.deadline_at
        if not (past_queue or past_task):
            keep.append(task)
            continue
        # Only tasks past a deadline pay for the attempt lookup.
        has_attempt = past_queue and await catalogs.attempt_count(task.id) > 0
        reason = overdue_reason(task, now, has_attempt=has_attempt)
        if reason is None:
            keep.append(task)
            continue
        waited_ms = int((now - task.created_at).total_seconds() * 1000)
        async with db.unit(now) as u:
            await u.move_task_at(
                task.id,
                task.status_version,
                TaskState.FAILED,
                reason,
                failure=Failure(
                    DEADLINE_FAILURE_CLASS,
                    reason,
                    f"still queued {waited_ms} ms after creation; "
                    f"queue deadline {_iso(task.queue_deadline_at)}, task deadline "
                    f"{_iso(task.deadline_at)}",
                ),
            )
    return keep


def _iso(at: datetime | None) -> str:
    return at.isoformat() if at is not None else "none"
