"""Task reads: a task with its attempts, jobs and decisions, pages of tasks, a task's events.

Read-only (writes go through `Database.unit`). `list_tasks` pages with an opaque token bound
to its filters (see `_sql` for the encoding).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import select

from controlplane.domain.states import TaskState
from controlplane.persistence import _reads, _rows, _sql
from controlplane.persistence.models import generation_tasks as T
from controlplane.persistence.models import provider_jobs, route_decisions, task_events
from controlplane.persistence.models import task_attempts as A
from controlplane.persistence.records import (
    AttemptRecord,
    TaskDetail,
    TaskEventRecord,
    TaskRecord,
)

if TYPE_CHECKING:
    from controlplane.persistence.database import Database

__all__ = ["DEFAULT_PAGE_SIZE", "MAX_PAGE_SIZE", "TaskQueries"]

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500


class TaskQueries:
    """Read-only task queries over one `Database`; each call reads on its own connection."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def get_task(self, task_id: int) -> TaskDetail | None:
        """The task with its attempts, provider jobs and route decisions, or None."""
        async with self._db.reading() as conn:
            task = await _reads.task(conn, task_id, lock=False)
            if task is None:
                return None
            jobs = await conn.execute(
                select(provider_jobs)
                .join(A, A.c.id == provider_jobs.c.attempt_id)
                .where(A.c.task_id == task_id)
                .order_by(provider_jobs.c.id)
            )
            decisions = await conn.execute(
                select(route_decisions)
                .where(route_decisions.c.task_id == task_id)
                .order_by(route_decisions.c.decision_no)
            )
            return TaskDetail(
                task=task,
                attempts=tuple(await _reads.attempts_of(conn, task_id)),
                provider_jobs=tuple(_rows.provider_job(m) for m in jobs.mappings()),
                route_decisions=tuple(_rows.route_decision(m) for m in decisions.mappings()),
            )

    async def get_attempt(self, attempt_id: int) -> AttemptRecord | None:
        """The attempt, or None."""
        async with self._db.reading() as conn:
            return await _reads.attempt(conn, attempt_id, lock=False)

    async def attempts_of_tasks(self, task_ids: Sequence[int]) -> dict[int, list[AttemptRecord]]:
        """The attempts of each of `task_ids`, in attempt order, in one statement (a page of
        tasks' attempts at once; a task without attempts is absent)."""
        if not task_ids:
            return {}
        query = (
            select(A).where(A.c.task_id.in_(list(task_ids))).order_by(A.c.task_id, A.c.attempt_no)
        )
        async with self._db.reading() as conn:
            rows = (await conn.execute(query)).mappings().all()
        found: dict[int, list[AttemptRecord]] = {}
        for m in rows:
            attempt = _rows.attempt(m)
            found.setdefault(attempt.task_id, []).append(attempt)
        return found

    async def list_tasks(
        self,
        *,
        tenant_id: str | None = None,
        state: TaskState | None = None,
        page_size: int = DEFAULT_PAGE_SIZE,
        page_token: str | None = None,
    ) -> tuple[list[TaskRecord], str | None]:
        """One page of tasks, newest first (descending id), and the token of the next page.

        Keyset pagination on ``id``: a page never repeats or skips a task because of inserts
        between calls. ``page_size <= 0`` means the default; it is capped at `MAX_PAGE_SIZE`.
        The token is opaque, bound to the filters it was issued for, and None on the last page.
        """
        size = DEFAULT_PAGE_SIZE if page_size <= 0 else min(page_size, MAX_PAGE_SIZE)
        filters = _sql.filter_fingerprint(tenant_id, state)
        query = select(T).order_by(T.c.id.desc()).limit(size + 1)
        if tenant_id is not None:
            query = query.where(T.c.tenant_id == tenant_id)
        if state is not None:
            query = query.where(T.c.status == state.value)
        if page_token:
            query = query.where(T.c.id < _sql.decode_token(page_token, filters))
        async with self._db.reading() as conn:
            rows = (await conn.execute(query)).mappings().all()
        records = [_rows.task(m) for m in rows[:size]]
        more = len(rows) > size
        return records, (_sql.encode_token(records[-1].id, filters) if more else None)

    async def task_events(
        self, task_id: int, *, after_seq: int = 0, limit: int = 100
    ) -> list[TaskEventRecord]:
        """The task's events with ``seq > after_seq`` in order (WatchTask replays from here)."""
        async with self._db.reading() as conn:
            rows = await conn.execute(
                select(task_events)
                .where(task_events.c.task_id == task_id, task_events.c.seq > after_seq)
                .order_by(task_events.c.seq)
                .limit(limit)
            )
            return [_rows.task_event(m) for m in rows.mappings()]
